#!/usr/bin/env bash
# A head and two workers on three hosts of their own: network namespaces joined by veth pairs, each with its own
# address (10.77.1.1 <-> 10.77.1.2, 10.77.2.1 <-> 10.77.2.2), so that nothing travels over loopback:
#   bash tests/integration/netns_workers.sh PATH/TO/paged
# The workers listen on their namespace's address with mutual TLS (a plain one there refuses to start); `paged
# generate --workers` in the head's namespace gives the golden greedy continuations and what the in-process engine
# gives for seeded sampling. Skipped (exit 0, with a message) where namespaces cannot be made (not root, no `ip`).
set -u

NAME=netns_workers
. "$(dirname "$0")/worker_common.bash" "$@"

ns="paged$$"
if ! command -v ip >/dev/null || ! ip netns add "${ns}h" 2>/dev/null; then
  echo "$NAME: SKIPPED: cannot create network namespaces here (needs root and iproute2)"
  exit 0
fi
ip netns add "${ns}a" && ip netns add "${ns}b" || { fail "ip netns add"; finish; }
del_namespaces() {
  for n in h a b; do ip netns pids "${ns}$n" 2>/dev/null | xargs -r kill -KILL; ip netns del "${ns}$n" 2>/dev/null; done
}
trap 'del_namespaces; cleanup' EXIT
for i in 1 2; do
  peer=$([ $i = 1 ] && echo a || echo b)
  ip link add "${ns}h$i" type veth peer name "${ns}w$i" &&
    ip link set "${ns}h$i" netns "${ns}h" && ip link set "${ns}w$i" netns "${ns}$peer" &&
    ip -n "${ns}h" addr add "10.77.$i.1/24" dev "${ns}h$i" && ip -n "${ns}h" link set "${ns}h$i" up &&
    ip -n "${ns}$peer" addr add "10.77.$i.2/24" dev "${ns}w$i" && ip -n "${ns}$peer" link set "${ns}w$i" up ||
    { fail "veth pair $i"; finish; }
done
for n in h a b; do ip -n "${ns}$n" link set lo up; done

"$PAGED" gen-certs "$TMP/certs" --host 10.77.1.2 --host 10.77.2.2 >/dev/null 2>"$TMP/err" || fail "gen-certs: $(cat "$TMP/err")"

# A plain worker on a namespace's own address does not start.
timeout -s KILL 20 ip netns exec "${ns}a" "$PAGED" worker --model "$MODEL" --device cpu --host 10.77.1.2 --port 7000 \
  >/dev/null 2>"$TMP/err"
rc=$?
[ "$rc" = 2 ] && grep -q 'mutual TLS' "$TMP/err" || fail "plain worker on 10.77.1.2: rc $rc, $(head -1 "$TMP/err")"

for i in 1 2; do
  peer=$([ $i = 1 ] && echo a || echo b)
  ip netns exec "${ns}$peer" "$PAGED" worker --model "$MODEL" --device cpu --host "10.77.$i.2" --port 7000 \
    --tls-dir "$TMP/certs" >"$TMP/worker$i.out" 2>"$TMP/worker$i.err" &
  pids+=($!)
done
for i in 1 2; do
  for _ in $(seq 1 100); do grep -q 'listening on' "$TMP/worker$i.out" && break; sleep 0.1; done
  grep -q "listening on 10.77.$i.2:7000 " "$TMP/worker$i.out" || fail "worker $i: $(cat "$TMP/worker$i.out" "$TMP/worker$i.err")"
done

node -e 'const g = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  for (const c of g.cases) console.log(JSON.stringify({prompt: c.prompt}));' "$GOLDEN" >"$TMP/prompts.jsonl"
timeout -s KILL 60 ip netns exec "${ns}h" "$PAGED" generate --model "$MODEL" --workers 10.77.1.2:7000,10.77.2.2:7000 \
  --tls-dir "$TMP/certs" --prompts-file "$TMP/prompts.jsonl" --max-tokens 64 --temperature 0 --json \
  >"$TMP/greedy.json" 2>"$TMP/err" || fail "greedy through the namespaces: $(cat "$TMP/err")"
node "$SRC/tests/http/golden_text.mjs" "$GOLDEN" "$MODEL" >"$TMP/continuations.jsonl"
node -e '
  const lines = (f) => require("fs").readFileSync(f, "utf8").trim().split("\n").map((l) => JSON.parse(l));
  const want = lines(process.argv[1]), got = lines(process.argv[2]);
  let bad = 0;
  want.forEach((c, i) => { if (got[i]?.outputs[0].text !== c.text) { bad++; console.error("mismatch:", c.prompt); } });
  process.exit(bad || got.length !== want.length ? 1 : 0);' "$TMP/continuations.jsonl" "$TMP/greedy.json" ||
  fail "greedy outputs through two workers in other namespaces differ from the golden ones"

for _ in $(seq 1 8); do cat "$TMP/prompts.jsonl"; done >"$TMP/many.jsonl"
sampling="--max-tokens 48 --temperature 0.8 --seed 7 --json"
# shellcheck disable=SC2086
timeout -s KILL 60 "$PAGED" generate --model "$MODEL" --device cpu --prompts-file "$TMP/many.jsonl" $sampling \
  >"$TMP/local.json" 2>"$TMP/err" || fail "local generate: $(cat "$TMP/err")"
# shellcheck disable=SC2086
timeout -s KILL 60 ip netns exec "${ns}h" "$PAGED" generate --model "$MODEL" --workers 10.77.1.2:7000,10.77.2.2:7000 \
  --tls-dir "$TMP/certs" --prompts-file "$TMP/many.jsonl" $sampling >"$TMP/remote.json" 2>"$TMP/err" ||
  fail "seeded generate through the namespaces: $(cat "$TMP/err")"
cmp -s "$TMP/local.json" "$TMP/remote.json" ||
  fail "seeded outputs differ: $(diff "$TMP/local.json" "$TMP/remote.json" | head -4)"
finish
