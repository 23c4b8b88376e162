"""Test-time allocation: spend an evaluation budget where extra samples change the outcome.

With n samples a prompt of pass rate p is solved (pass@n) with probability 1 - (1-p)^n; one more
sample adds p (1-p)^n. Those gains shrink with n, so giving each next sample to the prompt with
the largest predicted gain maximises the expected number of solved prompts. Easy prompts
(p near 1) are solved by their first sample and prompts out of reach (p near 0) gain nothing,
so the budget flows to prompts predicted hard but solvable.

A point prediction is trusted fully. With the predictor's uncertainty as a Beta(s mu,
s (1-mu)) of strength s (the PPM sampler's prior strength: its skill, in rollouts), the gain of
the (n+1)-th sample is its expectation E[p (1-p)^n] = mu prod_{j<n} (beta + j) / (alpha + beta
+ 1 + j): the allocation that maximises the expected solved share when the pass rates of the
prompts predicted at mu do follow that Beta. As s -> 0 the Beta's mass moves to 0 and 1
(prompts always or never solved), where extra samples change nothing; s -> infinity gives the
point rule back.
"""

from __future__ import annotations

import heapq

import numpy as np


def uniform_allocation(n_prompts: int, budget: int) -> np.ndarray:
    """budget samples spread as evenly as possible, (n_prompts,) ints summing to budget."""
    base, extra = divmod(budget, n_prompts)
    return np.array([base + (i < extra) for i in range(n_prompts)], dtype=np.int64)


def sample_gain(mu: float, n: int, strength: float | None = None) -> float:
    """Expected number of prompts newly solved by an (n+1)-th sample: p (1-p)^n at p = mu, or
    its mean under Beta(strength mu, strength (1-mu)).

    >>> round(sample_gain(0.5, 2), 4), round(sample_gain(0.5, 2, strength=2.0), 4)
    (0.125, 0.0833)
    """
    if strength is None:
        return mu * (1 - mu) ** n
    alpha, beta = strength * mu, strength * (1 - mu)
    g = mu
    for j in range(n):
        g *= (beta + j) / (alpha + beta + 1 + j)
    return g


def allocate_samples(
    pred: np.ndarray,
    budget: int,
    min_per_prompt: int = 1,
    max_per_prompt: int | None = None,
    strength: float | np.ndarray | None = None,
) -> np.ndarray:
    """Greedy pass@n allocation from predicted pass rates pred (N,) -> samples per prompt (N,).

    Every prompt gets min_per_prompt; each further sample goes to the prompt with the largest
    expected gain `sample_gain` (ties: lowest index), up to max_per_prompt; sum == budget
    unless the caps make that impossible. strength: the predictions' worth in rollouts, one
    for all or (N,) per prompt (None: exact).

    >>> allocate_samples(np.array([0.99, 0.3, 0.0]), 6).tolist()
    [1, 4, 1]
    """
    eps = 0.0 if strength is None else 1e-6  # a Beta needs both parameters positive
    p = np.clip(np.asarray(pred, dtype=float), eps, 1.0 - eps)
    n = len(p)
    if budget < min_per_prompt * n:
        raise ValueError(f"budget {budget} < min_per_prompt {min_per_prompt} x {n} prompts")
    if strength is not None and np.any(np.asarray(strength) <= 0):
        raise ValueError(f"strength is a prior's worth in rollouts and must be > 0, got {strength}")
    per_prompt = strength is not None and np.ndim(strength) > 0
    alloc = np.full(n, min_per_prompt, dtype=np.int64)
    cap = np.iinfo(np.int64).max if max_per_prompt is None else max_per_prompt

    def gain(i: int) -> float:
        k = float(strength[i]) if per_prompt else strength
        return sample_gain(float(p[i]), int(alloc[i]), k)

    heap = [(-gain(i), i) for i in range(n) if alloc[i] < cap]
    heapq.heapify(heap)
    for _ in range(budget - int(alloc.sum())):
        if not heap:
            break
        _, i = heapq.heappop(heap)
        alloc[i] += 1
        if alloc[i] < cap:
            heapq.heappush(heap, (-gain(i), i))
    return alloc


def expected_pass_at_n(alloc: np.ndarray, true_p: np.ndarray) -> float:
    """Expected share of prompts solved by at least one of their samples: mean 1 - (1-p)^n."""
    return float(np.mean(1 - (1 - np.asarray(true_p, dtype=float)) ** np.asarray(alloc)))


def sampled_pass_at_n(alloc: np.ndarray, true_p: np.ndarray, rng: np.random.Generator) -> float:
    """The same accuracy from one simulated evaluation (Bernoulli draws)."""
    solved = [rng.random(int(k)) < p for k, p in zip(alloc, true_p, strict=True)]
    return float(np.mean([s.any() for s in solved]))


def compare_allocations(
    pred: np.ndarray,
    true_p: np.ndarray,
    budget: int,
    strength: float | np.ndarray | None = None,
) -> dict:
    """Guided vs uniform accuracy at one budget, and the budget guided needs to match uniform
    (guided: `allocate_samples` with the predictions' strength).

    Returns uniform_accuracy, guided_accuracy, guided_budget_at_uniform_accuracy and
    compute_saved = 1 - that budget / budget (the inference compute saved at equal accuracy).
    """
    n = len(pred)
    uni = expected_pass_at_n(uniform_allocation(n, budget), true_p)
    guided = expected_pass_at_n(allocate_samples(pred, budget, strength=strength), true_p)
    lo, hi = n, budget  # smallest guided budget reaching the uniform accuracy (monotone search)
    if expected_pass_at_n(allocate_samples(pred, hi, strength=strength), true_p) < uni:
        lo = hi
    while lo < hi:
        mid = (lo + hi) // 2
        if expected_pass_at_n(allocate_samples(pred, mid, strength=strength), true_p) >= uni:
            hi = mid
        else:
            lo = mid + 1
    return {
        "uniform_accuracy": uni,
        "guided_accuracy": guided,
        "guided_budget_at_uniform_accuracy": lo,
        "compute_saved": 1 - lo / budget,
    }
