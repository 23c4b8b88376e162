#!/usr/bin/env bash
# The test suite on a fresh machine: install, lint, then every test (unit, integration against
# the real Tansu broker and SeaweedFS started by the project's own code, and learning tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
ruff check rlstream tests
ruff format --check rlstream tests
python -m pytest "$@"
