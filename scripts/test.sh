#!/usr/bin/env bash
# The test suite on a fresh machine: install, lint, build the docs, then every test (unit,
# integration against the real Tansu broker and SeaweedFS started by the project's own code,
# learning tests), then the broker-sensitive integration tests again on Apache Kafka.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev
# the web view's test drives a real headless browser: Debian's chromium (playwright downloads none)
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  SUDO=$([ "$(id -u)" -eq 0 ] && echo "" || echo "sudo")
  $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 \
    || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null; } \
    || echo "could not install chromium: the web view test will say so" >&2
fi
. .venv/bin/activate
ruff check rlstream tests
ruff format --check rlstream tests
mkdocs build --strict --quiet --site-dir "$(mktemp -d)"  # broken links fail the build
python -m pytest "$@"
if [ $# -eq 0 ]; then
  # the broker-sensitive part again on Apache Kafka (three-node behaviour: test_kafka.py above)
  RLSTREAM_STACK_BROKER=kafka python -m pytest -q tests/integration/test_consumers.py \
    tests/integration/test_publish_tail_replay.py tests/integration/test_cli.py \
    tests/integration/test_user_data.py tests/integration/test_loop.py tests/integration/test_serve.py
  # the chaos short form on a three-node cluster, where it also kills a partition's leader
  RLSTREAM_STACK_BROKER=kafka RLSTREAM_STACK_NODES=3 python -m pytest -q \
    tests/integration/test_chaos.py
fi
