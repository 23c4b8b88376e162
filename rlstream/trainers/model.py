"""A nanoGPT-style decoder with an optional value head, and a char tokenizer that round-trips.

The forward pass takes explicit positions and a key mask so that left-padded prompt batches and a
KV cache give the same logits as right-padded training batches (sampling.py relies on this).
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

PAD, EOS = "\x00", "\n"


class CharTokenizer:
    """Printable ASCII plus newline (the stop token) and a pad token; decode(encode(s)) == s.

    >>> tok = CharTokenizer()
    >>> tok.decode(tok.encode("037+085=2210\\n"))
    '037+085=2210\\n'
    """

    def __init__(self, alphabet: str = string.printable[:95]):
        self.itos = [PAD, EOS] + [c for c in alphabet if c not in (PAD, EOS)]
        self.stoi = {c: i for i, c in enumerate(self.itos)}
        self.pad_id, self.eos_id = self.stoi[PAD], self.stoi[EOS]

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> list[int]:
        try:
            return [self.stoi[c] for c in text]
        except KeyError as e:
            raise ValueError(
                f"character {e.args[0]!r} is not in the tokenizer's alphabet"
            ) from None

    def decode(self, ids: list[int]) -> str:
        return "".join(self.itos[i] for i in ids if i != self.pad_id)


@dataclass
class GPTConfig:
    vocab_size: int = 97
    block_size: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    value_head: bool = False


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x, mask=None, cache=None):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if cache is not None:  # append this step's keys/values to the cache: (B, nh, Tk, hs)
            if cache[0] is not None:
                k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
            cache[0], cache[1] = k, v
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(cfg.n_embd), nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        )

    def forward(self, x, mask=None, cache=None):
        x = x + self.attn(self.ln_1(x), mask, cache)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as in nanoGPT
        self.value_head = nn.Linear(cfg.n_embd, 1) if cfg.value_head else None
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # scaled residual init (GPT-2)
            if name.endswith("c_proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx, pos=None, mask=None, cache=None, values: bool = False):
        """Logits (B, T, V) for tokens idx (B, T); plus values (B, T) when values=True.

        pos (B, T): positions (default 0..T-1). mask (B, 1, T, Tk) bool: which keys each query
        sees (default causal). cache: a list of [k, v] per layer, filled and extended in place.
        """
        B, T = idx.shape
        if pos is None:
            pos = torch.arange(T, device=idx.device).expand(B, T)
        if int(pos.max()) >= self.config.block_size:
            raise ValueError(f"sequence longer than block_size {self.config.block_size}")
        x = self.wte(idx) + self.wpe(pos)  # (B, T, C)
        for i, block in enumerate(self.h):
            x = block(x, mask, None if cache is None else cache[i])
        x = self.ln_f(x)
        logits = self.lm_head(x)
        if not values:
            return logits
        if self.value_head is None:
            raise ValueError("this model has no value head (GPTConfig.value_head=False)")
        return logits, self.value_head(x).squeeze(-1)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) per position: logits (B, T, V), targets (B, T) -> (B, T)."""
    return torch.gather(F.log_softmax(logits.float(), dim=-1), -1, targets.unsqueeze(-1)).squeeze(
        -1
    )
