"""Pre-training data and step: a corpus of worked solutions (some systematically flawed) and
next-token loss on padded document batches.

A document is `prompt text + answer + "\\n"`. With probability `flaw_rate` a prompt whose class
has a systematic mistake (family.flawed_answer) is written with that mistake instead, so the
pre-trained model's most likely answer on those classes is wrong in a way RL can fix (INFRA.md).
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from rlstream.trainers.envs import Prompt, TaskMix, get_task, split_of
from rlstream.trainers.lm import Tokenizer


def worked_document(prompt: Prompt, rng: random.Random, flaw_rate: float) -> str:
    """The prompt with its answer, or with its family's systematic mistake at rate flaw_rate;
    a family whose prompts are episodes writes the whole episode (its `transcript`)."""
    family, answer = get_task(prompt.task), prompt.answer
    if flaw_rate > 0:
        flawed = family.flawed_answer(prompt)
        if flawed is not None and rng.random() < flaw_rate:
            answer = flawed
    if hasattr(family, "transcript"):
        answer = family.transcript(prompt, flawed=answer != prompt.answer)
    return prompt.text + answer + "\n"


def build_corpus(
    mix: TaskMix, n_docs: int, flaw_rate: float, seed: int, split_seed: int, fmt: str = "direct"
) -> list[str]:
    """n_docs worked documents from the train split only (held-out prompts never appear), in
    format `fmt` (direct: the answer; cot: a worked solution, `envs/cot.py`)."""
    from rlstream.trainers.envs import cot

    write = cot.document if fmt == "cot" else worked_document
    rng = random.Random(f"corpus:{seed}")
    docs = []
    while len(docs) < n_docs:
        p = mix.draw(rng)
        if split_of(p.prompt_id, split_seed, mix.heldout_frac) == "train":
            docs.append(write(p, rng, flaw_rate))
    return docs


VAL_DOCS = 4096  # validation documents: a separate draw of the generated corpus (seed + 1)


def validation_corpus(cfg, tok: Tokenizer) -> Corpus:
    """The fixed validation documents the plateau detector is judged on (cfg: a Config)."""
    mix = TaskMix.parse(cfg.data.tasks)
    docs = build_corpus(mix, VAL_DOCS, cfg.data.flaw_rate, cfg.seed + 1, cfg.seed, cfg.data.format)
    return Corpus(docs, tok, cfg.model.block_size)


def generated_corpus(cfg, tok: Tokenizer) -> Corpus:
    """cfg.data.corpus_docs worked documents from the task mix's train split."""
    mix = TaskMix.parse(cfg.data.tasks)
    docs = build_corpus(
        mix, cfg.data.corpus_docs, cfg.data.flaw_rate, cfg.seed, cfg.seed, cfg.data.format
    )
    return Corpus(docs, tok, cfg.model.block_size)


IGNORE = -100  # a target no loss counts (padding; works for tokenizers whose pad is EOS)


ENCODE_CHUNK = 4096  # documents tokenised at once


class Corpus:
    """Documents as rows of one right-padded tensor (grown by doubling); `extend` appends."""

    def __init__(self, docs: list[str], tok: Tokenizer, block_size: int):
        self.tok, self.width = tok, block_size + 1
        self.data = torch.full((max(1024, len(docs)), self.width), tok.pad_id, dtype=torch.long)
        self.lens = torch.zeros(len(self.data), dtype=torch.long)
        self.n = 0
        self.extend(docs)

    def extend(self, docs: list[str]) -> None:
        """Tokenised a chunk at a time: a tokenizer's per-document objects for a whole corpus
        would stay in the process's heap long after they are freed (+200 MB for 100k)."""
        while self.n + len(docs) > len(self.data):
            pad = torch.full_like(self.data, self.tok.pad_id)
            self.data, self.lens = (
                torch.cat([self.data, pad]),
                torch.cat([self.lens, self.lens * 0]),
            )
        for start in range(0, len(docs), ENCODE_CHUNK):
            rows = [r[: self.width] for r in self.tok.encode_documents(
                docs[start : start + ENCODE_CHUNK])]  # fmt: skip
            padded = [r + [self.tok.pad_id] * (self.width - len(r)) for r in rows]
            self.data[self.n : self.n + len(rows)] = torch.tensor(padded, dtype=torch.long)
            self.lens[self.n : self.n + len(rows)] = torch.tensor([len(r) for r in rows])
            self.n += len(rows)

    def __len__(self) -> int:
        return self.n

    def batch(
        self, batch_size: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y) (B, L-1): inputs and targets, targets IGNORE past each document's end."""
        idx = torch.randint(self.n, (batch_size,), generator=generator)
        rows, lens = self.data[idx], self.lens[idx]
        L = int(lens.max())
        past_end = torch.arange(L - 1)[None, :] >= (lens - 1)[:, None]
        return rows[:, : L - 1], rows[:, 1:L].masked_fill(past_end, IGNORE)


def lm_loss(model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the targets that are not IGNORE. x, y (B, T)."""
    logits = model(x)
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), ignore_index=IGNORE)


class Plateau:
    """Convergence: stop after `patience` evaluations without a `min_delta` improvement."""

    def __init__(self, patience: int, min_delta: float):
        self.patience, self.min_delta = patience, min_delta
        self.best, self.bad = float("inf"), 0

    def update(self, val_loss: float) -> bool:
        """Record a validation loss; True when the plateau has lasted `patience` evaluations."""
        if val_loss < self.best - self.min_delta:
            self.best, self.bad = val_loss, 0
        else:
            self.bad += 1
        return self.bad >= self.patience

    def state_dict(self) -> dict:
        return {"best": self.best, "bad": self.bad}

    def load_state_dict(self, s: dict) -> None:
        self.best, self.bad = s["best"], s["bad"]


@torch.no_grad()
def eval_loss(model, corpus: Corpus, batches: int, batch_size: int, seed: int) -> float:
    """Mean loss over a fixed set of batches (the same every call, by seed)."""
    g = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    batches_ = [corpus.batch(batch_size, g) for _ in range(batches)]
    losses = [lm_loss(model, x.to(device), y.to(device)) for x, y in batches_]
    return float(torch.stack(losses).mean())
