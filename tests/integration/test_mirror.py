"""Traffic mirroring for evaluation (`rlstream mirror`): while a run trains, a candidate (its
own version 0, the pre-trained policy) is judged on a mirror of the run's live prompts by a
consumer group of its own, paired with the policy serving the run; its figures land on
rl.eval_results.v1 as task mirror:NAME, and the run's own accounting is untouched."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from rlstream.ops.launcher.childrun import Live
from tests.integration.conftest import RLSTREAM, cli
from tests.integration.test_loop import SMALL, _rows_of

pytestmark = pytest.mark.integration
RUN = "mirror-it"


@pytest.fixture(scope="module")
def mirrored(stack_home, tmp_path_factory):
    out = tmp_path_factory.mktemp("mirror")
    args = [*RLSTREAM, "run", "--rl-steps", "60", "--run-id", RUN, "--out", str(out),
            "--summary", str(out / "summary.json"), *SMALL]  # fmt: skip
    run = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        live, deadline = Live(out / RUN / "live.json"), time.monotonic() + 300
        while live.phase() != "rl" and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert live.phase() == "rl", run.stderr.read() if run.poll() is not None else "timeout"
        result = cli("mirror", RUN, "--candidate", "0", "--name", "base", "--prompts", "16",
                     "--runs", str(out), "--summary", str(out / "mirror.json"),
                     timeout=300)  # fmt: skip
        assert run.wait(timeout=600) == 0, run.stderr.read()
    finally:
        if run.poll() is None:
            run.kill()
    return json.loads((out / "mirror.json").read_text()), out, result


def test_a_candidate_is_judged_on_the_live_prompts_beside_the_serving_policy(mirrored):
    figures, _, result = mirrored
    assert figures["mirrored_prompts"] == 16 and figures["candidate_version"] == 0
    assert figures["serving_versions"] and min(figures["serving_versions"]) > 0  # RL versions
    gap = figures["candidate_greedy"] - figures["serving_greedy"]
    assert figures["candidate_minus_serving"] == pytest.approx(gap, abs=1e-3)
    assert "mirror base: " in result.stderr  # progress as it goes
    rows = [r for r in _rows_of(RUN, "eval_results") if r["task"] == "mirror:base"]
    last = {r["metric"]: r for r in rows if r["n"] == 16}
    assert last["candidate_greedy"]["value"] == figures["candidate_greedy"]
    assert last["serving_greedy"]["value"] == figures["serving_greedy"]


def test_the_mirror_left_the_training_loop_untouched(mirrored):
    """Its own consumer group: every request still went to the rollout workers once, nothing
    lost, nothing trained twice; and a candidate that does not exist is one line."""
    _, out, _ = mirrored
    cli("audit", RUN, "--out", str(out), "--summary", str(out / "audit.json"), timeout=400)
    audit = json.loads((out / "audit.json").read_text())
    assert audit["experience_lost"] == 0 and audit["trained_twice"] == 0
    assert audit["requests_reissued"] == 0 and audit["archive_matches_published"]
    refused = cli("mirror", RUN, "--candidate", "999", "--runs", str(out), check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "no stored policy version 999" in refused.stderr
