"""The training core every loop calls: one train state, one pre-training and one RL update.

    state = TrainState(cfg)                          # model, optimizer, schedules, RNGs, counters
    m = pretrain_step(state, corpus, val)            # one LM update (+ validation, plateau)
    state.start_rl()                                 # freeze the reference, RL schedule from here
    m = rl_update(state, experience, lm_batch=None)  # one GRPO/PPO update on groups of rollouts

The in-process loop (`trainers/local.py`), the stream trainer (`streams/trainer.py`) and the
selection benchmark (`trainers/selection/loop.py`) differ only in where their data comes from,
when they evaluate and what they log. Everything an update decides is decided here: the
learning rate of each step, which groups are too stale to train on (more than
`rl.max_policy_lag` versions behind), the importance correction of the rest (PPO ratios against
the behaviour policy's logprobs, clipped), and how many groups were zero-variance.
`state_dict()` / `load_state_dict()` hold all of it, so a resumed loop repeats an
uninterrupted one exactly on CPU. With `state.join(ranks)` both updates run data-parallel over
trainer ranks, rank 0 sharing each batch out (`trainers/ranks.py`).
"""

from __future__ import annotations

import copy
import logging

import torch

from rlstream.config import Config
from rlstream.trainers.backend import CosineSchedule, make_adamw, make_backend
from rlstream.trainers.lm import CausalLM, build_model, load_tokenizer
from rlstream.trainers.policy import Policy
from rlstream.trainers.pretrain import Corpus, Plateau, eval_loss, lm_loss
from rlstream.trainers.ranks import Ranks, share_groups, share_rows
from rlstream.trainers.rl import Experience, Learner

log = logging.getLogger(__name__)
VAL_BATCHES, VAL_BATCH_SIZE = 8, 256  # the fixed validation set the plateau is judged on
SAMPLE_SEED_OFFSET = 7  # rollouts draw from their own generator: seed + 7


def resolve_device(device: str) -> str:
    """`auto` is the GPU when there is one; a GPU is this process's own (trainer ranks pin
    theirs, `Ranks.from_env`), so N ranks on one machine use N GPUs, not cuda:0 N times."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and torch.cuda.is_available():
        return f"cuda:{torch.cuda.current_device()}"
    return device


def zero_variance_groups(exp: Experience) -> int:
    """Groups whose rewards are all equal: every advantage is zero, they teach nothing."""
    rewards: dict = {}
    for g, r in zip(exp.group_ids, exp.rewards, strict=True):
        rewards.setdefault(g, set()).add(r)
    return sum(len(v) == 1 for v in rewards.values())


class TrainState:
    """Everything an update mutates, and its checkpoint.

    model/backend (optimizer), the pre-training and RL schedules, the plateau detector, the
    frozen reference and the RL learner once `start_rl` ran (the value head sits on the model
    when rl.algo is ppo), the data and sampling generators, and the step counters.
    """

    def __init__(self, cfg: Config, threads: int | None = None, policy: Policy | None = None):
        self.cfg = cfg
        m, p, rl = cfg.model, cfg.pretrain, cfg.rl
        if threads:
            torch.set_num_threads(threads)
        torch.manual_seed(cfg.seed)
        self.device = resolve_device(m.device)
        if policy is None:
            self.tok = load_tokenizer(m)
            model = build_model(m, self.tok, value_head=rl.algo == "ppo", device=self.device)
        else:
            self.tok, model = policy.tok, policy.model.to(self.device)
            if rl.algo == "ppo" and model.value_head is None:
                model.add_value_head()  # seeded above: the same head every run
        lr = p.lr if policy is None else rl.learning_rate
        self.backend = make_backend(
            model, make_adamw(model, lr), m.backend, rl.max_grad_norm, m.zero_stage
        )
        self.model = self.backend.module
        self.pretrain_schedule = CosineSchedule(p.lr, p.warmup_steps, p.max_steps, p.lr / 10)
        rl_lr = rl.learning_rate
        self.rl_schedule = CosineSchedule(rl_lr, 0, rl.steps, rl_lr * rl.min_lr_ratio)
        self.plateau = Plateau(p.patience, p.min_delta)
        self.data_gen = torch.Generator().manual_seed(cfg.seed)
        self.sample_gen = torch.Generator(device=self.device).manual_seed(
            cfg.seed + SAMPLE_SEED_OFFSET
        )
        self.phase = "pretrain"
        self.pre_step = self.rl_step = 0
        self.rollouts = self.stale_groups = self.zero_variance_groups = self.trained_groups = 0
        self.ref: CausalLM | None = None
        self.learner: Learner | None = None
        self.ranks: Ranks | None = None

    def join(self, ranks: Ranks | None) -> None:
        """Train data-parallel with `ranks` (rank 0 leads every update; `trainers/ranks.py`)."""
        self.ranks = self.backend.ranks = ranks

    @property
    def step(self) -> int:
        return self.pre_step + self.rl_step

    @property
    def version(self) -> int:
        """The policy version: RL updates applied so far."""
        return self.learner.version if self.learner else 0

    def policy(self) -> Policy:
        return Policy(self.model, self.tok, self.version)

    def start_rl(self, ref_state: dict | None = None) -> None:
        """Freeze a copy of the current policy as the KL reference and build the learner."""
        self.ref = copy.deepcopy(self.model).eval().requires_grad_(False)
        if ref_state is not None:
            self.ref.load_state_dict(ref_state)
        self.learner = Learner(self.backend, self.ref, self.cfg.rl, self.tok.pad_id, self.cfg.seed)
        self.backend.set_lr(self.cfg.rl.learning_rate)
        self.phase = "rl"
        if self.ranks is not None and self.ranks.leader:
            self.ranks.send(("start_rl",))

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.backend.optimizer_state(),
            "plateau": self.plateau.state_dict(),
            "data_gen": self.data_gen.get_state(),
            "sample_gen": self.sample_gen.get_state(),
            "phase": self.phase,
            "counters": {
                k: getattr(self, k)
                for k in (
                    "pre_step",
                    "rl_step",
                    "rollouts",
                    "stale_groups",
                    "zero_variance_groups",
                    "trained_groups",
                )
            },  # fmt: skip
            "ref": self.ref.state_dict() if self.ref else None,
            "learner": self.learner.state_dict() if self.learner else None,
        }

    def load_state_dict(self, s: dict) -> None:
        self.model.load_state_dict(s["model"])
        self.backend.load_optimizer_state(s["optimizer"])
        self.plateau.load_state_dict(s["plateau"])
        self.data_gen.set_state(s["data_gen"])
        self.sample_gen.set_state(s["sample_gen"])
        self.phase = s["phase"]
        for k, v in s["counters"].items():
            setattr(self, k, v)
        if s["ref"] is not None:
            self.start_rl(ref_state=s["ref"])
            self.learner.load_state_dict(s["learner"])
            self.phase = s["phase"]


def pretrain_update(state: TrainState, batch: tuple[torch.Tensor, torch.Tensor]) -> dict:
    """One next-token update on (x, y) at the schedule's learning rate for this step."""
    lr = state.pretrain_schedule(state.pre_step)
    state.backend.set_lr(lr)
    if state.ranks is not None:
        x, y = batch
        shares = share_rows(len(x), state.ranks.world)
        batch = state.ranks.lead("pretrain", lr, [(x[s], y[s]) for s in shares])
    loss = _pretrain_loss(state, batch)
    state.pre_step += 1
    return {"phase": "pretrain", "step": state.step, "loss": float(loss.detach()), "lr": lr}


def follower_pretrain_update(state: TrainState, lr: float, shard: tuple) -> None:
    """Ranks 1..N-1: rank 0's pre-training update, on this rank's shard of its batch."""
    state.backend.set_lr(lr)
    _pretrain_loss(state, shard)


def _pretrain_loss(state: TrainState, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = (t.to(state.device) for t in batch)
    loss = lm_loss(state.backend.model, x, y)
    state.backend.step(loss, weight=len(x))
    return loss


def pretrain_step(state: TrainState, corpus: Corpus, val: Corpus) -> dict:
    """A batch from the corpus, one update, and every `val_interval` steps the validation loss;
    on a plateau (or at the step cap) the phase becomes 'handoff'."""
    p = state.cfg.pretrain
    row = pretrain_update(state, corpus.batch(p.batch, state.data_gen))
    if state.pre_step % p.val_interval == 0 or state.pre_step >= p.max_steps:
        row["val_loss"] = eval_loss(state.model, val, VAL_BATCHES, VAL_BATCH_SIZE, state.cfg.seed)
        if state.plateau.update(row["val_loss"]) or state.pre_step >= p.max_steps:
            state.phase = "handoff"
    return row


def rl_update(state: TrainState, exp: Experience, lm_batch: tuple | None = None) -> dict:
    """One RL update (rl.epochs x rl.minibatches steps) on groups of experience.

    Groups more than rl.max_policy_lag versions behind are dropped and counted; the rest are
    importance-corrected by the clipped ratio to their behaviour logprobs. `lm_batch` (x, y)
    mixes in the pre-training loss (hybrid mode). Returns the update's metrics, including
    `trained_group_ids` (what was trained on), `dropped_groups` and `zero_variance_groups`.
    """
    state.backend.set_lr(state.rl_schedule(state.rl_step))
    fresh, stale = state.learner.split_stale(exp)
    shard = fresh
    if state.ranks is not None and len(fresh):  # every rank trains its share of the groups
        shares = share_groups(fresh.group_ids, state.ranks.world)
        lr = state.rl_schedule(state.rl_step)
        shard = state.ranks.lead("rl", lr, [fresh.select(ix) for ix in shares], lm_batch)
    metrics = state.learner.step(shard, lm_batch)
    trained = list(dict.fromkeys(fresh.group_ids))
    zero = zero_variance_groups(exp)
    state.stale_groups += stale
    state.zero_variance_groups += zero
    if trained:
        state.rl_step += 1
        state.trained_groups += len(trained)
        state.rollouts += len(fresh)
    return metrics | {
        "phase": "rl",
        "step": state.step,
        "rl_step": state.rl_step,
        "dropped_groups": stale,
        "zero_variance_groups": zero,
        "zero_variance_share": zero / max(1, len(dict.fromkeys(exp.group_ids))),
        "trained_group_ids": trained,
    }


def follow(state: TrainState, ranks: Ranks, on_update=None) -> None:
    """Ranks 1..N-1: apply rank 0's commands to `state` (a TrainState built from the same
    config) until it says stop; `on_update(phase)` after each update."""
    while True:
        kind, *args = ranks.receive()
        if kind == "stop":
            log.info("rank %d: stop", ranks.rank)
            return
        if kind == "gather_optimizer":  # rank 0 is checkpointing ZeRO's partitions
            state.backend.ranks.gather(state.backend.optimizer.state_dict())
        elif kind == "sync":
            state.load_state_dict(args[0])
            log.info("rank %d: synced at step %d (phase %s)", ranks.rank, state.step, state.phase)
        elif kind == "start_rl":
            state.start_rl()
        elif kind == "pretrain":
            lr, shards = args
            follower_pretrain_update(state, lr, shards[ranks.rank])
            if on_update:
                on_update("pretrain")
        elif kind == "rl":
            lr, shards, lm_batch = args
            state.backend.set_lr(lr)
            state.learner.step(shards[ranks.rank], lm_batch)
            if on_update:
                on_update("rl")
        else:
            raise ValueError(f"rank {ranks.rank}: unknown command {kind!r}")
