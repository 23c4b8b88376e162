"""The streaming trainer's de-duplication is bounded: ids are kept by policy version only while
a row of that version could still be trained, and a copy redelivered after its version left the
window is dropped as stale, never trained. No servers: rows are handed to `take`/`update`."""

from __future__ import annotations

from dataclasses import replace

from rlstream.config import load_config
from rlstream.connectors.endpoints import Endpoints
from rlstream.streams.experience_checks import VersionWindow, due
from rlstream.streams.trainer import StreamTrainer

G, P, LAG = 2, 1, 2


def group(request: str, version: int, rewards=(1.0, 0.0)) -> list[dict]:
    return [
        {"event_id": f"{request}-{i}", "request_id": request, "prompt_id": request,
         "sample_idx": i, "task": "add", "reward": r, "correct": r > 0, "policy_version": version,
         "prompt_tokens": [5, 6, 7], "completion_tokens": [8, 1], "logprobs": [-0.5, -0.7]}
        for i, r in enumerate(rewards)
    ]  # fmt: skip


def trainer() -> StreamTrainer:
    sets = [f"rl.group_size={G}", f"rl.prompts_per_step={P}", f"rl.max_policy_lag={LAG}"]
    cfg = load_config(None, [*sets, "model.n_layer=1", "model.n_embd=32"])
    t = StreamTrainer(cfg, Endpoints())
    t.state.start_rl()
    return t


def test_the_window_forgets_versions_below_its_floor_and_round_trips():
    w = VersionWindow()
    for v in range(6):
        for row in group(f"r{v}", v):
            w.add(row)
    assert len(w) == 12 and group("r3", 3)[0] in w and group("r3", 4)[0] not in w
    w.forget_before(4)
    assert len(w) == 4 and group("r3", 3)[0] not in w and group("r5", 5)[1] in w
    restored = VersionWindow()
    restored.load_state_dict(w.state_dict(), version=9)
    assert restored.state_dict() == w.state_dict()
    legacy = VersionWindow()  # a checkpoint from before the window: a flat list of ids
    legacy.load_state_dict(["r1-0"], version=7)
    assert {"event_id": "r1-0", "policy_version": 7} in legacy


def test_redelivered_rows_are_skipped_in_the_window_and_stale_after_it():
    t = trainer()
    steps = 8
    for step in range(steps):
        rows = group(f"r{step}", t.state.version)
        t.take(rows)
        t.take(rows)  # an at-least-once copy while its version is trainable: skipped
        t.update(t.ready)
        t.ready = []
    c = t.counters
    assert c["duplicates_skipped"] == steps * G and c["experience_trained"] == steps * G
    assert len(t.seen) <= (LAG + 1) * G  # bounded: only the trainable versions' ids
    old = group("r0", 0)  # redelivered long after its version left the window
    assert old[0] not in t.seen
    t.take(old)
    m = t.update(t.ready)
    assert m["dropped_groups"] == 1 and c["experience_trained"] == steps * G  # never trained
    assert c["duplicates_trained"] == 0
    state = t.state_dict()["stream"]
    assert sum(len(ids) for ids in state["seen"].values()) == len(t.seen)


def test_the_ledger_records_each_consumed_group_once_with_its_outcome():
    t = trainer()
    t.take(group("a", t.state.version))
    t.update(t.ready)
    t.ready = []
    t.take(group("flat", t.state.version, rewards=(1.0, 1.0)))  # zero variance: trained too
    t.take(group("old", t.state.version - LAG - 1))  # beyond the lag bound: stale
    t.update(t.ready)
    t.ready = []
    t.take(group("late", t.state.version)[:1])  # half a group when the run ends
    t.cfg = replace(t.cfg, rl=replace(t.cfg.rl, filter_zero_variance=True))
    t.take(group("filtered", t.state.version, rewards=(0.0, 0.0)))
    outcomes = {e["request_id"]: (e["outcome"], e["rl_step"]) for e in t.ledger}
    assert outcomes == {
        "a": ("trained", 1), "flat": ("trained", 2), "old": ("stale", 2),
        "filtered": ("filtered", 2),
    }  # fmt: skip
    assert [e["event_ids"] for e in t.ledger if e["request_id"] == "a"] == [["a-0", "a-1"]]
    t.record_untrained()
    assert t.ledger[-1]["request_id"] == "late" and t.ledger[-1]["outcome"] == "untrained_at_end"


def test_a_batch_that_trained_nothing_is_not_checkpointed_or_evaluated_again():
    """Every group stale: the RL step stays, and a checkpoint at it again rewrote its ledger
    part with only the stale groups (a chaos run reported 23 trained groups lost)."""
    assert due(4, 3, every=2, last=10) and due(10, 9, every=4, last=10)
    assert not due(4, 4, every=2, last=10)  # no step trained: nothing is due again
    assert not due(10, 10, every=4, last=10) and not due(5, 4, every=2, last=10)
