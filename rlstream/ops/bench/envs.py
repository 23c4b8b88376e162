"""`rlstream bench envs`: the episode engine's throughput and its time spent waiting on
environments, with added environment latency, one episode at a time against several at once.

The model is the default preset (randomly initialised: the policy's text does not matter here,
its compute does); the environment answers every turn after `latency_ms` (an `asyncio.sleep`)
and ends the episode after `turns` policy turns. An arm is (latency, concurrent episodes); each
repeat plays the same number of episodes, `concurrent` at a time in one batch, and reports
episodes per second and the share of the wall time the engine waited on environments.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from rlstream.config import EnvConfig
from rlstream.ops.bench.broker import Figure
from rlstream.trainers.environments.base import ENVIRONMENTS, Step


@dataclass
class Arm:
    latency_ms: float
    concurrent: int
    episodes_per_s: Figure
    wait_share: Figure


class Delayed:
    """Answers every turn after `latency_ms`; done after `turns` turns (env.options)."""

    def __init__(self, settings: EnvConfig):
        self.latency_s = float(settings.option("latency_ms", 0)) / 1000
        self.turns, self.taken = int(settings.option("turns", 3)), 0

    async def reset(self, prompt) -> str:
        return ""

    async def step(self, action: str) -> Step:
        await asyncio.sleep(self.latency_s)
        self.taken += 1
        return Step("ok\n", 0.0, self.taken >= self.turns)

    async def close(self) -> None:
        pass


def envs_bench(latencies_ms: list[float], concurrency: list[int], episodes: int, repeats: int,
               turns: int = 3) -> list[Arm]:  # fmt: skip
    """Every (latency, concurrency) arm, `repeats` times, `episodes` episodes each."""
    import torch

    from rlstream.config import ModelConfig
    from rlstream.trainers.environments.episodes import run_episodes
    from rlstream.trainers.envs import Prompt
    from rlstream.trainers.policy import build_policy

    if "bench-delayed" not in ENVIRONMENTS:
        ENVIRONMENTS.register("bench-delayed")(Delayed)
    policy = build_policy(ModelConfig(), seed=0)
    arms = []
    for latency in latencies_ms:
        settings = EnvConfig(
            max_turns=turns, options=f'{{"latency_ms": {latency}, "turns": {turns}}}'
        )
        for n in concurrency:
            arm = Arm(latency, n, Figure(), Figure())
            for r in range(repeats):
                generator = torch.Generator().manual_seed(r)
                played = waited = 0.0
                started = time.perf_counter()
                while played < episodes:
                    prompts = [Prompt(f"b{r}-{played}-{i}", f"{i % 10}+{i % 7}=", "add", 1, "",
                                      environment="bench-delayed") for i in range(n)]  # fmt: skip
                    batch = run_episodes(policy.model, policy.tok, prompts, 1, 4, 1.0, settings,
                                         generator)  # fmt: skip
                    waited += max(e.env_s for e in batch)  # the batch waits on its slowest
                    played += len(batch)
                wall = time.perf_counter() - started
                arm.episodes_per_s.values.append(played / wall)
                arm.wait_share.values.append(waited / wall)
            arms.append(arm)
    return arms
