"""The streaming loop's settings, shared by every process of a run (passed as a JSON file)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path


@dataclass
class LoopConfig:
    run_id: str = "run"
    """run id: names topics' run_id column, consumer groups and object-store prefixes"""
    tasks: str = "add,sub"
    """task mix (see rlstream.trainers.envs.TaskMix)"""
    seed: int = 0
    """seed of splits, corpus, init and sampling"""
    pool_size: int = 20_000
    """train prompts published to rl.prompts.v1 (the scheduler's pool)"""
    corpus_docs: int = 100_000
    """pre-training documents published to rl.corpus.v1"""
    pretrain_max_steps: int = 1000
    """cap on pre-training steps (the plateau detector may stop earlier)"""
    rl_steps: int = 150
    """RL updates"""
    prompts_per_step: int = 32
    """prompt groups per RL update"""
    group_size: int = 8
    """completions per prompt (G)"""
    max_new_tokens: int = 8
    """longest completion"""
    temperature: float = 1.0
    """rollout temperature"""
    rl_lr: float = 1e-4
    """RL learning rate"""
    max_policy_lag: int = 4
    """experience more than this many versions behind the trainer is dropped and counted"""
    target_in_flight: int = 96
    """rollout requests in flight (issued, not yet trained on): the scheduler's pacing bound"""
    publish_every: int = 1
    """RL steps between policy versions published to the rollout workers"""
    checkpoint_every: int = 10
    """RL steps between trainer checkpoints (offsets are committed right after each)"""
    eval_interval: int = 25
    """RL steps between held-out evaluations"""
    eval_prompts: int = 256
    """held-out prompts evaluated"""
    sampler: str = "uniform"
    """prompt sampler (rlstream.trainers.selection registry)"""
    ppm_features: str = "reference"
    """featurizers of the ppm sampler's predictive model: reference, confidence, hidden (read
    the newest policy, which the scheduler then follows) and/or text"""
    filter_zero_variance: bool = False
    """drop groups whose rewards are all equal instead of training on them (DAPO's dynamic
    sampling, streamed: dropped groups count as consumed, so the scheduler's pacing refills
    the batch); they still count in zero_variance_share"""
    filter_max_rounds: int = 8
    """the filter's cap: once filter_max_rounds x prompts_per_step groups were dropped for one
    batch, zero-variance groups fill the rest of it (DAPO's round cap: a pool the policy
    cannot learn from must not stall the loop)"""
    rollout_workers: int = 2
    """rollout worker processes"""
    threads: int = 1
    """torch threads per process"""
    session_timeout_ms: int = 6000
    """consumer-group session timeout"""

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self), indent=2))
        return path

    @classmethod
    def read(cls, path: Path) -> LoopConfig:
        data = json.loads(Path(path).read_text())
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def group(self, role: str) -> str:
        """The consumer group (faust app id) of a role in this run."""
        return f"rlstream-{self.run_id}-{role}"
