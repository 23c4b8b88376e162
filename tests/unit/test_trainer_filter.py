"""The streaming trainer's zero-variance filter (DAPO's dynamic sampling, streamed): which groups
reach the batch, how dropped ones are accounted, and the per-batch cap. No servers: the trainer
is built but never started, and rows are handed to `take` directly."""

from __future__ import annotations

from rlstream.config import load_config
from rlstream.connectors.endpoints import Endpoints
from rlstream.streams.trainer import StreamTrainer

G, P = 2, 2


def group(request: str, rewards: list[float]) -> list[dict]:
    return [
        {
            "event_id": f"{request}-{i}",
            "request_id": request,
            "sample_idx": i,
            "reward": r,
            "policy_version": 0,
        }
        for i, r in enumerate(rewards)
    ]


def trainer(*overrides: str) -> StreamTrainer:
    cfg = load_config(None, [f"rl.group_size={G}", f"rl.prompts_per_step={P}", *overrides])
    return StreamTrainer(cfg, Endpoints())


def test_zero_variance_groups_are_dropped_counted_and_consumed():
    t = trainer("rl.filter_zero_variance=true")
    for i, rewards in enumerate([[1, 1], [0, 1], [0, 0], [1, 0]]):
        t.take(group(f"r{i}", rewards))
    assert [g[0]["request_id"] for g in t.ready] == ["r1", "r3"]  # only informative groups
    c = t.counters
    assert c["filtered_groups"] == 2 and c["zero_variance_groups"] == 2
    assert c["groups_consumed"] == 2  # the scheduler sees them consumed and refills
    assert c["lag_0"] == 2  # still in the lag histogram, which sums to groups consumed


def test_without_the_filter_every_complete_group_is_ready():
    t = trainer()
    for i, rewards in enumerate([[1, 1], [0, 1], [0, 0]]):
        t.take(group(f"r{i}", rewards))
    t.take(group("r3", [1])[:1])  # incomplete: waits for its second sample
    assert [g[0]["request_id"] for g in t.ready] == ["r0", "r1", "r2"]
    assert t.counters["filtered_groups"] == 0 and "r3" in t.pending


def test_the_cap_lets_zero_variance_groups_fill_a_batch_the_pool_cannot():
    # cap = 1 round x P = 2 dropped groups per batch; after that they are admitted
    t = trainer("rl.filter_zero_variance=true", "rl.filter_max_rounds=1")
    for i in range(5):
        t.take(group(f"r{i}", [0, 0]))
    assert t.counters["filtered_groups"] == 2
    assert [g[0]["request_id"] for g in t.ready] == ["r2", "r3", "r4"]
