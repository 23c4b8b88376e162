"""The simulated user: truthful hints lead a search by halves to the secret, as the `guess`
family's worked documents say; patience, noise and reveal change what it says."""

from __future__ import annotations

import asyncio
import random

from rlstream.config import EnvConfig
from rlstream.trainers.environments import open_environment
from rlstream.trainers.envs import get_task


def play(prompt, lines, **options):
    import json

    env = open_environment("user", EnvConfig(max_turns=12, options=json.dumps(options)))

    async def go():
        await env.reset(prompt)
        return [await env.step(line) for line in lines]

    return asyncio.run(go())


def test_a_worked_documents_dialogue_is_what_the_user_says():
    family = get_task("guess")
    for seed in range(20):
        prompt = family.generate(random.Random(seed), 1 + seed % 3)
        lines = family.transcript(prompt, flawed=False).split("\n")
        guesses, hints = lines[0::2], lines[1::2]
        steps = play(prompt, guesses)
        assert [s.observation.strip() for s in steps[:-1]] == hints
        assert steps[-1].done and steps[-1].reward == 1.0 and guesses[-1] == prompt.answer


def test_patience_noise_reveal_and_cost_shape_the_dialogue():
    prompt = get_task("guess").generate(random.Random(3), 2)
    secret = int(prompt.answer)
    wrong = str(secret - 1 if secret > 1 else secret + 1)
    left = play(prompt, [wrong] * 3, patience=3)
    assert not left[1].done and left[2].done and left[2].reward == 0.0 and left[2].info["left"]
    truthful = play(prompt, [wrong] * 8)[0].observation
    noisy = {s.observation for s in play(prompt, [wrong] * 8, noise=1.0)[:7]}
    assert noisy == {
        truthful.replace("higher", "x").replace("lower", "higher").replace("x", "lower")
    }
    assert play(prompt, [wrong], reveal="distance")[0].observation.strip().endswith("by 1")
    assert play(prompt, ["what?"])[0].observation == "a number please\n"
    paid = play(prompt, [wrong, wrong, prompt.answer], turn_cost=0.25)[-1]
    assert paid.done and paid.reward == 0.5
