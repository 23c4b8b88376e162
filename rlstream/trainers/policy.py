"""The learning core as building blocks for the streaming loop (and used by the local loop).

policy = build_policy(GPTConfig(...))                    # or policy_from_bytes(blob)
samples = rollout(policy, prompts, group_size=8)          # G completions per prompt
rewards, correct = score(prompts, samples)                # verifiers or JSON reward rules
exp = to_experience(prompts, samples, rewards, version)   # an Experience batch
blob = policy_to_bytes(policy)                            # publish a policy version

Updates are the training core's (`rlstream.trainers.core`: TrainState, rl_update).
"""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass

import torch

from rlstream.trainers.envs import Prompt, verify
from rlstream.trainers.model import GPT, CharTokenizer, GPTConfig
from rlstream.trainers.rewards import RewardFn, call_reward, verifier_reward
from rlstream.trainers.rl import Experience
from rlstream.trainers.sampling import Samples, sample


@dataclass
class Policy:
    """A model, its tokenizer and the version of its weights."""

    model: GPT
    tok: CharTokenizer
    version: int = 0


def build_policy(config: GPTConfig | None = None, device: str = "cpu", seed: int = 0) -> Policy:
    """A freshly initialised policy (vocab size taken from the char tokenizer)."""
    tok = CharTokenizer()
    cfg = config or GPTConfig()
    cfg.vocab_size = tok.vocab_size
    torch.manual_seed(seed)
    return Policy(GPT(cfg).to(device), tok)


def rollout(
    policy: Policy,
    prompts: list[Prompt],
    group_size: int = 8,
    max_new_tokens: int = 8,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> Samples:
    """group_size completions per prompt in one batch (rows i*G .. i*G+G-1 belong to prompt i)."""
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


def score(
    prompts: list[Prompt], samples: Samples, reward_fn: RewardFn | None = None
) -> tuple[list[float], list[bool]]:
    """(rewards, correct) per completion; rewards from reward_fn (default: the verifiers)."""
    rows = [prompts[i] for i in samples.prompt_index]
    rewards = call_reward(reward_fn or verifier_reward, samples.texts, rows)
    correct = [verify(c, p) for c, p in zip(samples.texts, rows, strict=True)]
    return rewards, correct


def to_experience(
    prompts: list[Prompt], samples: Samples, rewards: list[float], policy_version: int
) -> Experience:
    """An Experience batch; the group id is '<row of the prompt in the batch>:<prompt_id>'."""
    groups = [f"{i}:{prompts[i].prompt_id}" for i in samples.prompt_index]
    return Experience(
        samples.prompt_tokens,
        samples.tokens,
        samples.logprobs,
        list(rewards),
        groups,
        [policy_version] * len(groups),
    )


def policy_to_bytes(policy: Policy) -> bytes:
    """Config, weights and version as bytes (for the object store / policy_versions events)."""
    buf = io.BytesIO()
    state = {
        "config": asdict(policy.model.config),
        "model": policy.model.state_dict(),
        "version": policy.version,
    }
    torch.save(state, buf)
    return buf.getvalue()


def policy_from_bytes(data: bytes, device: str = "cpu") -> Policy:
    state = torch.load(io.BytesIO(data), map_location=device, weights_only=False)
    model = GPT(GPTConfig(**state["config"])).to(device)
    model.load_state_dict(state["model"])
    return Policy(model, CharTokenizer(), state["version"])
