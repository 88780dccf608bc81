#!/usr/bin/env bash
# The main job: installs, builds, and serves the default model (stories260K) on http://127.0.0.1:8000.
# Extra arguments go to `paged serve` (e.g. --port 9000, --model DIR); PAGED_MODEL=DIR serves another model (with
# its own chat template).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh
if [ -n "${PAGED_MODEL:-}" ]; then
  exec build/paged serve "$PAGED_MODEL" "$@"
fi
exec build/paged serve models/stories260K --chat-template conf/chat_templates/llama2.jinja "$@"
