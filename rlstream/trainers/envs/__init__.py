"""Procedural task families with verifiable answers, a registry, and reproducible splits."""

from rlstream.trainers.envs import (  # noqa: F401  (register families)
    arithmetic,
    code,
    puzzles,
    tools,
    verifiers,
    walk,
)
from rlstream.trainers.envs.base import (
    TASKS,
    Grade,
    Prompt,
    TaskFamily,
    TaskMix,
    get_task,
    grade_all,
    make_prompt_id,
    register_task,
    sample_prompts,
    split_of,
    verify,
)

__all__ = [
    "TASKS",
    "Grade",
    "Prompt",
    "TaskFamily",
    "TaskMix",
    "get_task",
    "grade_all",
    "make_prompt_id",
    "register_task",
    "sample_prompts",
    "split_of",
    "verify",
]
