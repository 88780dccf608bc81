#!/usr/bin/env bash
# A bare clone works: with the shared test data (../shared beside the checkout) out of sight, the core tests pass and
# the main job (tools/serve.sh) serves the default model. Run after tools/test.sh has built build/ (CI does).
# Where it may (root, util-linux), an empty tmpfs is mounted over ../shared in a private mount namespace, so nothing
# can read it; otherwise $PAGED_SHARED_DIR points at an empty folder.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$(pwd)
SHARED=$(realpath -m "$SRC/../shared")
if [ -z "${PAGED_BARE_INSIDE:-}" ] && [ -d "$SHARED" ] && unshare -m true 2>/dev/null; then
  exec env PAGED_BARE_INSIDE=1 unshare -m bash -c 'mount -t tmpfs bare "$1" && exec bash "$2"' _ "$SHARED" "$0"
fi
EMPTY=$(mktemp -d)
LOG=$(mktemp)
trap 'kill "${server:-}" 2>/dev/null || true; rm -rf "$EMPTY" "$LOG"' EXIT
export PAGED_SHARED_DIR=$EMPTY
[ -z "$(ls -A "$SHARED" 2>/dev/null)" ] && echo "check_bare: $SHARED is out of sight (empty)" \
  || echo "check_bare: PAGED_SHARED_DIR=$EMPTY (empty)"

ctest --test-dir build -LE gpu --output-on-failure

# The main job from this clone alone: build (a no-op after tools/test.sh), serve, answer a completion and a chat.
port=$((20000 + RANDOM % 20000))
bash tools/serve.sh --port "$port" >"$LOG" 2>&1 &
server=$!
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  kill -0 "$server" 2>/dev/null || { cat "$LOG"; echo "check_bare: the server exited" >&2; exit 1; }
  sleep 0.2
done
ask() {  # ask PATH BODY: prints the generated text, fails on anything but 200 with non-empty text
  curl -sf "http://127.0.0.1:$port$1" -H 'Content-Type: application/json' -d "$2" |
    node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{const c=JSON.parse(s).choices[0];
      const t=c.text??c.message.content; if(!t) process.exit(1); console.log(JSON.stringify(t));})'
}
echo "completion: $(ask /v1/completions '{"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}')"
echo "chat: $(ask /v1/chat/completions '{"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 16}')"
kill -TERM "$server"
wait "$server" && echo "check_bare: served from the bare clone, exit 0" || { cat "$LOG"; exit 1; }
