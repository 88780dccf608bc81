#!/usr/bin/env bash
# Graceful shutdown of `paged serve` on SIGTERM (tests/http/check_shutdown.mjs says what is checked):
#   bash tests/integration/shutdown.sh PATH/TO/paged
set -u

NAME=shutdown
. "$(dirname "$0")/worker_common.bash" "$@"

install_node_clients
cd "$NODE_DIR" && timeout -s KILL 300 node check_shutdown.mjs --paged "$(realpath "$PAGED")" --model "$MODEL" ||
  fail "check_shutdown"
finish
