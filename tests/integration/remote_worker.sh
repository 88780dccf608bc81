#!/usr/bin/env bash
# An engine and its executor in two processes, over TCP on loopback through CAF's network layer:
#   bash tests/integration/remote_worker.sh PATH/TO/paged
# `paged worker` runs stories260K on the CPU; `paged generate --remote-executor` (the one-worker name of --workers) and `paged serve
# --workers` (queried with node's http client) must give what the in-process engine gives, greedy and seeded, with
# structured outputs too; a bad
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
  # Structured outputs through the worker (its masks made worker side) against an in-process server: the same
  # seeded answers, each valid (a regex, a JSON schema).
  "$PAGED" serve --model "$MODEL" --device cpu --port 0 >"$TMP/local_serve.out" 2>"$TMP/local_serve.err" &
  local_pid=$!
  pids+=("$local_pid")
  local_port_printed() {
    grep -ho 'http://[a-z0-9.]*:[0-9]*' "$TMP/local_serve.out" "$TMP/local_serve.err" 2>/dev/null | head -n 1 | sed 's/.*://'
  }
  if await_port local_port local_serve local_port_printed; then
    node --input-type=module -e '
      const [remote, local] = process.argv.slice(1);
      const post = async (port, path, body) => {
        for (let i = 0; i < 100; ++i) {
          const r = await fetch(`http://127.0.0.1:${port}${path}`, { method: "POST",
            headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
          if (r.status !== 503) return [r.status, await r.json()];
          await new Promise((ok) => setTimeout(ok, 100));
        }
        return [503, {}];
      };
      const pattern = "(Tom|Lily) (ran|saw) [a-z]{1,10}( [a-z]{1,10}){0,3}\\.";
      const schema = { type: "object", properties: { name: { type: "string", maxLength: 10 },
                       age: { type: "integer", minimum: 1, maximum: 9 } }, required: ["name", "age"] };
      let bad = 0;
      for (let seed = 0; seed < 4; ++seed) {
        const asks = [
          ["/v1/completions", { prompt: "Once upon a time", guided_regex: pattern }, (r) => r.choices[0].text,
           (t) => new RegExp(`^(?:${pattern})$`).test(t)],
          ["/v1/completions", { prompt: "Once upon a time", response_format: { type: "json_schema",
             json_schema: { name: "s", schema } } }, (r) => r.choices[0].text,
           (t) => { try { const v = JSON.parse(t); return typeof v.name === "string" && v.age >= 1 && v.age <= 9; }
                    catch { return false; } }],
        ];
        for (const [path, ask, textOf, valid] of asks) {
          const body = { model: "stories260K", max_tokens: 100, temperature: 1, seed, ...ask };
          const [rs, r] = await post(remote, path, body), [ls, l] = await post(local, path, body);
          const got = rs === 200 ? textOf(r) : JSON.stringify(r), want = ls === 200 ? textOf(l) : JSON.stringify(l);
          if (rs !== 200 || got !== want || !valid(got)) {
            console.error(`seed ${seed}: worker ${rs} ${JSON.stringify(got)}, in-process ${ls} ${JSON.stringify(want)}`);
            ++bad;
          }
        }
      }
      process.exit(bad ? 1 : 0);' "$serve_port" "$local_port" || fail "structured outputs through the worker"
  fi
  kill -TERM "$local_pid"
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
await_engine "$worker_port" 20 || fail "no engine joined the worker within 20 s"
kill -KILL "$worker_pid"
wait "$worker_pid" 2>/dev/null
await_exit "$client" 10
[ "$rc" = 1 ] && grep -q 'the engine stopped' "$TMP/lost.err" ||
  fail "lost worker: the engine ended with $rc, $(cat "$TMP/lost.err")"

finish
