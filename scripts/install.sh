#!/usr/bin/env bash
# Install rlstream and everything it needs into ./.venv (idempotent; quick when already done).
# torch is pinned to the CPU build on this machine's disk: an unpinned torch pulls a
# multi-GB CUDA build (INFRA.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet -e ".[dev]"
echo "rlstream installed in $(pwd)/.venv ($(rlstream --version 2>/dev/null || echo ok))"
