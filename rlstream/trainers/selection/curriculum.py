"""A curriculum over difficulty: any sampler, shown the pool's easiest level first and each
harder one once the policy succeeds at the hardest level open.

`selection.curriculum` (a success rate, 0: off) and `selection.curriculum_window` (groups):
the inner sampler (uniform, ppm, ...) chooses among the prompts of the open levels only; when
the share of successful rollouts over the last `window` groups of the hardest open level
reaches the threshold, the next level's prompts join its pool. For an environment whose
dynamics follow the prompt's difficulty (the world's slips), this raises the environment's
difficulty as the policy improves.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from rlstream.trainers.envs import Prompt

log = logging.getLogger(__name__)


class Curriculum:
    """The sampler interface (`select`, `update`, `extend`, `state_dict`) around an inner
    sampler built by `make(pool)` over the open levels' prompts."""

    def __init__(self, make: Callable[[list[Prompt]], object], pool: list[Prompt],
                 threshold: float, window: int):  # fmt: skip
        self.make, self.threshold, self.window = make, threshold, window
        self.given = list(pool)  # every prompt the sampler was given, open or waiting
        self.levels = sorted({p.difficulty for p in pool})
        self.open = 1  # levels open: self.levels[: self.open]
        self.waiting: list[Prompt] = [p for p in pool if p.difficulty > self.levels[0]]
        self.recent: deque[float] = deque(maxlen=window)
        self.raised_at: list[int] = []  # the update count at which each level opened
        self.updates = 0
        self.inner = make([p for p in pool if p.difficulty <= self.levels[0]])

    @property
    def pool(self) -> list[Prompt]:
        """Every prompt given, in the order given (the loops extend by what it holds)."""
        return self.given

    @property
    def level(self) -> int:
        """The hardest difficulty open."""
        return self.levels[self.open - 1]

    def __getattr__(self, name: str):  # everything else is the inner sampler's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def select(self, step: int, batch_size: int) -> list[Prompt]:
        return self.inner.select(step, batch_size)

    def update(self, prompts: list[Prompt], rewards: list[list[float]]) -> None:
        self.inner.update(prompts, rewards)
        self.updates += 1
        for prompt, group in zip(prompts, rewards, strict=True):
            if prompt.difficulty == self.level and group:
                self.recent.append(sum(r >= 0.5 for r in group) / len(group))
        full = len(self.recent) == self.window
        if full and sum(self.recent) / self.window >= self.threshold:
            self.raise_level()

    def raise_level(self) -> None:
        if self.open == len(self.levels):
            return
        self.open += 1
        joining = [p for p in self.waiting if p.difficulty <= self.level]
        self.waiting = [p for p in self.waiting if p.difficulty > self.level]
        self.recent.clear()
        self.raised_at.append(self.updates)
        self.inner.extend(joining)
        log.info("curriculum: difficulty %d opens (%d prompts) after %d updates", self.level,
                 len(joining), self.updates)  # fmt: skip

    def extend(self, prompts: list[Prompt]) -> None:
        """Prompts published while the run goes: open levels join now, the rest wait (a
        difficulty the pool had not seen opens after every level below it)."""
        self.given += prompts
        new_levels = {p.difficulty for p in prompts} - set(self.levels)
        if new_levels:
            level = self.level
            self.levels = sorted(set(self.levels) | new_levels)
            self.open = self.levels.index(level) + 1
        self.waiting += [p for p in prompts if p.difficulty > self.level]
        now = [p for p in prompts if p.difficulty <= self.level]
        if now:
            self.inner.extend(now)

    def figures(self) -> dict:
        return {"curriculum_level": self.level, "curriculum_levels": self.levels,
                "curriculum_raised_at": list(self.raised_at)}  # fmt: skip

    def state_dict(self) -> dict:
        order = [p.prompt_id for p in self.inner.pool]
        mine = {"open": self.open, "recent": list(self.recent), "raised_at": self.raised_at,
                "updates": self.updates, "order": order}  # fmt: skip
        return self.inner.state_dict() | {"curriculum": mine}

    def load_state_dict(self, state: dict) -> None:
        """The inner sampler rebuilt over the saved open prompts in their saved order (its
        per-prompt state is positional), then its own state restored."""
        mine = state.get("curriculum", {})
        self.open = min(mine.get("open", 1), len(self.levels))
        by_id = {p.prompt_id: p for p in self.given}
        order = [by_id[i] for i in mine.get("order", []) if i in by_id]
        if order:
            self.inner = self.make(order)
        inside = {p.prompt_id for p in self.inner.pool}
        self.waiting = [p for p in self.given if p.prompt_id not in inside]
        self.recent = deque(mine.get("recent", []), maxlen=self.window)
        self.raised_at, self.updates = mine.get("raised_at", []), mine.get("updates", 0)
        self.inner.load_state_dict(state)
