"""Data-parallel trainer ranks (`trainers/ranks.py`): two gloo ranks, each training its share
of every batch, take the very step one process takes on the whole batch, and stay identical;
on DeepSpeed ZeRO-2 too, whose checkpoint gathers every rank's optimizer partition and resumes
the pair where it was."""

from __future__ import annotations

import os
import random

import pytest
import torch
import torch.multiprocessing as mp

from rlstream.config import load_config
from rlstream.trainers.core import TrainState, follow, pretrain_update, resolve_device, rl_update
from rlstream.trainers.ranks import (
    INIT_ENV,
    LOCAL_ENV,
    WORLD_ENV,
    Ranks,
    local_rank,
    share_groups,
    share_rows,
)
from rlstream.trainers.rl import Experience

SETTINGS = ["model.n_layer=1", "model.n_embd=32", "model.threads=1"]


def _config(algo: str, backend: str):
    return load_config(None, [*SETTINGS, f"rl.algo={algo}", f"model.backend={backend}"])


def _batches(state: TrainState):
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


def _train(state: TrainState, until: int = 3, start: int = 0) -> None:
    pre, rl = _batches(state)
    if start == 0:
        for batch in pre:
            pretrain_update(state, batch)
        state.start_rl()
    for exp in rl[start:until]:
        rl_update(state, exp)


def _rank(rank: int, world: int, init: str, algo: str, backend: str, out: str, mode: str):
    """mode "train": the whole schedule; "checkpoint": two RL batches, the checkpoint, the
    third; "resume": from that checkpoint, the third."""
    os.environ.update({WORLD_ENV: str(world), INIT_ENV: init})
    ranks = Ranks.from_env(rank)
    state = TrainState(_config(algo, backend), threads=1)
    if ranks is None:  # one process on the whole batch, as clean as the ranks' processes
        _train(state)
        torch.save(state.model.state_dict(), f"{out}/{mode}-rank{rank}.pt")
        return
    if ranks.leader:
        if mode == "resume":
            ck = torch.load(f"{out}/checkpoint.pt", weights_only=False)
            state.load_state_dict(ck)
            state.join(ranks)
            ranks.send(("sync", ck))
            _train(state, until=3, start=2)
        else:
            state.join(ranks)
            _train(state, until=2 if mode == "checkpoint" else 3)
            if mode == "checkpoint":
                torch.save(state.state_dict(), f"{out}/checkpoint.pt")
                _train(state, until=3, start=2)
        ranks.send(("stop",))
    else:
        state.join(ranks)
        follow(state, ranks)
    torch.save(state.model.state_dict(), f"{out}/{mode}-rank{rank}.pt")
    ranks.close()


def _spawn(tmp_path, algo: str, backend: str, mode: str = "train", world: int = 2) -> list:
    """Every rank in a fresh process (what earlier tests left in this one cannot leak in)."""
    init = f"file://{tmp_path / f'rendezvous-{mode}'}"  # no port to race another process for
    mp.spawn(_rank, args=(world, init, algo, backend, str(tmp_path), mode), nprocs=world,
             join=True)  # fmt: skip
    return [torch.load(tmp_path / f"{mode}-rank{r}.pt") for r in range(world)]


# DeepSpeed's ranks build its CPU op and start its engine (~35 s): the slow tier
ZERO = pytest.param("grpo", "deepspeed", marks=pytest.mark.slow)


@pytest.mark.parametrize(("algo", "backend"), [("grpo", "torch"), ("ppo", "torch"), ZERO])
def test_two_ranks_take_the_step_one_process_takes_on_the_whole_batch(algo, backend, tmp_path):
    before = TrainState(_config(algo, "torch"), threads=1).model.state_dict()
    (alone,) = _spawn(tmp_path, algo, "torch", mode="alone", world=1)
    ranked = _spawn(tmp_path, algo, backend)
    for name, weight in alone.items():
        assert torch.equal(ranked[0][name], ranked[1][name]), name  # the ranks never diverge
        assert not torch.equal(weight, before[name]) or "value_head" in name  # it trained
        if algo == "grpo":  # group-relative advantages: sharding by whole groups is exact
            torch.testing.assert_close(ranked[0][name], weight, atol=2e-5, rtol=1e-4)
    if algo == "ppo":  # PPO normalises advantages over each rank's shard: close, not equal
        drift = max((ranked[0][n] - w).abs().max().item() for n, w in alone.items())
        assert drift < 0.05, drift


@pytest.mark.slow  # two DeepSpeed engines, twice (~17 s)
def test_a_zero_checkpoint_holds_every_ranks_partition_and_resumes_the_pair(tmp_path):
    straight = _spawn(tmp_path, "grpo", "deepspeed", "checkpoint")
    ck = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert isinstance(ck["optimizer"], list) and len(ck["optimizer"]) == 2
    resumed = _spawn(tmp_path, "grpo", "deepspeed", "resume")
    for name, weight in straight[0].items():
        assert torch.equal(resumed[0][name], weight) and torch.equal(resumed[1][name], weight)


def test_batches_are_shared_out_whole_groups_and_every_row_once():
    ids = [f"g{i // 4}" for i in range(20)]
    shards = share_groups(ids, 2)
    assert sorted(shards[0] + shards[1]) == list(range(20))
    assert {ids[i] for i in shards[0]}.isdisjoint({ids[i] for i in shards[1]})
    assert [len(s) for s in shards] == [12, 8]
    assert [s.stop - s.start for s in share_rows(7, 3)] == [2, 2, 3]


def test_each_rank_takes_its_own_gpu_index(monkeypatch):
    monkeypatch.delenv(LOCAL_ENV, raising=False)
    gpus = torch.cuda.device_count()
    assert local_rank(3) == (3 % gpus if gpus else 3)  # the supervisor's layout: one machine
    monkeypatch.setenv(LOCAL_ENV, "1")  # a launcher's (torchrun, a pod with its own GPUs)
    assert local_rank(7) == (1 % gpus if gpus else 1)
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == (f"cuda:{torch.cuda.current_device()}" if gpus else "cpu")
