# Shared by the scripts that run `paged worker` processes (remote_worker.sh, tls_worker.sh); sourced, and not a test
# itself (ctest runs tests/integration/*.sh). The script sets NAME and sources it with its arguments:
#   NAME=tls_worker; . "$(dirname "$0")/worker_common.bash" "$@"
# It gives PAGED, MODEL, GOLDEN, a scratch folder $TMP removed at exit, the processes in $pids killed at exit, and
# fail, start_worker, await_exit and finish.

PAGED=${1:?usage: $NAME.sh PATH/TO/paged}
SRC=${PAGED_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
SHARED=${PAGED_SHARED_DIR:-$SRC/../shared}
MODEL=$SHARED/models/stories260K
GOLDEN=$SHARED/golden/stories260K-greedy.json
[ -x "$PAGED" ] || { echo "$NAME: $PAGED is not an executable" >&2; exit 1; }
command -v node >/dev/null || { echo "$NAME: node is required (tools/setup.sh installs it)" >&2; exit 1; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/paged_$NAME.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$TMP"
}
trap cleanup EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# start_worker [FLAGS...]: a CPU worker of stories260K on a free loopback port, with the extra flags; sets
# $worker_pid and $worker_port, and leaves its output in $TMP/worker.out and .err.
start_worker() {
  "$PAGED" worker --model "$MODEL" --device cpu --port 0 "$@" >"$TMP/worker.out" 2>"$TMP/worker.err" &
  worker_pid=$!
  pids+=("$worker_pid")
  worker_port=""
  for _ in $(seq 1 100); do
    worker_port=$(sed -n 's/^paged worker: listening on 127.0.0.1:\([0-9]*\) .*/\1/p' "$TMP/worker.out")
    [ -n "$worker_port" ] && return 0
    sleep 0.1
  done
  fail "the worker did not report its port: $(cat "$TMP/worker.out" "$TMP/worker.err")"
  return 1
}

# await_exit PID SECONDS: waits for the process to end; sets $rc to its status, or to "hung".
await_exit() {
  for _ in $(seq 1 $(($2 * 10))); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$1" 2>/dev/null; then rc=hung; else wait "$1"; rc=$?; fi
}

# finish: the script's verdict and exit status.
finish() {
  if [ "$failures" -gt 0 ]; then
    echo "$NAME: $failures failure(s)" >&2
    exit 1
  fi
  echo "$NAME: all checks passed"
}
