"""Procedural task families with verifiable answers, a registry, and reproducible splits."""

from rlstream.trainers.envs import (  # noqa: F401  (register families)
    arithmetic,
    puzzles,
    tools,
    verifiers,
)
from rlstream.trainers.envs.base import (
    TASKS,
    Prompt,
    TaskFamily,
    TaskMix,
    get_task,
    make_prompt_id,
    register_task,
    sample_prompts,
    split_of,
    verify,
)

__all__ = [
    "TASKS",
    "Prompt",
    "TaskFamily",
    "TaskMix",
    "get_task",
    "make_prompt_id",
    "register_task",
    "sample_prompts",
    "split_of",
    "verify",
]
