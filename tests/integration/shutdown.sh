#!/usr/bin/env bash
# Graceful shutdown of `paged serve` on SIGTERM (tests/http/check_shutdown.mjs says what is checked):
#   bash tests/integration/shutdown.sh PATH/TO/paged
set -u

NAME=shutdown
. "$(dirname "$0")/worker_common.bash" "$@"

NODE_DIR="${PAGED_BINARY_DIR:?}/http-node"
mkdir -p "$NODE_DIR"
cp "$SRC/tests/http/package.json" "$SRC"/tests/http/*.mjs "$NODE_DIR/"
(cd "$NODE_DIR" && npm install --no-audit --no-fund --loglevel=error) || { echo "$NAME: npm install failed" >&2; exit 1; }
cd "$NODE_DIR" && timeout -s KILL 300 node check_shutdown.mjs --paged "$(realpath "$PAGED")" --model "$MODEL" ||
  fail "check_shutdown"
finish
