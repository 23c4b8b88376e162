"""Batched sampling with a KV cache: G completions per prompt, temperature, top-p, stop strings.

Prompts are left-padded; an attention mask hides the padding and positions start at 0 at each
prompt's first real token, so the logits match an unpadded forward pass of the same text (the
sampler's logprobs equal a teacher-forced pass: tested). The cache is transformers' own
(`DynamicCache`); each step feeds only the newest token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlstream.trainers.lm import CausalLM, Tokenizer


@dataclass
class Samples:
    """Completions in prompt-major order: rows i*n .. i*n+n-1 belong to prompt i."""

    prompt_index: list[int]
    prompt_tokens: list[list[int]]
    tokens: list[list[int]]  # completion tokens, including the stop token when one was sampled
    texts: list[str]  # completion text up to (without) the stop string or EOS
    logprobs: list[list[float]]  # log p(token) under the sampling distribution (temperature)
    finish_reasons: list[str]  # "stop" (EOS or a stop string) or "length" (max_new_tokens)
    episodes: list | None = None  # multi-turn: each row's `environments.episodes.Episode`


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero out the tail beyond cumulative mass top_p (always keeping the top token). (B, V)"""
    sorted_p, idx = probs.sort(dim=-1, descending=True)
    drop = sorted_p.cumsum(-1) - sorted_p > top_p
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter(-1, idx, sorted_p)


def completion_text(tok: Tokenizer, tokens: list[int], stop: tuple[str, ...]) -> str:
    """The text of completion tokens up to EOS or the first stop string (whichever is first)."""
    if tok.eos_id in tokens:
        tokens = tokens[: tokens.index(tok.eos_id)]
    text = tok.decode(tokens)
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=len(text))
    return text[:cut]


@torch.no_grad()
def sample(
    model: CausalLM,
    tok: Tokenizer,
    prompts: list[str],
    n: int = 1,
    max_new_tokens: int = 8,
    temperature: float = 1.0,
    top_p: float = 1.0,
    stop: tuple[str, ...] = ("\n",),
    use_cache: bool = True,
    generator: torch.Generator | None = None,
) -> Samples:
    """Sample n completions per prompt in one batch (each prompt formatted by the tokenizer:
    its chat template when it has one); temperature 0 is greedy."""
    enc = [e for e in tok.encode_prompts(prompts) for _ in range(n)]
    tokens, logprobs, finish = sample_ids(model, tok, enc, max_new_tokens, temperature, top_p,
                                          stop, use_cache, generator)  # fmt: skip
    return Samples(
        prompt_index=[i for i in range(len(prompts)) for _ in range(n)],
        prompt_tokens=enc,
        tokens=tokens,
        texts=[completion_text(tok, ts, stop) for ts in tokens],
        logprobs=logprobs,
        finish_reasons=finish,
    )


@torch.no_grad()
def sample_ids(
    model: CausalLM,
    tok: Tokenizer,
    enc: list[list[int]],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    stop: tuple[str, ...] = ("\n",),
    use_cache: bool = True,
    generator: torch.Generator | None = None,
) -> tuple[list[list[int]], list[list[float]], list[str]]:
    """One continuation of each token context in `enc` (token in, token out: an episode's next
    policy turn continues the exact ids it sampled before, never a re-tokenised text); the
    sampled ids (with their stop token), their logprobs and "stop" or "length" for each."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    B, P = len(enc), max(len(e) for e in enc)
    if P + max_new_tokens > model.block_size:
        raise ValueError(f"prompt {P} + {max_new_tokens} new tokens > block_size")
    stop_ids = torch.tensor(sorted(tok.stop_ids(stop)), device=device)
    # the whole sequence and its mask, allocated once: step t fills column P + t
    seq = torch.full((B, P + max_new_tokens), tok.pad_id, dtype=torch.long, device=device)
    valid = torch.zeros((B, P + max_new_tokens), dtype=torch.long, device=device)
    for i, e in enumerate(enc):
        seq[i, P - len(e) : P], valid[i, P - len(e) : P] = torch.tensor(e), 1
    valid[:, P:] = 1  # generated positions are real tokens (padding after a stop is ignored)
    positions = (valid.cumsum(1) - 1).clamp(min=0)
    out_lp = torch.zeros((B, max_new_tokens), device=device)
    alive = torch.ones(B, dtype=torch.bool, device=device)
    lengths = torch.zeros(B, dtype=torch.long, device=device)
    cache = DynamicCache() if use_cache else None
    for t in range(max_new_tokens):
        end = P + t  # tokens so far
        if use_cache and t > 0:  # only the newest token; it sees every valid key in the cache
            newest = slice(end - 1, end)
            logits = model(seq[:, newest], valid[:, :end], positions[:, newest], cache)
        else:
            logits = model(seq[:, :end], valid[:, :end], positions[:, :end], cache)
        logits = logits[:, -1, :].float()  # (B, V)
        if temperature == 0:
            nxt = logits.argmax(-1)
            logp = F.log_softmax(logits, -1)
        else:
            logp = F.log_softmax(logits / temperature, -1)
            probs = logp.exp()
            if top_p < 1.0:
                probs = _top_p_filter(probs, top_p)
            nxt = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        nxt = torch.where(alive, nxt, tok.pad_id)
        seq[:, end] = nxt
        out_lp[:, t] = logp.gather(-1, nxt[:, None]).squeeze(-1) * alive
        lengths += alive
        alive &= ~torch.isin(nxt, stop_ids)
        if not alive.any():
            break
    out_tok = seq[:, P:]
    tokens = [out_tok[i, : lengths[i]].tolist() for i in range(B)]
    logprobs = [out_lp[i, : lengths[i]].tolist() for i in range(B)]
    return tokens, logprobs, ["length" if a else "stop" for a in alive.tolist()]
