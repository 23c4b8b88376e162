"""Held-out evaluation: greedy accuracy and pass@1 (mean correctness of k samples)."""

from __future__ import annotations

from collections import defaultdict

import torch

from rlstream.trainers.envs import Prompt, verify
from rlstream.trainers.model import GPT, CharTokenizer
from rlstream.trainers.sampling import sample


def _per_task(prompts: list[Prompt], correct: list[float]) -> dict[str, float]:
    by: dict[str, list[float]] = defaultdict(list)
    for p, c in zip(prompts, correct, strict=True):
        by[p.task].append(c)
    return {k: sum(v) / len(v) for k, v in sorted(by.items())}


@torch.no_grad()
def evaluate(
    model: GPT,
    tok: CharTokenizer,
    prompts: list[Prompt],
    max_new_tokens: int,
    k: int = 8,
    temperature: float = 1.0,
    seed: int = 0,
    batch_prompts: int = 256,
) -> dict:
    """{'greedy': acc, 'pass1': mean correctness of k samples, 'greedy_by_task', 'pass1_by_task'}.

    Sampling uses its own generator seeded by `seed`, so evaluating never moves training RNG.
    """
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    greedy, sampled = [], []
    for i in range(0, len(prompts), batch_prompts):
        chunk = prompts[i : i + batch_prompts]
        texts = [p.text for p in chunk]
        s = sample(model, tok, texts, 1, max_new_tokens, temperature=0)
        greedy += [float(verify(c, p)) for c, p in zip(s.texts, chunk, strict=True)]
        if k:
            s = sample(model, tok, texts, k, max_new_tokens, temperature=temperature, generator=g)
            ok = [float(verify(c, chunk[j])) for c, j in zip(s.texts, s.prompt_index, strict=True)]
            sampled += [sum(ok[j * k : (j + 1) * k]) / k for j in range(len(chunk))]
    out = {"greedy": sum(greedy) / len(greedy), "greedy_by_task": _per_task(prompts, greedy)}
    if k:
        out["pass1"] = sum(sampled) / len(sampled)
        out["pass1_by_task"] = _per_task(prompts, sampled)
    return out
