#!/usr/bin/env bash
# The test command: installs, builds, and runs every test that does not need a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh
ctest --test-dir build -LE gpu --output-on-failure "$@"
