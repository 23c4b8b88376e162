"""Memory and checkpoint size over a run (pure): the figures a soak run is judged by."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from rlstream.ops.launcher.live import resource_figures, rss_mb, slope_per_1k


def test_the_slope_is_per_thousand_steps_and_needs_a_span():
    assert slope_per_1k([(0, 10.0), (500, 15.0), (1000, 20.0)]) == 10.0
    assert slope_per_1k([(100, 7.0), (600, 7.0), (2100, 7.0)]) == 0.0
    assert slope_per_1k([(1, 5.0), (2, 6.0)]) is None  # two points
    assert slope_per_1k([(1, 5.0), (3, 6.0), (5, 9.0)]) is None  # under 10 steps


def test_memory_is_traced_per_process_and_server_over_the_rl_phase():
    trace = [
        {"rl_step": 0, "processes": {"trainer": [90.0, 999.0]}},  # pre-training: left out
        *(
            {
                "rl_step": s,
                "processes": {"trainer": [50.0, 300.0 + s / 100], "scheduler": [5.0, None]},
                "servers": {"broker": 100.0 + s / 10},
            }  # fmt: skip
            for s in (10, 510, 1010)
        ),
    ]
    sizes = [[0, 50], [10, 1000], [510, 1000], [1010, 1000]]
    figures = resource_figures(trace, sizes)
    assert figures["rss_mb_end"] == {"broker": 201.0, "trainer": 310.1}
    assert figures["rss_mb_slope_per_1k_steps"] == {"broker": 100.0, "trainer": 10.0}
    assert figures["checkpoint_bytes_end"] == 1000
    assert figures["checkpoint_bytes_slope_per_1k_steps"] == 0.0


def test_a_server_that_exited_but_is_not_reaped_is_not_traced_at_zero():
    """A zombie reads 0 bytes resident: the run's last memory figure must not be that 0."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert rss_mb({"broker": child.pid}) == {}
        assert rss_mb({"me": psutil.Process().pid})["me"] > 10
    finally:
        child.wait()
