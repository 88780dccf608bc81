#!/usr/bin/env bash
# A WebSocket client that never reads is closed once the server's outbox for it passes its bound, and the server's
# memory stays bounded (tests/http/check_ws_reader.mjs): bash tests/integration/ws_reader.sh PATH/TO/paged
set -u

NAME=ws_reader
. "$(dirname "$0")/worker_common.bash" "$@"

install_node_clients
# An outbox bound of 1 MiB (the default is 8): the client that does not read passes it in seconds even on a loaded
# machine, and the check that the server's memory stays bounded holds the same.
printf '{"server": {"ws_max_outbox_bytes": 1048576}}' >"$TMP/serve.json"
"$PAGED" serve "$MODEL" --config "$TMP/serve.json" --port 0 --num-kv-blocks 1024 >"$TMP/serve.out" 2>"$TMP/serve.err" &
serve_pid=$!
pids+=("$serve_pid")
await_port serve_port serve server_port_printed || finish
(cd "$NODE_DIR" && timeout -s KILL 120 node check_ws_reader.mjs --base "http://127.0.0.1:$serve_port" --pid "$serve_pid") ||
  fail "check_ws_reader"
finish
