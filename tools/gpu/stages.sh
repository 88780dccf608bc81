# Helpers shared by the GPU scripts (sourced): a table of results, stage selection, and a logged, time-limited run.
# Needs STAGES and LOG_DIR set by the caller.
rows=()
add_row() { rows+=("| $1 | $2 | $3 |"); }
wanted() { [[ " $STAGES " == *" $1 "* ]]; }
# run NAME SECONDS CMD...: runs with a time limit, keeps the log, returns the command's status.
run() {
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*"
  local start=$SECONDS
  timeout "$limit" "$@" >"$LOG_DIR/$name.log" 2>&1
  local status=$?
  echo "    status $status after $((SECONDS - start)) s (log: $LOG_DIR/$name.log)"
  tail -n 5 "$LOG_DIR/$name.log" | sed 's/^/    /'
  return $status
}
status_word() { case $1 in 0) echo PASS ;; 124) echo "TIMEOUT" ;; *) echo "FAIL ($1)" ;; esac; }
# The last JSON line a `paged bench` log holds, and its output tok/s (whole tokens).
bench_json() { grep '^{' "$LOG_DIR/$1.log" | tail -n 1; }
tok_per_s() { echo "$1" | grep -o '"output_tok_per_s":[0-9.Ee+-]*' | cut -d: -f2 | awk '{ printf "%.0f", $1 }'; }
# await_health PORT: waits (up to 2 minutes) until a server on PORT answers /health.
await_health() {
  python3 -c 'import sys, time, urllib.request
for _ in range(1200):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=1); break
    except Exception: time.sleep(0.1)' "$1"
}
