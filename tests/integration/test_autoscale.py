"""Rollout workers scaled on the request backlog through the live loop
(`loop.rollout_workers=auto:1-3`): the scheduler's first burst of requests (target_in_flight
at once) raises the workers to 3, each change a consumer-group rebalance; the audit then finds
nothing lost, issued twice or trained twice.
The same run syncs its weights through a shared directory (`loop.weight_sync=DIR`)."""

from __future__ import annotations

import json
import math

import pytest

from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.objectstore import ObjectStore, stored_versions
from tests.integration.conftest import cli
from tests.integration.test_loop import SMALL, _rows_of

pytestmark = pytest.mark.integration
RUN = "autoscale-it"


@pytest.fixture(scope="module")
def scaled_run(stack_home, tmp_path_factory):
    out = tmp_path_factory.mktemp("autoscale")
    result = cli(
        "run", "--rl-steps", "40", "--workers", "auto:1-3", "--run-id", RUN, "--out", str(out),
        "--summary", str(out / "summary.json"), *SMALL, "--set", "target_in_flight=96",
        "--set", "loop.autoscale_up_s=1", "--set", "loop.autoscale_down_s=4",
        "--set", "rl.max_new_tokens=4",  # rollouts that outpace the trainer: the backlog drains
        "--set", f"loop.weight_sync={out / 'weights'}", "--set", "checkpoint.keep_policies=2",
        timeout=900,
    )  # fmt: skip
    return json.loads((out / "summary.json").read_text()), out, result


def test_the_workers_follow_the_backlog_up_to_max_each_change_as_it_asked(scaled_run):
    """The scheduler's first burst (target_in_flight requests at once) adds a worker; the
    workers reach MAX while the backlog stays high, and every change, either way, went the way
    the backlog at that moment asked (a dip retires one: runs went 1 -> 2 -> 3, and 1 -> 2 -> 1
    -> 2 -> 3). On 2 cores the workers stay the bottleneck, so the backlog does not drain to
    MIN for good within the run."""
    figures, _, result = scaled_run
    assert figures["completed"]
    scale = figures["autoscale"]
    decisions = scale["decisions"]
    counts = [d["workers"] for d in decisions]
    assert scale["range"] == "1-3" and scale["workers_max"] == 3 and 3 in counts, scale
    assert counts[0] == 2 and decisions[0]["lag"] > scale["lag_per_worker"]  # the burst
    for d, before in zip(decisions, [1, *counts[:-1]], strict=True):
        assert abs(d["workers"] - before) == 1, counts  # one at a time
        wanted = min(3, max(1, math.ceil(d["lag"] / scale["lag_per_worker"])))
        assert (d["workers"] > before) == (wanted > before), (d, before)
    assert scale["backlog_max"] > 2 * scale["lag_per_worker"]  # what called for a third
    assert "rollout workers 1 -> 2" in result.stdout  # said on the terminal as it happened


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
