#!/usr/bin/env bash
# The main job on a fresh machine: install, then `rlstream run` on the embedded default stack.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/rlstream run "$@"
