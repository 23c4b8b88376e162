"""`rlstream bench sandbox`, short form: every arm verifies the fn family's correct solutions and
reports its figures (the full form is the benchmark in docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_sandbox_reports_every_arm(tmp_path):
    summary = tmp_path / "sandbox.json"
    done = subprocess.run(
        [sys.executable, "-m", "rlstream.cli", "bench", "sandbox", "--isolation",
         "in-process,rlimits", "--concurrency", "1,2", "--executions", "12", "--repeats", "1",
         "--summary", str(summary)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "verifications/s" in done.stdout and "p99 ms" in done.stdout
    arms = json.loads(summary.read_text())["arms"]
    assert [(a["isolation"], a["concurrent"]) for a in arms] == [
        ("in-process", 1), ("in-process", 2), ("rlimits", 1), ("rlimits", 2)
    ]  # fmt: skip
    assert all(a["per_s"] > 0 and 0 < a["p50_ms"] <= a["p99_ms"] for a in arms)


def test_bench_sandbox_names_a_bad_arm_in_one_line():
    argv = [sys.executable, "-m", "rlstream.cli", "bench", "sandbox", "--isolation", "docker"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "'docker': use in-process" in done.stderr
    assert "Traceback" not in done.stderr
