"""`rlstream bench envs`, short form: every arm runs and reports its figures (the full form is
the benchmark in docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_envs_reports_every_arm(tmp_path):
    summary = tmp_path / "envs.json"
    done = subprocess.run(
        [sys.executable, "-m", "rlstream.cli", "bench", "envs", "--latencies-ms", "0,20",
         "--concurrency", "1,4", "--episodes", "4", "--repeats", "1", "--turns", "2",
         "--summary", str(summary)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "waiting on the environment" in done.stdout
    arms = json.loads(summary.read_text())["arms"]
    assert [(a["latency_ms"], a["concurrent"]) for a in arms] == [(0, 1), (0, 4), (20, 1), (20, 4)]
    assert all(a["episodes_per_s"] > 0 and 0 <= a["wait_share"] <= 1 for a in arms)
    waits = {(a["latency_ms"], a["concurrent"]): a["wait_share"] for a in arms}
    assert waits[(20, 1)] > waits[(0, 1)]  # 20 ms a step is time spent waiting, not computing
