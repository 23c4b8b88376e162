"""Test-time allocation: spend an evaluation budget where extra samples change the outcome.

With n samples a prompt of pass rate p is solved (pass@n) with probability 1 - (1-p)^n; one more
sample adds p (1-p)^n. Those gains shrink with n, so giving each next sample to the prompt with
the largest predicted gain maximises the expected number of solved prompts. Easy prompts
(p near 1) are solved by their first sample and prompts out of reach (p near 0) gain nothing,
so the budget flows to prompts predicted hard but solvable.
"""

from __future__ import annotations

import heapq

import numpy as np


def uniform_allocation(n_prompts: int, budget: int) -> np.ndarray:
    """budget samples spread as evenly as possible, (n_prompts,) ints summing to budget."""
    base, extra = divmod(budget, n_prompts)
    return np.array([base + (i < extra) for i in range(n_prompts)], dtype=np.int64)


def allocate_samples(
    pred: np.ndarray, budget: int, min_per_prompt: int = 1, max_per_prompt: int | None = None
) -> np.ndarray:
    """Greedy pass@n allocation from predicted pass rates pred (N,) -> samples per prompt (N,).

    Every prompt gets min_per_prompt; each further sample goes to the prompt with the largest
    predicted gain p (1-p)^n (ties: lowest index), up to max_per_prompt; sum == budget unless
    the caps make that impossible.

    >>> allocate_samples(np.array([0.99, 0.3, 0.0]), 6).tolist()
    [1, 4, 1]
    """
    p = np.clip(np.asarray(pred, dtype=float), 0.0, 1.0)
    n = len(p)
    if budget < min_per_prompt * n:
        raise ValueError(f"budget {budget} < min_per_prompt {min_per_prompt} x {n} prompts")
    alloc = np.full(n, min_per_prompt, dtype=np.int64)
    cap = np.iinfo(np.int64).max if max_per_prompt is None else max_per_prompt
    heap = [(-p[i] * (1 - p[i]) ** alloc[i], i) for i in range(n) if alloc[i] < cap]
    heapq.heapify(heap)
    for _ in range(budget - int(alloc.sum())):
        if not heap:
            break
        _, i = heapq.heappop(heap)
        alloc[i] += 1
        if alloc[i] < cap:
            heapq.heappush(heap, (-p[i] * (1 - p[i]) ** alloc[i], i))
    return alloc


def expected_pass_at_n(alloc: np.ndarray, true_p: np.ndarray) -> float:
    """Expected share of prompts solved by at least one of their samples: mean 1 - (1-p)^n."""
    return float(np.mean(1 - (1 - np.asarray(true_p, dtype=float)) ** np.asarray(alloc)))


def sampled_pass_at_n(alloc: np.ndarray, true_p: np.ndarray, rng: np.random.Generator) -> float:
    """The same accuracy from one simulated evaluation (Bernoulli draws)."""
    solved = [rng.random(int(k)) < p for k, p in zip(alloc, true_p, strict=True)]
    return float(np.mean([s.any() for s in solved]))


def compare_allocations(pred: np.ndarray, true_p: np.ndarray, budget: int) -> dict:
    """Guided vs uniform accuracy at one budget, and the budget guided needs to match uniform.

    Returns uniform_accuracy, guided_accuracy, guided_budget_at_uniform_accuracy and
    compute_saved = 1 - that budget / budget (the inference compute saved at equal accuracy).
    """
    n = len(pred)
    uni = expected_pass_at_n(uniform_allocation(n, budget), true_p)
    guided = expected_pass_at_n(allocate_samples(pred, budget), true_p)
    lo, hi = n, budget  # smallest guided budget reaching the uniform accuracy (monotone search)
    if expected_pass_at_n(allocate_samples(pred, hi), true_p) < uni:
        lo = hi
    while lo < hi:
        mid = (lo + hi) // 2
        if expected_pass_at_n(allocate_samples(pred, mid), true_p) >= uni:
            hi = mid
        else:
            lo = mid + 1
    return {
        "uniform_accuracy": uni,
        "guided_accuracy": guided,
        "guided_budget_at_uniform_accuracy": lo,
        "compute_saved": 1 - lo / budget,
    }
