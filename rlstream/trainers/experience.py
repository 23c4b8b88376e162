"""Pure functions the stream processors call: score rollouts, assemble experience groups.

They turn rows of one event into rows of the next, with deterministic event ids (so a message
processed twice produces the same ids and idempotent sinks drop the copy) and the producing
policy version carried through from the rollout's envelope.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from rlstream.schemas import DecodeError, make_event_id
from rlstream.trainers.datasets import prompt_of_row
from rlstream.trainers.envs import Grade, Prompt, grade_all
from rlstream.trainers.rewards import RewardFn, call_reward

MAX_GROUP_SIZE = 1024
"""The most completions one request may ask for (a worker samples a group in one batch)."""


@dataclass(frozen=True)
class RowLimits:
    """What a row of a run can hold: the model's vocabulary and context, the run's group size
    (None: not checked; the processors know only the run's group size and context)."""

    vocab_size: int | None = None
    block_size: int | None = None
    group_size: int | None = None


class RowRefused(DecodeError):
    """A row that decodes but cannot be a row of the run (`row_problem`): dead-lettered."""

    kind = "refused_row"


def row_problem(row: dict, limits: RowLimits) -> str | None:
    """Why a rollouts, rewards or experience row cannot be a row of the run, or None (pure).

    Every consumer of these rows checks them before they reach its state: a NaN reward would
    reach the scheduler's statistics and the loss, a group size no request has would hold a
    half-joined group in the assembler's table for good, a token id outside the vocabulary
    crashes the forward pass on every restart. Only the fields the row has are checked."""
    group = row.get("group_size", limits.group_size)
    if group is not None and not 1 <= group <= MAX_GROUP_SIZE:
        return f"group_size {group} is outside 1..{MAX_GROUP_SIZE}"
    if limits.group_size is not None and group != limits.group_size:
        return f"group_size {group}: the run's requests ask for {limits.group_size}"
    if group is not None and "sample_idx" in row and not 0 <= row["sample_idx"] < group:
        return f"sample_idx {row['sample_idx']} is outside a group of {group}"
    if "reward" in row and not math.isfinite(row["reward"]):
        return f"reward {row['reward']} is not finite"
    if "policy_version" in row and (row["policy_version"] is None or row["policy_version"] < 0):
        return f"policy_version {row['policy_version']} is not a version"
    if "completion_tokens" not in row or (row.get("env_error") and not row["completion_tokens"]):
        return None  # (an episode whose environment failed before its first turn: no tokens)
    prompt, completion = row["prompt_tokens"], row["completion_tokens"]
    if not prompt:
        return "no prompt tokens"
    if not completion:
        return "no completion tokens (a sampled completion ends with its stop token)"
    vocab = limits.vocab_size
    outside = [t for t in (*prompt, *completion) if t < 0 or (vocab is not None and t >= vocab)]
    if outside:
        within = f" (0..{vocab - 1})" if vocab is not None else ""
        return f"token id {outside[0]} is outside the vocabulary{within}"
    block, length = limits.block_size, len(prompt) + len(completion)
    if block is not None and length > block:
        return f"{length} tokens, more than the context ({block})"
    if len(row["logprobs"]) != len(completion):
        return f"{len(row['logprobs'])} logprobs for {len(completion)} completion tokens"
    mask = row.get("loss_mask")
    if mask is not None and (len(mask) != len(completion) or not set(mask) <= {0, 1}):
        return f"loss_mask of {len(mask)} 0/1 values for {len(completion)} completion tokens"
    if not all(math.isfinite(x) for x in row["logprobs"]):
        return "a logprob is not finite"
    return None


async def keep_rows_of_run(
    rows: list[dict],
    run_id: str | None,
    problem_of: Callable[[dict], str | None],
    refuse: Callable[[int, dict, str], Awaitable[None]],
) -> list[dict]:
    """The rows of run `run_id` (None: every run's) that `problem_of` finds nothing wrong with.
    Each other row of the run is handed to `refuse(index, row, problem)` (a dead letter, its
    index in the message as its part); other runs' rows are dropped."""
    good = []
    for i, row in enumerate(rows):
        if run_id is not None and row["run_id"] != run_id:
            continue
        problem = problem_of(row)
        if problem is None:
            good.append(row)
        else:
            await refuse(i, row, problem)
    return good


def prompt_of(row: dict) -> Prompt:
    """The Prompt a rollout row answers (the fields its verifier needs)."""
    return prompt_of_row(row | {"text": row["prompt_text"]})


def score_rollouts(
    rollouts: list[dict], reward_fn: RewardFn | None = None, verifier: str = "verifier"
) -> list[dict]:
    """One `rewards` row per `rollouts` row: the reward and whether the task verifier accepts it.

    Rows keep run_id and policy_version of their rollout; event ids derive from
    (request_id, sample_idx, verifier), so re-scoring with another verifier gives new ids.
    """
    if not rollouts:
        return []
    prompts = [prompt_of(r) for r in rollouts]
    completions = [r["completion"] for r in rollouts]
    # an episode's reward is its environment's return; the verifier or reward function scores
    # single-turn completions (the one-step case)
    plain = [i for i, r in enumerate(rollouts) if not r.get("environment")]
    rewards = [float(r.get("episode_reward") or 0.0) for r in rollouts]
    grades: dict[int, Grade] = {}
    if plain:
        texts, asked = [completions[i] for i in plain], [prompts[i] for i in plain]
        grades = dict(zip(plain, grade_all(texts, asked), strict=True))
        scored = call_reward(reward_fn, texts, asked) if reward_fn else None
        for n, i in enumerate(plain):
            rewards[i] = scored[n] if scored else grades[i].reward
    out = []
    for i, (row, reward) in enumerate(zip(rollouts, rewards, strict=True)):
        if row.get("environment"):
            correct = not row.get("env_error") and reward > 0
        else:
            correct = grades[i].correct
        details = grades[i].details if i in grades else ""
        out.append(
            {
                "event_id": make_event_id(
                    "rewards", row["request_id"], row["sample_idx"], verifier
                ),
                "run_id": row["run_id"],
                "policy_version": row["policy_version"],
                "request_id": row["request_id"],
                "prompt_id": row["prompt_id"],
                "sample_idx": row["sample_idx"],
                "group_size": row["group_size"],
                "task": row["task"],
                "reward": float(reward),
                "correct": correct,
                "verifier": f"env:{row['environment']}" if row.get("environment") else verifier,
            }
            | ({"details": details} if details else {})
        )
    return out


class Scorer:
    """score_rollouts one group at a time, each bounded by `timeout_s`: a verifier or reward
    function that raises, returns garbage or runs over gives its group reward 0 (all equal:
    GRPO learns nothing from it) with the reason in `details`, and the reason is returned so
    the processor dead-letters it. A call that runs over keeps its thread (Python cannot stop
    it); the next group gets a fresh one."""

    def __init__(self, reward_fn: RewardFn | None, verifier: str, timeout_s: float):
        from rlstream.trainers.envs import TASKS

        self.reward_fn, self.verifier, self.timeout_s = reward_fn, verifier, timeout_s
        self._pool = None
        for family in list(TASKS.values()):  # imports belong to start-up, not to the timeout
            getattr(family, "warm_up", lambda: None)()

    def score(self, rollouts: list[dict]) -> tuple[list[dict], list[tuple[int, str, str]]]:
        """(reward rows, failures as (first row index, request_id, reason))."""
        from concurrent.futures import ThreadPoolExecutor
        from concurrent.futures import TimeoutError as Timeout

        out, failures = [], []
        for start, group in _groups(rollouts):
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="verifier")
            job = self._pool.submit(score_rollouts, group, self.reward_fn, self.verifier)
            try:
                out += job.result(timeout=self.timeout_s)
                continue
            except Timeout:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
                reason = f"verifier timed out after {self.timeout_s:g} s"
            except Exception as exc:  # the user's verifier: whatever it raises is reported
                reason = f"verifier raised {exc!r:.300}"
            request_id = group[0]["request_id"]
            failures.append((start, request_id, f"request {request_id}: {reason}"))
            out += failed_rewards(group, self.verifier, reason)
        return out, failures


def _groups(rows: list[dict]) -> list[tuple[int, list[dict]]]:
    """Rows split by request_id, in order, with the index of each group's first row."""
    starts: dict[str, int] = {}
    groups: dict[str, list[dict]] = defaultdict(list)
    for i, row in enumerate(rows):
        starts.setdefault(row["request_id"], i)
        groups[row["request_id"]].append(row)
    return [(starts[rid], rows_) for rid, rows_ in groups.items()]


def failed_rewards(rollouts: list[dict], verifier: str, reason: str) -> list[dict]:
    """Reward 0, not correct, for each rollout of a group whose verifier failed."""
    return [
        {
            "event_id": make_event_id("rewards", r["request_id"], r["sample_idx"], verifier),
            "run_id": r["run_id"],
            "policy_version": r["policy_version"],
            "request_id": r["request_id"],
            "prompt_id": r["prompt_id"],
            "sample_idx": r["sample_idx"],
            "group_size": r["group_size"],
            "task": r["task"],
            "reward": 0.0,
            "correct": False,
            "verifier": verifier,
            "details": f"verifier failed: {reason}",
        }
        for r in rollouts
    ]


def complete_groups(rows: list[dict]) -> tuple[dict[str, list[dict]], dict[str, list[dict]]]:
    """Split rows by request_id into (complete groups, incomplete groups), de-duplicating
    repeated samples (at-least-once delivery) by sample_idx."""
    by_request: dict[str, dict[int, dict]] = defaultdict(dict)
    for row in rows:
        by_request[row["request_id"]][row["sample_idx"]] = row
    complete, partial = {}, {}
    for request_id, samples in by_request.items():
        group = [samples[i] for i in sorted(samples)]
        target = complete if len(group) >= group[0]["group_size"] else partial
        target[request_id] = group
    return complete, partial


def assemble_experience(rollouts: list[dict], rewards: list[dict]) -> list[dict]:
    """`experience` rows for one complete group: rollout tokens joined with rewards by
    sample_idx, sorted by sample_idx. Advantages are the trainer's (rl_update): GRPO's need
    only the group, PPO's need the trainer's value head."""
    reward_of = {r["sample_idx"]: r for r in rewards}
    missing = [r["sample_idx"] for r in rollouts if r["sample_idx"] not in reward_of]
    if missing:
        raise ValueError(f"request {rollouts[0]['request_id']}: no reward for samples {missing}")
    rollouts = sorted(rollouts, key=lambda r: r["sample_idx"])
    out = []
    for row in rollouts:
        scored = reward_of[row["sample_idx"]]
        out.append(
            {
                "event_id": make_event_id("experience", row["request_id"], row["sample_idx"]),
                "run_id": row["run_id"],
                "policy_version": row["policy_version"],
                "request_id": row["request_id"],
                "prompt_id": row["prompt_id"],
                "sample_idx": row["sample_idx"],
                "task": row["task"],
                "prompt_tokens": row["prompt_tokens"],
                "completion_tokens": row["completion_tokens"],
                "logprobs": row["logprobs"],
                "reward": scored["reward"],
                "correct": scored["correct"],
            }
            | {name: row.get(name) for name in EPISODE_COLUMNS if row.get(name) is not None}
        )
    return out


EPISODE_COLUMNS = ("environment", "loss_mask", "turn_rewards", "turns", "stop_reason",
                   "env_error", "env_spans")  # fmt: skip
"""What an experience row keeps of its episode (`schemas.events.EPISODE`)."""
