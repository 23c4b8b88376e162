"""Suite-wide collection order: the longest files first.

With `RLSTREAM_TEST_WORKERS=2` the test command runs the suite on two workers, a file at a
time each (`pytest -n 2 --dist loadfile --no-loadscope-reorder`, scripts/test.sh). Handing out
the longest files first (each takes a minute or more: a live run shared by its tests) lets the
short ones fill in behind them, so both workers finish together instead of one running a long
file alone at the end. Within a file the order is unchanged; files not named keep theirs,
after these.
"""

from __future__ import annotations

LONGEST_FIRST = (  # by the time each took in CI (`--durations`), longest first
    "tests/integration/test_chaos.py",
    "tests/integration/test_loop.py",
    "tests/integration/test_serve.py",
    "tests/trainers/test_learning.py",
    "tests/integration/test_ranks.py",
    "tests/integration/test_environments.py",
    "tests/integration/test_user_data.py",
    "tests/integration/test_autoscale.py",
    "tests/integration/test_mirror.py",
    "tests/integration/test_kafka.py",
    "tests/trainers/test_ranks.py",
    "tests/integration/test_remote_env_failures.py",
    "tests/integration/test_streams.py",
    "tests/integration/test_prometheus.py",
    "tests/integration/test_code.py",
    "tests/integration/test_openenv.py",
    "tests/trainers/test_checkpoint.py",
    "tests/selection/test_bench.py",
    "tests/integration/test_hf_run.py",
    "tests/trainers/test_deepspeed.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
