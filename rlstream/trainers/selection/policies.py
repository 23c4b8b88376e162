"""The benchmark's shared starting policies, built once and cached on disk by their config.

Pre-training dominates wall time on CPU (INFRA.md), so every arm and seed of a benchmark run
starts from the same pre-trained checkpoint, and a rerun with the same config skips it:
`pretrained_policy(cfg, cache_dir)` -> policy bytes, file `pretrain-<sha1 of cfg>.pt`.
`late_policy` RL-trains that checkpoint with uniform sampling for a few steps (cached the same
way): the starting point of the "late-training" pool, where most prompts are already solved.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from rlstream.trainers.envs import Prompt

CACHE_VERSION = 1


@dataclass(frozen=True)
class PretrainConfig:
    tasks: str = "add,sub"
    """task mix the corpus is drawn from"""
    seed: int = 0
    """seed of corpus, splits and init"""
    max_steps: int = 1000
    """pre-training step cap (the validation plateau may stop it earlier)"""
    corpus_docs: int = 100_000
    """worked documents"""
    flaw_rate: float = 0.65
    """share of flawable documents written with their family's systematic mistake"""
    block_size: int = 32
    """context length"""
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128

    def key(self, extra: dict | None = None) -> str:
        payload = asdict(self) | (extra or {}) | {"v": CACHE_VERSION}
        return hashlib.sha1(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


def _cached(path: Path, build) -> tuple[bytes, bool]:
    if path.exists():
        return path.read_bytes(), True
    blob = build()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(blob)
    tmp.replace(path)
    return blob, False


def pretrained_policy(cfg: PretrainConfig, cache_dir: Path, threads: int = 1, on_step=None):
    """(policy bytes, was_cached): the local loop's pre-training phase, run to its plateau/cap."""

    def build() -> bytes:
        from rlstream.trainers.local import Args, Run, pretrain_step
        from rlstream.trainers.policy import Policy, policy_to_bytes

        args = Args(
            tasks=cfg.tasks,
            seed=cfg.seed,
            threads=threads,
            device="cpu",
            backend="torch",
            n_layer=cfg.n_layer,
            n_head=cfg.n_head,
            n_embd=cfg.n_embd,
            block_size=cfg.block_size,
            corpus_docs=cfg.corpus_docs,
            flaw_rate=cfg.flaw_rate,
            pretrain_max_steps=cfg.max_steps,
            pool_size=16,
            eval_prompts=16,
            progress=False,
        )
        run = Run(args)
        while run.phase == "pretrain":
            pretrain_step(run)
            if on_step is not None:
                on_step(run.pre_step, cfg.max_steps)
        return policy_to_bytes(Policy(run.model, run.tok, 0))

    return _cached(Path(cache_dir) / f"pretrain-{cfg.key()}.pt", build)


def late_policy(
    blob: bytes,
    cfg: PretrainConfig,
    pool: list[Prompt],
    warmup_steps: int,
    cache_dir: Path,
    loop_args,
    on_step=None,
) -> tuple[bytes, bool]:
    """(policy bytes, was_cached): `blob` after `warmup_steps` uniform GRPO steps on `pool`."""
    from rlstream.trainers.selection.loop import LoopArgs, run_arm

    def build() -> bytes:
        from rlstream.trainers.policy import policy_to_bytes

        la = LoopArgs(**{**loop_args.__dict__, "steps": warmup_steps, "eval_every": warmup_steps})
        res = run_arm(blob, pool, pool[:8], "uniform", cfg.seed, la, on_step, keep_policy=True)
        return policy_to_bytes(res.policy)

    extra = {"warmup": warmup_steps, "pool": [p.prompt_id for p in pool[:4]], "n": len(pool)}
    extra |= {"lr": loop_args.rl_lr, "B": loop_args.prompts_per_step, "G": loop_args.group_size}
    return _cached(Path(cache_dir) / f"late-{cfg.key(extra)}.pt", build)
