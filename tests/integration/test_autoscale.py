"""Rollout workers scaled on the request backlog through the live loop
(`loop.rollout_workers=auto:1-3`): the scheduler's first burst of requests (target_in_flight
at once) raises the workers to 3, the workers' catching up brings them back to 1, each change
a consumer-group rebalance; the audit then finds nothing lost, issued twice or trained twice.
The same run syncs its weights through a shared directory (`loop.weight_sync=DIR`)."""

from __future__ import annotations

import json

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
        "--summary", str(out / "summary.json"), *SMALL, "--set", "target_in_flight=64",
        "--set", "loop.autoscale_up_s=2", "--set", "loop.autoscale_down_s=5",
        "--set", f"loop.weight_sync={out / 'weights'}", "--set", "checkpoint.keep_policies=2",
        timeout=900,
    )  # fmt: skip
    return json.loads((out / "summary.json").read_text()), out, result


def test_the_workers_rise_to_max_on_the_burst_and_fall_back_to_min(scaled_run):
    figures, _, result = scaled_run
    assert figures["completed"]
    scale = figures["autoscale"]
    counts = [d["workers"] for d in scale["decisions"]]
    assert scale["range"] == "1-3" and scale["workers_max"] == 3, scale
    peak = counts.index(3)
    assert counts[:peak] == [2] and 1 in counts[peak:], counts  # one at a time, then down
    assert all(d["lag"] > 0 for d in scale["decisions"][: peak + 1])  # raised by a backlog
    assert "rollout workers 1 -> 2" in result.stdout  # said on the terminal as it happened
    assert scale["backlog_max"] > 2 * scale["lag_per_worker"]  # what called for a third


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
