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
from dataclasses import asdict
from pathlib import Path

from rlstream.config import Config
from rlstream.trainers.envs import Prompt

CACHE_VERSION = 3  # 3: Hugging Face policies (a tar of the save_pretrained directory)


def cache_key(cfg: Config, extra: dict | None = None) -> str:
    """What a pre-trained checkpoint depends on: seed, model (a value head for ppo), data and
    pre-training settings."""
    parts = {k: asdict(getattr(cfg, k)) for k in ("model", "data", "pretrain")}
    payload = parts | {"seed": cfg.seed, "value_head": cfg.rl.algo == "ppo"} | (extra or {})
    payload["v"] = CACHE_VERSION
    payload["model"].pop("threads")
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


def pretrained_policy(cfg: Config, cache_dir: Path, threads: int = 1, on_step=None):
    """(policy bytes, was_cached): the training core's pre-training on the generated corpus,
    run to its plateau or cap (cfg.pretrain), as the in-process loop does."""

    def build() -> bytes:
        from rlstream.trainers.core import TrainState, pretrain_step
        from rlstream.trainers.policy import policy_to_bytes
        from rlstream.trainers.pretrain import generated_corpus, validation_corpus

        state = TrainState(cfg, threads=threads)
        corpus, val = generated_corpus(cfg, state.tok), validation_corpus(cfg, state.tok)
        while state.phase == "pretrain":
            pretrain_step(state, corpus, val)
            if on_step is not None:
                on_step(state.pre_step, cfg.pretrain.max_steps)
        return policy_to_bytes(state.policy())

    return _cached(Path(cache_dir) / f"pretrain-{cache_key(cfg)}.pt", build)


def late_policy(
    blob: bytes,
    cfg: Config,
    pool: list[Prompt],
    warmup_steps: int,
    cache_dir: Path,
    arm_args,
    on_step=None,
) -> tuple[bytes, bool]:
    """(policy bytes, was_cached): `blob` after `warmup_steps` uniform GRPO steps on `pool`."""
    from dataclasses import replace

    from rlstream.config import with_values
    from rlstream.trainers.selection.loop import run_arm

    def build() -> bytes:
        from rlstream.trainers.policy import policy_to_bytes

        warm = with_values(cfg, **{"rl.steps": warmup_steps})
        aa = replace(arm_args, eval_every=warmup_steps)
        res = run_arm(blob, pool, pool[:8], "uniform", cfg.seed, warm, aa, on_step, True)
        return policy_to_bytes(res.policy)

    extra = {"warmup": warmup_steps, "pool": [p.prompt_id for p in pool[:4]], "n": len(pool)}
    extra |= {"lr": cfg.rl.learning_rate, "B": cfg.rl.prompts_per_step, "G": cfg.rl.group_size}
    return _cached(Path(cache_dir) / f"late-{cache_key(cfg, extra)}.pt", build)
