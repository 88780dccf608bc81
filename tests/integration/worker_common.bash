# Shared by the scripts that run `paged worker` processes (remote_worker.sh, tls_worker.sh); sourced, and not a test
# itself (ctest runs tests/integration/*.sh). The script sets NAME and sources it with its arguments:
#   NAME=tls_worker; . "$(dirname "$0")/worker_common.bash" "$@"
# It gives PAGED, MODEL, GOLDEN, a scratch folder $TMP removed at exit, the processes in $pids killed at exit, and
# fail, start_worker, start_server, start_long_generation, await_engine, await_exit, install_node_clients and finish.

PAGED=${1:?usage: $NAME.sh PATH/TO/paged}
SRC=${PAGED_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
MODEL=$SRC/models/stories260K
GOLDEN=$SRC/tests/golden/stories260K-greedy.json
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
# fresh_logs NAME: empties $TMP/NAME.out and .err before a process that writes them starts, so that waiting for a
# line there never reads what an earlier process of that name wrote (a child truncates its files only once it runs).
fresh_logs() { : >"$TMP/$1.out"; : >"$TMP/$1.err"; }

start_worker() {
  fresh_logs worker
  "$PAGED" worker --model "$MODEL" --device cpu --port 0 "$@" >"$TMP/worker.out" 2>"$TMP/worker.err" &
  worker_pid=$!
  pids+=("$worker_pid")
  await_port worker_port worker worker_port_printed
}
worker_port_printed() { sed -n 's/^paged worker: listening on 127.0.0.1:\([0-9]*\) .*/\1/p' "$TMP/worker.out"; }

# await_port VAR NAME PRINTED: waits up to 10 s for the function PRINTED to print the port that process NAME (its
# output in $TMP/NAME.out and .err) listens on, and sets VAR to it.
await_port() {
  local port=""
  for _ in $(seq 1 100); do
    port=$("$3")
    if [ -n "$port" ]; then
      printf -v "$1" '%s' "$port"
      return 0
    fi
    sleep 0.1
  done
  fail "the $2 did not report its port: $(cat "$TMP/$2.out" "$TMP/$2.err")"
  return 1
}

# start_server: `paged serve` of the model on a free port, its executor the worker on $worker_port; sets $serve_pid
# and $serve_port, and leaves its output in $TMP/serve.out and .err.
start_server() {
  fresh_logs serve
  "$PAGED" serve --model "$MODEL" --workers "127.0.0.1:$worker_port" --port 0 >"$TMP/serve.out" \
    2>"$TMP/serve.err" &
  serve_pid=$!
  pids+=("$serve_pid")
  await_port serve_port serve server_port_printed
}
server_port_printed() {
  grep -ho 'http://[a-z0-9.]*:[0-9]*' "$TMP/serve.out" "$TMP/serve.err" 2>/dev/null | head -n 1 | sed 's/.*://'
}

# start_long_generation ERRFILE: `paged generate` of 48 long sampled completions through the worker, in the
# background (it runs for many seconds); sets $client and leaves its stderr in ERRFILE.
start_long_generation() {
  for _ in $(seq 1 48); do echo '{"prompt": "Once upon a time there was"}'; done >"$TMP/many.jsonl"
  "$PAGED" generate --model "$MODEL" --workers "127.0.0.1:$worker_port" --prompts-file "$TMP/many.jsonl" \
    --max-tokens 400 --ignore-eos --temperature 0.7 --seed 1 >/dev/null 2>"$1" &
  client=$!
  pids+=("$client")
}

# await_engine PORT SECONDS: waits until a TCP connection to the worker on PORT is established (an engine has
# joined it; /proc/net/tcp), then half a second for its first steps; returns 1 if none came within SECONDS. A fixed
# sleep was not enough on a loaded machine: the worker was killed before the engine had joined it.
await_engine() {
  local hex
  hex=$(printf '%04X' "$1")
  for _ in $(seq 1 $(($2 * 10))); do
    if grep -Eq "^ *[0-9]+: [0-9A-F]{8}:$hex [0-9A-F]{8}:[0-9A-F]{4} 01 " /proc/net/tcp; then
      sleep 0.5
      return 0
    fi
    sleep 0.1
  done
  return 1
}

# await_exit PID SECONDS: waits for the process to end; sets $rc to its status, or to "hung".
await_exit() {
  for _ in $(seq 1 $(($2 * 10))); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$1" 2>/dev/null; then rc=hung; else wait "$1"; rc=$?; fi
}

# install_node_clients: the npm packages of tests/http (the openai client, ws) and its scripts, in
# $PAGED_BINARY_DIR/http-node (shared with http_openai.sh); sets NODE_DIR.
install_node_clients() {
  NODE_DIR="${PAGED_BINARY_DIR:?run through ctest, or set PAGED_BINARY_DIR}/http-node"
  mkdir -p "$NODE_DIR"
  cp "$SRC/tests/http/package.json" "$SRC"/tests/http/*.mjs "$NODE_DIR/"
  (cd "$NODE_DIR" && npm install --no-audit --no-fund --loglevel=error) || { echo "$NAME: npm install failed" >&2; exit 1; }
}

# finish: the script's verdict and exit status.
finish() {
  if [ "$failures" -gt 0 ]; then
    # What the processes printed last, for the CI log: a crash or a refusal shows there.
    for log in "$TMP"/*.err; do
      [ -s "$log" ] && { echo "--- last lines of $(basename "$log"):" >&2; tail -n 15 "$log" >&2; }
    done
    echo "$NAME: $failures failure(s)" >&2
    exit 1
  fi
  echo "$NAME: all checks passed"
}
