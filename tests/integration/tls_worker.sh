#!/usr/bin/env bash
# Mutual TLS between an engine and its worker, in real processes on loopback:
#   bash tests/integration/tls_worker.sh PATH/TO/paged
# `paged gen-certs` makes two deployments, A and B. A worker with A's files serves an engine with A's files (the
# golden stories260K greedy outputs); an engine with B's files, and one without TLS, are refused naming TLS while the
# worker stays up; raw bytes sent to the TLS port (random, a bare BASP header, one claiming a 3 GiB payload) leave it
# alive with its memory flat; it still serves A's engine afterwards. A worker off loopback without TLS does not start.
set -u

NAME=tls_worker
. "$(dirname "$0")/worker_common.bash" "$@"

# gen-certs: two deployments; an existing one is kept unless --force (exit 1), a missing folder is a usage error.
"$PAGED" gen-certs "$TMP/A" >"$TMP/gen.out" 2>&1 || fail "gen-certs A: $(cat "$TMP/gen.out")"
"$PAGED" gen-certs "$TMP/B" --host worker-1.example --host 10.0.0.5 >"$TMP/gen.out" 2>&1 ||
  fail "gen-certs B: $(cat "$TMP/gen.out")"
for f in ca.pem node.pem node-key.pem; do [ -s "$TMP/A/$f" ] || fail "gen-certs wrote no $f"; done
mode=$(stat -c %a "$TMP/A/node-key.pem")
[ "$mode" = 600 ] || fail "node-key.pem is not private: mode $mode"
before=$(cat "$TMP/A/ca.pem")
"$PAGED" gen-certs "$TMP/A" >/dev/null 2>"$TMP/err"
rc=$?
[ "$rc" = 1 ] && grep -q -- '--force' "$TMP/err" && [ "$(cat "$TMP/A/ca.pem")" = "$before" ] ||
  fail "gen-certs over an existing deployment: rc $rc, $(cat "$TMP/err")"
"$PAGED" gen-certs >/dev/null 2>"$TMP/err"
rc=$?
[ "$rc" = 2 ] || fail "gen-certs without a folder: rc $rc, $(head -1 "$TMP/err")"

# (e) No TLS off loopback: the worker refuses to start (usage error) before it loads anything.
timeout -s KILL 20 "$PAGED" worker --model "$MODEL" --device cpu --host 0.0.0.0 --port 0 >/dev/null 2>"$TMP/err"
rc=$?
[ "$rc" = 2 ] && grep -q 'mutual TLS' "$TMP/err" || fail "plain worker on 0.0.0.0: rc $rc, $(head -1 "$TMP/err")"
# A deployment folder that lacks a file is refused naming the file.
mkdir "$TMP/partial"
cp "$TMP/A/ca.pem" "$TMP/A/node.pem" "$TMP/partial/"
timeout -s KILL 20 "$PAGED" worker --model "$MODEL" --device cpu --port 0 --tls-dir "$TMP/partial" >/dev/null \
  2>"$TMP/err"
rc=$?
[ "$rc" = 1 ] && grep -q 'node-key.pem' "$TMP/err" || fail "--tls-dir without its key: rc $rc, $(cat "$TMP/err")"

start_worker --tls-dir "$TMP/A" || exit 1
grep -q ' with mutual TLS ' "$TMP/worker.out" || fail "TLS worker banner: $(cat "$TMP/worker.out")"

node -e 'const g = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  for (const c of g.cases) console.log(JSON.stringify({prompt: c.prompt}));' "$GOLDEN" >"$TMP/prompts.jsonl"
# golden_generate TLS_DIR: the golden prompts through the worker; fails the test unless every greedy output is
# Hugging Face's.
golden_generate() {
  timeout -s KILL 60 "$PAGED" generate --model "$MODEL" --workers "127.0.0.1:$worker_port" --tls-dir "$1" \
    --prompts-file "$TMP/prompts.jsonl" --max-tokens 64 --temperature 0 --json >"$TMP/out.jsonl" 2>"$TMP/gen.err" ||
    { fail "generate through TLS: $(cat "$TMP/gen.err")"; return; }
  node -e 'const fs = require("fs");
    const g = JSON.parse(fs.readFileSync(process.argv[1], "utf8")).cases;
    const got = fs.readFileSync(process.argv[2], "utf8").trim().split("\n").map((l) => JSON.parse(l));
    if (got.length !== g.length) throw new Error(got.length + " outputs for " + g.length + " prompts");
    got.forEach((r, i) => {
      const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
      if (!same(r.prompt_token_ids, g[i].prompt_ids) || !same(r.outputs[0].token_ids, g[i].greedy_ids))
        throw new Error("case " + i + ": " + JSON.stringify(r.outputs[0].token_ids));
    });' "$GOLDEN" "$TMP/out.jsonl" 2>"$TMP/cmp.err" ||
    fail "TLS outputs differ from the golden ones: $(cat "$TMP/cmp.err")"
}

# (a) The same deployment's engine: Hugging Face's greedy outputs.
golden_generate "$TMP/A"

# refused_head WHAT ARGS...: an engine that must not get through; it must fail naming TLS while the worker lives.
refused_head() {
  local what=$1
  shift
  timeout -s KILL 60 "$PAGED" generate --model "$MODEL" --workers "127.0.0.1:$worker_port" "$@" --prompt hi \
    >/dev/null 2>"$TMP/err"
  rc=$?
  [ "$rc" = 1 ] && grep -q 'TLS' "$TMP/err" || fail "$what: rc $rc, $(cat "$TMP/err")"
  kill -0 "$worker_pid" 2>/dev/null || fail "the worker died of $what"
}
# (b) another deployment's certificates; (c) no TLS at all.
refused_head "an engine of another deployment" --tls-dir "$TMP/B"
refused_head "an engine without TLS"

# (d) Raw bytes to the TLS port, none of which may reach CAF's BASP parser (a bare header crashes a plain worker).
rss() { sed -n 's/^VmRSS:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$worker_pid/status"; }
rss_before=$(rss)
node -e '
  const net = require("net"), crypto = require("crypto");
  const header = (op, len) => { const h = Buffer.alloc(32); h.writeUInt8(op, 0); h.writeUInt32BE(len, 4); return h; };
  const probes = [crypto.randomBytes(4096), header(1, 0), header(2, 3 * 2 ** 30)];
  let closed = 0;
  process.on("exit", () => {
    if (closed !== 10 * probes.length) (console.error("only " + closed + " probes ended"), process.exitCode = 1);
  });
  const send = (i, n) => {
    if (i === probes.length) return n > 1 ? send(0, n - 1) : undefined;
    const s = net.connect(+process.argv[1], "127.0.0.1", () => s.write(probes[i]));
    s.on("data", () => {});  // read what comes (nothing should), so that the socket keeps node running
    s.on("error", () => {});
    s.on("close", () => { closed += 1; send(i + 1, n); });
    s.setTimeout(2000, () => s.destroy());
  };
  send(0, 10);' "$worker_port" 2>"$TMP/probe.err" || fail "probes: $(cat "$TMP/probe.err")"
sleep 0.3
if kill -0 "$worker_pid" 2>/dev/null; then
  rss_after=$(rss)
  [ $((rss_after - rss_before)) -lt 8192 ] ||
    fail "worker RSS grew from ${rss_before} kB to ${rss_after} kB under probes"
  # ... and it still serves the right engine.
  golden_generate "$TMP/A"
else
  fail "the worker died of raw bytes on its TLS port: $(cat "$TMP/worker.err")"
fi

kill -TERM "$worker_pid"
await_exit "$worker_pid" 5
[ "$rc" = 0 ] || fail "TLS worker after SIGTERM: $rc"
finish
