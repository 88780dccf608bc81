#!/usr/bin/env bash
# The main job: installs, builds, and serves the default model (stories260K) on http://127.0.0.1:8000.
# Extra arguments go to `paged serve` (e.g. --port 9000, --model DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh
shared=${PAGED_SHARED_DIR:-../shared}
[ -d "$shared/models" ] || shared=/work/shared
exec build/paged serve --model "${PAGED_MODEL:-$shared/models/stories260K}" "$@"
