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

from rlstream.config import EnvConfig
from rlstream.registry import Registry
from rlstream.trainers.envs import Prompt, verify
from rlstream.trainers.sampling import sample

# fn(model, tok, prompts, max_new_tokens, k, temperature, generator, env) -> per-prompt scores
EVALUATORS = Registry("evaluator")
register_evaluator = EVALUATORS.register
EVAL_SEED_OFFSET = 123  # evaluation samples draw from their own generator: seed + 123


def solved(model, tok, prompts, n, max_new_tokens, temperature, generator, env) -> list[float]:
    """1.0 or 0.0 for each of n completions per prompt (prompt-major): a completion verifies;
    where the prompts name an environment they run as episodes, and an episode counts when
    its environment did not fail and its return is positive."""
    if not any(p.environment for p in prompts):
        s = sample(model, tok, [p.text for p in prompts], n, max_new_tokens,
                   temperature=temperature, generator=generator)  # fmt: skip
        return [float(verify(c, prompts[j])) for c, j in zip(s.texts, s.prompt_index, strict=True)]
    from rlstream.trainers.environments.episodes import run_episodes

    out = []
    for e in run_episodes(model, tok, prompts, n, max_new_tokens, temperature, env, generator):
        if e.env is None:
            out.append(float(verify(e.action, e.prompt)))
        else:
            out.append(float(e.error is None and e.reward > 0))
    return out


@register_evaluator("greedy")
def greedy(model, tok, prompts, max_new_tokens, k, temperature, generator, env) -> list[float]:
    """1 where the greedy completion (or episode) solves the prompt."""
    return solved(model, tok, prompts, 1, max_new_tokens, 0, None, env)


@register_evaluator("pass1")
def pass1(model, tok, prompts, max_new_tokens, k, temperature, generator, env) -> list[float]:
    """The share of k temperature samples that solve the prompt (k = 0: not measured)."""
    if not k:
        return []
    ok = solved(model, tok, prompts, k, max_new_tokens, temperature, generator, env)
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
    env: EnvConfig | None = None,
) -> dict:
    """{'greedy', 'greedy_by_task', 'pass1', 'pass1_by_task', 'pass_rates'} (pass1 keys only
    when k > 0). Sampling uses its own generator seeded by `seed`, so evaluating never moves
    training RNG."""
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    scores: dict[str, list[float]] = {name: [] for name in EVALUATORS}
    for i in range(0, len(prompts), batch_prompts):
        chunk = prompts[i : i + batch_prompts]
        for name, fn in EVALUATORS.items():
            scores[name] += fn(model, tok, chunk, max_new_tokens, k, temperature, g, env)
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
    return evaluate(model, tok, prompts, cfg.rl.max_new_tokens, k, cfg.rl.temperature, seed,
                    env=cfg.env)  # fmt: skip
