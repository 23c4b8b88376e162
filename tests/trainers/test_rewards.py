import doctest
import json

import pytest

from rlstream.trainers import rewards
from rlstream.trainers.rewards import RewardConfigError, build_reward


def test_doctests():
    assert doctest.testmod(rewards).failed == 0


def test_weighted_combination_on_hand_made_cases():
    fn = build_reward(
        {
            "rules": [
                {"type": "exact_match", "weight": 1.0},
                {"type": "format", "pattern": "[0-9]+", "weight": 0.5},
                {"type": "length_penalty", "max_chars": 4, "per_char": 0.25},
            ]
        }
    )
    got = fn(["2210", "2211", "22a", "221000"], answer=["2210"] * 4)
    assert got == [1.5, 0.5, 0.0, 0.5 - 0.5]


def test_numeric_tolerance_and_countdown_and_math_verify():
    num = build_reward('{"rules": [{"type": "numeric", "rel_tol": 0.01}]}')
    assert num(["about 99.5", "98"], answer=["100", "100"]) == [1.0, 0.0]
    cd = build_reward({"rules": [{"type": "countdown"}]})
    assert cd(["7+3*5", "3*5+7", "3*5+7+7", "22"], answer=["3*5+7"] * 4) == [1.0, 1.0, 0.0, 0.0]
    pytest.importorskip("math_verify")
    mv = build_reward({"rules": [{"type": "math_verify"}]})
    assert mv(["$\\frac{1}{2}$", "0.25"], answer=["0.5", "0.5"]) == [1.0, 0.0]


@pytest.mark.parametrize(
    "config, field",
    [
        ({"rules": [{"type": "exact_match"}, {"type": "nope"}]}, r"rules\[1\]\.type"),
        ({"rules": [{"type": "format"}]}, r"rules\[0\]\.pattern: required"),
        ({"rules": [{"type": "format", "pattern": "(["}]}, r"rules\[0\]\.pattern: invalid regex"),
        ({"rules": [{"type": "exact_match", "weight": "1"}]}, r"rules\[0\]\.weight"),
        ({"rules": [{"type": "length_penalty", "max_chars": 2.5}]}, r"rules\[0\]\.max_chars"),
        ({"rules": [{"type": "exact_match", "tol": 1}]}, r"rules\[0\]\.tol: not a parameter"),
        ({"rules": []}, r"rules: the list is empty"),
        ({"rule": []}, r"^rules:"),
        ({"rules": [{"type": "exact_match"}], "extra": 1}, r"^extra:"),
        ({"rules": ["exact_match"]}, r"rules\[0\]: must be an object"),
        ('{"rules": [', r"invalid JSON"),
    ],
)
def test_malformed_rules_name_the_bad_field(config, field):
    with pytest.raises(RewardConfigError, match=field) as e:
        build_reward(config)
    assert "\n" not in str(e.value)


def test_rule_files(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"rules": [{"type": "exact_match"}]}))
    assert build_reward(good)(["1"], answer=["1"]) == [1.0]
    assert build_reward(str(good))(["1"], answer=["2"]) == [0.0]
    bad = tmp_path / "bad.json"
    bad.write_text('{"rules": [{"type": "numeric", "abs_tol": "x"}]}')
    with pytest.raises(RewardConfigError, match=r"rules\[0\]\.abs_tol"):
        build_reward(bad)
    with pytest.raises(RewardConfigError, match="missing.json"):
        build_reward(tmp_path / "missing.json")


def test_a_reward_function_loads_by_path_or_module_and_bad_specs_say_why(tmp_path):
    from rlstream.trainers.rewards import load_reward_fn

    (tmp_path / "grader.py").write_text(
        "LIMIT = 3\n"
        "def short(completions, **kw):\n    return [float(len(c) < LIMIT) for c in completions]\n"
    )
    (tmp_path / "broken.py").write_text("import no_such_module_anywhere\n")
    fn = load_reward_fn(f"{tmp_path}/grader.py:short")
    assert fn(["ab", "abcd"]) == [1.0, 0.0]
    assert load_reward_fn("math:sqrt")(4) == 2.0  # a module by name
    cases = {
        "grader.py": "give package.module:Name",
        f"{tmp_path}/missing.py:short": "no such file",
        f"{tmp_path}/broken.py:short": "importing",
        f"{tmp_path}/grader.py:nope": "has no 'nope'",
        f"{tmp_path}/grader.py:LIMIT": "has no function 'LIMIT'",
    }
    for spec, reason in cases.items():
        with pytest.raises(RewardConfigError, match=reason) as e:
            load_reward_fn(spec)
        assert "\n" not in str(e.value)


def test_a_format_bonus_sits_beside_a_chain_of_thought_prompts_own_verifier():
    import random

    from rlstream.trainers.envs import get_task
    from rlstream.trainers.rewards import build_reward, call_reward

    cot = get_task("cot:add")
    prompt = cot.generate(random.Random(0), 2)
    fn = build_reward({"rules": [{"type": "verifier"},
                                 {"type": "format", "pattern": ".*<answer>.*</answer>",
                                  "weight": 0.1}]})  # fmt: skip
    right, tagged_wrong = cot.solution(prompt), "1+1=2<answer>9</answer>"
    got = call_reward(fn, [right, tagged_wrong, prompt.answer], [prompt] * 3)
    assert got == pytest.approx([1.1, 0.1, 0.0])  # the bare answer: no tag, neither reward
