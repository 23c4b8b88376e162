"""Episodes, token in and token out: policy turn, environment step, policy turn ... until the
environment is done, the turn limit or the context.

Every policy turn continues the exact token ids sampled so far (`sampling.sample_ids`); what the
environment answers is tokenised on its own and appended, loss mask 0 and logprob 0, so the
trainer recomputes logprobs on the very tokens the policy sampled (no re-tokenised text between
turns). All live episodes of a batch take their policy turn in one batched forward pass, and
their environment steps run concurrently on the engine's own event loop, so one slow
environment costs its step's wall time once, not once per episode.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field

import torch

from rlstream.config import EnvConfig
from rlstream.trainers.environments.base import EnvironmentFailed, checked_step, open_environment
from rlstream.trainers.envs import Prompt
from rlstream.trainers.lm import CausalLM, Tokenizer
from rlstream.trainers.sampling import completion_text, sample_ids

STOP = ("\n",)  # a policy turn ends at a newline (or EOS), as a single-turn completion does


@dataclass
class Episode:
    prompt: Prompt
    context: list[int]  # the prompt's tokens, then every token of the episode so far
    n_prompt: int
    env: object | None = None
    tokens: list[int] = field(default_factory=list)  # after the prompt: policy and environment
    loss_mask: list[int] = field(default_factory=list)  # 1: the policy sampled it
    logprobs: list[float] = field(default_factory=list)  # 0.0 on environment tokens
    text: str = ""  # the transcript after the prompt (policy turns and observations)
    env_spans: list[int] = field(default_factory=list)  # [start, end) of each observation in text
    action: str = ""  # the last policy turn's text
    turns: int = 0  # policy turns taken
    turn_rewards: list[float] = field(default_factory=list)
    tool_calls: int = 0
    env_s: float = 0.0  # wall time spent waiting on the environment
    finish: str = "stop"  # the last policy turn's: "stop" or "length"
    stop_reason: str = ""  # done | turns | context | error (set when the episode ends)
    error: EnvironmentFailed | None = None

    @property
    def done(self) -> bool:
        return bool(self.stop_reason)

    @property
    def reward(self) -> float:
        return sum(self.turn_rewards)

    def append(self, ids: list[int], logprobs: list[float] | None, text: str) -> None:
        self.context += ids
        self.tokens += ids
        self.loss_mask += [1 if logprobs is not None else 0] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        if logprobs is None and text:
            self.env_spans += [len(self.text), len(self.text) + len(text)]
        self.text += text


class EnvLoop:
    """A private event loop on its own thread: environment calls are coroutines, awaited
    concurrently from synchronous code (the rollout worker's agent, evaluation) alike."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="envs")
        self.thread.start()

    def gather(self, calls: list[Coroutine], timeout_s: float) -> list:
        """Each call's result, or the exception it raised (a timeout: EnvironmentFailed)."""

        async def bounded(call):
            started = time.monotonic()
            try:
                return await asyncio.wait_for(call, timeout_s), time.monotonic() - started
            except TimeoutError:
                failed = EnvironmentFailed("env_timeout", f"no answer within {timeout_s:g} s")
                return failed, time.monotonic() - started
            except EnvironmentFailed as exc:
                return exc, time.monotonic() - started
            except Exception as exc:  # noqa: BLE001  (a user's environment: whatever it raises)
                failed = EnvironmentFailed("env_crashed", f"{exc!r:.300}")
                return failed, time.monotonic() - started

        async def all_of():
            return await asyncio.gather(*(bounded(c) for c in calls))

        return asyncio.run_coroutine_threadsafe(all_of(), self.loop).result()


_LOOP: EnvLoop | None = None


def env_loop() -> EnvLoop:
    global _LOOP
    if _LOOP is None:
        _LOOP = EnvLoop()
    return _LOOP


def run_episodes(
    model: CausalLM,
    tok: Tokenizer,
    prompts: list[Prompt],
    n: int,
    max_new_tokens: int,
    temperature: float,
    settings: EnvConfig,
    generator: torch.Generator | None = None,
) -> list[Episode]:
    """n episodes of each prompt, prompt-major (episodes i*n .. i*n+n-1 are prompt i's). A
    prompt without an environment gets one policy turn (its verifier scores it later)."""
    turn_tokens = settings.turn_tokens or max_new_tokens
    episodes = [
        Episode(p, list(ids), len(ids))
        for p, ids in zip(prompts, tok.encode_prompts([p.text for p in prompts]), strict=True)
        for _ in range(n)
    ]
    with_env = [e for e in episodes if e.prompt.environment]
    for e in with_env:
        e.env = open_environment(e.prompt.environment, settings, e.prompt)
    loop = env_loop()
    resets = loop.gather([e.env.reset(e.prompt) for e in with_env], settings.step_timeout_s)
    _observe(tok, model, with_env, resets, settings.max_turns, reset=True)
    while live := [e for e in episodes if not e.done]:
        for e in live:
            if len(e.context) >= model.block_size:
                e.stop_reason = "context"
        live = [e for e in live if not e.done]
        while live and model.block_size - max(len(e.context) for e in live) < 1:
            longest = max(live, key=lambda e: len(e.context))
            longest.stop_reason = "context"
            live.remove(longest)
        if not live:
            break
        room = model.block_size - max(len(e.context) for e in live)
        ids, logprobs, finish = sample_ids(model, tok, [e.context for e in live],
                                           min(turn_tokens, room), temperature,
                                           stop=STOP, generator=generator)  # fmt: skip
        for e, t, lp, f in zip(live, ids, logprobs, finish, strict=True):
            e.action = completion_text(tok, t, STOP)
            e.append(t, lp, tok.decode(t))
            e.finish, e.turns = f, e.turns + 1
            if e.env is None:
                e.stop_reason = "done"
        stepping = [e for e in live if e.env is not None]
        results = loop.gather([e.env.step(e.action) for e in stepping], settings.step_timeout_s)
        _observe(tok, model, stepping, results, settings.max_turns)
    loop.gather([e.env.close() for e in with_env], settings.step_timeout_s)
    return episodes


def _observe(tok: Tokenizer, model: CausalLM, episodes: list[Episode], results, max_turns: int,
             reset: bool = False) -> None:  # fmt: skip
    """Apply each environment answer (a reset's text or a Step) to its episode."""
    for e, (result, seconds) in zip(episodes, results, strict=True):
        e.env_s += seconds
        try:
            if isinstance(result, Exception):
                raise result
            if reset:
                if not isinstance(result, str):
                    raise EnvironmentFailed("env_protocol", "reset returned no text")
                observation = result
            else:
                step = checked_step(result)
                e.turn_rewards.append(step.reward)
                e.tool_calls += bool(step.info.get("tool_call"))
                if step.done or e.turns >= max_turns:
                    e.stop_reason = "done" if step.done else "turns"
                    continue
                after_eos = bool(e.tokens) and e.tokens[-1] == tok.eos_id
                observation = tok.format_turn(step.observation, after_eos)
            try:
                ids = tok.encode(observation) if observation else []
            except ValueError as exc:
                raise EnvironmentFailed("env_protocol", f"observation: {exc}") from None
        except EnvironmentFailed as exc:
            e.error, e.stop_reason = exc, "error"
            continue
        if len(e.context) + len(ids) >= model.block_size:
            e.stop_reason = "context"  # no room for the observation and a policy turn
            continue
        e.append(ids, None, observation)
