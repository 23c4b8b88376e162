"""Pure functions the stream processors call: score rollouts, assemble experience groups.

They turn rows of one event into rows of the next, with deterministic event ids (so a message
processed twice produces the same ids and idempotent sinks drop the copy) and the producing
policy version carried through from the rollout's envelope.
"""

from __future__ import annotations

from collections import defaultdict

from rlstream.schemas import make_event_id
from rlstream.trainers.envs import Prompt, verify
from rlstream.trainers.rewards import RewardFn, verifier_reward


def prompt_of(row: dict) -> Prompt:
    """The Prompt a rollout row answers (the fields its verifier needs)."""
    return Prompt(row["prompt_id"], row["prompt_text"], row["task"], row.get("difficulty") or 0,
                  row.get("answer") or "")  # fmt: skip


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
    fn = reward_fn or verifier_reward
    rewards = fn(completions, prompts=prompts, answer=[p.answer for p in prompts],
                 text=[p.text for p in prompts])  # fmt: skip
    out = []
    for row, prompt, reward in zip(rollouts, prompts, rewards, strict=True):
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
                "correct": bool(verify(row["completion"], prompt)),
                "verifier": verifier,
            }
        )
    return out


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
        )
    return out
