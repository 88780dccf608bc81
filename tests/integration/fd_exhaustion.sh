#!/usr/bin/env bash
# Out of file descriptors, `paged serve` backs off instead of spinning, and serves again once descriptors are free:
#   bash tests/integration/fd_exhaustion.sh PATH/TO/paged
# The server's limit is lowered to 64 descriptors (prlimit) and 200 connections are opened and held: over 2 s its CPU
# stays under a quarter of a core and it writes a handful of log lines, not one per failed accept; once they are
# closed a completion answers 200.
set -u

NAME=fd_exhaustion
. "$(dirname "$0")/worker_common.bash" "$@"
command -v python3 >/dev/null && command -v prlimit >/dev/null ||
  { echo "$NAME: python3 and prlimit are required" >&2; exit 1; }

"$PAGED" serve "$MODEL" --port 0 >"$TMP/serve.out" 2>"$TMP/serve.err" &
serve_pid=$!
pids+=("$serve_pid")
await_port serve_port serve server_port_printed || finish
prlimit --pid "$serve_pid" --nofile=64:64 || fail "prlimit"

python3 - "$serve_port" "$serve_pid" "$TMP/serve.err" <<'PY' || fail "$(cat "$TMP/fd.err" 2>/dev/null)"
import os, socket, sys, time
port, pid, log = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
ticks = os.sysconf("SC_CLK_TCK")
def cpu():
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / ticks
held = []
for _ in range(200):
    try:
        held.append(socket.create_connection(("127.0.0.1", port), timeout=2))
    except OSError:
        break
time.sleep(0.5)  # the server has hit its limit by now
lines_before, start = sum(1 for _ in open(log)), cpu()
time.sleep(2)
used, lines = cpu() - start, sum(1 for _ in open(log)) - lines_before
assert used < 0.5, f"{used:.2f} s of CPU in 2 s while out of descriptors"
assert lines < 20, f"{lines} log lines in 2 s while out of descriptors"
for s in held:
    s.close()
print(f"out of descriptors: {used:.2f} s of CPU and {lines} log lines in 2 s", file=sys.stderr)
PY
# Served again: a completion answers 200 (the backoff is at most a second).
code=000
for _ in $(seq 1 30); do
  code=$(curl -s -o /dev/null -w '%{http_code}' -m 5 -H 'Content-Type: application/json' \
    -d '{"prompt": "Once upon a time", "max_tokens": 4}' "http://127.0.0.1:$serve_port/v1/completions")
  [ "$code" = 200 ] && break
  sleep 0.2
done
[ "$code" = 200 ] || fail "after the connections closed the server answered $code"
grep -q "retrying with backoff" "$TMP/serve.err" || fail "no backoff was logged: $(tail -3 "$TMP/serve.err")"
finish
