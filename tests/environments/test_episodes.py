"""The episode engine, token in and token out: what the policy sampled and what the environment
answered stay apart (loss mask, logprobs), every way an environment fails ends its episode with
a reason and leaves the others alone, and environment steps run concurrently.

Most tests drive the engine with a scripted policy (a fake model inside a unit test: the next
token is read off a transcript), so the episode's text is known; the last one samples from a
real model with a BPE tokenizer and recomputes the logprobs on the stored tokens."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
import torch

from rlstream.config import EnvConfig
from rlstream.trainers.environments import ENVIRONMENTS, Step
from rlstream.trainers.environments.episodes import run_episodes
from rlstream.trainers.envs import Prompt
from rlstream.trainers.envs.base import make_prompt
from rlstream.trainers.lm import Tokenizer, token_logprobs
from rlstream.trainers.rl import Experience, collate


class Scripted(torch.nn.Module):
    """Greedy on a transcript: each row's next token is the transcript's next character, the
    row found by the text its first forward pass sees (later passes feed one token, with the
    position telling how far along it is)."""

    def __init__(self, tok: Tokenizer, transcripts: list[str], block_size: int = 64):
        super().__init__()
        self.tok, self.transcripts, self.block_size = tok, transcripts, block_size
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.rows: list[str] = []

    def forward(self, idx, attention_mask=None, position_ids=None, cache=None, values=False):
        if idx.shape[1] > 1:  # a new batch: its full contexts
            rows = zip(idx.tolist(), attention_mask.tolist(), strict=True)
            texts = [self.tok.decode([t for t, v in zip(r, m, strict=True) if v]) for r, m in rows]
            self.rows = [next(t for t in self.transcripts if t.startswith(x)) for x in texts]
        logits = torch.full((idx.shape[0], idx.shape[1], self.tok.vocab_size), -30.0)
        for b, script in enumerate(self.rows):
            at = int(position_ids[b, -1]) + 1
            nxt = script[at] if at < len(script) else "\n"
            logits[b, -1, self.tok.encode(nxt)[0]] = 30.0
        return logits


def calc(text: str, answer: str, environment: str = "calculator") -> Prompt:
    p = make_prompt("calc", text, answer, 2)
    return Prompt(**(p.to_row() | {"environment": environment}))


def play(prompts, transcripts, n=1, block_size=64, new_tokens=8, **settings):
    tok = Tokenizer.char()
    model = Scripted(tok, transcripts, block_size)
    return run_episodes(model, tok, prompts, n, new_tokens, 0.0, EnvConfig(**settings))


def test_a_tool_episode_keeps_the_policys_and_the_environments_tokens_apart():
    (e,) = play([calc("123*45=", "5535")], ["123*45=?123*45\n5535\n5535\n"])
    assert e.text == "?123*45\n5535\n5535\n" and e.env_spans == [8, 13]  # the tool's line
    assert e.loss_mask == [1] * 8 + [0] * 5 + [1] * 5  # "?123*45\n", the tool's line, the answer
    assert all(lp == 0.0 for lp, m in zip(e.logprobs, e.loss_mask, strict=True) if not m)
    assert all(lp > -1e-3 for lp, m in zip(e.logprobs, e.loss_mask, strict=True) if m)
    assert (e.turns, e.tool_calls, e.turn_rewards, e.reward) == (2, 1, [0.0, 1.0], 1.0)
    assert e.stop_reason == "done" and e.error is None
    assert e.context == e.context[: e.n_prompt] + e.tokens  # token in, token out


def test_without_the_tool_the_same_episode_is_told_no_and_a_direct_answer_is_scored():
    prompts = [calc("123*45=", "5535"), calc("12*4=", "48")]
    no_tool, direct = play(prompts, ["123*45=?123*45\nno tool\n4920\n", "12*4=48\n"],
                           options='{"tool": false}')  # fmt: skip
    assert no_tool.text == "?123*45\nno tool\n4920\n" and no_tool.reward == 0.0
    assert direct.text == "48\n" and direct.reward == 1.0 and direct.turns == 1


def test_the_turn_limit_and_the_context_end_an_episode():
    (calls,) = play([calc("12*4=", "48")], ["12*4=" + "?12*4\n48\n" * 5], max_turns=2)
    assert calls.stop_reason == "turns" and calls.turns == 2 and calls.reward == 0.0
    (long,) = play([calc("12*4=", "48")], ["12*4=" + "?12*4\n48\n" * 5], block_size=24)
    assert long.stop_reason == "context" and len(long.context) <= 24


def test_a_prompt_without_an_environment_is_one_turn_in_the_same_batch():
    plain = make_prompt("add", "012+034=", "0460", 2)
    (e, tool) = play([plain, calc("12*4=", "48")], ["012+034=0460\n", "12*4=?12*4\n48\n48\n"])
    assert e.env is None and e.turns == 1 and e.action == "0460" and e.loss_mask == [1] * 5
    assert tool.reward == 1.0 and tool.turns == 2


class Broken:
    """One way to fail per prompt text: slow, raise, NaN, not a Step, a closed socket."""

    def __init__(self, settings):
        self.how = ""

    async def reset(self, prompt):
        self.how = prompt.answer
        return ""

    async def step(self, action):
        if self.how == "slow":
            await asyncio.sleep(5)
        if self.how == "raise":
            raise RuntimeError("the simulator fell over")
        if self.how == "closed":
            raise ConnectionResetError("socket closed mid-episode")
        if self.how == "nan":
            return Step("", math.nan, True)
        if self.how == "dict":
            return {"observation": "?", "reward": 1}
        return Step("", 1.0, True)

    async def close(self):
        pass


@pytest.fixture
def broken():
    ENVIRONMENTS.register("broken-test")(Broken)
    yield "broken-test"
    del ENVIRONMENTS["broken-test"]


def test_each_way_an_environment_fails_ends_only_its_own_episode(broken):
    hows = ["slow", "raise", "closed", "nan", "dict", "fine"]
    prompts = [calc(f"{i}*2=", how, broken) for i, how in enumerate(hows)]
    started = time.monotonic()
    episodes = play(prompts, [f"{i}*2=1\n" for i in range(len(hows))], step_timeout_s=0.5)
    assert time.monotonic() - started < 3  # the slow step timed out after 0.5 s, not 5
    kinds = {e.prompt.answer: e.error.kind if e.error else None for e in episodes}
    assert kinds == {"slow": "env_timeout", "raise": "env_crashed", "closed": "env_crashed",
                     "nan": "env_bad_reward", "dict": "env_protocol", "fine": None}  # fmt: skip
    assert all(e.stop_reason == "error" for e in episodes if e.error)
    assert "socket closed" in str(episodes[2].error)


class Slow:
    def __init__(self, settings):
        pass

    async def reset(self, prompt):
        return ""

    async def step(self, action):
        await asyncio.sleep(0.3)
        return Step("", 1.0, True)

    async def close(self):
        pass


def test_environment_steps_of_a_batch_run_concurrently():
    ENVIRONMENTS.register("slow-test")(Slow)
    try:
        started = time.monotonic()
        episodes = play([calc(f"{i}*3=", "x", "slow-test") for i in range(8)],
                        [f"{i}*3=1\n" for i in range(8)])  # fmt: skip
        elapsed = time.monotonic() - started
    finally:
        del ENVIRONMENTS["slow-test"]
    assert all(e.reward == 1.0 for e in episodes)
    assert all(e.env_s >= 0.3 for e in episodes)
    assert elapsed < 8 * 0.3 / 2  # eight 0.3 s steps took about one step's time


class Chat:
    """Three turns of small talk, each answered `ok`."""

    def __init__(self, settings):
        self.turns = 0

    async def reset(self, prompt):
        return ""

    async def step(self, action):
        self.turns += 1
        return Step(" ok\n", 0.1, self.turns == 3)

    async def close(self):
        pass


def chat_episodes(model, tok, text: str):
    """Two three-turn episodes of small talk (`Chat`), sampled at temperature 1."""
    ENVIRONMENTS.register("chat-test")(Chat)
    try:
        prompt = Prompt(**(make_prompt("add", text, "", 1).to_row()
                           | {"environment": "chat-test"}))  # fmt: skip
        return run_episodes(model, tok, [prompt], 2, 6, 1.0, EnvConfig(max_turns=3),
                            torch.Generator().manual_seed(0))  # fmt: skip
    finally:
        del ENVIRONMENTS["chat-test"]


def recomputed(model, tok, e):
    """The trainer's logprobs on an episode's stored tokens, and the collated batch."""
    exp = Experience([e.context[: e.n_prompt]], [e.tokens], [e.logprobs], [e.reward], [0], [0],
                     [e.loss_mask])  # fmt: skip
    b = collate(exp, tok.pad_id)
    with torch.no_grad():
        return token_logprobs(model(b["tokens"][:, :-1]), b["tokens"][:, 1:]), b


def test_a_bpe_models_sampled_logprobs_match_the_trainers_recomputation_after_three_turns():
    from rlstream.config import ModelConfig
    from rlstream.trainers.lm import build_model

    tok = Tokenizer.bpe(["hello there, how are you? ok fine thanks\n"] * 50, vocab_size=300)
    torch.manual_seed(0)
    model = build_model(ModelConfig(block_size=96), tok)
    episodes = chat_episodes(model, tok, "hello there")
    for e in episodes:
        assert e.turns == 3 and e.stop_reason == "done" and e.reward == pytest.approx(0.3)
        assert 0 in e.loss_mask and e.loss_mask[0] == 1
        logp, b = recomputed(model, tok, e)
        mask = b["mask"].bool()
        assert int(mask.sum()) == sum(e.loss_mask)  # environment tokens are not trained
        torch.testing.assert_close(logp[mask], b["old_logp"][mask], atol=1e-4, rtol=1e-4)


def test_the_python_tool_runs_each_call_in_the_sandbox():
    """`!code` lines run in the sandbox: their output comes back as the environment's line,
    an error as its last line, a network call fails there (no network in the sandbox)."""
    prompts = [calc("6*7=", "42", "python"), calc("1*1=", "1", "python"),
               calc("2*2=", "4", "python")]  # fmt: skip
    scripts = [
        "6*7=!print(6*7)\n42\n42\n",
        "1*1=!1/0\nZeroDivisionError: division by zero\n1\n",
        "2*2=!import socket;socket.create_connection(('127.0.0.1',9),1)\n"
        "OSError: [Errno 101] Network is unreachable\n4\n",
    ]
    played = play(prompts, scripts, block_size=160, new_tokens=64)
    for e, script, prompt in zip(played, scripts, prompts, strict=True):
        assert e.error is None and e.text == script[len(prompt.text) :], e.text
        assert (e.tool_calls, e.reward, e.stop_reason) == (1, 1.0, "done")
        start, end = e.env_spans
        assert e.loss_mask[start:end] == [0] * (end - start)  # the tool's line is not trained


def test_with_a_chat_template_each_answer_is_a_user_turn_and_logprobs_still_match(tmp_path):
    """A BPE model with a chat template: every environment answer goes in as a user turn
    between the template's markers, trained on never (loss mask 0, markers included), and the
    trainer's recomputed logprobs match the sampled ones after three turns."""
    from rlstream.config import ModelConfig
    from rlstream.trainers.lm import build_model, load_tokenizer
    from tests.hf_models import CHAT, tiny_model_dir

    where = tiny_model_dir(tmp_path / "chat", "qwen2", chat_template=CHAT, positions=256)
    m = ModelConfig(path=str(where), block_size=256)
    tok = load_tokenizer(m)
    assert tok.chat
    model = build_model(m, tok).eval()
    episodes = chat_episodes(model, tok, "1+2=")
    turn = "<|im_end|>\n<|im_start|>user\n ok\n<|im_end|>\n<|im_start|>assistant\n"
    for e in episodes:
        assert e.turns == 3 and e.stop_reason == "done", (e.stop_reason, e.error)
        spans = list(zip(e.env_spans[::2], e.env_spans[1::2], strict=True))
        assert len(spans) == 2 and all(e.text[a:b].endswith(turn[10:]) for a, b in spans)
        env_ids = [t for t, keep in zip(e.tokens, e.loss_mask, strict=True) if not keep]
        assert "<|im_start|>user" in tok.decode(env_ids) and 1 in e.loss_mask
        logp, b = recomputed(model, tok, e)
        mask = b["mask"].bool()
        assert int(mask.sum()) == sum(e.loss_mask)
        torch.testing.assert_close(logp[mask], b["old_logp"][mask], atol=1e-4, rtol=1e-4)


def test_pymul_worked_documents_are_what_the_python_tool_answers():
    """The `pymul` family's worked episodes, replayed against the Python tool in the sandbox:
    what each call printed is the next line of the document, and the answer earns 1."""
    import random

    from rlstream.trainers.environments.python import PythonTool
    from rlstream.trainers.envs import get_task

    family = get_task("pymul")

    async def replay(prompt):
        tool = PythonTool(EnvConfig())
        await tool.reset(prompt)
        call, printed, answer = family.transcript(prompt, flawed=False).split("\n")
        seen = await tool.step(call)
        return seen, printed, await tool.step(answer)

    for seed in range(3):
        prompt = family.generate(random.Random(seed), 1 + seed)
        assert prompt.environment == "python"
        seen, printed, final = asyncio.run(replay(prompt))
        assert seen.observation == printed + "\n" and seen.info["tool_call"]
        assert final.done and final.reward == 1.0
    flawed = family.generate(random.Random(7), 2)
    assert family.transcript(flawed, flawed=True) != flawed.answer
