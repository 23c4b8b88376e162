"""Prompts, the task-family interface and its registry, deterministic train/held-out splits.

A task family turns a `random.Random` and a difficulty into a `Prompt` whose `answer` is the exact
completion a correct model writes (for arithmetic: zero-padded, digit-reversed, see arithmetic.py).
Families also know how to verify a completion and, for pre-training, which *systematic* mistake a
flawed worked solution makes (INFRA.md: random wrong answers leave greedy accuracy unmoved by RL).
"""

from __future__ import annotations

import hashlib
import importlib
import random
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Prompt:
    """One verifiable prompt; every field is a plain str/int so it fits an Arrow `prompts` event."""

    prompt_id: str
    text: str
    task: str
    difficulty: int
    answer: str
    verifier: str = ""
    """the family whose verifier checks it (`exact`, `numeric`, `math`, ...); empty: the task's"""
    metadata: str = ""
    """the row's further columns as a JSON object (empty: none); a reward function gets each
    as a keyword argument, as TRL passes a dataset's columns"""
    environment: str = ""
    """the environment its episodes run in (`rlstream.trainers.environments`); empty: one
    policy turn, scored by the verifier"""

    def to_row(self) -> dict:
        """The prompt as a plain dict (prompt_id, text, task, difficulty, answer, verifier,
        metadata and environment where there are some)."""
        row = dict(vars(self))  # every field is a plain value: no deep copy (asdict) needed
        for optional in ("metadata", "environment"):
            if not row[optional]:
                del row[optional]
        return row


def make_prompt_id(task: str, text: str) -> str:
    """Deterministic id from content: the same task and text always give the same id.

    >>> make_prompt_id("add", "037+085=") == make_prompt_id("add", "037+085=")
    True
    """
    return hashlib.sha1(f"{task}\x1f{text}".encode()).hexdigest()[:16]


def make_prompt(task: str, text: str, answer: str, difficulty: int) -> Prompt:
    return Prompt(make_prompt_id(task, text), text, task, int(difficulty), answer)


class TaskFamily(Protocol):
    """A procedural generator of verifiable prompts with a difficulty knob."""

    name: str
    difficulties: tuple[int, ...]

    def generate(self, rng: random.Random, difficulty: int) -> Prompt:
        """A random prompt of the given difficulty."""
        ...

    def verify(self, completion: str, prompt: Prompt) -> bool:
        """Whether a completion (without the stop token) solves the prompt."""
        ...

    def flawed_answer(self, prompt: Prompt) -> str | None:
        """The answer a systematically wrong worked solution writes, or None if there is none."""
        ...


TASKS: dict[str, TaskFamily] = {}


def register_task(family: TaskFamily) -> TaskFamily:
    """Add a family to the registry; a duplicate name is an error."""
    if family.name in TASKS:
        raise ValueError(f"task family {family.name!r} is already registered")
    TASKS[family.name] = family
    return family


FAMILY_MAKERS = {
    "rg": "rlstream.trainers.envs.rgym:rgym_family",
    "cot": "rlstream.trainers.envs.cot:cot_family",
}
"""Families built on first use from a prefixed name (`rg:gcd`, `cot:add`): prefix ->
`module:function(name)`, imported by name so this module imports none of its plug-ins."""


def get_task(name: str) -> TaskFamily:
    """Look a family up by name; `rg:<dataset>` builds a reasoning-gym adapter on first use."""
    prefix = name.partition(":")[0]
    if name not in TASKS and prefix in FAMILY_MAKERS:
        module, maker = FAMILY_MAKERS[prefix].split(":")
        register_task(getattr(importlib.import_module(module), maker)(name))
    if name not in TASKS:
        raise KeyError(
            f"unknown task family {name!r}; known: {sorted(TASKS)}, cot:<task> or rg:<dataset>"
        )
    return TASKS[name]


def split_of(prompt_id: str, seed: int, heldout_frac: float) -> str:
    """'heldout' or 'train', a pure function of (prompt_id, seed): splits are disjoint by design."""
    h = int(hashlib.sha1(f"{seed}:{prompt_id}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "heldout" if h < heldout_frac else "train"


@dataclass(frozen=True)
class TaskMix:
    """Which families to draw from, with weights, and which difficulties of each."""

    weights: dict[str, float]
    difficulties: dict[str, tuple[int, ...]] | None = None
    heldout_frac: float = 0.2

    @classmethod
    def parse(cls, spec: str, heldout_frac: float = 0.2) -> TaskMix:
        """Parse 'add,sub' or 'add:2,mul:1@1-2' (name[:weight][@dmin-dmax]) into a mix; a
        reasoning-gym family keeps its prefix: 'rg:gcd:0.5' is rg:gcd at weight 0.5."""
        weights, diffs = {}, {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            part, _, drange = part.partition("@")
            prefix = "rg:" if part.startswith("rg:") else ""
            name, _, w = part.removeprefix(prefix).partition(":")
            name = prefix + name
            weights[name] = float(w) if w else 1.0
            if drange:
                lo, _, hi = drange.partition("-")
                diffs[name] = tuple(range(int(lo), int(hi or lo) + 1))
        for name in weights:
            if not getattr(get_task(name), "generates", True):
                raise KeyError(f"task {name!r} only verifies user prompts; it cannot generate")
        return cls(weights, diffs or None, heldout_frac)

    def draw(self, rng: random.Random) -> Prompt:
        """One prompt: a family by weight, then a difficulty uniformly from its range."""
        names = list(self.weights)
        name = rng.choices(names, weights=[self.weights[n] for n in names])[0]
        family = get_task(name)
        diffs = (self.difficulties or {}).get(name, family.difficulties)
        return family.generate(rng, rng.choice(diffs))


def sample_prompts(
    mix: TaskMix, n: int, split: str, seed: int, unique: bool = True, strict: bool = True
) -> list[Prompt]:
    """n prompts of one split ('train' or 'heldout'), reproducible from seed.

    With unique=True a small task space may hold fewer than n: strict=False returns what exists.

    Membership is decided by `split_of(prompt_id, seed)` so the same seed always gives disjoint
    splits however many prompts are drawn from each.
    """
    rng = random.Random(f"{seed}:{split}")
    out, seen = [], set()
    for _ in range(200 * n + 1000):
        if len(out) == n:
            return out
        p = mix.draw(rng)
        if split_of(p.prompt_id, seed, mix.heldout_frac) != split:
            continue
        if unique and p.prompt_id in seen:
            continue
        seen.add(p.prompt_id)
        out.append(p)
    if strict or not out:
        raise ValueError(
            f"could only draw {len(out)} of {n} {split} prompts: the task space is small"
        )
    return out


@dataclass(frozen=True)
class Grade:
    """A verifier's verdict on one completion: its reward, whether it is correct, and what a
    person reviewing it should read (which test failed, how the execution ended)."""

    reward: float
    correct: bool
    details: str = ""


def verify(completion: str, prompt: Prompt) -> bool:
    """Whether a completion solves a prompt, by its verifier (`verifier`, else its task's)."""
    return get_task(prompt.verifier or prompt.task).verify(completion, prompt)


def grade_all(completions: list[str], prompts: list[Prompt]) -> list[Grade]:
    """Each completion's Grade by its prompt's verifier: a family with `grade_many` (code,
    which runs its tests in the sandbox) grades its prompts in one batch, any other scores
    1.0 where it verifies the completion."""
    grades: list[Grade | None] = [None] * len(prompts)
    by_family: dict[str, list[int]] = {}
    for i, prompt in enumerate(prompts):
        by_family.setdefault(prompt.verifier or prompt.task, []).append(i)
    for name, members in by_family.items():
        family = get_task(name)
        mine = [completions[i] for i in members], [prompts[i] for i in members]
        if hasattr(family, "grade_many"):
            verdicts = family.grade_many(*mine)
        else:
            verdicts = [Grade(float(ok), ok) for ok in map(bool, map(family.verify, *mine))]
        for i, verdict in zip(members, verdicts, strict=True):
            grades[i] = verdict
    return grades


def check_task_mix(tasks: str, fmt: str) -> None:
    """Whether `data.tasks` names a mix the families can generate, in `data.format`; a
    ValueError names the setting and the fix (the config's check, SETTING_CHECKS)."""
    try:
        mix = TaskMix.parse(tasks)
    except (KeyError, ValueError) as exc:
        raise ValueError(f"data.tasks: {exc.args[0]}") from None
    flat = [n for n in mix.weights if fmt == "cot" and not hasattr(get_task(n), "solve")]
    if flat:
        raise ValueError(f"data.format: cot: task {flat[0]!r} has no worked solutions "
                         "(the built-in families do); use data.format=direct")  # fmt: skip
