#!/usr/bin/env bash
# Builds each candidate of tools/gpu/candidates (a patch on the current tree: a kernel or benchmark change waiting
# for its measurement on the H200) beside the current build, so that one device call measures every candidate
# against the tree it applies to (run_gpu_checks.sh's `candidates` stage). Each patch is applied, the GPU binaries
# are built and copied to BUILD/ship/candidates/NAME, and the patch is taken back out; the tree is left as it was.
# Run tools/gpu/ship.sh first (it makes BUILD/ship); then tar BUILD/ship as usual.
# usage: tools/gpu/candidates.sh [BUILD_DIR] [NAME...]   (default: build, every patch)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
shift || true
DIR=tools/gpu/candidates
[ -d "$BUILD/ship" ] || { echo "candidates: $BUILD/ship missing (run tools/gpu/ship.sh $BUILD first)" >&2; exit 1; }
names=("$@")
[ ${#names[@]} -gt 0 ] || for p in "$DIR"/*.patch; do names+=("$(basename "$p" .patch)"); done
for name in "${names[@]}"; do
  patch="$DIR/$name.patch"
  [ -f "$patch" ] || { echo "candidates: no $patch" >&2; exit 1; }
  if ! git apply --check "$patch" 2>/dev/null; then
    echo "candidates: $name no longer applies to this tree (skipped; refresh or delete it)" >&2
    continue
  fi
  git apply "$patch"
  trap 'git apply -R "$patch"' EXIT
  cmake --build "$BUILD" -j"${PAGED_JOBS:-2}" --target paged paged_gpu_tests bench_cuda_attention bench_cuda_runner \
    >"$BUILD/candidate_$name.log" 2>&1 ||
    { echo "candidates: $name failed to build (see $BUILD/candidate_$name.log)" >&2; exit 1; }
  git apply -R "$patch"
  trap - EXIT
  mkdir -p "$BUILD/ship/candidates/$name"
  for b in paged paged_gpu_tests bench_cuda_attention bench_cuda_runner; do
    cp "$BUILD/$b" "$BUILD/ship/candidates/$name/"
  done
  echo "candidates: $name built"
done
# The tree is back as it was: rebuild so that BUILD's own binaries are the tree's again.
cmake --build "$BUILD" -j"${PAGED_JOBS:-2}" --target paged paged_gpu_tests bench_cuda_attention bench_cuda_runner \
  >"$BUILD/candidate_restore.log" 2>&1
