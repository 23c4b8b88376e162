"""RL math as pure functions on tensors: advantages, GAE, clipped policy loss, KL, masked means.

Shapes: B sequences, T completion tokens; `mask` (B, T) is 1.0 on real completion tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of x over positions where mask is 1 (all of them, or along dim). x, mask (B, T).

    >>> masked_mean(torch.tensor([[1., 2., 9.]]), torch.tensor([[1., 1., 0.]]))
    tensor(1.5000)
    """
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1.0)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def compute_grpo_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6, scale_std: bool = True
) -> torch.Tensor:
    """Group-normalised advantages: (r - mean_g) / (std_g + eps). rewards, group_ids (N,) -> (N,).

    std is the unbiased sample std (as in GRPO); a group whose rewards are all equal gets 0.

    >>> compute_grpo_advantages(torch.tensor([1., 0., 0., 0.]), torch.tensor([0, 0, 0, 0]))
    tensor([ 1.5000, -0.5000, -0.5000, -0.5000])
    """
    _, inv = torch.unique(group_ids, return_inverse=True)
    G = int(inv.max()) + 1
    count = rewards.new_zeros(G).index_add_(0, inv, torch.ones_like(rewards))
    mean = rewards.new_zeros(G).index_add_(0, inv, rewards) / count
    centred = rewards - mean[inv]
    if not scale_std:
        return centred
    var = rewards.new_zeros(G).index_add_(0, inv, centred**2) / (count - 1).clamp(min=1.0)
    std = var.sqrt()[inv]
    return torch.where(std > 0, centred / (std + eps), torch.zeros_like(centred))


def compute_gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over each sequence's real tokens. All (B, T).

    The value after a sequence's last real token is 0 (the episode ends). A masked position
    inside a sequence (an environment's tokens between two policy turns) is stepped over: the
    next turn's value and advantage reach the turn before it. Returns (advantages, returns) with
    returns = advantages + values; both are 0 on masked positions.
    """
    B, T = rewards.shape
    adv = torch.zeros_like(rewards)
    last = rewards.new_zeros(B)
    next_value = rewards.new_zeros(B)
    for t in reversed(range(T)):
        real = mask[:, t] > 0
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        gae = delta + gamma * lam * last
        adv[:, t] = torch.where(real, gae, 0.0)
        last = torch.where(real, gae, last)
        next_value = torch.where(real, values[:, t], next_value)
    return adv, (adv + values) * mask


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: float = 0.2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped surrogate loss -min(r A, clip(r) A), token-mean; and the clipped fraction.

    logp, old_logp, mask (B, T); advantages (B, T) or (B,) (broadcast over tokens). The ratio
    r = exp(logp - old_logp) is the importance weight for experience from an older policy.
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logp)
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip, 1.0 + clip) * advantages
    loss = masked_mean(-torch.minimum(unclipped, clipped), mask)
    clipfrac = masked_mean(((ratio - 1.0).abs() > clip).float(), mask)
    return loss, clipfrac


def kl_estimator(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL(pi || ref) estimate from sampled tokens' logprobs. (B, T) -> (B, T).

    k1 = logp - ref_logp; k3 = exp(ref - logp) - (ref - logp) - 1 (Schulman's unbiased,
    non-negative estimator, http://joschu.net/blog/kl-approx.html).

    >>> kl_estimator(torch.tensor([0.0]), torch.tensor([0.0]))
    tensor([0.])
    """
    log_ratio = ref_logp - logp
    if kind == "k1":
        return -log_ratio
    if kind == "k3":
        return torch.exp(log_ratio) - log_ratio - 1.0
    raise ValueError(f"unknown KL estimator {kind!r} (k1 or k3)")


def value_loss(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """0.5 * masked mean squared error. All (B, T)."""
    return 0.5 * masked_mean((values - returns) ** 2, mask)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of each position's distribution: (B, T, V) -> (B, T)."""
    logp = F.log_softmax(logits.float(), -1)
    return -(logp.exp() * logp).sum(-1)
