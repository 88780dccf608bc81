#!/usr/bin/env bash
# `paged serve` binds its port before it loads the model:
#   bash tests/integration/serve_startup.sh PATH/TO/paged
# A busy port fails at once with one line naming it (no Boost internals, nothing loaded: no "loading" line); while the
# engine is still coming up (here: its worker is stopped, so the hello waits) GET /health answers 503
# {"status":"loading"} and a completion 503 with code model_loading, and a connection taken then is never left
# hanging once the server proper has the port. A server killed by SIGSEGV prints the signal and
# its stack to stderr and dies of it.
set -u

NAME=serve_startup
. "$(dirname "$0")/worker_common.bash" "$@"

"$PAGED" serve "$MODEL" --port 0 >"$TMP/serve.out" 2>"$TMP/serve.err" &
serve_pid=$!
pids+=("$serve_pid")
await_port serve_port serve server_port_printed || finish
timeout -s KILL 20 "$PAGED" serve "$MODEL" --port "$serve_port" >"$TMP/busy.out" 2>"$TMP/busy.err"
rc=$?
[ "$rc" = 1 ] && [ "$(wc -l <"$TMP/busy.err")" = 1 ] &&
  grep -qx "paged: error: cannot listen on 127.0.0.1:$serve_port: Address already in use" "$TMP/busy.err" &&
  ! grep -q loading "$TMP/busy.out" || fail "a busy port: rc $rc, $(cat "$TMP/busy.out" "$TMP/busy.err")"

start_worker || finish
kill -STOP "$worker_pid"
"$PAGED" serve "$MODEL" --workers "127.0.0.1:$worker_port" --port 0 >"$TMP/head.out" 2>"$TMP/head.err" &
head_pid=$!
pids+=("$head_pid")
# The window lasts until the engine gives up on the stopped worker (about a second): watch for the port closely.
python3 - "$TMP/head.out" "$worker_pid" <<'PY' || fail "while loading: $(cat "$TMP/head.out" "$TMP/head.err")"
import json, os, re, signal, socket, sys, time, urllib.error, urllib.request
deadline, port = time.time() + 10, None
while port is None and time.time() < deadline:
    m = re.search(r"^paged: listening on 127\.0\.0\.1:(\d+), loading ", open(sys.argv[1]).read(), re.M)
    port = m and m.group(1)
    time.sleep(0.005)
def answer(path, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
health = answer("/health")
completion = answer("/v1/completions", b'{"prompt": "x"}')
assert health == (503, {"status": "loading"}), health
assert completion[0] == 503 and completion[1]["error"]["code"] == "model_loading", completion
# A connection the loading responder took but whose request comes after the server took the port over is answered
# or closed, never left waiting (it was, under the responder's stopped io_context).
early = socket.create_connection(("127.0.0.1", int(port)), timeout=5)
time.sleep(0.3)  # taken by the loading responder
os.kill(int(sys.argv[2]), signal.SIGCONT)
while "paged: serving" not in open(sys.argv[1]).read():
    assert time.time() < deadline + 20, "the head never served"
    time.sleep(0.05)
try:
    early.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    early.recv(1024)  # an answer, or b"" when closed
except (ConnectionResetError, BrokenPipeError):
    pass
except socket.timeout:
    raise AssertionError("a connection taken while loading was left without an answer")
PY
kill -CONT "$worker_pid"

# A fatal signal is reported before the process dies of it: one line naming it, then the stack's addresses.
kill -SEGV "$serve_pid"
{ wait "$serve_pid"; } 2>/dev/null  # not the shell's own "Segmentation fault" line
rc=$?
[ "$rc" = 139 ] && grep -q "^paged: fatal signal SEGV, stack:$" "$TMP/serve.err" &&
  [ "$(sed -n '/^paged: fatal signal/,$p' "$TMP/serve.err" | grep -c 'paged(')" -ge 1 ] ||
  fail "SIGSEGV: rc $rc, $(tail -n 5 "$TMP/serve.err")"
finish
