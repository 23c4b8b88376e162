"""Optimisation backends: plain torch, or DeepSpeed ZeRO (chosen on CUDA or by flag).

Both expose the same three things the loops need: `model` (call it for training forwards),
`step(loss) -> grad_norm` (backward, clip, optimizer step, zero grads) and state dicts.
The learning rate is set by the loop every step from a `CosineSchedule` (nanoGPT style).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass

import torch


@dataclass
class CosineSchedule:
    """Linear warmup to lr, cosine decay to min_lr at max_steps, min_lr after."""

    lr: float
    warmup_steps: int
    max_steps: int
    min_lr: float

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if step >= self.max_steps:
            return self.min_lr
        frac = (step - self.warmup_steps) / max(1, self.max_steps - self.warmup_steps)
        return self.min_lr + 0.5 * (1.0 + math.cos(math.pi * frac)) * (self.lr - self.min_lr)

    def state_dict(self) -> dict:
        return asdict(self)


def make_adamw(model: torch.nn.Module, lr: float, weight_decay: float = 0.1) -> torch.optim.AdamW:
    """AdamW(0.9, 0.95); weight decay on matrices only (not biases, norms), as in nanoGPT."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


class TorchBackend:
    name = "torch"

    def __init__(self, model, optimizer, max_grad_norm: float = 1.0):
        self.model, self.module, self.optimizer = model, model, optimizer
        self.max_grad_norm = max_grad_norm
        self.ranks = None  # data-parallel trainer ranks (`trainers/ranks.py`), set by TrainState

    def set_lr(self, lr: float) -> None:
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    def step(self, loss: torch.Tensor | None, weight: float = 1.0) -> float:
        """Backward, clip, optimizer step. With trainer ranks the gradients are first averaged
        across them, each weighted by its share of the batch (`weight`; a rank with nothing
        to train this step passes loss None and weight 0)."""
        if loss is not None:
            loss.backward()
        if self.ranks is not None:
            self.ranks.reduce_gradients([p for p in self.module.parameters() if p.requires_grad],
                                        weight)  # fmt: skip
        norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def optimizer_state(self) -> dict:
        return self.optimizer.state_dict()

    def load_optimizer_state(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)


class DeepSpeedBackend(TorchBackend):
    """A DeepSpeed engine around the model with a client torch AdamW (no fused-op JIT build)."""

    name = "deepspeed"

    def __init__(self, model, optimizer, max_grad_norm: float = 1.0, zero_stage: int = 2):
        import deepspeed

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        if not torch.distributed.is_initialized():
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            deepspeed.init_distributed(dist_backend=backend, verbose=False)
        config = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": max_grad_norm,
            "zero_optimization": {"stage": zero_stage},
            "bf16": {"enabled": False},  # fp32: small models, exact logprob ratios
            "steps_per_print": 10**9,
        }
        engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        self.model, self.module, self.optimizer, self.engine = engine, engine.module, opt, engine
        self.max_grad_norm = max_grad_norm
        self.ranks = None  # data-parallel trainer ranks (`trainers/ranks.py`), set by TrainState

    def optimizer_state(self) -> dict | list[dict]:
        """This rank's optimizer state; with trainer ranks, every rank's (ZeRO partitions the
        state across them), gathered on rank 0, which alone checkpoints."""
        if self.ranks is None:
            return self.optimizer.state_dict()
        self.ranks.send(("gather_optimizer",))
        return self.ranks.gather(self.optimizer.state_dict())

    def load_optimizer_state(self, state: dict | list[dict]) -> None:
        """One state, or one per trainer rank (a checkpoint of ZeRO across ranks)."""
        states = state if isinstance(state, list) else [state]
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        if len(states) != world:
            raise ValueError(
                f"the checkpoint holds the optimizer state of {len(states)} trainer ranks, this "
                f"run has {world}: resume with loop.trainer_ranks={len(states)}"
            )
        if hasattr(self.optimizer, "_load_legacy_checkpoint"):  # a ZeRO 1/2 optimizer
            # It takes every rank's state and picks its own; fp32 partitions are rebuilt from
            # the (already loaded) weights.
            self.optimizer.load_state_dict(states, load_from_fp32_weights=False)
        else:
            self.optimizer.load_state_dict(states[rank])

    def step(self, loss: torch.Tensor | None, weight: float = 1.0) -> float:
        """DeepSpeed averages the ranks' gradients evenly: each rank's loss is scaled by its
        share of the batch (times the ranks) first, so the mean is the weighted one; a rank
        with nothing to train backpropagates a zero that touches every parameter."""
        if self.ranks is not None:
            total = torch.tensor([float(weight)])
            torch.distributed.all_reduce(total)
            params = [p for p in self.module.parameters() if p.requires_grad]
            if loss is None:
                loss = sum(p.sum() for p in params) * 0.0
            loss = loss * (weight * self.ranks.world / max(float(total), 1e-12))
        self.engine.backward(loss)
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")


def make_backend(
    model, optimizer, kind: str = "auto", max_grad_norm: float = 1.0, zero_stage: int = 2
) -> TorchBackend:
    """'torch', 'deepspeed', or 'auto' (DeepSpeed on CUDA when it is installed, torch otherwise)."""
    if kind == "auto":
        import importlib.util

        has_ds = importlib.util.find_spec("deepspeed") is not None
        kind = "deepspeed" if torch.cuda.is_available() and has_ds else "torch"
    if kind == "torch":
        return TorchBackend(model, optimizer, max_grad_norm)
    if kind == "deepspeed":
        return DeepSpeedBackend(model, optimizer, max_grad_norm, zero_stage)
    raise ValueError(f"unknown backend {kind!r}: auto, torch or deepspeed")
