"""The RL math of one update (GRPO or PPO), independent of how the experience was produced.

`rlstream.trainers.core.rl_update` is the one caller: it asks `Learner.split_stale` which groups
are too old to train on, then `Learner.step(fresh)` computes advantages (registry
`ADVANTAGES`: grpo, ppo) and runs `update_epochs` x `num_minibatches` clipped policy-gradient
updates with a KL penalty to a frozen reference and optional value/entropy/LM terms.
Settings are `rlstream.config.RLConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlstream.config import RLConfig
from rlstream.registry import Registry
from rlstream.trainers.algos import (
    compute_gae,
    compute_grpo_advantages,
    entropy_from_logits,
    kl_estimator,
    masked_mean,
    ppo_clip_loss,
    value_loss,
)
from rlstream.trainers.lm import token_logprobs
from rlstream.trainers.pretrain import lm_loss


@dataclass
class Experience:
    """N completions; rows sharing a group id are G samples of one prompt."""

    prompt_tokens: list[list[int]]
    completion_tokens: list[list[int]]
    old_logprobs: list[list[float]]  # per completion token, under the policy that sampled it
    rewards: list[float]
    group_ids: list  # any hashable per row (e.g. prompt_id)
    policy_version: list[int]  # version of the policy that produced each row
    loss_masks: list | None = None
    """per row: 1 on the completion tokens the policy sampled, 0 on an environment's (a
    multi-turn episode); None for a row (or all rows) whose every completion token is the
    policy's"""
    turn_rewards: list | None = None
    """per row: an episode's reward after each policy turn (PPO credits each at its turn's
    last token), or None (the whole reward at the last token)"""

    def __post_init__(self):
        if self.loss_masks is None:
            self.loss_masks = [None] * len(self.rewards)
        if self.turn_rewards is None:
            self.turn_rewards = [None] * len(self.rewards)

    def __len__(self) -> int:
        return len(self.rewards)

    def _columns(self) -> list[list]:
        return [self.prompt_tokens, self.completion_tokens, self.old_logprobs, self.rewards,
                self.group_ids, self.policy_version, self.loss_masks,
                self.turn_rewards]  # fmt: skip

    def select(self, rows) -> Experience:
        return Experience(*[[col[i] for i in rows] for col in self._columns()])

    def concat(self, other: Experience) -> Experience:
        return Experience(*[a + b for a, b in zip(self._columns(), other._columns(), strict=True)])

    @classmethod
    def from_rows(cls, rows: list[dict]) -> Experience:
        """From rl.experience.v2 rows (a group is a request_id)."""
        return cls(
            [r["prompt_tokens"] for r in rows],
            [r["completion_tokens"] for r in rows],
            [r["logprobs"] for r in rows],
            [r["reward"] for r in rows],
            [r["request_id"] for r in rows],
            [r["policy_version"] for r in rows],
            [r.get("loss_mask") for r in rows],
            [r.get("turn_rewards") for r in rows],
        )


def collate(exp: Experience, pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded tensors: tokens (N, L); old_logp, mask, token_rewards (N, L-1) aligned
    with targets (token_rewards: each row's reward where PPO credits it, `turn_credit`)."""
    seqs = [p + c for p, c in zip(exp.prompt_tokens, exp.completion_tokens, strict=True)]
    N, L = len(seqs), max(len(s) for s in seqs)
    tokens = torch.full((N, L), pad_id, dtype=torch.long)
    old = torch.zeros((N, L - 1))
    mask = torch.zeros((N, L - 1))
    for i, (p, c) in enumerate(zip(exp.prompt_tokens, exp.completion_tokens, strict=True)):
        tokens[i, : len(p) + len(c)] = torch.tensor(p + c)
        start = len(p) - 1  # the target at position start is the first completion token
        own = exp.loss_masks[i]
        mask[i, start : start + len(c)] = 1.0 if own is None else torch.tensor(own[: len(c)])
        old[i, start : start + len(c)] = torch.tensor(exp.old_logprobs[i][: len(c)])
    token_rewards = torch.zeros((N, L - 1))
    for i in range(N):
        for at, reward in turn_credit(mask[i].tolist(), exp.rewards[i], exp.turn_rewards[i]):
            token_rewards[i, at] = reward
    return {"tokens": tokens, "old_logp": old, "mask": mask, "rewards": torch.tensor(exp.rewards),
            "token_rewards": token_rewards}  # fmt: skip


def turn_credit(mask: list[float], reward: float, turns: list[float] | None) -> list[tuple]:
    """Where a row's reward is credited: each policy turn's reward at that turn's last trained
    token when there is one reward per turn (an episode), else the whole reward at the last
    trained token.

    >>> turn_credit([0, 1, 1, 0, 0, 1, 0], 1.5, [0.5, 1.0])
    [(2, 0.5), (5, 1.0)]
    >>> turn_credit([0, 1, 1, 0], 1.0, None)
    [(2, 1.0)]
    """
    ends = [t for t, m in enumerate(mask) if m > 0 and (t + 1 == len(mask) or mask[t + 1] == 0)]
    if not ends:
        return []
    if turns and len(turns) == len(ends) and abs(sum(turns) - reward) < 1e-4:
        return list(zip(ends, turns, strict=True))
    return [(ends[-1], reward)]


ADVANTAGES = Registry("advantage estimator")  # fn(batch, values, cfg) -> (adv, returns)
register_advantage = ADVANTAGES.register


@register_advantage("grpo")
def _grpo(b: dict, values: torch.Tensor | None, args: RLConfig):
    return compute_grpo_advantages(b["rewards"], b["group_index"]), None


@register_advantage("ppo")
def _ppo(b: dict, values: torch.Tensor, args: RLConfig):
    """Rewards where `turn_credit` puts them (an episode's at each turn's end, else at the last
    token); GAE over the policy's tokens; normalised advantages."""
    mask = b["mask"]
    adv, ret = compute_gae(b["token_rewards"], values * mask, mask, args.gamma, args.lam)
    mean, std = (
        masked_mean(adv, mask),
        masked_mean((adv - masked_mean(adv, mask)) ** 2, mask).sqrt(),
    )
    return (adv - mean) / (std + 1e-8) * mask, ret


class Learner:
    """Owns the policy's optimisation state; `version` counts the updates applied so far."""

    def __init__(self, backend, ref_model, args: RLConfig, pad_id: int, seed: int = 0):
        if args.algo not in ADVANTAGES:
            raise ValueError(f"unknown algo {args.algo!r}; known: {sorted(ADVANTAGES)}")
        if args.algo == "ppo" and backend.module.value_head is None:
            raise ValueError("ppo needs a model with a value head (CausalLM(value_head=True))")
        self.backend, self.ref, self.args, self.pad_id = backend, ref_model, args, pad_id
        self.version = 0
        self.generator = torch.Generator().manual_seed(seed)

    def split_stale(self, exp: Experience) -> tuple[Experience, int]:
        """(the groups fresh enough to train on, how many whole groups are too stale: any row
        more than max_policy_lag versions behind)."""
        stale = {
            g
            for g, v in zip(exp.group_ids, exp.policy_version, strict=True)
            if self.version - v > self.args.max_policy_lag
        }
        keep = [i for i, g in enumerate(exp.group_ids) if g not in stale]
        return exp.select(keep), len(stale)

    def _forward(self, tokens, want_values: bool):
        out = self.backend.model(tokens[:, :-1], values=want_values)
        return out if want_values else (out, None)

    def step(self, exp: Experience, lm_batch: tuple | None = None) -> dict:
        """Apply one RL update (epochs x minibatches) to exp; lm_batch=(x, y) mixes in LM loss."""
        metrics = {"version": self.version}
        ranks = getattr(self.backend, "ranks", None)
        if len(exp) == 0:
            if ranks is None or ranks.leader:  # rank 0 always has a share of an update
                return metrics | {"loss": float("nan")}
            return self._idle_step(metrics, lm_batch)  # the others train: take their step
        a, ppo = self.args, self.args.algo == "ppo"
        device = next(self.backend.module.parameters()).device
        b = {k: v.to(device) for k, v in collate(exp, self.pad_id).items()}
        index = {g: i for i, g in enumerate(dict.fromkeys(exp.group_ids))}
        b["group_index"] = torch.tensor([index[g] for g in exp.group_ids], device=device)
        with torch.no_grad():
            ref_logp = token_logprobs(self.ref(b["tokens"][:, :-1]), b["tokens"][:, 1:])
            values = self._forward(b["tokens"], True)[1] if ppo else None
        adv, returns = ADVANTAGES[a.algo](b, values, a)
        N = len(exp)
        sums: dict[str, float] = {}
        for _ in range(a.epochs):
            order = torch.arange(N)
            if a.minibatches > 1:
                order = torch.randperm(N, generator=self.generator)
            # with ranks every rank takes exactly epochs x minibatches steps, empty ones too
            split = order.tensor_split if ranks is not None else order.chunk
            for mb in split(a.minibatches):
                if len(mb) == 0:
                    self.backend.step(None, weight=0.0)
                    continue
                mb = mb.to(device)
                m = self._minibatch_loss(b, mb, adv, returns, ref_logp, lm_batch)
                tokens = float(b["mask"][mb].sum())
                m["grad_norm"] = self.backend.step(m.pop("_loss"), weight=tokens)
                for k, v in m.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
        n_updates = a.epochs * a.minibatches
        self.version += 1
        metrics |= {k: v / n_updates for k, v in sums.items()}
        metrics["reward"] = float(b["rewards"].mean())
        metrics["tokens"] = int(b["mask"].sum())
        if ranks is not None:
            metrics = ranks.reduce_metrics(metrics, self._figures(lm_batch), weight=N)
        return metrics

    def _figures(self, lm_batch) -> list[str]:
        """The update's figures, the same on every rank (reduced across ranks)."""
        keys = ["pg_loss", "kl", "entropy", "clipfrac", "loss", "grad_norm", "reward", "tokens"]
        keys += ["value_loss"] if self.args.algo == "ppo" else []
        return keys + (["lm_loss"] if lm_batch is not None else [])

    def _idle_step(self, metrics: dict, lm_batch) -> dict:
        """A rank whose shard is empty: its zero-weight part of every step of this update."""
        for _ in range(self.args.epochs * self.args.minibatches):
            self.backend.step(None, weight=0.0)
        self.version += 1
        return self.backend.ranks.reduce_metrics(metrics, self._figures(lm_batch), weight=0)

    def _minibatch_loss(self, b, mb, adv, returns, ref_logp, lm_batch) -> dict:
        a = self.args
        tokens, mask, old = b["tokens"][mb], b["mask"][mb], b["old_logp"][mb]
        logits, values = self._forward(tokens, a.algo == "ppo")
        logp = token_logprobs(logits, tokens[:, 1:])
        pg, clipfrac = ppo_clip_loss(logp, old, adv[mb], mask, a.clip)
        kl = masked_mean(kl_estimator(logp, ref_logp[mb]), mask)
        ent = masked_mean(entropy_from_logits(logits), mask)
        loss = pg + a.kl_coef * kl
        out = {
            "pg_loss": pg.detach(),
            "kl": kl.detach(),
            "entropy": ent.detach(),
            "clipfrac": clipfrac,
        }
        if a.algo == "ppo":
            vl = value_loss(values, returns[mb], mask)
            loss = loss + a.vf_coef * vl - a.ent_coef * ent
            out["value_loss"] = vl.detach()
        if lm_batch is not None:
            x, y = (t.to(tokens.device) for t in lm_batch)
            lm = lm_loss(self.backend.model, x, y)
            loss = loss + a.lm_coef * lm
            out["lm_loss"] = lm.detach()
        out["loss"] = loss.detach()
        out["_loss"] = loss
        return out

    def state_dict(self) -> dict:
        return {"version": self.version, "generator": self.generator.get_state()}

    def load_state_dict(self, s: dict) -> None:
        self.version = s["version"]
        self.generator.set_state(s["generator"])
