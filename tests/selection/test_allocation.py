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
from rlstream.trainers.selection.allocation import sampled_pass_at_n


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
