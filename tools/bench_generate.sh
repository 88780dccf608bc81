#!/usr/bin/env bash
# Generation throughput of `paged generate` on a model (default: stories260K), for one sequence and for a batch.
#   tools/bench_generate.sh [PAGED_BINARY] [MODEL_DIR] [-- extra paged flags, e.g. --device cpu]
# Environment: NEW_TOKENS (256), BATCH (32), REPEATS (5: the best run of each is kept).
# Greedy, --ignore-eos, so every sequence generates exactly NEW_TOKENS tokens. Model load, process start and the
# prefill are measured by the same command with --max-tokens 1 and subtracted, which leaves the decode rate;
# the end-to-end rate (everything included) is printed too.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
PAGED=${1:-$here/build/paged}
MODEL=${2:-$here/models/stories260K}
shift $(($# < 2 ? $# : 2))
[ "${1:-}" = "--" ] && shift
EXTRA=("$@")
NEW_TOKENS=${NEW_TOKENS:-256}
BATCH=${BATCH:-32}
REPEATS=${REPEATS:-5}
[ -x "$PAGED" ] || { echo "bench_generate: no paged binary at $PAGED (build first, or pass its path)" >&2; exit 2; }
[ -d "$MODEL" ] || { echo "bench_generate: no model at $MODEL" >&2; exit 2; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/paged_bench.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# Distinct prompts (no shared prefix beyond BOS), a few words each.
subjects=(girl boy dog cat bird fish frog bear lion mouse duck horse king queen tree ball)
places=("in the park" "by the sea" "in a big house" "at school" "in the woods" "on a hill")
for ((i = 0; i < BATCH; i++)); do
  printf '{"prompt": "Once upon a time, a little %s lived %s. One day"}\n' \
    "${subjects[i % ${#subjects[@]}]}" "${places[i % ${#places[@]}]}"
done >"$TMP/batch.jsonl"
head -n 1 "$TMP/batch.jsonl" >"$TMP/one.jsonl"

now_ns() { date +%s%N; }

# best_seconds FILE MAX_TOKENS: the fastest of REPEATS runs, in seconds; checks every sequence ran to MAX_TOKENS.
best_seconds() {
  local file=$1 max=$2 best="" t0 t1 s
  for ((r = 0; r < REPEATS; r++)); do
    t0=$(now_ns)
    "$PAGED" generate --model "$MODEL" --prompts-file "$file" --max-tokens "$max" --temperature 0 --ignore-eos \
      --json "${EXTRA[@]}" >"$TMP/out" 2>"$TMP/err" || { echo "bench_generate: paged failed:" >&2; cat "$TMP/err" >&2; exit 1; }
    t1=$(now_ns)
    local want=$(($(wc -l <"$file") * max))
    local got
    got=$(grep -o '"token_ids":\[[^]]*\]' "$TMP/out" | sed 's/.*\[//; s/\]//' | tr ',' '\n' | grep -c . || true)
    [ "$got" = "$want" ] || { echo "bench_generate: expected $want generated tokens, got $got" >&2; exit 1; }
    s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.4f", (b - a) / 1e9 }')
    if [ -z "$best" ] || awk -v x="$s" -v y="$best" 'BEGIN { exit !(x < y) }'; then best=$s; fi
  done
  echo "$best"
}

cpu=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//' || true)
echo "paged generate throughput: $(basename "$MODEL"), greedy, $NEW_TOKENS new tokens per sequence (--ignore-eos),"
echo "best of $REPEATS runs; ${cpu:-unknown CPU}, $(nproc) cores visible; extra flags: ${EXTRA[*]:-none}"
echo
printf '%-6s %-12s %-10s %-16s %-14s %-16s\n' batch "new tokens" "wall (s)" "load+prefill (s)" "decode tok/s" "end-to-end tok/s"
for n in 1 "$BATCH"; do
  file=$TMP/one.jsonl
  [ "$n" = 1 ] || file=$TMP/batch.jsonl
  base=$(best_seconds "$file" 1)         # process start, model load, prefill, one token, shutdown
  full=$(best_seconds "$file" "$NEW_TOKENS")
  awk -v n="$n" -v k="$NEW_TOKENS" -v base="$base" -v full="$full" 'BEGIN {
    decode = full - base
    rate = (decode > 0) ? sprintf("%.0f", n * (k - 1) / decode) : "n/a"
    printf "%-6d %-12d %-10.3f %-16.3f %-14s %-16.0f\n", n, n * k, full, base, rate, n * k / full
  }'
done
