"""Held-out evaluation, one metric vocabulary for every loop and benchmark.

`evaluate(policy, prompts, max_new_tokens, k, temperature, seed)` runs every registered
evaluator (`EVALUATORS`: greedy, pass1) over the prompts and returns, for each metric `m`,
`m` (the mean) and `m_by_task` (per task family); `pass1` also gives `pass_rates` (each prompt's
share of k correct samples). The in-process loop, the stream trainer (rl.eval_results.v1 rows
with task "all" or the family) and the selection benchmark all read these keys.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from rlstream.registry import Registry
from rlstream.trainers.envs import Prompt, verify
from rlstream.trainers.sampling import sample

# fn(model, tok, prompts, max_new_tokens, k, temperature, generator) -> per-prompt scores
EVALUATORS = Registry("evaluator")
register_evaluator = EVALUATORS.register
EVAL_SEED_OFFSET = 123  # evaluation samples draw from their own generator: seed + 123


@register_evaluator("greedy")
def greedy(model, tok, prompts, max_new_tokens, k, temperature, generator) -> list[float]:
    """1 where the greedy completion verifies."""
    s = sample(model, tok, [p.text for p in prompts], 1, max_new_tokens, temperature=0)
    return [float(verify(c, p)) for c, p in zip(s.texts, prompts, strict=True)]


@register_evaluator("pass1")
def pass1(model, tok, prompts, max_new_tokens, k, temperature, generator) -> list[float]:
    """The share of k temperature samples that verify (k = 0: not measured)."""
    if not k:
        return []
    texts = [p.text for p in prompts]
    s = sample(model, tok, texts, k, max_new_tokens, temperature=temperature, generator=generator)
    ok = [float(verify(c, prompts[j])) for c, j in zip(s.texts, s.prompt_index, strict=True)]
    return [sum(ok[j * k : (j + 1) * k]) / k for j in range(len(prompts))]


def by_task(prompts: list[Prompt], scores: list[float]) -> dict[str, float]:
    groups: dict[str, list[float]] = defaultdict(list)
    for p, c in zip(prompts, scores, strict=True):
        groups[p.task].append(c)
    return {k: sum(v) / len(v) for k, v in sorted(groups.items())}


@torch.no_grad()
def evaluate(
    model,
    tok,
    prompts: list[Prompt],
    max_new_tokens: int,
    k: int = 8,
    temperature: float = 1.0,
    seed: int = 0,
    batch_prompts: int = 256,
) -> dict:
    """{'greedy', 'greedy_by_task', 'pass1', 'pass1_by_task', 'pass_rates'} (pass1 keys only
    when k > 0). Sampling uses its own generator seeded by `seed`, so evaluating never moves
    training RNG."""
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    scores: dict[str, list[float]] = {name: [] for name in EVALUATORS}
    for i in range(0, len(prompts), batch_prompts):
        chunk = prompts[i : i + batch_prompts]
        for name, fn in EVALUATORS.items():
            scores[name] += fn(model, tok, chunk, max_new_tokens, k, temperature, g)
    out: dict = {}
    for name, values in scores.items():
        if values:
            out[name] = sum(values) / len(values)
            out[f"{name}_by_task"] = by_task(prompts, values)
    if scores.get("pass1"):
        out["pass_rates"] = scores["pass1"]
    return out


def evaluate_with(model, tok, prompts: list[Prompt], cfg, k: int | None = None, seed=None):
    """`evaluate` with a Config's settings: rl.max_new_tokens, rl.temperature, k samples
    (default eval.samples), seeded by `seed` (default cfg.seed) + EVAL_SEED_OFFSET."""
    k = cfg.eval.samples if k is None else k
    seed = (cfg.seed if seed is None else seed) + EVAL_SEED_OFFSET
    return evaluate(model, tok, prompts, cfg.rl.max_new_tokens, k, cfg.rl.temperature, seed)
