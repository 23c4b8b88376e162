"""The in-process loop: pre-train until the validation loss plateaus, then RL, then evaluate.

`train_local(Args(...)) -> summary dict` is the Python API behind `rlstream train --mode local`.
Read top to bottom: Args -> setup -> pre-training loop -> hand-off -> RL loop -> report.
Every random draw comes from a generator whose state is checkpointed, so a resumed run repeats
the uninterrupted one exactly (CPU, same thread count).
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass

import torch

from rlstream.trainers.backend import CosineSchedule, make_adamw, make_backend
from rlstream.trainers.checkpoint import (
    CheckpointStore,
    DirectoryStore,
    latest_checkpoint,
    save_checkpoint,
    set_rng_state,
)
from rlstream.trainers.envs import TaskMix, sample_prompts
from rlstream.trainers.evaluate import evaluate
from rlstream.trainers.model import GPT, CharTokenizer, GPTConfig
from rlstream.trainers.policy import Policy, rollout, score, to_experience
from rlstream.trainers.pretrain import Corpus, Plateau, build_corpus, eval_loss, lm_loss
from rlstream.trainers.report import bar_info, make_summary, progress_bars, write_outputs
from rlstream.trainers.rewards import build_reward, verifier_reward
from rlstream.trainers.rl import Learner, RLArgs
from rlstream.trainers.samplers import PromptSampler, make_sampler


@dataclass
class Args:
    tasks: str = "add,sub"
    """task mix: name[:weight][@dmin-dmax], comma separated (families: add sub mul chain ...)"""
    seed: int = 0
    """seed of everything: splits, corpus, init, sampling"""
    threads: int = 2
    """torch CPU threads"""
    device: str = "auto"
    """cpu, cuda or auto"""
    backend: str = "auto"
    """torch, deepspeed, or auto (deepspeed on CUDA when installed)"""
    zero_stage: int = 2
    """DeepSpeed ZeRO stage"""
    n_layer: int = 4
    """transformer layers"""
    n_head: int = 4
    """attention heads"""
    n_embd: int = 128
    """embedding width"""
    block_size: int = 32
    """context length (prompt + completion)"""
    corpus_docs: int = 100_000
    """pre-training documents (worked solutions from the train split)"""
    flaw_rate: float = 0.65
    """share of flawable documents written with their family's systematic mistake"""
    pretrain_batch: int = 128
    """documents per pre-training step"""
    pretrain_lr: float = 2e-3
    """peak pre-training learning rate"""
    pretrain_max_steps: int = 2000
    """cap on pre-training steps (the cosine schedule's length)"""
    warmup_steps: int = 100
    """linear warmup steps"""
    val_interval: int = 200
    """pre-training steps between validation-loss checks"""
    patience: int = 2
    """validation checks without improvement before pre-training is declared converged"""
    min_delta: float = 0.01
    """smallest validation-loss improvement that counts"""
    algo: str = "grpo"
    """RL algorithm: grpo or ppo"""
    rl_steps: int = 300
    """RL steps (one experience batch and one update each)"""
    prompts_per_step: int = 32
    """prompts per RL step"""
    group_size: int = 8
    """completions per prompt (G)"""
    temperature: float = 1.0
    """sampling temperature for rollouts and pass@1 (old logprobs are tempered: keep 1.0)"""
    rl_lr: float = 1e-4
    """RL learning rate (cosine-decayed to a tenth over rl_steps)"""
    kl_coef: float = 0.0
    """KL penalty weight to the frozen pre-trained reference"""
    update_epochs: int | None = None
    """RL update epochs per batch (default: 1 for grpo, 10 for ppo as in the design notes)"""
    num_minibatches: int | None = None
    """RL minibatches per epoch (default: 1 for grpo, 4 for ppo)"""
    max_new_tokens: int = 8
    """longest completion sampled"""
    hybrid: bool = False
    """mix pre-training loss into RL updates and append verified rollouts to the corpus"""
    hybrid_ratio: float = 0.3
    """share of hybrid compute spent on pre-training loss (0.3 = RL:LM 7:3)"""
    sampler: str = "uniform"
    """prompt sampler (see rlstream.trainers.samplers.SAMPLERS)"""
    pool_size: int = 20_000
    """train prompts the sampler draws from"""
    reward_rules: str | None = None
    """JSON reward rule file (default: the task families' verifiers, 1 or 0)"""
    eval_prompts: int = 256
    """held-out prompts evaluated"""
    eval_samples: int = 8
    """samples per prompt for pass@1"""
    eval_interval: int = 25
    """RL steps between held-out evaluations"""
    checkpoint_dir: str | None = None
    """directory for checkpoints (none: no checkpoints)"""
    checkpoint_every: int = 0
    """steps (pre-train + RL) between checkpoints; 0 = never"""
    keep_last: int = 3
    """checkpoints retained"""
    resume: bool = False
    """continue from the newest checkpoint in checkpoint_dir"""
    out_dir: str | None = None
    """where history.json and curves.png go"""
    summary: str | None = None
    """path of the summary JSON"""
    progress: bool = True
    """show rich progress bars and the final table"""

    def __post_init__(self):
        if self.algo not in ("grpo", "ppo"):
            raise ValueError(f"algo must be grpo or ppo, got {self.algo!r}")
        if self.update_epochs is None:
            self.update_epochs = 10 if self.algo == "ppo" else 1
        if self.num_minibatches is None:
            self.num_minibatches = 4 if self.algo == "ppo" else 1
        if self.algo == "grpo" and self.group_size < 2:
            raise ValueError("grpo needs group_size >= 2: advantages are relative within a group")
        if not 0 <= self.hybrid_ratio < 1:
            raise ValueError("hybrid_ratio is a share of compute in [0, 1)")
        if self.num_minibatches > self.prompts_per_step * self.group_size:
            raise ValueError("num_minibatches exceeds the rollouts per step")


class Run:
    """Everything the loop mutates, in one place (and in one checkpoint)."""

    def __init__(self, args: Args, store=None, sampler=None):
        self.args = a = args
        torch.set_num_threads(a.threads)
        torch.manual_seed(a.seed)
        dev = "cuda" if a.device == "auto" and torch.cuda.is_available() else a.device
        self.device = "cpu" if dev == "auto" else dev
        self.tok = CharTokenizer()
        self.mix = TaskMix.parse(a.tasks)
        cfg = GPTConfig(
            self.tok.vocab_size,
            a.block_size,
            a.n_layer,
            a.n_head,
            a.n_embd,
            value_head=a.algo == "ppo",
        )
        model = GPT(cfg).to(self.device)
        self.backend = make_backend(
            model, make_adamw(model, a.pretrain_lr), a.backend, 1.0, a.zero_stage
        )
        self.model = self.backend.module
        self.schedule = CosineSchedule(
            a.pretrain_lr, a.warmup_steps, a.pretrain_max_steps, a.pretrain_lr / 10
        )
        self.corpus = Corpus(
            build_corpus(self.mix, a.corpus_docs, a.flaw_rate, a.seed, a.seed),
            self.tok,
            a.block_size,
        )
        self.val = Corpus(
            build_corpus(self.mix, 4096, a.flaw_rate, a.seed + 1, a.seed), self.tok, a.block_size
        )
        self.added_docs: list[str] = []
        self.eval_set = sample_prompts(self.mix, a.eval_prompts, "heldout", a.seed, strict=False)
        if sampler is None:
            pool = sample_prompts(self.mix, a.pool_size, "train", a.seed, unique=False)
            sampler = make_sampler(a.sampler, pool, a.seed)
        self.sampler = sampler
        self.reward_fn = build_reward(a.reward_rules) if a.reward_rules else verifier_reward
        self.data_gen = torch.Generator().manual_seed(a.seed)
        self.sample_gen = torch.Generator(device=self.device).manual_seed(a.seed + 7)
        self.plateau = Plateau(a.patience, a.min_delta)
        self.phase, self.pre_step, self.rl_step, self.rollouts = "pretrain", 0, 0, 0
        self.history: list[dict] = []
        self.pretrain_eval: dict = {}
        self.ref: GPT | None = None
        self.learner: Learner | None = None
        if store is None and a.checkpoint_dir:
            store = DirectoryStore(a.checkpoint_dir)
        self.store = store

    @property
    def step(self) -> int:
        return self.pre_step + self.rl_step

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.backend.optimizer_state(),
            "schedule": self.schedule.state_dict(),
            "plateau": self.plateau.state_dict(),
            "sampler": self.sampler.state_dict(),
            "data_gen": self.data_gen.get_state(),
            "sample_gen": self.sample_gen.get_state(),
            "phase": self.phase,
            "pre_step": self.pre_step,
            "rl_step": self.rl_step,
            "rollouts": self.rollouts,
            "history": self.history,
            "pretrain_eval": self.pretrain_eval,
            "added_docs": self.added_docs,
            "args": asdict(self.args),
            "ref": self.ref.state_dict() if self.ref else None,
            "learner": self.learner.state_dict() if self.learner else None,
        }

    def load_state_dict(self, s: dict) -> None:
        self.model.load_state_dict(s["model"])
        self.backend.load_optimizer_state(s["optimizer"])
        self.plateau.load_state_dict(s["plateau"])
        self.sampler.load_state_dict(s["sampler"])
        self.data_gen.set_state(s["data_gen"])
        self.sample_gen.set_state(s["sample_gen"])
        self.phase, self.pre_step, self.rl_step = s["phase"], s["pre_step"], s["rl_step"]
        self.rollouts, self.history, self.pretrain_eval = (
            s["rollouts"],
            s["history"],
            s["pretrain_eval"],
        )
        self.added_docs = s["added_docs"]
        self.corpus.extend(self.added_docs)
        if s["ref"] is not None:
            self.start_rl(ref_state=s["ref"])
            self.learner.load_state_dict(s["learner"])
        set_rng_state(s["rng"])

    def maybe_checkpoint(self) -> None:
        a = self.args
        if self.store is not None and a.checkpoint_every and self.step % a.checkpoint_every == 0:
            save_checkpoint(self.store, self.step, self.state_dict(), a.keep_last)

    def start_rl(self, ref_state: dict | None = None) -> None:
        """Freeze a copy of the pre-trained policy as the KL reference; build the learner."""
        a = self.args
        self.ref = copy.deepcopy(self.model).eval().requires_grad_(False)
        if ref_state is not None:
            self.ref.load_state_dict(ref_state)
        rl_args = RLArgs(
            algo=a.algo,
            lr=a.rl_lr,
            kl_coef=a.kl_coef,
            update_epochs=a.update_epochs,
            num_minibatches=a.num_minibatches,
        )
        self.learner = Learner(self.backend, self.ref, rl_args, self.tok.pad_id, a.seed)
        self.backend.set_lr(a.rl_lr)
        self.phase = "rl"

    def evaluate(self) -> dict:
        a = self.args
        return evaluate(
            self.model,
            self.tok,
            self.eval_set,
            a.max_new_tokens,
            a.eval_samples,
            a.temperature,
            seed=a.seed + 123,
        )


def pretrain_step(run: Run) -> dict:
    a = run.args
    run.backend.set_lr(run.schedule(run.pre_step))
    x, y = run.corpus.batch(a.pretrain_batch, run.data_gen)
    loss = lm_loss(run.backend.model, x.to(run.device), y.to(run.device), run.tok.pad_id)
    run.backend.step(loss)
    run.pre_step += 1
    row = {
        "phase": "pretrain",
        "step": run.step,
        "loss": float(loss.detach()),
        "lr": run.schedule(run.pre_step - 1),
    }
    if run.pre_step % a.val_interval == 0 or run.pre_step >= a.pretrain_max_steps:
        row["val_loss"] = eval_loss(run.model, run.val, 8, 256, a.seed)
        if run.plateau.update(row["val_loss"]) or run.pre_step >= a.pretrain_max_steps:
            run.phase = "handoff"
    return row


def rl_step(run: Run) -> dict:
    """Select prompts, sample G completions each, score, update, report rewards to the sampler."""
    a = run.args
    run.backend.set_lr(CosineSchedule(a.rl_lr, 0, a.rl_steps, a.rl_lr / 10)(run.rl_step))
    prompts = run.sampler.select(run.rl_step, a.prompts_per_step)
    policy = Policy(run.model, run.tok, run.learner.version)
    s = rollout(policy, prompts, a.group_size, a.max_new_tokens, a.temperature, run.sample_gen)
    rewards, correct = score(prompts, s, run.reward_fn)
    rows = [prompts[i] for i in s.prompt_index]
    G = a.group_size
    run.sampler.update(prompts, [rewards[i * G : (i + 1) * G] for i in range(len(prompts))])
    exp = to_experience(prompts, s, rewards, run.learner.version)
    lm_batch = None
    if a.hybrid:
        n_lm = max(1, round(len(rows) * a.hybrid_ratio / (1 - a.hybrid_ratio)))
        lm_batch = run.corpus.batch(n_lm, run.data_gen)
        new = [p.text + c + "\n" for p, c, ok in zip(rows, s.texts, correct, strict=True) if ok]
        run.corpus.extend(new)
        run.added_docs += new
    m = run.learner.step(exp, lm_batch)
    run.rl_step += 1
    run.rollouts += len(rows)
    row = {
        "phase": "rl",
        "step": run.step,
        "rl_step": run.rl_step,
        "accuracy": sum(correct) / len(correct),
    } | m
    row["zero_var_groups"] = sum(
        len(set(rewards[i * G : (i + 1) * G])) == 1 for i in range(len(prompts))
    ) / len(prompts)
    if run.rl_step % a.eval_interval == 0 or run.rl_step == a.rl_steps:
        row |= run.evaluate()
    return row


def _log_line(a: Args, row: dict) -> None:
    """Without progress bars (logs, CI), print a line at every evaluation instead."""
    if not a.progress and ("val_loss" in row or "greedy" in row):
        keys = ("phase", "step", "loss", "val_loss", "reward", "greedy", "pass1", "entropy")
        print(
            " ".join(
                f"{k}={row[k]:.4g}" if isinstance(row[k], float) else f"{k}={row[k]}"
                for k in keys
                if k in row
            ),
            flush=True,
        )


def train_local(
    args: Args, store: CheckpointStore | None = None, sampler: PromptSampler | None = None
) -> dict:
    """Pre-train, hand off, RL, evaluate; returns (and optionally writes) the summary.

    store: where checkpoints go (default: DirectoryStore(args.checkpoint_dir)); any object with
    save_bytes/load_bytes/list/delete. sampler: picks each step's prompts and receives their
    rewards (default: args.sampler over a pool of args.pool_size train prompts).
    """
    t0 = time.time()
    run = Run(args, store, sampler)
    if args.resume and run.store is None:
        raise ValueError("resume needs a checkpoint store (--checkpoint-dir)")
    if args.resume and (state := latest_checkpoint(run.store)) is not None:
        run.load_state_dict(state)
    a, info = args, {}
    with progress_bars(a.progress) as bar:
        pt = bar.add_task("pretrain", total=a.pretrain_max_steps, completed=run.pre_step, info="")
        while run.phase == "pretrain":
            row = pretrain_step(run)
            run.history.append(row)
            info |= {k: row[k] for k in ("loss", "val_loss") if k in row}
            _log_line(a, row)
            bar.update(
                pt, completed=run.pre_step, info=bar_info(info, {"loss": "loss", "val_loss": "val"})
            )
            if run.phase == "pretrain":
                run.maybe_checkpoint()
        t_pre = time.time() - t0
        if run.phase == "handoff":
            ev = run.evaluate()
            run.pretrain_eval = ev | {"steps": run.pre_step, "wall_s": t_pre}
            run.history.append({"phase": "rl", "step": run.step, "rl_step": 0} | ev)
            run.start_rl()
            run.maybe_checkpoint()
        rl = bar.add_task("rl", total=a.rl_steps, completed=run.rl_step, info="")
        while run.rl_step < a.rl_steps:
            row = rl_step(run)
            run.history.append(row)
            info |= {k: row[k] for k in ("reward", "greedy", "pass1", "entropy") if k in row}
            _log_line(a, row)
            bar.update(
                rl,
                completed=run.rl_step,
                info=bar_info(
                    info,
                    {"reward": "reward", "greedy": "greedy", "pass1": "pass@1", "entropy": "H"},
                ),
            )
            run.maybe_checkpoint()
    final = (
        run.evaluate() if not run.history or "greedy" not in run.history[-1] else run.history[-1]
    )
    summary = make_summary(run, final, time.time() - t0)
    write_outputs(run, summary)
    return summary
