"""The learning core as building blocks for the streaming loop (and used by the local loop).

policy = build_policy(ModelConfig(...))                  # or load_policy(dir), policy_from_bytes
samples = rollout(policy, prompts, group_size=8)          # G completions per prompt
rewards, correct = score(prompts, samples)                # verifiers or JSON reward rules
exp = to_experience(prompts, samples, rewards, version)   # an Experience batch
save_policy(policy, dir); blob = policy_to_bytes(policy)  # a Hugging Face directory / its tar

Updates are the training core's (`rlstream.trainers.core`: TrainState, rl_update).
"""

from __future__ import annotations

import io
import json
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from rlstream.config import EnvConfig
from rlstream.connectors.objectstore import POLICY_META
from rlstream.trainers.envs import Prompt, verify
from rlstream.trainers.lm import (
    CausalLM,
    Tokenizer,
    build_model,
    load_tokenizer,
    merged,
    prepare_transformers,
)
from rlstream.trainers.rewards import RewardFn, call_reward, verifier_reward
from rlstream.trainers.rl import Experience
from rlstream.trainers.sampling import Samples, sample


@dataclass
class Policy:
    """A model, its tokenizer and the version of its weights."""

    model: CausalLM
    tok: Tokenizer
    version: int = 0


def build_policy(model_cfg=None, device: str = "cpu", seed: int = 0, value_head=False) -> Policy:
    """A policy from `model_cfg` (a ModelConfig; default: the tiny preset), seeded."""
    from rlstream.config import ModelConfig

    m = model_cfg or ModelConfig()
    tok = load_tokenizer(m)
    torch.manual_seed(seed)
    return Policy(build_model(m, tok, value_head, device), tok)


def rollout(
    policy: Policy,
    prompts: list[Prompt],
    group_size: int = 8,
    max_new_tokens: int = 8,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    env: EnvConfig | None = None,
) -> Samples:
    """group_size completions per prompt in one batch (rows i*G .. i*G+G-1 belong to prompt i).
    When a prompt names an environment the batch runs as episodes (`environments.episodes`):
    a row's tokens are its whole episode, its text the transcript."""
    if any(p.environment for p in prompts):
        return episode_samples(policy, prompts, group_size, max_new_tokens, temperature,
                               generator, env or EnvConfig())  # fmt: skip
    texts = [p.text for p in prompts]
    return sample(
        policy.model,
        policy.tok,
        texts,
        group_size,
        max_new_tokens,
        temperature,
        generator=generator,
    )


def episode_samples(policy, prompts, n, max_new_tokens, temperature, generator, env) -> Samples:
    from rlstream.trainers.environments.episodes import run_episodes

    episodes = run_episodes(policy.model, policy.tok, prompts, n, max_new_tokens, temperature,
                            env, generator)  # fmt: skip
    return Samples(
        prompt_index=[i for i in range(len(prompts)) for _ in range(n)],
        prompt_tokens=[e.context[: e.n_prompt] for e in episodes],
        tokens=[e.tokens for e in episodes],
        texts=[e.text if e.env is not None else e.action for e in episodes],
        logprobs=[e.logprobs for e in episodes],
        finish_reasons=[e.finish for e in episodes],
        episodes=episodes,
    )


def score(
    prompts: list[Prompt], samples: Samples, reward_fn: RewardFn | None = None
) -> tuple[list[float], list[bool]]:
    """(rewards, correct) per completion; rewards from reward_fn (default: the verifiers), an
    episode's from its environment (its return; correct when it is positive)."""
    rows = [prompts[i] for i in samples.prompt_index]
    rewards = call_reward(reward_fn or verifier_reward, samples.texts, rows)
    correct = [verify(c, p) for c, p in zip(samples.texts, rows, strict=True)]
    for k, e in enumerate(samples.episodes or []):
        if e.env is not None:
            rewards[k] = 0.0 if e.error else e.reward
            correct[k] = e.error is None and e.reward > 0
    return rewards, correct


def to_experience(
    prompts: list[Prompt], samples: Samples, rewards: list[float], policy_version: int
) -> Experience:
    """An Experience batch; the group id is '<row of the prompt in the batch>:<prompt_id>'."""
    groups = [f"{i}:{prompts[i].prompt_id}" for i in samples.prompt_index]
    masks = turns = None
    if samples.episodes:  # an episode whose environment failed trains nothing
        masks = [[0] * len(e.loss_mask) if e.error else e.loss_mask for e in samples.episodes]
        turns = [e.turn_rewards if e.prompt.environment else None for e in samples.episodes]
    return Experience(
        samples.prompt_tokens,
        samples.tokens,
        samples.logprobs,
        list(rewards),
        groups,
        [policy_version] * len(groups),
        masks,
        turns,
    )


def save_policy(policy: Policy, directory: str | Path) -> Path:
    """A Hugging Face directory (`save_pretrained`: config, safetensors weights, tokenizer
    files) that `AutoModelForCausalLM` / `AutoTokenizer.from_pretrained` load with no rlstream
    code, plus rlstream.json. LoRA adapters are merged in; the value head is the trainer's, not
    part of a policy version."""
    prepare_transformers()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    merged(policy.model.lm).save_pretrained(directory, safe_serialization=True)
    policy.tok.save(directory)
    meta = {"version": policy.version, "block_size": policy.model.block_size}
    (directory / POLICY_META).write_text(json.dumps(meta))
    return directory


def load_policy(directory: str | Path, device: str = "cpu") -> Policy:
    prepare_transformers()
    from transformers import AutoModelForCausalLM

    directory = Path(directory)
    meta = json.loads((directory / POLICY_META).read_text())
    lm = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    model = CausalLM(lm, meta["block_size"]).to(device)
    return Policy(model, Tokenizer.load(directory), meta["version"])


def policy_to_bytes(policy: Policy) -> bytes:
    """The policy's Hugging Face directory as one uncompressed tar (in-memory copies)."""
    buf = io.BytesIO()
    with tempfile.TemporaryDirectory() as d, tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(save_policy(policy, d).iterdir()):
            tar.add(path, arcname=path.name)
    return buf.getvalue()


def policy_from_bytes(data: bytes, device: str = "cpu") -> Policy:
    with tempfile.TemporaryDirectory() as d:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(d, filter="data")
        return load_policy(d, device)
