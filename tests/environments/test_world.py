"""The world environment: its dynamics follow the prompt's difficulty (slips at 2 and 3), a
worked walk reaches the goal, the flawed habit (always `+`) never reaches a lower one."""

from __future__ import annotations

import asyncio
import random

from rlstream.config import EnvConfig
from rlstream.trainers.environments.world import World
from rlstream.trainers.envs import get_task


def _play(world: World, prompt, actions: list[str]) -> tuple[float, bool, list[str]]:
    async def go():
        await world.reset(prompt)
        said = []
        for action in actions:
            step = await world.step(action)
            said.append(step.observation)
            if step.done:
                return step.reward, True, said
        return 0.0, False, said

    return asyncio.run(go())


def test_a_worked_walk_reaches_the_goal_and_the_flawed_habit_never_reaches_a_lower_one():
    family, rng = get_task("walk"), random.Random(0)
    prompts = [family.generate(rng, 1) for _ in range(40)]
    for p in prompts:
        actions = family.transcript(p, flawed=False).split("\n")[::2]
        reward, done, said = _play(World(EnvConfig()), p, actions)
        assert done and reward == 1.0, (p.text, actions, said)
        positions = family.transcript(p, flawed=False).split("\n")[1::2]
        assert [s.strip() for s in said[:-1]] == positions  # no slips at difficulty 1
    lower = [p for p in prompts if family.flawed_answer(p) is not None]
    assert lower
    for p in lower:
        assert _play(World(EnvConfig()), p, ["+"] * 9)[1] is False


def test_the_dynamics_harden_with_the_difficulty():
    family, rng = get_task("walk"), random.Random(1)
    slips = {}
    for d in (1, 2):
        world, n, slipped = World(EnvConfig(options='{"seed": 7}')), 0, 0
        for _ in range(200):
            p = family.generate(rng, d)
            asyncio.run(world.reset(p))
            step = asyncio.run(world.step("+"))
            n, slipped = n + 1, slipped + step.info["slipped"]
        slips[d] = slipped / n
    assert slips[1] == 0 and 0.08 < slips[2] < 0.25
    forced = World(EnvConfig(options='{"slip": 1.0}'))
    p = family.generate(rng, 1)
    asyncio.run(forced.reset(p))
    start = int(p.text.split()[2])
    step = asyncio.run(forced.step("+"))
    assert step.info["slipped"] and (step.done or step.observation == f"{max(0, start - 1)}\n")


def test_a_prompts_own_env_options_set_its_episodes_world():
    """One task under two environment settings, as rows of a dataset: each episode's world
    takes its prompt's `env_options` over the run's env.options."""
    import json

    from rlstream.trainers.environments.base import open_environment
    from rlstream.trainers.envs import Prompt

    family = get_task("walk")
    base = family.generate(random.Random(2), 1)
    slippery = Prompt(**(base.to_row() | {"metadata": json.dumps({"env_options": {"slip": 1.0}})}))
    run = EnvConfig(options='{"slip": 0.0}')
    plain_world = open_environment("world", run, base)
    slippery_world = open_environment("world", run, slippery)
    asyncio.run(plain_world.reset(base))
    asyncio.run(slippery_world.reset(slippery))
    assert not asyncio.run(plain_world.step("+")).info["slipped"]
    assert asyncio.run(slippery_world.step("+")).info["slipped"]
    assert slippery_world.slip == 1.0 and plain_world.slip == 0.0
