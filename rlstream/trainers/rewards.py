"""Reward functions built from JSON rules, TRL style: `fn(completions, **kwargs) -> list[float]`.

A rule file looks like::

    {"rules": [
        {"type": "exact_match", "weight": 1.0},
        {"type": "format", "pattern": "^[0-9]+$", "weight": 0.1},
        {"type": "length_penalty", "max_chars": 8, "per_char": 0.05}
    ]}

`verifier` is each prompt's own verifier (a chain-of-thought prompt's reads only its final
answer tag), so a format bonus can sit beside it:
`[{"type": "verifier"}, {"type": "format", "pattern": ".*<answer>.*</answer>", "weight": 0.1}]`.

The reward is the weighted sum of the rules. Every rule is validated on load; a bad file raises
`RewardConfigError` naming the field (`rules[1].pattern: ...`). Keyword arguments are the prompt
columns (`answer`, `text`, ...), one value per completion.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlstream.registry import import_spec
from rlstream.trainers.envs.puzzles import countdown_correct

RewardFn = Callable[..., list[float]]


class RewardConfigError(ValueError):
    """A reward rule file is malformed; the message names the field and the fix."""


# ---- reward functions (pure) -------------------------------------------------------------------


def exact_match(completions: list[str], answer: list[str], **kwargs) -> list[float]:
    """1.0 where the stripped completion equals the answer.

    >>> exact_match(["2210", " 221 "], answer=["2210", "2210"])
    [1.0, 0.0]
    """
    return [float(c.strip() == str(a).strip()) for c, a in zip(completions, answer, strict=True)]


_NUM = re.compile(r"-?\d+(?:\.\d+)?")


def numeric(
    completions: list[str], answer: list[str], abs_tol: float = 0.0, rel_tol: float = 0.0, **kwargs
) -> list[float]:
    """1.0 where the last number in the completion is within tolerance of the answer.

    >>> numeric(["x = 3.14", "3", "none"], answer=["3.1416"] * 3, abs_tol=0.01)
    [1.0, 0.0, 0.0]
    """
    out = []
    for c, a in zip(completions, answer, strict=True):
        nums = _NUM.findall(c)
        ok = bool(nums) and math.isclose(
            float(nums[-1]), float(a), abs_tol=abs_tol, rel_tol=rel_tol
        )
        out.append(float(ok))
    return out


def countdown(completions: list[str], answer: list[str], **kwargs) -> list[float]:
    """1.0 where the completion is an expression reaching the reference's value with its numbers.

    >>> countdown(["9*3-5+2", "9*3"], answer=["2-5+9*3", "2-5+9*3"])
    [1.0, 0.0]
    """
    return [float(countdown_correct(c, a)) for c, a in zip(completions, answer, strict=True)]


def format_match(completions: list[str], pattern: str, **kwargs) -> list[float]:
    """1.0 where the whole stripped completion matches the regex.

    >>> format_match(["0122", "12a"], pattern="[0-9]+")
    [1.0, 0.0]
    """
    rx = re.compile(pattern)
    return [float(rx.fullmatch(c.strip()) is not None) for c in completions]


def length_penalty(
    completions: list[str], max_chars: int, per_char: float = 0.01, **kwargs
) -> list[float]:
    """-per_char for every character beyond max_chars (0 otherwise).

    >>> length_penalty(["abc", "abcdef"], max_chars=4, per_char=0.5)
    [0.0, -1.0]
    """
    return [-per_char * (len(c) - max_chars) if len(c) > max_chars else 0.0 for c in completions]


def math_verify_match(completions: list[str], answer: list[str], **kwargs) -> list[float]:
    """1.0 where math-verify finds the completion equivalent to the answer (e.g. 1/2 == 0.5).

    Timeouts are disabled: math-verify's timeouts use signals and are not thread-safe (INFRA.md).

    >>> math_verify_match(["$\\\\frac{1}{2}$", "0.4"], answer=["0.5", "0.5"])
    [1.0, 0.0]
    """
    from math_verify import parse, verify

    out = []
    for c, a in zip(completions, answer, strict=True):
        gold = parse(str(a), parsing_timeout=None)
        pred = parse(c, parsing_timeout=None)
        out.append(float(bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=None)))
    return out


# ---- rules registry and loading ----------------------------------------------------------------


@dataclass(frozen=True)
class RuleSpec:
    """A rule type: its function and its parameters {name: (type, required)}."""

    fn: RewardFn
    params: dict[str, tuple[type | tuple[type, ...], bool]]


_NUMBER = (int, float)
RULES: dict[str, RuleSpec] = {}


def register_rule(name: str, fn: RewardFn, **params: tuple) -> None:
    """Add a rule type; a duplicate name is an error."""
    if name in RULES:
        raise ValueError(f"reward rule {name!r} is already registered")
    RULES[name] = RuleSpec(fn, params)


register_rule("exact_match", exact_match)
register_rule("verifier", lambda completions, prompts, **kw: verifier_reward(completions, prompts))
register_rule("numeric", numeric, abs_tol=(_NUMBER, False), rel_tol=(_NUMBER, False))
register_rule("countdown", countdown)
register_rule("format", format_match, pattern=(str, True))
register_rule("length_penalty", length_penalty, max_chars=(int, True), per_char=(_NUMBER, False))
register_rule("math_verify", math_verify_match)


def _validate_rule(i: int, rule: object) -> tuple[str, float, dict]:
    where = f"rules[{i}]"
    if not isinstance(rule, dict):
        raise RewardConfigError(f"{where}: must be an object, got {type(rule).__name__}")
    kind = rule.get("type")
    if kind not in RULES:
        raise RewardConfigError(f"{where}.type: unknown rule {kind!r}; known: {sorted(RULES)}")
    spec = RULES[kind]
    weight = rule.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, _NUMBER):
        raise RewardConfigError(f"{where}.weight: must be a number, got {weight!r}")
    params = {k: v for k, v in rule.items() if k not in ("type", "weight")}
    for key in params:
        if key not in spec.params:
            known = ", ".join(sorted(spec.params)) or "none"
            raise RewardConfigError(f"{where}.{key}: not a parameter of {kind} (known: {known})")
    for key, (typ, required) in spec.params.items():
        if key not in params:
            if required:
                raise RewardConfigError(f"{where}.{key}: required by {kind}")
            continue
        val = params[key]
        if isinstance(val, bool) or not isinstance(val, typ):
            raise RewardConfigError(f"{where}.{key}: wrong type {type(val).__name__}")
    if "pattern" in params:
        try:
            re.compile(params["pattern"])
        except re.error as e:
            raise RewardConfigError(f"{where}.pattern: invalid regex ({e})") from None
    return kind, float(weight), params


def build_reward(config: dict | str | Path) -> RewardFn:
    """A reward function from a rule dict, a JSON string or a path to a JSON file.

    >>> fn = build_reward({"rules": [{"type": "exact_match"}, {"type": "length_penalty",
    ...                   "max_chars": 4, "per_char": 0.5}]})
    >>> fn(["2210", "221000"], answer=["2210", "2210"])
    [1.0, -1.0]
    """
    if isinstance(config, Path) or (
        isinstance(config, str) and not config.lstrip().startswith("{")
    ):
        try:
            config = Path(config).read_text()
        except OSError as e:
            raise RewardConfigError(f"reward rules file {config}: {e.strerror}") from None
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except json.JSONDecodeError as e:
            raise RewardConfigError(f"reward rules: invalid JSON ({e})") from None
    if not isinstance(config, dict) or not isinstance(config.get("rules"), list):
        raise RewardConfigError("rules: expected an object with a list under 'rules'")
    if not config["rules"]:
        raise RewardConfigError("rules: the list is empty; give at least one rule")
    extra = set(config) - {"rules"}
    if extra:
        raise RewardConfigError(f"{sorted(extra)[0]}: unknown top-level field (only 'rules')")
    rules = [_validate_rule(i, r) for i, r in enumerate(config["rules"])]

    def reward(completions: list[str], **kwargs) -> list[float]:
        total = [0.0] * len(completions)
        for kind, weight, params in rules:
            scores = RULES[kind].fn(completions, **kwargs, **params)
            total = [t + weight * s for t, s in zip(total, scores, strict=True)]
        return total

    return reward


def reward_kwargs(prompts: list) -> dict[str, list]:
    """The prompt columns a reward function receives, one value per completion (TRL passes a
    dataset's columns the same way); `prompts` holds the Prompt objects themselves. A user's
    further columns (the row's `metadata`) come as keyword arguments too, None where a row
    lacks one; a column named like a built-in one keeps the built-in's value.

    >>> from rlstream.trainers.envs import Prompt
    >>> p = Prompt("id", "2+2=", "numeric", 0, "4", metadata='{"level": "easy"}')
    >>> reward_kwargs([p, Prompt("id2", "1+1=", "numeric", 0, "2")])["level"]
    ['easy', None]
    """
    extra = [_columns(p) for p in prompts]
    names = sorted({k for row in extra for k in row})
    return {name: [row.get(name) for row in extra] for name in names} | {
        "prompts": prompts,
        "answer": [p.answer for p in prompts],
        "text": [p.text for p in prompts],
        "task": [p.task for p in prompts],
        "prompt_id": [p.prompt_id for p in prompts],
        "difficulty": [p.difficulty for p in prompts],
        "verifier": [p.verifier for p in prompts],
    }


def _columns(prompt) -> dict:
    try:
        value = json.loads(getattr(prompt, "metadata", "") or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def call_reward(fn: RewardFn, completions: list[str], prompts: list) -> list[float]:
    """fn's rewards as floats, checked: one finite number per completion (ValueError else)."""
    rewards = fn(completions, **reward_kwargs(prompts))
    try:
        out = [float(r) for r in rewards]
    except (TypeError, ValueError):
        raise ValueError(f"the reward function returned {rewards!r:.80}, not numbers") from None
    if len(out) != len(completions):
        raise ValueError(f"the reward function gave {len(out)} rewards for {len(completions)}")
    if not all(math.isfinite(r) for r in out):
        raise ValueError(f"the reward function returned a non-finite reward ({out})")
    return out


def verifier_reward(completions: list[str], prompts: list, **kwargs) -> list[float]:
    """Default reward: each prompt's verifier's (1.0 where it verifies the completion; a code
    prompt's share of tests passed, or all-or-nothing, as its row says)."""
    from rlstream.trainers.envs import grade_all

    return [g.reward for g in grade_all(completions, prompts)]


def make_reward_fn(rules: str | Path | None, fn: str | None = None) -> RewardFn:
    """The user's function `fn` (module:function), else the JSON reward rules at `rules`,
    else each prompt's verifier."""
    if fn:
        return load_reward_fn(fn)
    return build_reward(rules) if rules else verifier_reward


def load_reward_fn(spec: str) -> RewardFn:
    """`module:function` or `path/to/file.py:function`, imported (`registry.import_spec`, as
    every plug-in is); RewardConfigError names what is wrong (the format, the file, the
    module, the attribute, not callable)."""
    where, _, name = spec.rpartition(":")
    if where.endswith(".py") and not Path(where).resolve().is_file():
        raise RewardConfigError(f"{spec!r}: no such file {where!r}")
    try:
        fn = import_spec(spec)
    except ValueError as exc:
        raise RewardConfigError(str(exc)) from None
    if not callable(fn):
        raise RewardConfigError(f"{spec!r}: {where!r} has no function {name!r}")
    return fn


def check_reward_fn(spec: str) -> None:
    """Whether `rl.reward_fn` loads; a ValueError says why (the config's check)."""
    try:
        load_reward_fn(spec)
    except RewardConfigError as exc:
        raise ValueError(str(exc)) from None
