"""Data-parallel trainer ranks (`trainers/ranks.py`): two gloo ranks, each training its share
of every batch, take the very step one process takes on the whole batch, and stay identical."""

from __future__ import annotations

import os
import random

import pytest
import torch
import torch.multiprocessing as mp

from rlstream.config import load_config
from rlstream.trainers.core import TrainState, follow, pretrain_update, rl_update
from rlstream.trainers.ranks import INIT_ENV, WORLD_ENV, Ranks, share_groups, share_rows
from rlstream.trainers.rl import Experience

SETTINGS = ["model.n_layer=1", "model.n_embd=32", "model.threads=1", "model.backend=torch"]


def _batches(state: TrainState, algo: str):
    """Two pre-training batches and three RL batches of 5 groups of 4 (one rank gets 3)."""
    gen = torch.Generator().manual_seed(1)
    vocab, block = state.tok.vocab_size, state.cfg.model.block_size
    pre = [torch.randint(0, vocab, (6, block + 1), generator=gen) for _ in range(2)]
    rng = random.Random(2)
    rl = []
    for step in range(3):
        rows = 20
        prompts = [[rng.randrange(vocab) for _ in range(rng.randint(3, 6))] for _ in range(rows)]
        completions = [[rng.randrange(vocab) for _ in range(rng.randint(2, 5))] for _ in prompts]
        rl.append(Experience(
            prompts, completions, [[-2.0] * len(c) for c in completions],
            [float(rng.random() < 0.5) for _ in prompts],
            [f"g{step}-{i // 4}" for i in range(rows)],
            [-10 if step == 1 else 0] * rows,  # the second batch is all stale: no update at all
        ))  # fmt: skip
    return [(x[:, :-1], x[:, 1:]) for x in pre], rl


def _train(state: TrainState, algo: str) -> None:
    pre, rl = _batches(state, algo)
    for batch in pre:
        pretrain_update(state, batch)
    state.start_rl()
    for exp in rl:
        rl_update(state, exp)


def _rank(rank: int, world: int, init: str, algo: str, out: str) -> None:
    os.environ.update({WORLD_ENV: str(world), INIT_ENV: init})
    cfg = load_config(None, [*SETTINGS, f"rl.algo={algo}"])
    state = TrainState(cfg, threads=1)
    ranks = Ranks.from_env(rank)
    state.join(ranks)
    if ranks.leader:
        _train(state, algo)
        ranks.send(("stop",))
    else:
        follow(state, ranks)
    torch.save(state.model.state_dict(), f"{out}/rank{rank}.pt")
    ranks.close()


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_two_ranks_take_the_step_one_process_takes_on_the_whole_batch(algo, tmp_path):
    cfg = load_config(None, [*SETTINGS, f"rl.algo={algo}"])
    alone = TrainState(cfg, threads=1)
    before = {k: v.clone() for k, v in alone.model.state_dict().items()}
    _train(alone, algo)
    init = f"file://{tmp_path / 'rendezvous'}"  # no port to race another process for
    mp.spawn(_rank, args=(2, init, algo, str(tmp_path)), nprocs=2, join=True)
    ranked = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for name, weight in alone.model.state_dict().items():
        assert torch.equal(ranked[0][name], ranked[1][name]), name  # the ranks never diverge
        assert not torch.equal(weight, before[name]) or "value_head" in name  # it trained
        if algo == "grpo":  # group-relative advantages: sharding by whole groups is exact
            torch.testing.assert_close(ranked[0][name], weight, atol=2e-5, rtol=1e-4)
    if algo == "ppo":  # PPO normalises advantages over each rank's shard: close, not equal
        alone_weights = alone.model.state_dict().items()
        drift = max((ranked[0][n] - w).abs().max().item() for n, w in alone_weights)
        assert drift < 0.05, drift


def test_batches_are_shared_out_whole_groups_and_every_row_once():
    ids = [f"g{i // 4}" for i in range(20)]
    shards = share_groups(ids, 2)
    assert sorted(shards[0] + shards[1]) == list(range(20))
    assert {ids[i] for i in shards[0]}.isdisjoint({ids[i] for i in shards[1]})
    assert [len(s) for s in shards] == [12, 8]
    assert [s.stop - s.start for s in share_rows(7, 3)] == [2, 2, 3]
