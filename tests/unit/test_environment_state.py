"""The scheduler's environment state in Qdrant (local mode under a temporary path): while the
vector store is unavailable statistics stay in memory, the flush is retried, nothing is lost
(the outage is the chaos suite's failpoint, $RLSTREAM_FAULTS_DIR/qdrant); the PPM's
neighbourhood reads back what it wrote; another run's collection carries over."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.faults import FAULTS_DIR, refused_calls
from rlstream.streams.environment_state import EnvironmentState
from rlstream.streams.selection_stats import Calibration, SelectionClock
from rlstream.trainers.envs import Prompt
from rlstream.trainers.selection.features import CachedFeaturizer, TextFeaturizer
from rlstream.trainers.selection.neighbours import QdrantNeighbourhood
from rlstream.trainers.selection.ppm import WarmStartError


def _state(tmp_path, run_id: str = "env-it", flush_every: int = 4) -> EnvironmentState:
    endpoints = Endpoints(qdrant_path=str(tmp_path / "qdrant"))
    return EnvironmentState(endpoints, run_id, CachedFeaturizer(TextFeaturizer()), flush_every)


def _prompts(n: int) -> list[Prompt]:
    return [Prompt(f"{i:016x}", f"{i}+1=", "add", 1, str(i + 1)) for i in range(n)]


def test_an_unavailable_store_keeps_the_statistics_until_it_is_back(tmp_path, monkeypatch):
    monkeypatch.setenv(FAULTS_DIR, str(tmp_path / "faults"))
    (tmp_path / "faults").mkdir()
    flag = tmp_path / "faults" / "qdrant"
    flag.touch()  # down from the start: not even the collection exists yet
    state = _state(tmp_path)
    state.RETRY_S = 0.0
    for p in _prompts(6):
        state.observe(p, [1.0, 0.0], policy_version=3)  # flushes are tried and fail
    assert len(state.dirty) == 6 and not state.ensured
    flag.unlink()
    state.observe(_prompts(7)[-1], [1.0, 1.0], policy_version=4)
    assert not state.dirty and state.store.count() == 7
    hit = state.store.search(state.featurize(_prompts(1)).tolist()[0], limit=1)[0]
    assert hit.payload["attempts"] == 2 and hit.payload["pass_rate"] == 0.5
    state.close()


def test_the_ppm_neighbourhood_reads_back_what_the_scheduler_upserted(tmp_path):
    """The live PPM's neighbourhood features come from the run's Qdrant collection: a query
    returns the upserted counts of the nearest prompts (not an in-memory copy)."""
    state = _state(tmp_path)
    prompts = _prompts(8)
    outcomes = {p.prompt_id: [1.0] * (i % 4) + [0.0] * (4 - i % 4) for i, p in enumerate(prompts)}
    for p in prompts:
        state.observe(p, outcomes[p.prompt_id], policy_version=1)
    assert state.flush() and state.store.count() == 8
    reader = QdrantNeighbourhood(state.featurize.dim, k=1, prior_strength=1e-9,
                                 store=state.store, writes=False)  # fmt: skip
    assert reader.mirror.row == {}  # it has seen nothing itself
    rate, weight = reader.query(state.featurize(prompts))  # each prompt's nearest: itself
    expected = [sum(outcomes[p.prompt_id]) / 4 for p in prompts]
    np.testing.assert_allclose(rate, expected, atol=1e-6)
    np.testing.assert_allclose(weight, 4.0, rtol=1e-4)  # cosine 1 x 4 attempts
    excluded, _ = reader.query(state.featurize(prompts[:1]), exclude=[prompts[0].prompt_id])
    nearest = state.store.search(state.featurize(prompts[:1]).tolist()[0], limit=2)[1]
    assert excluded[0] == pytest.approx(nearest.payload["pass_rate"], abs=1e-6)
    assert reader.fallbacks == 0
    state.close()


def test_the_neighbourhood_reads_its_mirror_while_the_store_is_down_and_says_so(
    tmp_path, monkeypatch, caplog
):
    """An outage of the vector store during PPM reads: the mirror answers, the log says when
    the store went and came back, and the failpoint counts the calls it refused (what
    `rlstream chaos` waits for before it lifts the outage)."""
    faults = tmp_path / "faults"
    faults.mkdir()
    monkeypatch.setenv(FAULTS_DIR, str(faults))
    state = _state(tmp_path)
    neighbourhood = QdrantNeighbourhood(state.featurize.dim, k=2, store=state.store)
    prompts = _prompts(4)
    neighbourhood.add([p.prompt_id for p in prompts], state.featurize(prompts), [1, 0, 1, 0],
                      [2, 2, 2, 2])  # fmt: skip
    up, _ = neighbourhood.query(state.featurize(prompts))
    (faults / "qdrant").touch()
    with caplog.at_level("INFO"):
        down, _ = neighbourhood.query(state.featurize(prompts))
        neighbourhood.query(state.featurize(prompts))
        (faults / "qdrant").unlink()
        neighbourhood.query(state.featurize(prompts))
    assert neighbourhood.fallbacks == 2 and refused_calls(faults, "qdrant") == 2
    np.testing.assert_allclose(down, up, atol=1e-5)  # the mirror holds what was added
    lines = [r.getMessage() for r in caplog.records]
    assert sum("vector store unavailable" in m for m in lines) == 1  # once per outage
    assert sum("vector store available again" in m for m in lines) == 1
    state.close()


def test_another_runs_collection_carries_over_and_a_wrong_space_is_refused(tmp_path):
    old = _state(tmp_path / "old", "old-run")
    for p in _prompts(5):
        old.observe(p, [1.0, 0.0, 0.0, 0.0], policy_version=7)
    assert old.flush()
    points = [{"id": p.id, "vector": p.vector, "payload": json.dumps(p.payload)}
              for p in old.store.scroll_all()]  # fmt: skip
    old.close()
    new = _state(tmp_path / "new", "new-run")
    new.carry_over(points)
    assert not new.carried and new.store.count() == 5  # written at once
    hit = new.store.search(new.featurize(_prompts(1)).tolist()[0], limit=1)[0]
    assert hit.payload["attempts"] == 4 and hit.payload["last_policy_version"] == 7
    with pytest.raises(WarmStartError, match="dimensions"):
        new.carry_over([{"id": 1, "vector": [0.0] * 3, "payload": "{}"}])
    new.close()


def test_live_calibration_scores_first_picks_and_keeps_the_uniform_share_apart():
    from rlstream.trainers.selection.records import ScoreRecord

    def record(pid, pred, reason="informative", selected=True):
        return ScoreRecord(pid, pred, 0.1, 1, "ppm", selected, reason)

    cal = Calibration(least=2)
    cal.predicted(
        [
            record("a", 0.9),
            record("b", 0.2, "uniform_share"),
            record("c", 0.5),
            record("d", 0.5, "not_picked", selected=False),
        ],
        counts={"c": [4, 8, 0]},
    )
    assert set(cal.pending) == {"a", "b"}  # c was rolled out before, d not picked
    cal.observed("a", [1.0, 1.0, 1.0, 0.0])
    assert cal.figures() == {}  # fewer than `least` groups
    cal.observed("b", [0.0, 0.0, 0.0, 1.0])
    cal.observed("d", [1.0] * 4)  # never predicted: ignored
    figures = cal.figures()
    assert set(figures) == {"unseen"} and figures["unseen"]["n_prompts"] == 2
    # Brier over the 8 outcomes: a (0.9 vs 1,1,1,0) and b (0.2 vs 0,0,0,1)
    expected = (3 * 0.1**2 + 0.9**2 + 3 * 0.2**2 + 0.8**2) / 8
    assert figures["unseen"]["brier"] == pytest.approx(expected)
    assert figures["unseen"]["pearson_r"] == pytest.approx(1.0)
    assert len(cal.scored["uniform"]) == 1 and not cal.pending


def test_the_selection_clock_adds_up_its_parts_per_round():
    from rlstream import metrics

    def counted(part: str) -> float:
        return (
            metrics.REGISTRY.get_sample_value(
                "rlstream_scheduler_select_seconds_total", {"part": part}
            )
            or 0.0
        )

    clock = SelectionClock()
    assert clock.figures() == {}  # no round yet
    before = counted("fit")
    for _ in range(2):
        with clock.part("fit"):
            time.sleep(0.02)
        with clock.part("pick"):
            pass
        clock.rounds += 1
        clock.screened(128 if clock.rounds == 1 else 640)  # screened more the second time
    figures = clock.figures()
    assert figures["candidates_per_round"] == 384.0
    assert figures["fit_ms_per_round"] >= 20.0
    assert figures["select_ms_per_round"] == pytest.approx(
        figures["fit_ms_per_round"] + figures["pick_ms_per_round"], abs=0.02
    )
    assert figures["select_s"] == pytest.approx(2 * figures["select_ms_per_round"] / 1000, abs=1e-3)
    assert counted("fit") - before == pytest.approx(clock.seconds["fit"])  # the metrics page
    restarted = SelectionClock()  # a restarted scheduler counts on from its snapshot
    restarted.load_state_dict(clock.state_dict())
    assert restarted.figures() == figures
