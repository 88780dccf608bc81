#!/usr/bin/env bash
# `paged bench serve` against a real `paged serve` of stories260K on loopback:
#   bash tests/integration/bench_serve.sh PATH/TO/paged
# A burst and a --request-rate run with --max-concurrency finish with 0 failures; the result file has vLLM's fields,
# completed == --num-prompts, and the server's /metrics counted the same requests, prompt and generated tokens; an
# impossible SLO (ttft:0.001) gives goodput 0 and loose ones goodput == request throughput. A ShareGPT-format file
# through --dataset-path (with --tokenizer; without it a usage error). A server killed mid-run: the tool ends
# promptly, exit 0 as vLLM's, with the failures counted and reported. An unreachable server is an error (exit 1).
set -u

NAME=bench_serve
. "$(dirname "$0")/worker_common.bash" "$@"
command -v curl >/dev/null || { echo "$NAME: curl is required (tools/setup.sh installs it)" >&2; exit 1; }

"$PAGED" serve --model "$MODEL" --device cpu --port 0 >"$TMP/serve.out" 2>"$TMP/serve.err" &
pids+=("$!")
await_port serve_port serve server_port_printed || finish
BASE="http://127.0.0.1:$serve_port"

# counter SERIES: the server's value of a /metrics series (labels included), 0 when absent.
counter() { curl -s "$BASE/metrics" | awk -v k="$1" '$1 == k { v = $2 } END { print v + 0 }'; }
SUCCESS='vllm:request_success_total{model_name="stories260K",finished_reason="length"}'
PROMPT='vllm:prompt_tokens_total{model_name="stories260K"}'
GENERATED='vllm:generation_tokens_total{model_name="stories260K"}'
# field FILE EXPR: EXPR evaluated on the result JSON in FILE as `r` (node), printed.
field() { node -e 'const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  process.stdout.write(String(eval(process.argv[2])))' "$1" "$2"; }
# check_counts LABEL FILE SUCCESS0 PROMPT0 GENERATED0: the server counted what the result in FILE says was sent.
check_counts() {
  local s p g
  s=$(($(counter "$SUCCESS") - $3)) p=$(($(counter "$PROMPT") - $4)) g=$(($(counter "$GENERATED") - $5))
  [ "$s" = "$(field "$2" r.completed)" ] && [ "$p" = "$(field "$2" r.total_input_tokens)" ] &&
    [ "$g" = "$(field "$2" r.total_output_tokens)" ] ||
    fail "$1: the server counted $s requests, $p prompt and $g generated tokens; the tool: $(field "$2" \
      '[r.completed, r.total_input_tokens, r.total_output_tokens].join(" ")')"
}
snapshot() { echo "$(counter "$SUCCESS") $(counter "$PROMPT") $(counter "$GENERATED")"; }

# A burst of 16 (random ids, exact lengths) with an SLO no request can meet.
read -r s0 p0 g0 <<<"$(snapshot)"
"$PAGED" bench serve --base-url "$BASE" --num-prompts 16 --random-input-len 24 --random-output-len 12 --ignore-eos \
  --goodput ttft:0.001 --result-file "$TMP/burst.json" >"$TMP/burst.out" 2>"$TMP/burst.err" ||
  fail "burst: exit $? $(cat "$TMP/burst.err")"
grep -q '^============ Serving Benchmark Result ============$' "$TMP/burst.out" &&
  grep -qE '^Successful requests: +16 *$' "$TMP/burst.out" && grep -qE '^Failed requests: +0 *$' "$TMP/burst.out" &&
  grep -qE '^P99 ITL \(ms\): +[0-9.]+ *$' "$TMP/burst.out" || fail "burst: the table: $(cat "$TMP/burst.out")"
grep -q '^bench serve: 16/16$' "$TMP/burst.err" || fail "burst: no progress lines on stderr: $(cat "$TMP/burst.err")"
[ "$(field "$TMP/burst.json" '[r.completed, r.failed, r.num_prompts, r.total_input_tokens, r.total_output_tokens,
  r.request_goodput].join(" ")')" = "16 0 16 384 192 0" ] || fail "burst: $(head -c 600 "$TMP/burst.json")"
[ "$(field "$TMP/burst.json" '["duration", "request_throughput", "output_throughput", "total_token_throughput",
  "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms",
  "p99_itl_ms"].every((k) => typeof r[k] === "number" && r[k] > 0) && r.request_rate === "inf" &&
  r.ttfts.length === 16 && r.itls.every((l) => l.length === 11) && r.output_lens.every((n) => n === 12) &&
  r.input_lens.every((n) => n === 24) && r.errors.every((e) => e === "")')" = true ] ||
  fail "burst: the result's fields: $(head -c 600 "$TMP/burst.json")"
check_counts burst "$TMP/burst.json" "$s0" "$p0" "$g0"

# 20 at 20 requests/s (Poisson, seeded), at most 4 at once, with SLOs every request meets.
read -r s0 p0 g0 <<<"$(snapshot)"
"$PAGED" bench serve --base-url "$BASE" --num-prompts 20 --random-input-len 16 --random-output-len 8 \
  --random-range-ratio 0.5 --request-rate 20 --max-concurrency 4 --seed 3 --goodput ttft:60000 tpot:60000 e2el:60000 \
  --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99 --result-file "$TMP/rate.json" \
  >"$TMP/rate.out" 2>"$TMP/rate.err" || fail "rate: exit $? $(cat "$TMP/rate.err")"
grep -qE '^Request rate configured \(RPS\): +20.00 *$' "$TMP/rate.out" &&
  grep -qE '^Maximum request concurrency: +4 *$' "$TMP/rate.out" && grep -qE '^P50 E2EL \(ms\):' "$TMP/rate.out" ||
  fail "rate: the table: $(cat "$TMP/rate.out")"
# 19 gaps of mean 50 ms take about 0.95 s (seeded); a burst would take a tenth of that.
[ "$(field "$TMP/rate.json" 'r.completed === 20 && r.failed === 0 && r.duration > 0.3 && r.request_rate === 20 &&
  r.max_concurrency === 4 && Math.abs(r.request_goodput - r.request_throughput) < 1e-9 &&
  typeof r.p50_e2el_ms === "number" && r.input_lens.some((n) => n !== 16)')" = true ] ||
  fail "rate: $(head -c 600 "$TMP/rate.json")"
check_counts rate "$TMP/rate.json" "$s0" "$p0" "$g0"

# A ShareGPT-format file: the first human turn is the prompt (sent as text), the reply's length the output's; the
# second conversation's prompt is too short (under 4 tokens) and is dropped, the first one repeated up to 3.
cat >"$TMP/sharegpt.json" <<'JSON'
[{"id": "a", "conversations": [{"from": "human", "value": "Once upon a time there was a little girl named Lily."},
  {"from": "gpt", "value": "She liked to play outside in the sun with her friends every day."}]},
 {"id": "b", "conversations": [{"from": "human", "value": "Hi"},
  {"from": "gpt", "value": "Hello, how are you today?"}]},
 {"id": "c", "conversations": [{"from": "human", "value": "alone"}]}]
JSON
"$PAGED" bench serve --base-url "$BASE" --dataset-path "$TMP/sharegpt.json" --num-prompts 3 >"$TMP/nok.out" \
  2>"$TMP/nok.err"
rc=$?
[ "$rc" = 2 ] && grep -q -- '--tokenizer' "$TMP/nok.err" ||
  fail "sharegpt without --tokenizer: exit $rc $(head -n 2 "$TMP/nok.err")"
read -r s0 p0 g0 <<<"$(snapshot)"
"$PAGED" bench serve --base-url "$BASE" --dataset-name sharegpt --dataset-path "$TMP/sharegpt.json" \
  --tokenizer "$MODEL" --num-prompts 3 --ignore-eos --result-file "$TMP/sharegpt_result.json" >"$TMP/sharegpt.out" \
  2>"$TMP/sharegpt.err" || fail "sharegpt: exit $? $(cat "$TMP/sharegpt.err")"
curl -s "$BASE/tokenize" -d '{"prompt": "Once upon a time there was a little girl named Lily."}' >"$TMP/tokens.json"
prompt_len=$(field "$TMP/tokens.json" r.count)  # the server's count, BOS included
[ "$(field "$TMP/sharegpt_result.json" 'r.completed + " " + r.dataset_name + " " + r.input_lens.join(",")')" = \
  "3 sharegpt $prompt_len,$prompt_len,$prompt_len" ] || fail "sharegpt: $(head -c 600 "$TMP/sharegpt_result.json")"
check_counts sharegpt "$TMP/sharegpt_result.json" "$s0" "$p0" "$g0"

# A server killed mid-run: the tool ends (no hang), exit 0 as vLLM's, the failures counted and reported.
"$PAGED" serve --model "$MODEL" --device cpu --port 0 >"$TMP/victim.out" 2>"$TMP/victim.err" &
victim=$!
pids+=("$victim")
victim_port_printed() { grep -ho 'http://[a-z0-9.]*:[0-9]*' "$TMP/victim.out" 2>/dev/null | head -n 1 | sed 's/.*://'; }
await_port victim_port victim victim_port_printed || finish
"$PAGED" bench serve --base-url "http://127.0.0.1:$victim_port" --num-prompts 60 --random-input-len 16 \
  --random-output-len 48 --ignore-eos --request-rate 20 --result-file "$TMP/killed.json" >"$TMP/killed.out" \
  2>"$TMP/killed.err" &
client=$!
pids+=("$client")
sleep 1
kill -KILL "$victim"
await_exit "$client" 20
[ "$rc" = 0 ] || fail "killed server: the tool's exit is $rc: $(tail -n 3 "$TMP/killed.err")"
[ "$(field "$TMP/killed.json" 'r.failed > 0 && r.completed + r.failed === 60 &&
  r.errors.filter((e) => e !== "").length === r.failed')" = true ] ||
  fail "killed server: $(head -c 400 "$TMP/killed.json")"
grep -qE '^Failed requests: +[1-9][0-9]* *$' "$TMP/killed.out" &&
  grep -q 'requests failed; the first: ' "$TMP/killed.err" ||
  fail "killed server: the failures are not reported: $(cat "$TMP/killed.out" "$TMP/killed.err" | tail -n 8)"

# Nothing listens: an error naming the server, exit 1; bad flags: usage errors, exit 2.
"$PAGED" bench serve --base-url "http://127.0.0.1:$victim_port" --num-prompts 2 >/dev/null 2>"$TMP/gone.err"
rc=$?
[ "$rc" = 1 ] && grep -q 'cannot connect' "$TMP/gone.err" || fail "unreachable server: exit $rc $(cat "$TMP/gone.err")"
for bad in "--num-prompts 2" "--base-url $BASE --goodput itl:5" "--base-url ftp://127.0.0.1:1" \
  "--base-url $BASE --request-rate 0" "--base-url $BASE --endpoint /v1/chat/completions" \
  "--base-url $BASE --percentile-metrics ttft,foo" "--base-url $BASE --dataset-name fixed"; do
  # shellcheck disable=SC2086
  "$PAGED" bench serve $bad >/dev/null 2>"$TMP/usage.err"
  rc=$?
  [ "$rc" = 2 ] || fail "bench serve $bad: exit $rc, not a usage error: $(head -n 1 "$TMP/usage.err")"
done

finish
