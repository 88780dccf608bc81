#!/usr/bin/env bash
# Replicas across processes: a head over two TLS workers, failover of running streams, rejoin, 503 with none left
# (tests/http/check_replicas.mjs says what is checked). Usage: bash tests/integration/replicas.sh PATH/TO/paged
# (env PAGED_BINARY_DIR: the npm clients are installed into $PAGED_BINARY_DIR/http-node, as http_openai.sh does).
set -u

NAME=replicas
. "$(dirname "$0")/worker_common.bash" "$@"

install_node_clients
cd "$NODE_DIR" && timeout -s KILL 300 node check_replicas.mjs --paged "$(realpath "$PAGED")" --model "$MODEL" \
  --golden "$GOLDEN" --work "$TMP" || fail "check_replicas"
finish
