"""The in-process loop: pre-train until the validation loss plateaus, then RL, then evaluate.

`train_local(Config(...), LocalOptions(...)) -> summary dict` is the Python API behind
`rlstream train --mode local`. Read top to bottom: setup -> pre-training loop -> hand-off ->
RL loop -> report. The updates are the training core's (`trainers/core.py`); this file owns
only where the data comes from (files or the generated rows, `collect` from the sampler), when to
evaluate and checkpoint, and what to log. Every random draw comes from a generator whose state
is checkpointed, so a resumed run repeats the uninterrupted one exactly (CPU, same threads).
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rlstream import sandbox
from rlstream.config import Config, ConfigError, to_dict
from rlstream.tracking import track_local, tracking_uri
from rlstream.trainers.checkpoint import (
    CheckpointStore,
    DirectoryStore,
    latest_checkpoint,
    save_checkpoint,
    set_rng_state,
)
from rlstream.trainers.collect import collect
from rlstream.trainers.core import TrainState, pretrain_step, rl_update
from rlstream.trainers.datasets import local_view, usable, with_tokenizer
from rlstream.trainers.evaluate import evaluate_with
from rlstream.trainers.pretrain import Corpus
from rlstream.trainers.report import bar_info, make_summary, progress_bars, write_outputs
from rlstream.trainers.rewards import make_reward_fn
from rlstream.trainers.selection.registry import build_sampler, policy_moved


@dataclass
class LocalOptions:
    """What the in-process loop writes and where (the training settings are the Config)."""

    checkpoint_dir: str | None = None
    """directory for checkpoints (none: no checkpoints)"""
    resume: bool = False
    """continue from the newest checkpoint in checkpoint_dir"""
    out_dir: str | None = None
    """where history.json, curves.png and config.yaml go"""
    summary: str | None = None
    """path of the summary JSON"""
    progress: bool = True
    """progress bars on a terminal and the final table (off, or no terminal: a plain line at
    every evaluation and every 5 s)"""


class Run:
    """The loop's state: the train state plus its data, sampler, history and checkpoint store."""

    def __init__(self, cfg: Config, store=None, sampler=None):
        self.cfg = c = cfg
        self.state = TrainState(cfg, threads=cfg.threads(streaming=False))
        view, self.bad_rows = local_view(c)
        try:
            data = usable(view, c, self.state.tok)
        except ValueError as exc:
            raise ConfigError(f"data.prompts: {exc}") from None
        self.dataset, self.refused = view.name, data.refused
        self.corpus = Corpus(data.docs, self.state.tok, c.model.block_size)
        self.val = Corpus(data.validation, self.state.tok, c.model.block_size)
        self.added_docs: list[str] = []
        self.eval_set = data.eval_set
        if sampler is None:
            sampler = build_sampler(c, data.pool, self.state.policy)
        self.sampler = sampler
        self.reward_fn = make_reward_fn(c.rl.reward_rules, c.rl.reward_fn)
        self.history: list[dict] = []
        self.pretrain_eval: dict = {}
        self.generated = 0  # rollouts generated, zero-variance rounds the filter dropped included
        self.store = store

    def state_dict(self) -> dict:
        return self.state.state_dict() | {
            "sampler": self.sampler.state_dict(),
            "history": self.history,
            "pretrain_eval": self.pretrain_eval,
            "added_docs": self.added_docs,
            "generated": self.generated,
            "config": to_dict(self.cfg),
        }

    def load_state_dict(self, s: dict) -> None:
        self.state.load_state_dict(s)
        self.sampler.load_state_dict(s["sampler"])
        self.history, self.pretrain_eval = s["history"], s["pretrain_eval"]
        self.added_docs, self.generated = s["added_docs"], s["generated"]
        self.corpus.extend(self.added_docs)
        set_rng_state(s["rng"])

    def maybe_checkpoint(self) -> None:
        every = self.cfg.checkpoint.every
        if self.store is not None and self.state.step % every == 0:
            save_checkpoint(
                self.store, self.state.step, self.state_dict(), self.cfg.checkpoint.keep_last
            )

    def evaluate(self) -> dict:
        ev = evaluate_with(self.state.model, self.state.tok, self.eval_set, self.cfg)
        ev.pop("pass_rates", None)
        return ev


def rl_step(run: Run) -> dict:
    """Collect a batch from the sampler, (hybrid: mix in LM loss, feed verified rollouts back),
    update, evaluate on schedule."""
    c, st = run.cfg, run.state
    batch = collect(st.policy(), run.sampler, c.rl, st.rl_step, st.sample_gen, run.reward_fn, c.env)
    run.generated += batch.rollouts
    lm_batch = None
    if c.rl.hybrid:
        ratio = c.rl.hybrid_ratio
        n_lm = max(1, round(len(batch.texts) * ratio / (1 - ratio)))
        lm_batch = run.corpus.batch(n_lm, st.data_gen)
        G = c.rl.group_size
        rows = [p for p in batch.prompts for _ in range(G)]
        new = [p.text + t + "\n" for p, t, ok in zip(rows, batch.texts, batch.correct, strict=True)
               if ok]  # fmt: skip
        run.corpus.extend(new)
        run.added_docs += new
    m = rl_update(st, batch.experience, lm_batch)
    m.pop("trained_group_ids")
    row = {"accuracy": sum(batch.correct) / max(1, len(batch.correct))} | m
    policy_moved(run.sampler)
    if st.rl_step % c.eval.interval == 0 or st.rl_step == c.rl.steps:
        row |= run.evaluate()
    return row


class PlainProgress:
    """Without a terminal (logs, CI, nohup) the bars draw nothing: a plain line instead at
    every evaluation and at least every `every_s` seconds."""

    KEYS = ("loss", "val_loss", "reward", "greedy", "pass1", "entropy")

    def __init__(self, enabled: bool, every_s: float = 5.0):
        self.enabled, self.every_s, self.at = enabled, every_s, time.monotonic()

    def __call__(self, row: dict, done: int, total: int) -> None:
        evaluated = "val_loss" in row or "greedy" in row
        if not self.enabled or not (evaluated or time.monotonic() - self.at >= self.every_s):
            return
        self.at = time.monotonic()
        shown = [f"{k}={row[k]:.4g}" for k in self.KEYS if isinstance(row.get(k), float)]
        print(f"{row['phase']} step {done}/{total} " + " ".join(shown), flush=True)


def train_local(
    cfg: Config,
    opts: LocalOptions | None = None,
    store: CheckpointStore | None = None,
    sampler=None,
) -> dict:
    """Pre-train, hand off, RL, evaluate; returns (and optionally writes) the summary.

    store: where checkpoints go (default: DirectoryStore(opts.checkpoint_dir)); sampler: picks
    each step's prompts and receives their rewards (default: cfg.selection.sampler over a pool
    of cfg.data.pool_size train prompts).
    """
    opts = opts or LocalOptions()
    if cfg.selection.ppm_from:
        raise ConfigError(
            "selection.ppm_from warm-starts the streaming scheduler's PPM (`rlstream run`); "
            "the in-process loop has no scheduler snapshot to start from: drop it here"
        )
    keep = opts.out_dir or opts.checkpoint_dir  # a trained tokenizer goes there (bpe:N)
    with contextlib.ExitStack() as scratch:
        where = Path(keep) if keep else Path(scratch.enter_context(tempfile.TemporaryDirectory()))
        return _train_local(with_tokenizer(cfg, where / "tokenizer"), opts, store, sampler)


def _train_local(cfg: Config, opts: LocalOptions, store, sampler) -> dict:
    t0 = time.time()
    sandbox.configure(cfg.sandbox)  # code prompts' tests run with the run's limits
    if store is None and opts.checkpoint_dir:
        store = DirectoryStore(opts.checkpoint_dir)
    if opts.resume and store is None:
        raise ValueError("resume needs a checkpoint store (--checkpoint-dir)")
    run = Run(cfg, store, sampler)
    st = run.state
    if opts.resume and (saved := latest_checkpoint(store)) is not None:
        run.load_state_dict(saved)
    info: dict = {}
    bars = opts.progress and sys.stdout.isatty()
    plain = PlainProgress(not bars)
    with progress_bars(bars) as bar:
        pt = bar.add_task("pretrain", total=cfg.pretrain.max_steps, completed=st.pre_step, info="")
        while st.phase == "pretrain":
            row = pretrain_step(st, run.corpus, run.val)
            run.history.append(row)
            info |= {k: row[k] for k in ("loss", "val_loss") if k in row}
            plain(row, st.pre_step, cfg.pretrain.max_steps)
            labels = {"loss": "loss", "val_loss": "val"}
            bar.update(pt, completed=st.pre_step, info=bar_info(info, labels))
            if st.phase == "pretrain":
                run.maybe_checkpoint()
        t_pre = time.time() - t0
        if st.phase == "handoff":
            ev = run.evaluate()
            run.pretrain_eval = ev | {"steps": st.pre_step, "wall_s": t_pre}
            run.history.append({"phase": "rl", "step": st.step, "rl_step": 0} | ev)
            st.start_rl()
            run.maybe_checkpoint()
        rl = bar.add_task("rl", total=cfg.rl.steps, completed=st.rl_step, info="")
        while st.rl_step < cfg.rl.steps:
            row = rl_step(run)
            run.history.append(row)
            info |= {k: row[k] for k in ("reward", "greedy", "pass1", "entropy") if k in row}
            plain(row, st.rl_step, cfg.rl.steps)
            labels = {"reward": "reward", "greedy": "greedy", "pass1": "pass@1", "entropy": "H"}
            bar.update(rl, completed=st.rl_step, info=bar_info(info, labels))
            run.maybe_checkpoint()
    last = run.history[-1] if run.history else {}
    final = last if "greedy" in last else run.evaluate()
    summary = make_summary(run, final, time.time() - t0)
    figures = getattr(run.sampler, "figures", None)  # a curriculum's levels
    summary |= figures() if callable(figures) else {}
    write_outputs(run, opts, summary)
    if tracking_uri(cfg):
        track_local(cfg, Path(opts.out_dir) if opts.out_dir else None, run.history, summary)
    return summary
