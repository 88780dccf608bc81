#!/usr/bin/env bash
# HTTPS for `paged serve` (vLLM's --ssl-certfile, --ssl-keyfile, --ssl-ca-certs, --ssl-cert-reqs):
#   bash tests/integration/http_tls.sh PATH/TO/paged
# Certificates from `paged gen-certs`; curl and the Node clients of tests/http/check_tls.mjs trust its CA. One server
# with a certificate (the openai client, wss://, the dashboard; plain HTTP gets nothing), one that also asks clients
# for certificates of the CA (--ssl-cert-reqs 2); `paged bench serve` against the first. Options that do not go together, or files that are not there, are a
# usage error (exit 2) before the model loads.
set -u

NAME=http_tls
. "$(dirname "$0")/worker_common.bash" "$@"
command -v curl >/dev/null || { echo "$NAME: curl is required (tools/setup.sh installs it)" >&2; exit 1; }
install_node_clients

"$PAGED" gen-certs "$TMP/certs" >/dev/null || fail "gen-certs"
CERTS=$TMP/certs
https_port_printed() {
  grep -ho 'https://[a-z0-9.]*:[0-9]*' "$TMP/serve.out" "$TMP/serve.err" 2>/dev/null | head -n 1 | sed 's/.*://'
}
start_https() {  # start_https [FLAGS...]: sets $serve_port
  fresh_logs serve
  "$PAGED" serve --model "$MODEL" --port 0 --chat-template "$SRC/conf/chat_templates/llama2.jinja" \
    --ssl-certfile "$CERTS/node.pem" --ssl-keyfile "$CERTS/node-key.pem" "$@" \
    >"$TMP/serve.out" 2>"$TMP/serve.err" &
  pids+=("$!")
  await_port serve_port serve https_port_printed
}

start_https || finish
BASE="https://127.0.0.1:$serve_port"
code=$(curl -s -o /dev/null -w '%{http_code}' --cacert "$CERTS/ca.pem" "$BASE/health")
[ "$code" = 200 ] || fail "curl over HTTPS: /health $code"
curl -s -o /dev/null "$BASE/health" && fail "curl without the CA trusted the server's certificate"
first=$BASE

start_https --ssl-ca-certs "$CERTS/ca.pem" --ssl-cert-reqs 2 || finish
MTLS="https://127.0.0.1:$serve_port"
code=$(curl -s -o /dev/null -w '%{http_code}' --cacert "$CERTS/ca.pem" --cert "$CERTS/node.pem" \
  --key "$CERTS/node-key.pem" "$MTLS/health")
[ "$code" = 200 ] || fail "curl with a client certificate: /health $code"
curl -s -o /dev/null --cacert "$CERTS/ca.pem" "$MTLS/health" && fail "mutual TLS served a client without a certificate"

(cd "$NODE_DIR" && NODE_EXTRA_CA_CERTS="$CERTS/ca.pem" node check_tls.mjs --base "$first" --golden "$GOLDEN" \
  --model "$MODEL" --mtls "$MTLS" --cert "$CERTS/node.pem" --key "$CERTS/node-key.pem") || fail check_tls

# paged bench serve over HTTPS: the server's certificate checked against --ssl-ca-certs, for the host named (localhost
# and 127.0.0.1 are on it), every request answered; without that CA the handshake is refused, each request fails.
bench_tls() {  # bench_tls NAME URL [FLAGS...]: runs 8 requests; the table goes to $TMP/NAME.out
  local name=$1 url=$2
  shift 2
  "$PAGED" bench serve --base-url "$url" --num-prompts 8 --random-input-len 16 --random-output-len 8 --ignore-eos \
    --disable-tqdm "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
}
bench_tls bench "https://localhost:${first##*:}" --ssl-ca-certs "$CERTS/ca.pem" ||
  fail "bench serve over HTTPS: exit $?, $(cat "$TMP/bench.err")"
grep -qE '^Successful requests: +8 *$' "$TMP/bench.out" || fail "bench serve over HTTPS: $(cat "$TMP/bench.out")"
bench_tls bench_untrusted "$first" && fail "bench serve trusted a certificate of no CA it knows"
grep -q "certificate verify failed" "$TMP/bench_untrusted.err" "$TMP/bench_untrusted.out" ||
  fail "bench serve without the CA: $(cat "$TMP/bench_untrusted.err")"
bench_tls bench_plain "http://127.0.0.1:${first##*:}" --ssl-ca-certs "$CERTS/ca.pem" && fail "--ssl-ca-certs with http://"
grep -q "https://" "$TMP/bench_plain.err" || fail "--ssl-ca-certs with http://: $(cat "$TMP/bench_plain.err")"

# Usage errors, before anything loads.
expect_usage() {  # expect_usage WHAT PATTERN FLAGS...
  local what=$1 pattern=$2
  shift 2
  "$PAGED" serve --model "$MODEL" --port 0 "$@" >"$TMP/usage.out" 2>"$TMP/usage.err"
  local rc=$?
  [ "$rc" = 2 ] && grep -q -- "$pattern" "$TMP/usage.err" || fail "$what: exit $rc, $(cat "$TMP/usage.err")"
}
expect_usage "a key without a certificate" "go together" --ssl-keyfile "$CERTS/node-key.pem"
expect_usage "a missing certificate file" "cannot read" --ssl-certfile "$TMP/none.pem" --ssl-keyfile "$CERTS/node-key.pem"
expect_usage "a key that is not a key" "ssl-keyfile" --ssl-certfile "$CERTS/node.pem" --ssl-keyfile "$CERTS/ca.pem"
expect_usage "client certificates without TLS" "need --ssl-certfile" --ssl-ca-certs "$CERTS/ca.pem"
expect_usage "cert_reqs without CA certificates" "needs --ssl-ca-certs" --ssl-certfile "$CERTS/node.pem" \
  --ssl-keyfile "$CERTS/node-key.pem" --ssl-cert-reqs 2
finish
