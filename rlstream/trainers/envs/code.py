"""Code tasks: the `code` verifier runs a completion against its prompt's tests in the sandbox
(`rlstream.sandbox`), and `fn`, a built-in family of small Python functions.

A code prompt's tests are columns of its row (its `metadata`), in the common datasets' shapes:

    tests / test_list (MBPP)      assert statements, run after the program in its namespace;
                                  test_setup_code / setup runs before them
    test + entry_point (HumanEval) a `check(candidate)` function, called with the entry point;
                                  the program is the prompt's text followed by the completion
    io: [{"input", "output"}]     stdin/stdout pairs, one execution each (also APPS'
                                  input_output {"inputs", "outputs"} and CodeContests'
                                  public_tests / private_tests {"input", "output"})
    code_prefix                   text the program starts with, before the completion
    scoring                       share (the share of tests passed; default) or all (1 only
                                  when every test passes; HumanEval's default)
    language                      python (the only one the sandbox runs)

A completion's last fenced block (```python ... ```) is its code when it has one. The reward's
details name the first failing test and how the execution ended (timeout, crash, output limit).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass

from rlstream.trainers.envs.base import Grade, Prompt, make_prompt, register_task

_FENCE = re.compile(r"```[a-zA-Z0-9_+-]*\n(.*?)```", re.S)


@dataclass(frozen=True)
class CodeTask:
    """What a code prompt's row asks: the program's start, and its tests."""

    prefix: str = ""
    tests: tuple[str, ...] = ()
    io: tuple[tuple[str, str], ...] = ()
    scoring: str = "share"

    @property
    def count(self) -> int:
        return len(self.tests) + len(self.io)


def code_of(completion: str) -> str:
    """The code in a completion: its last fenced block, else all of it.

    >>> code_of("Here:\\n```python\\ndef f(x):\\n    return x\\n```\\n")
    'def f(x):\\n    return x\\n'
    >>> code_of("x+1")
    'x+1'
    """
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else completion


def parse_task(prompt_text: str, metadata: str) -> CodeTask:
    """The task a code row describes; ValueError names what is wrong with its columns."""
    try:
        cols = json.loads(metadata or "{}")
    except ValueError:
        raise ValueError("metadata is not JSON") from None
    if not isinstance(cols, dict):
        raise ValueError("metadata is not a JSON object")
    language = str(cols.get("language") or "python").lower()
    if language not in ("python", "python3", "py"):
        raise ValueError(f"language {language!r}: only python runs in the sandbox")
    tests, prefix, scoring = _strings(cols, "tests", "test_list"), cols.get("code_prefix"), "share"
    setup = cols.get("test_setup_code") or cols.get("setup") or ""
    if cols.get("test") and cols.get("entry_point"):  # HumanEval
        tests.append(f"{cols['test']}\ncheck({cols['entry_point']})")
        prefix, scoring = prefix if prefix is not None else prompt_text, "all"
    elif cols.get("test"):
        raise ValueError("test (HumanEval) needs entry_point, the function check() is given")
    io = _io_pairs(cols)
    if not tests and not io:
        raise ValueError("has no tests: give tests (or test_list), test with entry_point, or "
                         "io pairs (or input_output, public_tests)")  # fmt: skip
    for i, test in enumerate(tests):
        try:
            compile(test, f"<test {i}>", "exec")
        except SyntaxError as exc:
            raise ValueError(f"test {i} does not parse ({exc.msg}, line {exc.lineno})") from None
    scoring = cols.get("scoring") or scoring
    if scoring not in ("share", "all"):
        raise ValueError(f"scoring {scoring!r} is not share or all")
    if setup:
        tests = [f"{setup}\n{t}" for t in tests]
    return CodeTask(str(prefix or ""), tuple(tests), tuple(io), scoring)


def reference_solution(metadata: str | None) -> str:
    """A code row's reference solution from its columns: MBPP's `code`, HumanEval's
    `canonical_solution` ('' when it has neither, or is not a code row's JSON).

    >>> reference_solution('{"code": "def f(): return 1", "test_list": []}')
    'def f(): return 1'
    """
    try:
        cols = json.loads(metadata or "{}")
    except ValueError:
        return ""
    if not isinstance(cols, dict):
        return ""
    found = cols.get("code") or cols.get("canonical_solution") or ""
    return found if isinstance(found, str) else ""


def _strings(cols: dict, *names: str) -> list[str]:
    for name in names:
        value = cols.get(name)
        if value is None:
            continue
        if isinstance(value, str):
            value = [line for line in value.splitlines() if line.strip()]
        if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
            raise ValueError(f"{name} must be a list of test statements (strings)")
        return list(value)
    return []


def _io_pairs(cols: dict) -> list[tuple[str, str]]:
    pairs = []
    for pair in cols.get("io") or []:
        if not isinstance(pair, dict) or not {"input", "output"} <= pair.keys():
            raise ValueError('io must be a list of {"input": ..., "output": ...} objects')
        pairs.append((pair["input"], pair["output"]))
    apps = cols.get("input_output")
    if isinstance(apps, str):
        try:
            apps = json.loads(apps)
        except ValueError:
            raise ValueError("input_output is not JSON") from None
    sides = [(apps, "inputs", "outputs")] if apps else []
    sides += [(cols.get(k), "input", "output") for k in ("public_tests", "private_tests")]
    for side, ins, outs in sides:
        if not side:
            continue
        if not isinstance(side, dict) or len(side.get(ins) or []) != len(side.get(outs) or []):
            raise ValueError(f"{ins}/{outs} must be two lists of the same length")
        pairs += list(zip(side[ins], side[outs], strict=True))
    for given, expected in pairs:
        if not isinstance(given, str) or not isinstance(expected, str):
            raise ValueError("io inputs and outputs must be strings")
    return pairs


def _same_output(got: str, expected: str) -> bool:
    """Equal up to trailing whitespace on each line and blank lines at the end."""

    def lines(text: str) -> list[str]:
        return [line.rstrip() for line in text.rstrip().splitlines()]

    return lines(got) == lines(expected)


def grade_many(completions: list[str], prompts: list[Prompt]) -> list[Grade]:
    """Each completion run against its prompt's tests, the executions spread over the
    sandbox's workers."""
    from rlstream.sandbox import shared

    sandbox = shared()
    tasks, jobs, owners = [], [], []
    for i, (completion, prompt) in enumerate(zip(completions, prompts, strict=True)):
        try:
            task = parse_task(prompt.text, prompt.metadata)
        except ValueError as exc:
            tasks.append(exc)
            continue
        tasks.append(task)
        program = task.prefix + code_of(completion)
        if task.tests:
            jobs.append({"code": program, "tests": list(task.tests)})
            owners.append(i)
        for given, _ in task.io:
            jobs.append({"code": program, "stdin": given})
            owners.append(i)
    runs: dict[int, list] = {}
    for owner, execution in zip(owners, sandbox.map(jobs), strict=True):
        runs.setdefault(owner, []).append(execution)
    return [
        _grade(task, runs.get(i, []), sandbox.cfg) if isinstance(task, CodeTask)
        else Grade(0.0, False, f"not a code task: {task}")
        for i, task in enumerate(tasks)
    ]  # fmt: skip


def _grade(task: CodeTask, executions: list, limits) -> Grade:
    passed, failures = 0, []
    if task.tests:
        run, executions = executions[0], executions[1:]
        if len(run.tests) > len(task.tests):  # the program wrote results of its own
            forged = f"{len(run.tests)} test results for {len(task.tests)} tests"
            return Grade(0.0, False, f"{forged}: the program wrote to the result channel")
        for test, result in zip(task.tests, run.tests + [None] * len(task.tests), strict=False):
            if result and result.get("passed"):
                passed += 1
            elif result:
                failures.append(f"{_first_line(test)} ({result.get('error')})")
        cut_short = len(run.tests) < len(task.tests)
        why = (run.why(limits) or "it exited before its tests ran") if cut_short else ""
        if run.load_error:
            failures.insert(0, f"the program does not run ({run.load_error})")
        elif why:
            failures.append(why)
    for (given, expected), run in zip(task.io, executions, strict=True):
        if run.status == "ok" and _same_output(run.stdout, expected):
            passed += 1
        else:
            shown = run.why(limits) or f"printed {run.stdout[:60]!r}, expected {expected[:60]!r}"
            failures.append(f"input {given[:40]!r}: {shown}")
    reward = passed / task.count if task.scoring == "share" else float(passed == task.count)
    details = f"{passed}/{task.count} tests passed"
    if failures:
        details += "; " + "; ".join(failures[:2])
        stderr = executions[-1].stderr if executions else ""
        if stderr.strip() and not task.tests:
            details += f"; stderr: {stderr.strip().splitlines()[-1][:200]}"
    return Grade(reward, passed == task.count, details)


def _first_line(test: str) -> str:
    lines = test.strip().splitlines()
    return (lines[-1] if lines else "")[:80]


@dataclass
class CodeVerifier:
    """The `code` verifier: user prompts with tests (it generates none)."""

    name: str = "code"
    doc: str = "runs the completion against the prompt's tests in the sandbox"
    difficulties: tuple[int, ...] = (0,)
    generates = False

    def generate(self, rng: random.Random, difficulty: int) -> Prompt:
        raise TypeError("task 'code' only verifies user prompts; it generates none")

    def flawed_answer(self, prompt: Prompt) -> str | None:
        return None

    def row_problem(self, row: dict) -> str | None:
        """Why this row's tests cannot be run, or None."""
        try:
            parse_task(row.get("text") or "", row.get("metadata") or "")
        except ValueError as exc:
            return str(exc)
        return None

    def grade(self, completion: str, prompt: Prompt) -> Grade:
        return grade_many([completion], [prompt])[0]

    def grade_many(self, completions: list[str], prompts: list[Prompt]) -> list[Grade]:
        return grade_many(completions, prompts)

    def verify(self, completion: str, prompt: Prompt) -> bool:
        return self.grade(completion, prompt).correct


OPS = {  # name -> (the expression, the classic bug a flawed solution writes, or None)
    "add": ("x+{k}", None),
    "mul": ("x*{k}", None),
    "div": ("x//{k}", "x/{k}"),  # true division where floor division was meant
    "pow": ("x**{k}", "x^{k}"),  # XOR where power was meant
}
CONSTANTS = {1: range(2, 10), 2: range(10, 100)}  # difficulty -> the constant k
POWERS = {1: (2, 3), 2: (4, 5)}  # pow's k


@dataclass
class SmallFunctions:
    """`fn`: a one-line function named for what it does, `div3=lambda x:` -> `x//3`, checked
    by hidden tests in the sandbox (all must pass). Flawed solutions make the two classic
    bugs: `/` for floor division and `^` for power (pow's k is 2-5)."""

    name: str = "fn"
    difficulties: tuple[int, ...] = (1, 2)
    verifier: str = "code"

    def generate(self, rng: random.Random, difficulty: int) -> Prompt:
        op = rng.choice(sorted(OPS))
        k = rng.choice(POWERS[difficulty] if op == "pow" else CONSTANTS[difficulty])
        fname = f"{op}{k}"
        answer = OPS[op][0].format(k=k)
        prompt = make_prompt(self.name, f"{fname}=lambda x:", answer, difficulty)
        meta = {"code_prefix": prompt.text, "scoring": "all", "tests": _tests(fname, answer, k)}
        return Prompt(**(prompt.to_row() | {"verifier": self.verifier,
                                            "metadata": json.dumps(meta)}))  # fmt: skip

    def verify(self, completion: str, prompt: Prompt) -> bool:
        return CODE.grade(completion, prompt).correct

    def flawed_answer(self, prompt: Prompt) -> str | None:
        name = prompt.text.partition("=")[0]
        op, k = name[:3], name[3:]
        bug = OPS[op][1]
        return bug.format(k=k) if bug else None


def _tests(fname: str, expression: str, k: int) -> list[str]:
    """Five hidden tests, the same for the same function: inputs from 1 to 40 and one that
    is not a multiple of the constant (so `/` cannot pass them all)."""
    rng = random.Random(fname)
    xs = [rng.randint(1, 40) for _ in range(4)] + [k * rng.randint(1, 5) + 1]
    return [f"assert {fname}({x})=={eval(expression, {'x': x})}" for x in xs]


CODE = register_task(CodeVerifier())
register_task(SmallFunctions())
