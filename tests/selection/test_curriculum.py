"""The curriculum over difficulty: the easiest level first, the next once the hardest open
level's success rate over the window reaches the threshold; late prompts wait for their level;
a restored curriculum makes the same selections as the uninterrupted one."""

from __future__ import annotations

import random

from rlstream.trainers.envs import get_task
from rlstream.trainers.selection.curriculum import Curriculum
from rlstream.trainers.selection.registry import make_selection_sampler


def _pool(n: int = 60) -> list:
    family, rng = get_task("walk"), random.Random(0)
    return [family.generate(rng, d) for d in (1, 2, 3) for _ in range(n // 3)]


def _curriculum(pool, threshold=0.75, window=4):
    return Curriculum(lambda open_pool: make_selection_sampler("uniform", open_pool, 0), pool,
                      threshold, window)  # fmt: skip


def test_levels_open_one_at_a_time_as_the_hardest_open_one_is_solved():
    c = _curriculum(_pool())
    assert c.level == 1 and {p.difficulty for p in c.inner.pool} == {1}
    for step in range(3):  # failing: the level stays
        picks = c.select(step, 4)
        assert {p.difficulty for p in picks} == {1}
        c.update(picks, [[0.0, 0.0, 1.0, 0.0]] * len(picks))
    assert c.level == 1
    picks = c.select(3, 4)
    c.update(picks, [[1.0, 1.0, 1.0, 0.0]] * len(picks))  # 75% over the window: level 2 opens
    assert c.level == 2 and c.raised_at == [4]
    assert {p.difficulty for p in c.inner.pool} == {1, 2} and len(c.pool) == 60
    seen = {p.difficulty for step in range(10) for p in c.select(10 + step, 4)}
    assert seen == {1, 2}  # never 3 yet
    assert c.figures()["curriculum_level"] == 2


def test_prompts_published_later_wait_for_their_level():
    pool = _pool()
    c = _curriculum([p for p in pool if p.difficulty < 3])
    late = [p for p in pool if p.difficulty == 3][:5]
    c.extend(late)
    assert c.levels == [1, 2, 3] and not set(late) & set(c.inner.pool)
    c.raise_level()
    c.raise_level()
    assert c.level == 3 and set(late) <= set(c.inner.pool)


def test_a_restored_curriculum_selects_what_the_uninterrupted_one_would():
    pool = _pool()
    a = _curriculum(pool)
    for step in range(4):
        picks = a.select(step, 4)
        a.update(picks, [[1.0, 1.0, 1.0, 1.0]] * len(picks))
    assert a.level >= 2
    b = _curriculum(pool)
    b.load_state_dict(a.state_dict())
    assert b.level == a.level and [p.prompt_id for p in b.inner.pool] == [
        p.prompt_id for p in a.inner.pool
    ]
    assert [p.prompt_id for p in b.select(9, 8)] == [p.prompt_id for p in a.select(9, 8)]
