"""Code tasks through `rlstream run` on the real broker, S3 server and Qdrant: a user's
MBPP-style JSONL (a text, the reference `code`, a `test_list`) trains through `--prompts`, every
reward comes from the completion's tests run in the sandbox with its details on the reward row,
rows whose tests cannot run are refused at publish with the reason, and escape attempts
published into the live run's rollouts are each scored 0 with their reason while the
processors and the run go on."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest

from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.kafka import EventProducer
from rlstream.ops.launcher.figures import _run_rows
from rlstream.schemas import get, rows_to_batch

pytestmark = pytest.mark.integration
RUN, DATASET, STEPS, P, G = "code-it", "mbpp-mini", 6, 4, 4

OPS = {"inc": "x+{k}", "dbl": "x*{k}", "sub": "x-{k}", "mod": "x%{k}"}


def _mbpp_rows() -> list[dict]:
    """MBPP's shape, one-line functions (the char model's completions end at a newline)."""
    rows = []
    for name, body in OPS.items():
        for k in range(2, 8):
            fn = f"{name}{k}"
            expr = body.format(k=k)
            tests = [f"assert {fn}({x})=={eval(expr, {'x': x})}" for x in (3, 10, 17)]
            rows.append({"task": "code", "text": f"Write {fn}(x).",
                         "code": f"def {fn}(x): return {expr}", "test_list": tests})  # fmt: skip
    return rows


BAD_ROWS = [
    ({"task": "code", "text": "Write f(x).", "test_list": ["assert f(1) =="]},
     "test 0 does not parse"),
    ({"task": "code", "text": "Write g(x).", "test_list": ["assert g(1)==1"],
      "language": "rust"}, "only python runs"),
    ({"task": "code", "text": "Write h(x).", "code": "def h(x): return x"}, "has no tests"),
]  # fmt: skip

ATTACKS = {  # each comes before a correct solution: only a sandbox that stops it scores it 0
    "loop": ("while True:\n    pass", "CPU time|timed out"),  # on a loaded box: the wall clock
    "fork": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
             "        pass", "CPU time|timed out"),
    "memory": ("hog = bytearray(4 * 1024**3)", "MemoryError"),
    "output": ("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", "wrote more than"),
    "escape": ("open('/work/escaped-by-the-sandbox', 'w').write('x')", "does not run"),
    "secret": ("import os\nassert 'RLSTREAM_S3' in str(dict(os.environ)), 'no secret'",
               "no secret"),
    "network": ("import socket\nsocket.create_connection(('127.0.0.1', 9092), 1)",
                "Network is unreachable"),
    "parent": ("import os\nos.kill(os.getppid(), 9)", "PermissionError"),
    "ctypes": ("import ctypes\nctypes.string_at(0)", "crashed (SIGSEGV)"),
}  # fmt: skip


def _attack_rows(prompt: dict) -> list[dict]:
    """The attacks in groups of G: G - 1 attacks and the prompt's reference solution in each,
    the solution after each attack too."""
    names, solution = list(ATTACKS), prompt.get("answer") or ""
    rows = []
    for g in range(0, len(names), G - 1):
        completions = [f"{ATTACKS[n][0]}\n{solution}" for n in names[g : g + G - 1]]
        completions += [solution]
        rows += [
            {
                "request_id": f"{RUN}-attacks-{g}", "prompt_id": prompt["prompt_id"],
                "sample_idx": i, "group_size": G, "task": "code",
                "prompt_text": prompt["text"], "metadata": prompt["metadata"],
                "prompt_tokens": [1, 2, 3], "completion": text, "completion_tokens": [4, 5],
                "logprobs": [-0.5, -0.25], "worker_id": "attacker",
            }
            for i, text in enumerate(completions)
        ]  # fmt: skip
    return rows


async def _publish_attacks(rows: list[dict]) -> None:
    rollouts = get("rollouts")
    async with EventProducer(Endpoints.from_env()) as producer:
        await producer.send(rollouts, rows_to_batch(rollouts, rows, run_id=RUN))


@pytest.fixture(scope="module")
def code_run(stack_home, tmp_path_factory):
    out = tmp_path_factory.mktemp("code-runs")
    prompts = out / f"{DATASET}.jsonl"
    rows = _mbpp_rows() + [row for row, _ in BAD_ROWS]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = out / "summary.json"
    args = [sys.executable, "-m", "rlstream.cli", "run", "--prompts", str(prompts),
            "--sampler", "uniform", "--rl-steps", str(STEPS), "--run-id", RUN, "--out", str(out),
            "--summary", str(summary), "--set", "model.block_size=64",
            "--set", "rl.max_new_tokens=28", "--set", "pretrain.max_steps=60",
            "--set", "pretrain.batch=32", "--set", "eval.prompts=16", "--set", "eval.interval=3",
            "--set", f"prompts_per_step={P}", "--set", f"group_size={G}",
            "--set", "target_in_flight=16"]  # fmt: skip
    log = out / "run.log"
    with open(log, "w") as sink:
        run = subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT, text=True,
                               env=os.environ | {"RLSTREAM_S3_PROBE": "s3-secret"})  # fmt: skip
        try:
            deadline = time.monotonic() + 400
            requests = []
            while time.monotonic() < deadline and run.poll() is None and not requests:
                requests = asyncio.run(_run_rows(Endpoints.from_env(), "rollout_requests", RUN))
                time.sleep(0.5)
            assert requests, log.read_text()[-3000:]
            attacks = _attack_rows(requests[0])
            asyncio.run(_publish_attacks(attacks))
            run.wait(timeout=600)
        finally:
            run.kill()
    assert run.returncode == 0, log.read_text()[-3000:]
    return json.loads(summary.read_text()), out


def test_an_mbpp_file_trains_and_every_reward_is_its_tests_run_in_the_sandbox(code_run):
    figures, _ = code_run
    assert figures["dataset"] == DATASET and figures["completed"]
    assert figures["rl_steps"] == STEPS
    rewards = asyncio.run(_run_rows(Endpoints.from_env(), "rewards", RUN))
    ours = [r for r in rewards if not r["request_id"].startswith(f"{RUN}-attacks")]
    assert len(ours) >= STEPS * P * G
    assert all(r["details"] and "tests passed" in r["details"] for r in ours)
    for r in ours:  # the share of the three tests, as the details say
        passed = int(r["details"].split("/")[0])
        assert r["reward"] == pytest.approx(passed / 3) and r["correct"] == (passed == 3)
    experience = asyncio.run(_run_rows(Endpoints.from_env(), "experience", RUN))
    assert experience and {r["task"] for r in experience} == {"code"}


def test_rows_whose_tests_cannot_run_are_refused_at_publish_with_the_reason(code_run):
    figures, _ = code_run
    assert figures["prompts_refused"] == len(BAD_ROWS)
    [(_, refused)] = figures["bad_rows"].items()
    for (_, reason), (_, expected) in zip(refused, BAD_ROWS, strict=True):
        assert expected in reason, reason


def test_escape_attempts_score_zero_with_their_reason_and_the_run_goes_on(code_run):
    rewards = asyncio.run(_run_rows(Endpoints.from_env(), "rewards", RUN))
    scored = {(r["request_id"], r["sample_idx"]): r for r in rewards
              if r["request_id"].startswith(f"{RUN}-attacks")}  # fmt: skip
    attacks = [r for r in _attack_rows({"prompt_id": "", "text": "", "metadata": ""})
               if r["sample_idx"] < G - 1]  # fmt: skip
    assert len(scored) == len(attacks) + len(attacks) // (G - 1)
    for row, (name, (_, reason)) in zip(attacks, ATTACKS.items(), strict=True):
        got = scored[(row["request_id"], row["sample_idx"])]
        assert got["reward"] == 0.0 and not got["correct"], (name, got)
        assert any(r in got["details"] for r in reason.split("|")), (name, got["details"])
    solutions = [r for key, r in scored.items() if key[1] == G - 1]
    assert [r["reward"] for r in solutions] == [1.0] * len(solutions)  # after the attacks
    assert not os.path.exists("/work/escaped-by-the-sandbox")
    gone = subprocess.run(["ps", "-eo", "uid="], capture_output=True, text=True).stdout.split()
    assert not [uid for uid in gone if uid.startswith("610")]  # no sandboxed process survives
