"""An LLM as the user: a Hugging Face model directory answers the policy's turns (greedy, so an
episode replays exactly), the right answer ends the episode, and in an episode the user's lines
are the environment's (loss mask 0)."""

from __future__ import annotations

import asyncio
import json

import torch

from rlstream.config import EnvConfig, ModelConfig
from rlstream.trainers.environments.episodes import run_episodes
from rlstream.trainers.environments.llm_user import LLMUser
from rlstream.trainers.envs import Prompt
from rlstream.trainers.lm import Tokenizer, build_model
from tests.hf_models import tiny_model_dir


def _settings(directory) -> EnvConfig:
    return EnvConfig(max_turns=3, options=json.dumps({"user_model": str(directory),
                                                      "user_max_new_tokens": 8}))  # fmt: skip


def test_the_user_model_answers_and_the_right_answer_ends_the_episode(tmp_path):
    directory = tiny_model_dir(tmp_path / "user", "llama", tokenizer="chars")
    prompt = Prompt("p", "guess the word:", "exact", 0, "owl", environment="llm-user")

    async def play():
        user = LLMUser(_settings(directory))
        await user.reset(prompt)
        asked = await user.step("is it a bird?")
        solved = await user.step("owl")
        return asked, solved

    first, second = asyncio.run(play()), asyncio.run(play())
    asked, solved = first
    assert asked.observation.endswith("\n") and asked.observation.strip()
    assert not asked.done and asked.info["user_model"] == str(directory)
    assert asked.observation == second[0].observation  # greedy: the same reply again
    assert solved.done and solved.reward == 1.0


def test_in_an_episode_the_users_lines_are_the_environments(tmp_path):
    directory = tiny_model_dir(tmp_path / "user", "llama", tokenizer="chars")
    tok = Tokenizer.char()
    torch.manual_seed(0)
    policy = build_model(ModelConfig(block_size=96, n_layer=1, n_embd=32, n_head=2), tok)
    prompt = Prompt("p", "guess the word:", "exact", 0, "owl", environment="llm-user")
    episodes = run_episodes(policy, tok, [prompt], 2, 6, 1.0, _settings(directory),
                            torch.Generator().manual_seed(0))  # fmt: skip
    assert any(e.env_spans for e in episodes), "the user never answered"
    for e in episodes:
        assert e.error is None, e.error
        assert e.turns >= 1 and e.stop_reason in ("done", "turns", "context")
        if e.env_spans:
            start, end = e.env_spans[:2]
            assert e.text[start:end].strip()
            assert 0 in e.loss_mask
