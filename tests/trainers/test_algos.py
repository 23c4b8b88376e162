import doctest
import math

import pytest
import torch

from rlstream.trainers import algos
from rlstream.trainers.algos import (
    compute_gae,
    compute_grpo_advantages,
    kl_estimator,
    masked_mean,
    ppo_clip_loss,
)


def test_doctests():
    assert doctest.testmod(algos).failed == 0


def test_grpo_advantages_by_hand():
    # group a: mean 0.25, unbiased std 0.5; group b: all equal -> 0; group c: [1, 0] -> +-0.7071
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 1.0, 0.0])
    g = torch.tensor([5, 5, 5, 5, 9, 9, 1, 1])
    adv = compute_grpo_advantages(r, g, eps=0.0)
    s = 1 / math.sqrt(2)
    assert adv.tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5, 0.0, 0.0, s, -s])
    assert compute_grpo_advantages(r, g, scale_std=False).tolist() == pytest.approx(
        [0.75, -0.25, -0.25, -0.25, 0, 0, 0.5, -0.5]
    )


def test_gae_by_hand():
    # one sequence of 3 real tokens, reward 1 at the last; gamma 0.99, lambda 0.95
    r = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    v = torch.tensor([[0.5, 0.6, 0.7, 9.0]])  # the padded value (9.0) must not leak in
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    adv, ret = compute_gae(r, v, m, gamma=0.99, lam=0.95)
    d2 = 1.0 - 0.7
    d1 = 0.99 * 0.7 - 0.6
    d0 = 0.99 * 0.6 - 0.5
    a2, a1 = d2, d1 + 0.99 * 0.95 * d2
    a0 = d0 + 0.99 * 0.95 * a1
    assert adv[0].tolist() == pytest.approx([a0, a1, a2, 0.0], abs=1e-6)
    assert ret[0, :3].tolist() == pytest.approx([a0 + 0.5, a1 + 0.6, a2 + 0.7], abs=1e-6)
    # gamma = lambda = 1: advantages are reward-to-go minus value
    adv1, _ = compute_gae(r, v, m, 1.0, 1.0)
    assert adv1[0, :3].tolist() == pytest.approx([0.5, 0.4, 0.3])


def test_ppo_clip_loss_by_hand():
    logp = torch.log(torch.tensor([[1.5, 1.5, 0.5, 0.5, 1.0]]))
    old = torch.zeros_like(logp)
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    # min(r A, clip(r) A): 1.2, -1.5, 0.5, -0.8 -> loss = -mean = 0.15; every ratio is clipped
    loss, clipfrac = ppo_clip_loss(logp, old, adv, mask, clip=0.2)
    assert float(loss) == pytest.approx(0.15)
    assert float(clipfrac) == pytest.approx(1.0)
    # sequence-level advantages broadcast over tokens
    loss_b, _ = ppo_clip_loss(logp[:, :2], old[:, :2], torch.tensor([1.0]), mask[:, :2])
    assert float(loss_b) == pytest.approx(-(1.2 + 1.2) / 2)


def test_kl_estimators_by_hand():
    logp, ref = torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25]))
    assert float(kl_estimator(logp, ref, "k3")) == pytest.approx(0.5 - math.log(0.5) - 1)
    assert float(kl_estimator(logp, ref, "k1")) == pytest.approx(math.log(2))
    assert float(kl_estimator(ref, ref)) == 0.0
    with pytest.raises(ValueError):
        kl_estimator(logp, ref, "k9")


def test_masked_means():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0]])
    m = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert float(masked_mean(x, m)) == pytest.approx(2.5)  # token mean: (1+2+3+4) / 4
    assert masked_mean(x, m, dim=1).tolist() == pytest.approx([2.0, 4.0])  # per sequence
    assert float(masked_mean(x, torch.zeros_like(m))) == 0.0  # empty mask: no NaN
