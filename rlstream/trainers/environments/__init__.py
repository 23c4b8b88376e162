"""Environments: multi-turn episodes, the design notes' environment simulator.

An episode is `reset(prompt) -> observation`, then `step(action) -> Step(observation, reward,
done, info)` after each policy turn, until the environment says done, the turn limit or the
context runs out. A prompt names its environment (`Prompt.environment`, a column of a prompts
row, or its task family's `environment`); a prompt without one is the one-step case: one
policy turn, scored by its verifier. `base` holds the interface and registry (no torch),
`episodes` the token-in/token-out engine the rollout workers and evaluation run.
"""

from rlstream.trainers.environments.base import (
    ENVIRONMENTS,
    Environment,
    EnvironmentFailed,
    Step,
    open_environment,
)

__all__ = [
    "ENVIRONMENTS",
    "Environment",
    "EnvironmentFailed",
    "Step",
    "open_environment",
]
