"""What selection costs, counted in the unit rollouts are paid in: generated tokens.

A decoded token is one unit. A prompt token read in one forward pass (prefill: the rollouts'
prompts, a `hidden` featurizer's whole pass, a greedy decode's prompt) costs `prefill_ratio`
units, the time of a prefill token over the time of a decoded token on the same policy and
batch, measured (`measure_prefill_ratio`), not assumed: 0.5-0.66 for the bench's tiny policy
and 8-token prompts on 2 CPU cores, where each pass costs about as much as its overhead; on a
GPU, where a decode step is bound by memory bandwidth, a prefill token is far cheaper.
`Compute` counts both for rollouts and for scoring alike, so "compute to target" charges a
sampler for the generations its predictor spends as well as for the rollouts it asks for.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass
class Compute:
    decoded: int = 0
    """tokens generated one step at a time"""
    prefilled: int = 0
    """prompt tokens read in a forward pass"""

    def add(self, prefilled: int = 0, decoded: int = 0) -> None:
        self.prefilled += int(prefilled)
        self.decoded += int(decoded)

    def add_samples(self, samples) -> None:
        """A batch of completions: its prompts prefilled, its completion tokens decoded."""
        self.add(sum(map(len, samples.prompt_tokens)), sum(map(len, samples.tokens)))

    def units(self, prefill_ratio: float) -> float:
        """Decoded-token equivalents."""
        return self.decoded + prefill_ratio * self.prefilled

    def as_dict(self) -> dict:
        return {"decoded": self.decoded, "prefilled": self.prefilled}


@torch.no_grad()
def measure_prefill_ratio(policy, texts: list[str], new_tokens: int = 16, repeats: int = 5):
    """(ratio, detail): seconds per prefilled prompt token over seconds per decoded token, for
    `texts` as one batch on `policy`. A prefill is one forward pass over the prompts; a decoded
    token is one step of a greedy decode with the KV cache, the prefill taken out. Each time is
    the fastest of `repeats`: other processes on the same cores only ever add time, and a
    median of differences let one slow prefill make the decode look free (a ratio of 70 where
    it was 0.6 with the cores to itself)."""
    from rlstream.trainers.sampling import sample_ids

    m, tok = policy.model, policy.tok
    enc = tok.encode_prompts(texts)
    length = min(min(map(len, enc)), m.block_size - new_tokens)
    batch = [e[-length:] for e in enc]
    x = torch.tensor(batch, device=next(m.parameters()).device)
    prefill, generate = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        m.lm(input_ids=x, attention_mask=torch.ones_like(x))
        prefill.append(time.perf_counter() - t)
        t = time.perf_counter()
        tokens, _, _ = sample_ids(m, tok, batch, new_tokens, 0.0, 1.0, (), True, None)
        generate.append(time.perf_counter() - t)
        decoded = sum(map(len, tokens))
    prefill_s = min(prefill)
    decode_s = max(min(generate) - prefill_s, 1e-9)
    ratio = (prefill_s / (len(batch) * length)) / (decode_s / max(decoded, 1))
    detail = {"prefill_ratio": ratio, "prompts": len(batch), "prompt_tokens": length,
              "decoded_tokens": decoded, "prefill_s": prefill_s, "decode_s": decode_s}  # fmt: skip
    return ratio, detail
