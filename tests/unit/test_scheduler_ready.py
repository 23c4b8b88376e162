"""The streaming scheduler computes its pool's prompt vectors before the first policy exists:
the trainer publishes it when pre-training ends, and embedding the pool then (MiniLM, ~35 s
of CPU for 20,000 prompts) kept the trainer waiting for its first experience."""

from __future__ import annotations

import asyncio

from rlstream.config import ModelConfig, load_config
from rlstream.connectors.endpoints import Endpoints
from rlstream.streams.scheduler_rounds import Scheduler
from rlstream.trainers.envs.base import make_prompt
from rlstream.trainers.policy import build_policy


def test_the_pool_is_embedded_while_the_first_policy_is_awaited(tmp_path):
    cfg = load_config(None, ["run_id=ready", "selection.sampler=ppm",
                             "selection.ppm_features=text,hidden"])  # fmt: skip
    prompts = [make_prompt("add", f"{a}+{a + 3}=", str(2 * a + 3), 1) for a in range(40)]
    scheduler = Scheduler(
        cfg, Endpoints(qdrant_path=str(tmp_path)), [(p.prompt_id, p) for p in prompts]
    )
    cache = scheduler.env_state.featurize.cache

    async def go() -> None:
        ready = asyncio.create_task(scheduler.ready())
        for _ in range(200):  # the embedding runs in a thread
            if len(cache) == len(prompts):
                break
            await asyncio.sleep(0.02)
        assert set(cache) == {p.prompt_id for p in prompts}
        assert not ready.done() and scheduler.sampler is None  # no policy yet
        scheduler.follower.policy = build_policy(ModelConfig(n_layer=1, n_head=2, n_embd=16))
        scheduler.follower.ready.set()
        await asyncio.wait_for(ready, timeout=60)
        assert len(scheduler.sampler.pool) == len(prompts)
        assert scheduler.sampler.embedder is scheduler.env_state.featurize  # the cached vectors

    asyncio.run(go())
