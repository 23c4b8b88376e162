#!/usr/bin/env bash
# Install rlstream into ./.venv (idempotent; quick when already done).
#   bash scripts/install.sh        what the main job needs (scripts/run.sh)
#   bash scripts/install.sh dev    and what the tests need: pytest, ruff, MLflow, playwright,
#                                  DeepSpeed, MkDocs, promtool (scripts/test.sh)
# torch is pinned (2.13.0): PyPI's build, CUDA libraries included, runs on the CPU (INFRA.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
EXTRAS=${1:-}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet "torch==2.13.0"
# PYTHONWARNINGS: setuptools' generic notice on every editable install ("folders named like
# the package may take precedence") is not about this project; errors still print
PYTHONWARNINGS=ignore python -m pip install --quiet -e ".${EXTRAS:+[$EXTRAS]}"
if [ "$EXTRAS" = dev ] && ! command -v promtool >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  # promtool validates and unit-tests the alert rules (compose/prometheus); Debian's package has it
  SUDO=$([ "$(id -u)" -eq 0 ] && echo "" || echo "sudo")
  $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 \
    || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } \
    || echo "could not install prometheus (promtool): the alert-rule tests will say so" >&2
fi
echo "rlstream installed in $(pwd)/.venv ($(rlstream --version 2>/dev/null || echo ok))"
