"""Building blocks the streaming loop calls: build, rollout, score, experience, update, bytes."""

import pytest
import torch

from rlstream.config import ModelConfig, load_config
from rlstream.trainers.checkpoint import MemoryStore
from rlstream.trainers.core import TrainState, rl_update
from rlstream.trainers.envs import TaskMix, sample_prompts
from rlstream.trainers.local import LocalOptions, train_local
from rlstream.trainers.policy import (
    build_policy,
    policy_from_bytes,
    policy_to_bytes,
    rollout,
    score,
    to_experience,
)
from rlstream.trainers.rewards import build_reward
from rlstream.trainers.selection.base import UniformSelection


def test_rollout_score_update_and_publish():
    policy = build_policy(ModelConfig(block_size=24, n_layer=1, n_head=2, n_embd=32))
    prompts = sample_prompts(TaskMix.parse("add@1,sub@1"), 3, "train", seed=0)
    s = rollout(
        policy, prompts, group_size=4, max_new_tokens=5, generator=torch.Generator().manual_seed(0)
    )
    assert len(s.texts) == 12 and s.prompt_index == [0] * 4 + [1] * 4 + [2] * 4
    rewards, correct = score(prompts, s)
    assert rewards == [float(c) for c in correct]
    rule = build_reward({"rules": [{"type": "length_penalty", "max_chars": 0, "per_char": 1.0}]})
    assert score(prompts, s, rule)[0] == [-float(len(t)) for t in s.texts]
    exp = to_experience(prompts, s, [float(len(t) % 2) for t in s.texts], policy.version)
    state = TrainState(load_config(None, ["rl.lr=1e-3", "model.backend=torch"]), policy=policy)
    state.start_rl()
    assert state.model is policy.model and state.version == 0
    blob = policy_to_bytes(policy)
    m = rl_update(state, exp)
    assert state.version == 1 and m["tokens"] == sum(len(t) for t in s.tokens)
    assert m["rl_step"] == state.rl_step == 1 and m["dropped_groups"] == 0
    assert m["trained_group_ids"] == list(dict.fromkeys(exp.group_ids)) and state.rollouts == 12
    assert state.policy().version == 1 and state.policy().model is policy.model
    old = policy_from_bytes(blob)
    assert old.version == 0
    changed = [
        not torch.equal(a, b)
        for a, b in zip(old.model.parameters(), policy.model.parameters(), strict=True)
    ]
    assert any(changed)


def test_train_local_with_injected_store_and_sampler():
    class CountingSampler(UniformSelection):
        calls = 0

        def update(self, prompts, rewards):
            CountingSampler.calls += 1
            assert len(rewards) == len(prompts) and all(len(r) == 2 for r in rewards)
            super().update(prompts, rewards)

    pool = sample_prompts(TaskMix.parse("add@1"), 50, "train", seed=0)
    store = MemoryStore()
    cfg = load_config(
        None,
        [
            "data.tasks=add@1",
            "data.corpus_docs=500",
            "pretrain.max_steps=6",
            "pretrain.val_interval=3",
            "pretrain.warmup_steps=2",
            "rl.steps=3",
            "eval.interval=3",
            "eval.prompts=8",
            "eval.samples=2",
            "rl.prompts_per_step=2",
            "rl.group_size=2",
            "model.n_layer=1",
            "model.n_embd=32",
            "model.threads=1",
            "model.backend=torch",
            "checkpoint.every=3",
            "checkpoint.keep_last=2",
            "selection.sampler=uniform",
        ],
    )
    s = train_local(
        cfg, LocalOptions(progress=False), store=store, sampler=CountingSampler(pool, seed=0)
    )
    assert CountingSampler.calls == 3 and s["rl_steps"] == 3
    assert store.list() == ["step-00000006.pt", "step-00000009.pt"]


def test_a_shared_directory_holds_whole_versions_loaded_in_place_and_pruned(tmp_path):
    """loop.weight_sync=DIR: a version is renamed into place whole, a follower loads it from
    its file:// URI (no object store), and only the newest `keep` and those kept for good
    stay."""
    from dataclasses import replace

    from rlstream.streams.policystore import SharedPolicies, fetch_policy

    shared = SharedPolicies(tmp_path, "run-a", keep=2, every=3)
    policy = build_policy()
    uris = [shared.write(replace(policy, version=v)) for v in range(5)]
    assert not list(tmp_path.glob("run-a/*.partial"))
    loaded = fetch_policy(None, uris[4])
    assert loaded.version == 4
    for a, b in zip(policy.model.parameters(), loaded.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert shared.prune(4) == [1, 2]  # 0 and 3 kept for good, 3 and 4 the newest two
    kept = sorted(p.name for p in (tmp_path / "run-a").iterdir())
    assert kept == ["version=000000", "version=000003", "version=000004"]
    with pytest.raises(FileNotFoundError):  # pruned while announced: the follower skips it
        fetch_policy(None, uris[1])


def test_a_version_pruned_while_it_is_loaded_reads_as_gone(tmp_path, monkeypatch):
    """The trainer prunes a shared version while a follower reads it (CI: transformers took
    the vanishing directory for a hub repo id and the rollout worker crashed): gone, as a
    version pruned before the read is, and the follower tries another."""
    from dataclasses import replace

    from rlstream.streams import policystore

    shared = policystore.SharedPolicies(tmp_path, "run-b", keep=1, every=0)
    uri = shared.write(replace(build_policy(), version=3))
    real = policystore.load_policy

    def pruned_meanwhile(directory, device="cpu"):
        shared.prune(5)  # the trainer published version 5 as this one is read
        return real(directory, device)

    monkeypatch.setattr(policystore, "load_policy", pruned_meanwhile)
    with pytest.raises(FileNotFoundError, match="pruned while it was read"):
        policystore.fetch_policy(None, uri)


def test_a_version_pruned_between_its_weights_and_its_tokenizer_reads_as_gone(
    tmp_path, monkeypatch
):
    """The pruning removed the tokenizer's files after the model was read: transformers then
    loads a tokenizer of one token without an error (a rollout worker dead-lettered every
    request it read with it, in CI). Gone, as any version pruned while it is read."""
    from dataclasses import replace
    from pathlib import Path

    from rlstream.streams import policystore
    from rlstream.trainers import policy as policy_module

    shared = policystore.SharedPolicies(tmp_path, "run-c", keep=1, every=0)
    uri = shared.write(replace(build_policy(), version=3))
    real = policy_module.Tokenizer.load

    def pruned_meanwhile(directory):
        # the trainer's pruning, halfway: rlstream.json first, then the tokenizer's files
        for name in (policy_module.POLICY_META, "tokenizer.json", "tokenizer_config.json"):
            (Path(directory) / name).unlink()
        return real(directory)

    monkeypatch.setattr(policy_module.Tokenizer, "load", staticmethod(pruned_meanwhile))
    with pytest.raises(FileNotFoundError, match="pruned while it was read"):
        policystore.fetch_policy(None, uri)
