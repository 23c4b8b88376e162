"""Rollout workers scaled on the request backlog through the live loop
(`loop.rollout_workers=auto:1-3`). The burst: the scheduler's first target_in_flight requests,
more than one worker keeps up with, raise the workers to 3, one at a time. The drain: the
scheduler is then paused (SIGSTOP: the source of requests goes quiet), the workers eat the
backlog and retire one at a time back to 1; the scheduler is let go and the run finishes. Each
change is a consumer-group rebalance; the audit finds nothing lost, issued or trained twice.
The same run syncs its weights through a shared directory (`loop.weight_sync=DIR`)."""

from __future__ import annotations

import json
import math
import os
import queue
import signal
import subprocess
import threading
import time

import pytest

from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.objectstore import ObjectStore, stored_versions
from rlstream.ops.reliability.chaos_faults import pid_of
from tests.integration.conftest import RLSTREAM, cli
from tests.integration.test_loop import SMALL, _rows_of

pytestmark = pytest.mark.integration
RUN = "autoscale-it"


def _wait_for(lines: queue.Queue, text: str, timeout: float, seen: list[str]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        if line is None:
            break
        seen.append(line)
        if text in line:
            return
    raise AssertionError(f"no {text!r} within {timeout:.0f} s:\n" + "".join(seen[-40:]))


@pytest.fixture(scope="module")
def scaled_run(stack_home, tmp_path_factory):
    out = tmp_path_factory.mktemp("autoscale")
    args = [
        *RLSTREAM, "run", "--rl-steps", "40", "--workers", "auto:1-3", "--run-id", RUN,
        "--out", str(out), "--summary", str(out / "summary.json"), *SMALL,
        "--set", "target_in_flight=96", "--set", "loop.autoscale_up_s=0",
        "--set", "loop.autoscale_down_s=4",
        "--set", f"loop.weight_sync={out / 'weights'}", "--set", "checkpoint.keep_policies=2",
    ]  # fmt: skip
    run = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [*map(lines.put, run.stdout), lines.put(None)],
                     daemon=True).start()  # fmt: skip
    seen: list[str] = []
    try:
        _wait_for(lines, "rollout workers 2 -> 3", 420, seen)  # the burst
        scheduler = pid_of(run.pid, "scheduler")
        os.kill(scheduler, signal.SIGSTOP)
        try:
            _wait_for(lines, "rollout workers 2 -> 1", 180, seen)  # the drain
        finally:
            os.kill(scheduler, signal.SIGCONT)
        _wait_for(lines, "report:", 420, seen)
        assert run.wait(timeout=60) == 0, "".join(seen[-40:])
    finally:
        if run.poll() is None:
            run.kill()
    return json.loads((out / "summary.json").read_text()), out, "".join(seen)


def test_the_workers_rise_to_max_on_the_burst_and_drain_back_to_min(scaled_run):
    """Every change is one worker, and went the way the backlog at that moment asked."""
    figures, _, stdout = scaled_run
    assert figures["completed"]
    scale = figures["autoscale"]
    decisions = scale["decisions"]
    counts = [d["workers"] for d in decisions]
    assert scale["range"] == "1-3" and scale["workers_max"] == 3, scale
    assert counts[0] == 2 and decisions[0]["lag"] > scale["lag_per_worker"]  # the burst
    top = counts.index(3)
    assert 1 in counts[top:], counts  # the drain, back to MIN
    for d, before in zip(decisions, [1, *counts[:-1]], strict=True):
        assert abs(d["workers"] - before) == 1, counts  # one at a time
        wanted = min(3, max(1, math.ceil(d["lag"] / scale["lag_per_worker"])))
        assert (d["workers"] > before) == (wanted > before), (d, before)
    assert scale["backlog_max"] > 2 * scale["lag_per_worker"]  # what called for a third
    assert "rollout workers 1 -> 2" in stdout  # said on the terminal as it happened


def test_nothing_is_lost_issued_or_trained_twice_across_the_rebalances(scaled_run):
    _, out, _ = scaled_run
    audited = cli("audit", RUN, "--out", str(out), "--summary", str(out / "audit.json"),
                  timeout=400)  # fmt: skip
    figures = json.loads((out / "audit.json").read_text())
    assert figures["experience_lost"] == 0 and figures["trained_twice"] == 0, audited.stdout
    assert figures["requests_reissued"] == 0 and figures["archive_matches_published"]
    assert figures["incomplete_groups"] == 0


def test_policy_versions_reach_the_workers_through_the_shared_directory(scaled_run):
    _, out, _ = scaled_run
    versions = _rows_of(RUN, "policy_versions")
    announced = [r for r in versions if r["phase"] == "rl"]
    assert announced and all(r["checkpoint_uri"].startswith("file://") for r in announced)
    newest = max(r["version"] for r in announced)
    kept = sorted(p.name for p in (out / "weights" / RUN).iterdir())
    assert kept == [f"version={v:06d}" for v in sorted({0, newest - 1, newest})]  # pruned
    used = {r["policy_version"] for r in _rows_of(RUN, "rollouts")}
    assert max(used) >= newest - 4  # the workers kept loading new versions from it
    # the store keeps the record: version 0 and the last (rlstream export finds them)
    (done,) = [r["version"] for r in versions if r["phase"] == "done"]
    stored = stored_versions(ObjectStore(Endpoints.from_env()), RUN)
    assert {0, done} <= set(stored), stored


def test_a_prepared_run_has_its_config_and_data_and_no_process(stack_home, tmp_path):
    """`rlstream run --prepare-only`: what processes deployed elsewhere (deploy/kubernetes)
    start from: the run's config.json and its data on the stack; no process of the run."""
    from rlstream.config import Config

    summary = tmp_path / "prepared.json"
    cli("run", "--prepare-only", "--run-id", "prepared-it", "--out", str(tmp_path),
        "--workers", "auto:1-4", "--summary", str(summary), *SMALL)  # fmt: skip
    figures = json.loads(summary.read_text())
    cfg = Config.read(tmp_path / "prepared-it" / "config.json")
    assert figures["prepared"] and cfg.run_id == "prepared-it"
    assert cfg.loop.worker_range == (1, 4)
    assert figures["prompts_published"] > 0 and figures["corpus_published"] > 0
    assert not (tmp_path / "prepared-it" / "logs").exists()  # nothing was started
    # with no stack to outlive the command, it says so in one line
    refused = cli("run", "--prepare-only", "--out", str(tmp_path), *SMALL,
                  env={"RLSTREAM_HOME": str(tmp_path / "no-stack")}, check=False)  # fmt: skip
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "--prepare-only" in refused.stderr and "rlstream stack up" in refused.stderr
