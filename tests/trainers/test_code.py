"""The `code` verifier's rows in the common datasets' shapes (MBPP, HumanEval, APPS,
CodeContests, plain io pairs), its admission check, and the built-in `fn` family."""

from __future__ import annotations

import json
import random

import pytest

from rlstream.trainers.datasets import verifier_problem
from rlstream.trainers.envs import Prompt, get_task, grade_all
from rlstream.trainers.envs.code import code_of, parse_task


def _prompt(text: str = "", **columns) -> Prompt:
    return Prompt("p", text, "code", 0, "", "code", json.dumps(columns))


def test_mbpp_rows_score_the_share_of_their_asserts_with_the_setup_code_first():
    p = _prompt("Write add(a, b).", test_list=["assert add(1, 2) == 3", "assert add(2, 2) == 5"],
                test_setup_code="import math")  # fmt: skip
    [g] = grade_all(["def add(a, b):\n    return a + b + int(math.floor(0.5))"], [p])
    assert g.reward == 0.5 and not g.correct and "1/2 tests passed" in g.details


def test_humaneval_rows_run_the_prompt_then_the_completion_and_are_all_or_nothing():
    check = "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(3) == 9\n"
    p = _prompt("def square(x):\n", test=check, entry_point="square")
    good, half = grade_all(["    return x * x\n", "    return 2 * x\n"], [p, p])
    assert good.reward == 1.0 and good.correct
    assert half.reward == 0.0  # passes candidate(2) only: HumanEval scores all or nothing


def test_stdin_stdout_rows_in_apps_and_codecontests_shapes():
    program = "n = int(input())\nprint(n * 2)\n"
    apps = _prompt("double", input_output=json.dumps({"inputs": ["2\n", "5\n"],
                                                      "outputs": ["4\n", "10\n"]}))  # fmt: skip
    contests = _prompt("double", public_tests={"input": ["3\n"], "output": ["6"]},
                       private_tests={"input": ["7\n"], "output": ["15\n"]})  # fmt: skip
    a, c = grade_all([program, program], [apps, contests])
    assert a.reward == 1.0 and a.correct
    assert c.reward == 0.5 and "input '7\\n': printed '14\\n', expected '15\\n'" in c.details


def test_a_fenced_block_is_the_code_and_all_scoring_is_honoured():
    p = _prompt("x", tests=["assert f() == 1", "assert f() == 2"], scoring="all")
    [g] = grade_all(["Here it is:\n```python\ndef f():\n    return 1\n```\nDone."], [p])
    assert g.reward == 0.0 and "1/2 tests passed" in g.details
    assert code_of("```\nprint(1)\n```") == "print(1)\n"


@pytest.mark.parametrize(
    ("columns", "reason"),
    [
        ({}, "has no tests"),
        ({"tests": ["assert f(1) ==="]}, "test 0 does not parse"),
        ({"tests": "assert f(1) == 1", "language": "rust"}, "only python runs"),
        ({"tests": [1, 2]}, "must be a list of test statements"),
        ({"test": "def check(c): pass"}, "needs entry_point"),
        ({"io": [{"input": "1"}]}, "io must be a list"),
        ({"tests": ["assert 1"], "scoring": "most"}, "is not share or all"),
    ],
)
def test_admission_refuses_rows_whose_tests_cannot_run_with_the_reason(columns, reason):
    row = {"prompt_id": "p", "text": "t", "task": "code", "metadata": json.dumps(columns)}
    problem = verifier_problem(row)
    assert problem is not None and reason in problem and problem.startswith("task 'code'")


def test_a_good_row_is_admitted():
    row = {"text": "t", "task": "code", "metadata": json.dumps({"tests": ["assert True"]})}
    assert verifier_problem(row) is None
    assert parse_task("t", row["metadata"]).count == 1


def test_the_fn_family_writes_the_classic_bugs_and_its_tests_catch_them():
    family, rng = get_task("fn"), random.Random(3)
    prompts = [family.generate(rng, d) for d in (1, 2) for _ in range(40)]
    flawed = [(p, family.flawed_answer(p)) for p in prompts]
    flawed = [(p, bad) for p, bad in flawed if bad is not None]
    assert {bad[1] for _, bad in flawed} == {"/", "^"}  # x/k and x^k
    grades = grade_all([p.answer for p in prompts] + [bad for _, bad in flawed],
                       prompts + [p for p, _ in flawed])  # fmt: skip
    assert all(g.correct for g in grades[: len(prompts)])
    assert not any(g.correct for g in grades[len(prompts) :])
    assert all(p.verifier == "code" and p.text.endswith("=lambda x:") for p in prompts)


def test_datasets_export_writes_the_code_family_as_a_users_file(tmp_path):
    import subprocess
    import sys

    from rlstream.schemas import get
    from rlstream.trainers.datasets import file_rows, prompt_of_row

    out = tmp_path / "fn.jsonl"
    subprocess.run([sys.executable, "-m", "rlstream.cli", "datasets", "export", "fn", "--size",
                    "40", "--out", str(out)], check=True, capture_output=True)  # fmt: skip
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(written) == 40 and all("tests" in r and r["verifier"] == "code" for r in written)
    rows, bad = file_rows(str(out), get("prompts"), "fn-export", verifier_problem)
    assert not bad and len(rows) == 40
    prompts = [prompt_of_row(r) for r in rows]
    assert all(g.correct for g in grade_all([p.answer for p in prompts], prompts))
