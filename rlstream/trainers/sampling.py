"""Batched sampling with a KV cache: G completions per prompt, temperature, top-p, stop tokens.

Prompts are left-padded; positions start at 0 at each prompt's first real token and a key mask
hides the padding, so the logits match an unpadded forward pass of the same text.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlstream.trainers.model import GPT, CharTokenizer


@dataclass
class Samples:
    """Completions in prompt-major order: rows i*n .. i*n+n-1 belong to prompt i."""

    prompt_index: list[int]
    prompt_tokens: list[list[int]]
    tokens: list[list[int]]  # completion tokens, including the stop token when one was sampled
    texts: list[str]  # completion text without the stop token
    logprobs: list[list[float]]  # log p(token) under the sampling distribution (temperature)


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero out the tail beyond cumulative mass top_p (always keeping the top token). (B, V)"""
    sorted_p, idx = probs.sort(dim=-1, descending=True)
    drop = sorted_p.cumsum(-1) - sorted_p > top_p
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter(-1, idx, sorted_p)


@torch.no_grad()
def sample(
    model: GPT,
    tok: CharTokenizer,
    prompts: list[str],
    n: int = 1,
    max_new_tokens: int = 8,
    temperature: float = 1.0,
    top_p: float = 1.0,
    stop: tuple[str, ...] = ("\n",),
    use_cache: bool = True,
    generator: torch.Generator | None = None,
) -> Samples:
    """Sample n completions per prompt in one batch; temperature 0 is greedy."""
    device = next(model.parameters()).device
    enc = [tok.encode(p) for p in prompts for _ in range(n)]
    B, P = len(enc), max(len(e) for e in enc)
    if P + max_new_tokens > model.config.block_size:
        raise ValueError(f"prompt {P} + {max_new_tokens} new tokens > block_size")
    stop_ids = torch.tensor([tok.stoi[s] for s in stop], device=device)
    idx = torch.full((B, P), tok.pad_id, dtype=torch.long, device=device)
    valid = torch.zeros((B, P), dtype=torch.bool, device=device)
    for i, e in enumerate(enc):
        idx[i, P - len(e) :], valid[i, P - len(e) :] = torch.tensor(e), True
    out_tok = torch.full((B, max_new_tokens), tok.pad_id, dtype=torch.long, device=device)
    out_lp = torch.zeros((B, max_new_tokens), device=device)
    alive = torch.ones(B, dtype=torch.bool, device=device)
    lengths = torch.zeros(B, dtype=torch.long, device=device)
    cache = [[None, None] for _ in model.h] if use_cache else None
    seq, seq_valid = idx, valid
    for t in range(max_new_tokens):
        Tk = seq.shape[1]
        pos_all = (seq_valid.cumsum(1) - 1).clamp(min=0)  # (B, Tk)
        causal = torch.ones(Tk, Tk, dtype=torch.bool, device=device).tril()
        mask = (causal[None] & seq_valid[:, None, :]) | torch.eye(
            Tk, dtype=torch.bool, device=device
        )[None]
        if use_cache and t > 0:  # feed only the newest token; it sees every valid key
            logits = model(seq[:, -1:], pos_all[:, -1:], seq_valid[:, None, None, :], cache)
        else:
            logits = model(seq, pos_all, mask[:, None], cache)
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
        out_tok[:, t] = nxt
        out_lp[:, t] = logp.gather(-1, nxt[:, None]).squeeze(-1) * alive
        lengths += alive
        alive &= ~torch.isin(nxt, stop_ids)
        seq = torch.cat([seq, nxt[:, None]], 1)
        seq_valid = torch.cat([seq_valid, torch.ones(B, 1, dtype=torch.bool, device=device)], 1)
        if not alive.any():
            break
    tokens = [out_tok[i, : lengths[i]].tolist() for i in range(B)]
    stop_set = set(stop_ids.tolist())
    texts = [tok.decode([t for t in ts if t not in stop_set]) for ts in tokens]
    return Samples(
        prompt_index=[i for i in range(len(prompts)) for _ in range(n)],
        prompt_tokens=enc,
        tokens=tokens,
        texts=texts,
        logprobs=[out_lp[i, : lengths[i]].tolist() for i in range(B)],
    )
