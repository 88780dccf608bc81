#!/usr/bin/env bash
# Clients that close the connection after one request, or send many at once, get every response:
#   bash tests/integration/http_clients.sh PATH/TO/paged
# Python's urllib (it sends "Connection: close"), curl --http1.0, a streamed completion with "Connection: close", and
# 32 completions pipelined on one connection (then a /health with "Connection: close"): each answers 200 with the
# golden greedy continuation of stories260K (the prompt's continuation, tests/http/golden_text.mjs). Then `serve
# MODEL --host localhost` with PAGED_API_KEY set answers /v1/models 401 without the key and 200 with it, and answers
# to both of its --served-model-name names. /ping,
# /version, /tokenize and /detokenize answer; /metrics has vLLM's series; the log has the startup, request and stats
# lines; CORS follows --allowed-origins.
set -u

NAME=http_clients
. "$(dirname "$0")/worker_common.bash" "$@"
command -v python3 >/dev/null && command -v curl >/dev/null ||
  { echo "$NAME: python3 and curl are required (tools/setup.sh installs them)" >&2; exit 1; }

"$PAGED" serve --model "$MODEL" --port 0 --enable-log-requests --stats-interval 1 --allowed-origins https://app.example \
  >"$TMP/serve.out" 2>"$TMP/serve.err" &
serve_pid=$!
pids+=("$serve_pid")
await_port serve_port serve server_port_printed || finish
BASE="http://127.0.0.1:$serve_port"
want=$(node "$SRC/tests/http/golden_text.mjs" "$GOLDEN" "$MODEL" | head -n 1)  # {prompt, text}: its continuation
body=$(node -e 'const w = JSON.parse(process.argv[1]);
  process.stdout.write(JSON.stringify({model: "stories260K", prompt: w.prompt, max_tokens: 64, temperature: 0}))' "$want")
# text_of FILE: the first choice's text of the completion JSON in FILE, as JSON.
text_of() { node -e 'try { process.stdout.write(JSON.stringify(JSON.parse(require("fs").readFileSync(process.argv[1],
  "utf8")).choices[0].text)) } catch (e) { process.stdout.write("unreadable") }' "$1"; }
golden=$(node -e 'process.stdout.write(JSON.stringify(JSON.parse(process.argv[1]).text))' "$want")

python3 - "$BASE" "$body" >"$TMP/urllib.json" 2>"$TMP/urllib.err" <<'PY' || fail "urllib: $(cat "$TMP/urllib.err")"
import sys, urllib.request
req = urllib.request.Request(sys.argv[1] + "/v1/completions", data=sys.argv[2].encode(),
                             headers={"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=30) as r:
    assert r.status == 200, r.status
    sys.stdout.write(r.read().decode())
PY
[ "$(text_of "$TMP/urllib.json")" = "$golden" ] || fail "urllib: $(head -c 300 "$TMP/urllib.json")"

curl -s --http1.0 -m 30 -H 'Content-Type: application/json' -d "$body" "$BASE/v1/completions" >"$TMP/http10.json" ||
  fail "curl --http1.0: exit $?"
[ "$(text_of "$TMP/http10.json")" = "$golden" ] || fail "curl --http1.0: $(head -c 300 "$TMP/http10.json")"

stream=$(node -e 'const b = JSON.parse(process.argv[1]); b.stream = true; process.stdout.write(JSON.stringify(b))' "$body")
curl -s -N -m 30 -H 'Connection: close' -H 'Content-Type: application/json' -d "$stream" "$BASE/v1/completions" \
  >"$TMP/stream.txt" || fail "streamed with Connection: close: curl exit $?"
got=$(node -e 'let t = ""; for (const l of require("fs").readFileSync(process.argv[1], "utf8").split("\n"))
  if (l.startsWith("data: {")) t += JSON.parse(l.slice(6)).choices[0].text;
  process.stdout.write(JSON.stringify(t))' "$TMP/stream.txt")
[ "$got" = "$golden" ] && tail -n 2 "$TMP/stream.txt" | grep -q '^data: \[DONE\]' ||
  fail "streamed with Connection: close: $got / $(tail -c 200 "$TMP/stream.txt")"

python3 - "$serve_port" "$body" "$golden" 2>"$TMP/pipe.err" <<'PY' || fail "32 pipelined requests: $(cat "$TMP/pipe.err")"
import json, socket, sys
port, body, golden = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
one = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
       % (len(body), body)).encode()
s = socket.create_connection(("127.0.0.1", port), timeout=30)
s.sendall(one * 32 + b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
data = b""
while chunk := s.recv(65536):
    data += chunk
texts, health, rest = [], 0, data
while rest:
    head, _, rest = rest.partition(b"\r\n\r\n")
    status = head.split(b"\r\n")[0]
    length = next(int(l.split(b":")[1]) for l in head.split(b"\r\n")[1:] if l.lower().startswith(b"content-length"))
    payload, rest = rest[:length], rest[length:]
    assert status == b"HTTP/1.1 200 OK", status
    if b"text_completion" in payload:
        texts.append(json.loads(payload)["choices"][0]["text"])
    else:
        health += 1
assert len(texts) == 32 and health == 1, (len(texts), health)
assert all(t == golden for t in texts), texts[:2]
PY
# vLLM's series names, labelled with the model, count what the requests above did (35 completions of 64 tokens).
curl -s "$BASE/metrics" >"$TMP/metrics.txt"
for series in vllm:num_requests_running vllm:num_requests_waiting vllm:kv_cache_usage_perc vllm:prefix_cache_queries_total \
  vllm:prefix_cache_hits_total vllm:time_to_first_token_seconds_count vllm:inter_token_latency_seconds_count \
  vllm:request_queue_time_seconds_count vllm:request_prefill_time_seconds_count vllm:request_decode_time_seconds_count \
  vllm:iteration_tokens_total_count vllm:e2e_request_latency_seconds_count; do
  grep -q "^$series{model_name=\"stories260K\"} " "$TMP/metrics.txt" || fail "/metrics has no $series"
done
node -e '
  const m = {};
  for (const l of require("fs").readFileSync(process.argv[1], "utf8").split("\n"))
    if (l && !l.startsWith("#")) m[l.slice(0, l.lastIndexOf(" "))] = Number(l.slice(l.lastIndexOf(" ") + 1));
  const M = (name, extra = "") => m[`${name}{model_name="stories260K"${extra}}`];
  const ok = M("vllm:request_success_total", ",finished_reason=\"length\"") >= 35 &&
    M("vllm:generation_tokens_total") >= 35 * 64 && M("vllm:prompt_tokens_total") >= 35 * 5 &&
    M("vllm:e2e_request_latency_seconds_count") >= 35 && M("vllm:num_requests_running") === 0;
  process.exit(ok ? 0 : 1);' "$TMP/metrics.txt" || fail "vLLM series: $(grep -E "^vllm:(request_success|generation_tokens)" "$TMP/metrics.txt")"

# CORS (--allowed-origins): an allowed origin is named on every response, a streamed one too, and its preflight answered;
# another origin gets no CORS header and its preflight 400.
header() { tr -d '\r' | grep -i "^$1:" | sed 's/^[^:]*: //'; }
got=$(curl -s -D - -o /dev/null -H 'Origin: https://app.example' "$BASE/v1/models" | header access-control-allow-origin)
[ "$got" = https://app.example ] || fail "CORS on /v1/models: '$got'"
got=$(curl -s -N -D - -o /dev/null -H 'Origin: https://app.example' -H 'Content-Type: application/json' -d "$stream" \
  "$BASE/v1/completions" | header access-control-allow-origin)
[ "$got" = https://app.example ] || fail "CORS on a stream: '$got'"
got=$(curl -s -D - -o /dev/null -H 'Origin: https://evil.example' "$BASE/v1/models" | header access-control-allow-origin)
[ -z "$got" ] || fail "CORS for another origin: '$got'"
curl -s -D "$TMP/preflight.txt" -o /dev/null -X OPTIONS -H 'Origin: https://app.example' \
  -H 'Access-Control-Request-Method: POST' -H 'Access-Control-Request-Headers: authorization, content-type' \
  "$BASE/v1/completions"
head -n 1 "$TMP/preflight.txt" | grep -q ' 200' && [ "$(header access-control-allow-methods <"$TMP/preflight.txt")" = "GET, POST, DELETE, OPTIONS" ] &&
  [ "$(header access-control-allow-headers <"$TMP/preflight.txt")" = "authorization, content-type" ] ||
  fail "preflight: $(cat "$TMP/preflight.txt")"
code=$(curl -s -o /dev/null -w '%{http_code}' -X OPTIONS -H 'Origin: https://evil.example' \
  -H 'Access-Control-Request-Method: POST' "$BASE/v1/completions")
[ "$code" = 400 ] || fail "preflight of another origin: $code"

# vLLM's small endpoints: /ping, /version, /tokenize and /detokenize round trip.
[ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/ping")" = 200 ] || fail "/ping"
curl -s "$BASE/version" | grep -qE '^\{"version":"[0-9]+\.[0-9]+\.[0-9]+"\}$' || fail "/version: $(curl -s "$BASE/version")"
ids=$(curl -s "$BASE/tokenize" -d '{"prompt": "Once upon a time"}' | node -e 'let d = "";
  process.stdin.on("data", (c) => d += c).on("end", () => process.stdout.write(JSON.stringify(JSON.parse(d).tokens)))')
text=$(curl -s "$BASE/detokenize" -d "{\"tokens\": $ids}")
[ "$text" = '{"prompt":"Once upon a time"}' ] || fail "/tokenize then /detokenize: $ids -> $text"

# The server's log: what it loaded and the KV cache as it started, a line per request as it starts and ends, and a
# stats line while it works.
sleep 1.5  # one more stats interval
for line in "paged: model stories260K \\(llama, .*computing in float32 on cpu, .* of weights, ready in" \
  "paged: KV cache: [0-9]+ blocks of 16 tokens in float32 \(.* MiB\), CPU swap pool" "paged: maximum concurrency at max_model_len 512: " \
  "paged: prompt [0-9.]+ tok/s, generation [0-9.]+ tok/s, running [0-9]+, waiting [0-9]+, swapped [0-9]+, KV cache"; do
  grep -qE "^$line" "$TMP/serve.out" || fail "the log has no line /$line/: $(head -c 600 "$TMP/serve.out")"
done
starts=$(grep -cE '^paged: request (cmpl|chatcmpl)-[0-9a-f]+: 1 prompt\(s\) of 5 tokens, max_tokens 64' "$TMP/serve.out")
ends=$(grep -cE '^paged: request cmpl-[0-9a-f]+ prompt 0: 5 prompt and 64 completion tokens, finished: length' "$TMP/serve.out")
[ "$starts" -ge 35 ] && [ "$ends" -ge 35 ] || fail "request log: $starts starts and $ends ends for 35 requests"

# A host name is resolved, and the API key comes from PAGED_API_KEY when --api-key is not given.
kill "$serve_pid"
wait "$serve_pid" 2>/dev/null
fresh_logs serve
PAGED_API_KEY=s3cret "$PAGED" serve "$MODEL" --host localhost --port 0 --served-model-name tiny \
  --served-model-name tiny-v2 >"$TMP/serve.out" 2>"$TMP/serve.err" &
serve_pid=$!
pids+=("$serve_pid")
await_port serve_port serve server_port_printed || finish
grep -q "http://localhost:$serve_port" "$TMP/serve.out" || fail "--host localhost: $(cat "$TMP/serve.out")"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://localhost:$serve_port/v1/models")
[ "$code" = 401 ] || fail "PAGED_API_KEY: /v1/models without the key answered $code"
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer s3cret' "http://localhost:$serve_port/v1/models")
[ "$code" = 200 ] || fail "PAGED_API_KEY: /v1/models with the key answered $code"
# Several served names (vLLM's): /v1/models lists each, a request may name any, the response names the first.
ids=$(curl -s -H 'Authorization: Bearer s3cret' "http://localhost:$serve_port/v1/models" |
  node -e 'process.stdout.write(JSON.parse(require("fs").readFileSync(0, "utf8")).data.map((m) => m.id).join(","))')
[ "$ids" = "tiny,tiny-v2" ] || fail "--served-model-name twice: /v1/models lists $ids"
answer=$(curl -s -H 'Authorization: Bearer s3cret' -H 'Content-Type: application/json' \
  -d '{"model": "tiny-v2", "prompt": "Once", "max_tokens": 2}' "http://localhost:$serve_port/v1/completions")
case "$answer" in *'"model":"tiny"'*) ;; *) fail "a request naming the second name: $answer" ;; esac
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer s3cret' -H 'Content-Type: application/json' \
  -d '{"model": "stories260K", "prompt": "Once", "max_tokens": 2}' "http://localhost:$serve_port/v1/completions")
[ "$code" = 404 ] || fail "a name not served answered $code"
finish
