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
# promtool validates and unit-tests the alert rules (compose/prometheus); Debian's package has it
if ! command -v promtool >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  SUDO=$([ "$(id -u)" -eq 0 ] && echo "" || echo "sudo")
  $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 \
    || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } \
    || echo "could not install prometheus (promtool): the alert-rule tests will say so" >&2
fi
echo "rlstream installed in $(pwd)/.venv ($(rlstream --version 2>/dev/null || echo ok))"
