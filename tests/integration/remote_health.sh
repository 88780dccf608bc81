#!/usr/bin/env bash
# /health of a server whose executor is a `paged worker`, before and after the worker is lost:
#   bash tests/integration/remote_health.sh PATH/TO/paged
# Before: 200 with {"status":"ok","replicas":[{"kind":"remote","address":...,"state":"ready"}]} and
# paged_engine_ready 1. After a SIGKILL of the idle worker: 503 with status "unavailable", a reason and the executor
# "lost", paged_engine_ready 0, and a new completion answers 503 at once (not 500, not a hang).
set -u

NAME=remote_health
. "$(dirname "$0")/worker_common.bash" "$@"

start_worker || exit 1
start_server || finish

# probe PATH [BODY]: "STATUS CONTENT-TYPE BODY" of a GET (or, with a body, a POST of JSON), within 10 s.
probe() {
  timeout -s KILL 15 node -e '
    const [port, path, body] = process.argv.slice(1);
    const req = require("http").request({host: "127.0.0.1", port: +port, path, method: body ? "POST" : "GET",
      headers: {"Content-Type": "application/json"}, timeout: 10000}, (res) => {
      let text = "";
      res.on("data", (c) => text += c);
      res.on("end", () => process.stdout.write(res.statusCode + " " + res.headers["content-type"] + " " + text));
    });
    req.on("timeout", () => { console.log("hung"); process.exit(1); });
    req.on("error", (e) => { console.log(e.message); process.exit(1); });
    req.end(body || "");' "$serve_port" "$@"
}
completion='{"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 8}'

want="200 application/json {\"status\":\"ok\",\"replicas\":[{\"kind\":\"remote\",\"address\":\"127.0.0.1:$worker_port\",\"state\":\"ready\"}]}"
got=$(probe /health)
[ "$got" = "$want" ] || fail "health while ready: $got"
probe /metrics | grep -q '^paged_engine_ready 1$' || fail "paged_engine_ready while ready: not 1"
got=$(probe /v1/completions "$completion")
[ "${got%% *}" = 200 ] || fail "completion while ready: $got"

kill -KILL "$worker_pid"
wait "$worker_pid" 2>/dev/null
got=""
for _ in $(seq 1 50); do  # the connection's loss reaches the engine within moments
  got=$(probe /health)
  [ "${got%% *}" = 503 ] && break
  sleep 0.1
done
node -e '
  const [status, type, ...rest] = process.argv[1].split(" ");
  const h = JSON.parse(rest.join(" "));
  const ok = status === "503" && type === "application/json" && h.status === "unavailable" &&
    /executor is gone/.test(h.reason) && h.replicas.length === 1 && h.replicas[0].kind === "remote" &&
    h.replicas[0].address === "127.0.0.1:" + process.argv[2] && h.replicas[0].state === "lost";
  process.exit(ok ? 0 : 1);' "$got" "$worker_port" || fail "health after the worker is lost: $got"
probe /metrics | grep -q '^paged_engine_ready 0$' || fail "paged_engine_ready after the worker is lost: not 0"
got=$(probe /v1/completions "$completion")
[ "${got%% *}" = 503 ] && grep -q "executor is gone" <<<"$got" || fail "completion after the worker is lost: $got"

kill -TERM "$serve_pid"
await_exit "$serve_pid" 10
[ "$rc" = 0 ] || fail "server exit status $rc after SIGTERM"
finish
