"""The selection-sampler registry: name -> class; a duplicate name is an error.

Every registered class is built as `cls(pool, seed, args=None, **kwargs)`, the same call
`rlstream.trainers.samplers.make_sampler` uses, so any entry can be plugged into the local loop.
"""

from __future__ import annotations

from typing import Any

from rlstream.trainers.envs import Prompt

SELECTION_SAMPLERS: dict[str, type] = {}


def register_sampler(name: str):
    """Class decorator that adds a sampler under `name` (and sets `cls.name`)."""

    def add(cls: type) -> type:
        if name in SELECTION_SAMPLERS:
            raise ValueError(
                f"selection sampler {name!r} is already registered "
                f"(by {SELECTION_SAMPLERS[name].__qualname__}); pick another name"
            )
        cls.name = name
        SELECTION_SAMPLERS[name] = cls
        return cls

    return add


def make_selection_sampler(name: str, pool: list[Prompt], seed: int = 0, **kwargs: Any):
    """Build a registered sampler; unknown names list the known ones."""
    if name not in SELECTION_SAMPLERS:
        raise ValueError(f"unknown selection sampler {name!r}; known: {sorted(SELECTION_SAMPLERS)}")
    return SELECTION_SAMPLERS[name](pool, seed, **kwargs)
