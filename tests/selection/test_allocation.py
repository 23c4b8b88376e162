"""Test-time allocation: guided by informative predictions it beats uniform at equal budget."""

from __future__ import annotations

import numpy as np
import pytest

from rlstream.trainers.selection import (
    allocate_samples,
    compare_allocations,
    expected_pass_at_n,
    uniform_allocation,
)
from rlstream.trainers.selection.allocation import sample_gain, sampled_pass_at_n


def test_allocation_basics():
    assert uniform_allocation(3, 7).tolist() == [3, 2, 2]
    a = allocate_samples(np.array([0.99, 0.3, 0.0]), 6)
    assert a.tolist() == [1, 4, 1] and a.sum() == 6  # the hard-but-solvable prompt gets the rest
    assert allocate_samples(np.array([0.3, 0.3]), 10, max_per_prompt=3).tolist() == [3, 3]
    with pytest.raises(ValueError, match="budget"):
        allocate_samples(np.array([0.5, 0.5]), 1)
    # pass@n by hand: 1 - 0.5^2 = 0.75 and 1 - 0.9^1 = 0.1 -> mean 0.425
    assert expected_pass_at_n(np.array([2, 1]), np.array([0.5, 0.1])) == pytest.approx(0.425)


def _pool(n=300, seed=0):
    rng = np.random.default_rng(seed)
    kind = rng.choice(3, size=n, p=[0.4, 0.3, 0.3])  # easy, out of reach, hard-but-solvable
    p = np.where(
        kind == 0,
        rng.uniform(0.9, 1.0, n),
        np.where(kind == 1, rng.uniform(0.0, 0.01, n), rng.uniform(0.05, 0.3, n)),
    )
    pred = np.clip(p + rng.normal(0, 0.05, n), 0, 1)  # informative, noisy predictions
    return p, pred, rng


def test_guided_allocation_beats_uniform_at_equal_budget():
    p, pred, rng = _pool()
    budget = 4 * len(p)
    cmp = compare_allocations(pred, p, budget)
    # measured: uniform 0.536, guided 0.598 expected pass@n at 4 samples per prompt; guided
    # reaches uniform's accuracy with 762 of 1200 samples (compute saved 0.365)
    assert cmp["guided_accuracy"] >= cmp["uniform_accuracy"] + 0.03
    assert cmp["compute_saved"] >= 0.3
    guided = allocate_samples(pred, budget)
    assert guided.sum() == budget
    uniform = uniform_allocation(len(p), budget)
    sims = [
        sampled_pass_at_n(guided, p, rng) - sampled_pass_at_n(uniform, p, rng) for _ in range(20)
    ]
    assert np.mean(sims) > 0


def test_uninformative_predictions_do_not_help_much():
    p, _, rng = _pool()
    cmp = compare_allocations(rng.uniform(0, 1, len(p)), p, 4 * len(p))
    assert cmp["guided_accuracy"] <= cmp["uniform_accuracy"] + 0.01


def test_posterior_gain_by_hand_and_strong_priors_give_the_point_rule():
    # Beta(1, 1): E[p (1-p)^2] = B(2, 3) = 1/12; the point rule at 0.5 says 1/8
    assert sample_gain(0.5, 2, strength=2.0) == pytest.approx(1 / 12)
    assert sample_gain(0.5, 2) == pytest.approx(1 / 8)
    p, pred, _ = _pool()
    assert (allocate_samples(pred, 1200, strength=1e7) == allocate_samples(pred, 1200)).all()
    with pytest.raises(ValueError, match="strength"):
        allocate_samples(pred, 1200, strength=0.0)


def test_posterior_allocation_beats_the_point_rule_when_errors_follow_the_beta():
    # true pass rates scattered around the predictions as Beta(s mu, s (1-mu)), s = 2:
    # measured (seed 0, 2,000 prompts, 3 samples each): compute saved 8.8% vs 6.8%
    rng = np.random.default_rng(0)
    mu = rng.uniform(0.02, 0.98, 2000)
    p = rng.beta(2 * mu, 2 * (1 - mu))
    point = compare_allocations(mu, p, 3 * len(p))
    post = compare_allocations(mu, p, 3 * len(p), strength=2.0)
    assert post["guided_accuracy"] > point["guided_accuracy"]
    assert post["compute_saved"] > point["compute_saved"]
