#!/usr/bin/env bash
# An engine and its executor in two processes, over TCP on loopback through CAF's network layer:
#   bash tests/integration/remote_worker.sh PATH/TO/paged
# `paged worker` runs stories260K on the CPU; `paged generate --remote-executor` (the one-worker name of --workers) and `paged serve
# --workers` (queried with node's http client) must give what the in-process engine gives, greedy and seeded; a bad
# address must fail with a clear message, and the worker must end cleanly on SIGTERM.
set -u

NAME=remote_worker
. "$(dirname "$0")/worker_common.bash" "$@"

start_worker || exit 1
grep -q '(cpu, [0-9]* KV blocks of 16 tokens)' "$TMP/worker.out" || fail "worker banner: $(cat "$TMP/worker.out")"

# generate: local and remote, greedy and seeded sampling with penalties, several prompts in one batch.
prompts="$TMP/prompts.jsonl"
printf '%s\n' '{"prompt": "Once upon a time"}' '{"prompt": "Lily and Ben"}' '{"prompt": "The sun was"}' \
  '{"prompt": "One day, a little"}' >"$prompts"
for sampling in "--temperature 0" "--temperature 0.8 --top-p 0.9 --seed 7 --repetition-penalty 1.2 --n 2"; do
  # shellcheck disable=SC2086
  timeout -s KILL 60 "$PAGED" generate --model "$MODEL" --device cpu --prompts-file "$prompts" --max-tokens 40 \
    $sampling --json >"$TMP/local.json" 2>"$TMP/local.err" || fail "local generate ($sampling): $(cat "$TMP/local.err")"
  # shellcheck disable=SC2086
  timeout -s KILL 60 "$PAGED" generate --model "$MODEL" --remote-executor "127.0.0.1:$worker_port" \
    --prompts-file "$prompts" --max-tokens 40 $sampling --json >"$TMP/remote.json" 2>"$TMP/remote.err" ||
    fail "remote generate ($sampling): $(cat "$TMP/remote.err")"
  [ -s "$TMP/local.json" ] || fail "no local output ($sampling)"
  cmp -s "$TMP/local.json" "$TMP/remote.json" ||
    fail "remote output differs ($sampling): $(diff "$TMP/local.json" "$TMP/remote.json" | head -5)"
done

# serve: an OpenAI completion through a server whose executor is the worker, against the local engine's text.
if start_server; then
  node -e '
    const body = JSON.stringify({model: "stories260K", prompt: "Once upon a time", max_tokens: 32, temperature: 0});
    const req = require("http").request({host: "127.0.0.1", port: +process.argv[1], path: "/v1/completions",
      method: "POST", headers: {"Content-Type": "application/json"}}, (res) => res.pipe(process.stdout));
    req.on("error", (e) => { console.error(e.message); process.exit(1); });
    req.end(body);' "$serve_port" >"$TMP/http.json"
  timeout -s KILL 60 "$PAGED" generate --model "$MODEL" --device cpu --prompt "Once upon a time" --max-tokens 32 \
    --temperature 0 --json >"$TMP/local.txt" 2>/dev/null
  want=$(node -e 'const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    process.stdout.write(JSON.stringify(r.outputs[0].text))' "$TMP/local.txt" 2>/dev/null || true)
  got=$(node -e 'const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    process.stdout.write(JSON.stringify(r.choices[0].text))' "$TMP/http.json" 2>/dev/null || true)
  [ -n "$got" ] && [ "$got" = "$want" ] || fail "served text $got, local $want ($(head -c 300 "$TMP/http.json"))"
fi

kill -TERM "$serve_pid"
wait "$serve_pid"
rc=$?
[ "$rc" = 0 ] || fail "server exit status $rc after SIGTERM"

# Bad addresses: exit 1 with a message naming the flag; nothing listens on a closed port.
timeout -s KILL 60 "$PAGED" generate --model "$MODEL" --workers "nowhere" --prompt hi >/dev/null \
  2>"$TMP/err"
rc=$?
[ "$rc" = 1 ] && grep -q -- '--workers' "$TMP/err" || fail "bad address: rc $rc, $(cat "$TMP/err")"

# The worker ends on SIGTERM with status 0; an engine pointed at it afterwards fails cleanly.
kill -TERM "$worker_pid"
await_exit "$worker_pid" 5
[ "$rc" = 0 ] || fail "worker after SIGTERM: $rc"
timeout -s KILL 60 "$PAGED" generate --model "$MODEL" --workers "127.0.0.1:$worker_port" --prompt hi \
  >/dev/null 2>"$TMP/err"
rc=$?
[ "$rc" = 1 ] && grep -q -- '--workers' "$TMP/err" || fail "closed port: rc $rc, $(cat "$TMP/err")"

# A worker lost mid-generation: the engine ends the running requests with the reason (exit 1), it does not hang.
start_worker || exit 1
start_long_generation "$TMP/lost.err"
sleep 0.5
kill -KILL "$worker_pid"
wait "$worker_pid" 2>/dev/null
await_exit "$client" 10
[ "$rc" = 1 ] && grep -q 'the engine stopped' "$TMP/lost.err" ||
  fail "lost worker: the engine ended with $rc, $(cat "$TMP/lost.err")"

finish
