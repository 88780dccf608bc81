#!/usr/bin/env bash
# The live dashboard in a real browser: headless Chromium loads /dashboard from `paged serve` (with an API key) under
# a few streaming requests, a screenshot is kept in the build folder, and the figures the page shows agree with
# /metrics (tests/http/check_dashboard.mjs). Requests without the key are refused.
#   bash tests/integration/dashboard.sh PATH/TO/paged
# Chromium (Debian's `chromium`, tools/setup.sh installs it) missing: a warning and a skip, except in CI (CI set).
set -u

NAME=dashboard
. "$(dirname "$0")/worker_common.bash" "$@"

CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROMIUM" ]; then
  if [ -n "${CI:-}" ]; then
    echo "$NAME: chromium is required in CI (tools/setup.sh installs it)" >&2
    exit 1
  fi
  echo "WARN: $NAME: chromium not found (tools/setup.sh installs it): skipped" >&2
  exit 0
fi

install_node_clients
KEY=dash-k3y
"$PAGED" serve "$MODEL" --port 0 --api-key "$KEY" --num-kv-blocks 256 >"$TMP/serve.out" 2>"$TMP/serve.err" &
serve_pid=$!
pids+=("$serve_pid")
await_port serve_port serve server_port_printed || finish

# Its own profile folder; as root Chromium needs --no-sandbox. The DevTools port is chosen by Chromium and written
# to the profile's DevToolsActivePort.
"$CHROMIUM" --headless=new --no-sandbox --disable-gpu --no-first-run --no-default-browser-check \
  --disable-dev-shm-usage --user-data-dir="$TMP/chromium" --remote-debugging-port=0 --window-size=1280,900 \
  about:blank >"$TMP/chromium.out" 2>"$TMP/chromium.err" &
chromium_pid=$!
pids+=("$chromium_pid")
devtools_port=""
for _ in $(seq 1 150); do
  devtools_port=$(head -n 1 "$TMP/chromium/DevToolsActivePort" 2>/dev/null)
  [ -n "$devtools_port" ] && break
  sleep 0.1
done
[ -n "$devtools_port" ] || { fail "chromium did not open its DevTools port: $(tail -n 5 "$TMP/chromium.err")"; finish; }

ARTEFACTS="$PAGED_BINARY_DIR/dashboard"
mkdir -p "$ARTEFACTS"
(cd "$NODE_DIR" && timeout -s KILL 120 node check_dashboard.mjs --base "http://127.0.0.1:$serve_port" --key "$KEY" \
  --devtools "http://127.0.0.1:$devtools_port" --screenshot "$ARTEFACTS/dashboard.png") || fail "check_dashboard"
kill "$chromium_pid" 2>/dev/null
wait "$chromium_pid" 2>/dev/null  # its profile folder is complete before the cleanup removes it
finish
