#!/usr/bin/env bash
# Installs the dependencies (tools/setup.sh) and builds everything into build/ (CUDA kernels too where nvcc exists).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${PAGED_CMAKE_ARGS:-}
cmake --build build -j"${PAGED_JOBS:-2}"
