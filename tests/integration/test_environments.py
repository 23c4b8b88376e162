"""Multi-turn episodes through `rlstream run`: the calculator environment on the `calc` task.

The run pre-trains on whole episodes (the tool called, its result copied), then the rollout
workers play episodes against the environment; the archive must hold, for every episode, loss
mask 1 on every token the policy sampled and 0 on every token the calculator answered, and the
reward the environment gave."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.objectstore import ObjectStore
from rlstream.trainers.environments.calculator import calculate
from rlstream.trainers.lm import Tokenizer
from tests.integration.conftest import cli
from tests.integration.test_openenv import expected_mask

pytestmark = pytest.mark.integration
RUN = "calc-it"


@pytest.fixture(scope="module")
def calc_run(stack_home, tmp_path_factory):
    out = tmp_path_factory.mktemp("calc")
    summary = out / "summary.json"
    result = cli(
        "run", "--run-id", RUN, "--rl-steps", "4", "--out", str(out), "--summary", str(summary),
        "--set", "data.tasks=calc", "--set", "data.flaw_rate=0.1", "--set", "pretrain.lr=3e-3",
        "--set", "pretrain.max_steps=300", "--set", "pretrain.batch=32",
        "--set", "pretrain.warmup_steps=20", "--set", "corpus_docs=3000",
        "--set", "pool_size=300", "--set", "eval.prompts=16", "--set", "eval.interval=2",
        "--set", "prompts_per_step=4", "--set", "group_size=4",
        "--set", "target_in_flight=16", "--set", "env.max_turns=3",
        "--set", "selection.curriculum=0.95", "--set", "selection.curriculum_window=64",
        timeout=900,
    )  # fmt: skip
    return json.loads(summary.read_text()), result


def test_the_archive_trains_the_policys_tokens_and_never_the_environments(calc_run):
    figures, _ = calc_run
    assert figures["completed"]
    archive = ObjectStore(Endpoints.from_env()).read_parquet_prefix(f"{RUN}/experience/")
    rows = archive.to_pylist()
    assert rows and all(r["environment"] == "calculator" for r in rows)
    called = [r for r in rows if 0 in r["loss_mask"]]
    assert len(called) >= len(rows) // 4, "the pre-trained policy should call the tool"
    tok = Tokenizer.char()
    for r in rows:
        text, mask, spans = r_text(r), r["loss_mask"], r["env_spans"] or []
        assert len(mask) == len(r["completion_tokens"]) == len(r["logprobs"])
        assert mask == expected_mask(tok, r["completion_tokens"], spans)
        assert all(lp == 0.0 for lp, m in zip(r["logprobs"], mask, strict=True) if not m)
        for start, end in zip(spans[::2], spans[1::2], strict=True):
            call = text[:start].rstrip("\n").rsplit("\n", 1)[-1]
            assert call.startswith("?") and text[start:end] == calculate(call[1:]) + "\n"
        # the answer is the policy's last turn, after the environment's last text: an empty
        # turn after a result is no answer, though the result above it is the right number
        final = text[spans[-1] :] if spans else text
        last = final.strip().rsplit("\n", 1)[-1]
        right = r["stop_reason"] == "done" and not last.startswith("?") and last == _answer(r)
        assert r["reward"] == float(right) and r["correct"] == right, (text, r["reward"])


def r_text(row: dict) -> str:
    from rlstream.trainers.lm import Tokenizer

    return Tokenizer.char().decode(row["completion_tokens"])


def _answer(row: dict) -> str:
    a, b = re.fullmatch(r"(\d+)\*(\d+)=", r_text_prompt(row)).groups()
    return str(int(a) * int(b))


def r_text_prompt(row: dict) -> str:
    from rlstream.trainers.lm import Tokenizer

    return Tokenizer.char().decode(row["prompt_tokens"])


def test_the_curriculum_holds_the_scheduler_to_the_easiest_level_until_it_is_solved(calc_run):
    """selection.curriculum through the live scheduler: calc's pool has difficulties 1-3, and
    a 95% bar over 64 groups is not reached in four steps, so every request is difficulty 1."""
    from rlstream.ops.launcher.figures import _run_rows

    figures, _ = calc_run
    requests = asyncio.run(_run_rows(Endpoints.from_env(), "rollout_requests", RUN))
    assert requests and {r["difficulty"] for r in requests} == {1}
    assert figures["scheduler_curriculum_level"] == 1
    assert figures["scheduler_curriculum_raises"] == 0


def test_tail_shows_an_episodes_turns_with_the_environments_text_apart(calc_run):
    result = cli("tail", "rollouts", "--where", f"run_id = '{RUN}' AND tool_calls > 0",
                 "--limit", "3")  # fmt: skip
    assert "⏎" in result.stdout and "?" in result.stdout
    # the episode view: how each ended beside its transcript, no token-id columns
    assert "stop_reason" in result.stdout and "prompt_tokens" not in result.stdout
    shown = cli("tail", "rollouts", "--json", "--where", f"run_id = '{RUN}'", "--limit", "1")
    row = json.loads(shown.stdout.splitlines()[0])
    assert row["environment"] == "calculator" and row["turns"] >= 1 and "loss_mask" in row


FLAKY = '''
import asyncio
import json
import math

from rlstream.trainers.environments import Step


class Flaky:
    """A user's environment (imported by path) that fails as its prompt's `fail` column says."""

    def __init__(self, settings):
        self.fail = ""

    async def reset(self, prompt):
        self.fail = json.loads(prompt.metadata or "{}").get("fail", "")
        return ""

    async def step(self, action):
        if self.fail == "slow":
            await asyncio.sleep(30)
        if self.fail == "raise":
            raise RuntimeError("the simulator fell over")
        if self.fail == "closed":
            raise ConnectionResetError("socket closed mid-episode")
        if self.fail == "nan":
            return Step("", math.nan, True)
        if self.fail == "garbage":
            return {"reward": "lots"}
        return Step("", float(len(action) % 2), True)

    async def close(self):
        pass
'''
FAILS = {"slow": "env_timeout", "raise": "env_crashed", "closed": "env_crashed",
         "nan": "env_bad_reward", "garbage": "env_protocol"}  # fmt: skip


def test_a_run_whose_every_episode_fails_stops_with_the_reason(stack_home, tmp_path):
    """env.max_failed_groups: a broken environment ends the run (exit 1, the reason in the
    summary) instead of feeding the trainer nothing forever."""
    (tmp_path / "flaky.py").write_text(FLAKY)
    env = f"{tmp_path}/flaky.py:Flaky"
    rows = [{"prompt_id": f"raise-{i}", "text": f"say {i}:", "task": "exact", "answer": "x",
             "environment": env, "fail": "raise", "split": "train" if i < 8 else "heldout"}
            for i in range(10)]  # fmt: skip
    prompts = tmp_path / "broken.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = tmp_path / "summary.json"
    result = cli(
        "run", "--prompts", str(prompts), "--run-id", "broken-env-it", "--rl-steps", "50",
        "--sampler", "uniform", "--out", str(tmp_path), "--summary", str(summary),
        "--set", "env.max_failed_groups=6", "--set", "pretrain.max_steps=10",
        "--set", "eval.prompts=2", "--set", "prompts_per_step=4", "--set", "group_size=4",
        "--set", "target_in_flight=16",
        timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-3000:]
    figures = json.loads(summary.read_text())
    assert not figures["completed"] and not figures.get("rl_steps")
    assert "6 groups in a row" in figures["stopped"] and "env_crashed 6" in figures["stopped"]
    assert "trainer stopped the run" in result.stdout + result.stderr
