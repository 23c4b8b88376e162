"""Every event on the wire, version 1. Each schema starts with the common envelope
(event_id, run_id, policy_version, produced_at); `nullable=False` marks a required field.

Keys follow ARCHITECTURE.md: everything about a prompt is keyed by `prompt_id`, so all G samples
of a prompt land on one partition (group advantages need them together).
"""

from __future__ import annotations

import pyarrow as pa

from rlstream.schemas.registry import register


def req(name: str, type_: pa.DataType) -> pa.Field:
    return pa.field(name, type_, nullable=False)


def opt(name: str, type_: pa.DataType) -> pa.Field:
    return pa.field(name, type_, nullable=True)


STR, I32, I64, F32, F64, BOOL = (
    pa.string(),
    pa.int32(),
    pa.int64(),
    pa.float32(),
    pa.float64(),
    pa.bool_(),
)
TOKENS = pa.list_(pa.int32())
LOGPROBS = pa.list_(pa.float32())
MASK = pa.list_(pa.int8())  # per completion token: 1 the policy sampled it, 0 an environment's
EPISODE = [  # a multi-turn episode's own columns (null on a single-turn completion)
    opt("environment", STR),
    opt("loss_mask", MASK),
    opt("turn_rewards", LOGPROBS),
    opt("turns", I32),
    opt("stop_reason", STR),  # done | turns | context | error
    opt("env_error", STR),  # "<kind>: <reason>" when the environment failed
    opt("env_spans", TOKENS),  # [start, end) pairs: the environment's text within `completion`
]

PROMPTS = register(
    "prompts",
    1,
    [
        req("prompt_id", STR),
        req("text", STR),
        req("task", STR),
        opt("difficulty", I32),
        opt("answer", STR),  # ground truth for the verifier; absent for open-ended prompts
        opt("split", STR),  # train / heldout; absent: carved from prompt_id (data.heldout_frac)
        opt("dataset", STR),  # the pool a run selects from (`rlstream run --dataset`)
        opt("verifier", STR),  # the verifier to check it with; absent: the task's
        opt("metadata", STR),  # JSON object with any further columns the user supplied
        opt("environment", STR),  # the environment its episodes run in; absent: single-turn
    ],
    key="prompt_id",
    partitions=4,
    doc="Prompts to train on, published by users and environment generators.",
)

PROMPT_SCORES = register(
    "prompt_scores",
    1,
    [
        req("prompt_id", STR),
        req("predicted_pass_rate", F32),
        opt("uncertainty", F32),
        req("ppm_version", I64),
        req("sampler", STR),
        req("selected", BOOL),
        opt("reason", STR),
        opt("text", STR),
        opt("task", STR),
        opt("answer", STR),
    ],
    key="prompt_id",
    partitions=4,
    doc="The scheduler's view of a prompt before any rollout: predicted pass rate and decision.",
)

ROLLOUT_REQUESTS = register(
    "rollout_requests",
    1,
    [
        req("request_id", STR),
        req("prompt_id", STR),
        req("text", STR),
        req("task", STR),
        opt("difficulty", I32),
        opt("answer", STR),
        req("group_size", I32),
        req("sampler", STR),
        opt("predicted_pass_rate", F32),
        opt("verifier", STR),
        opt("metadata", STR),  # the prompt's further columns (JSON): a reward function gets them
        opt("environment", STR),
    ],
    key="prompt_id",
    partitions=4,
    doc="A selected prompt and how many completions (G) to generate for it.",
)

ROLLOUTS = register(
    "rollouts",
    1,
    [
        req("request_id", STR),
        req("prompt_id", STR),
        req("sample_idx", I32),
        req("group_size", I32),
        req("task", STR),
        req("prompt_text", STR),
        opt("difficulty", I32),
        opt("answer", STR),
        req("prompt_tokens", TOKENS),
        req("completion", STR),
        req("completion_tokens", TOKENS),
        req("logprobs", LOGPROBS),
        opt("finish_reason", STR),
        opt("worker_id", STR),
        opt("verifier", STR),  # carried from the request: score_rollouts checks with it
        opt("metadata", STR),  # carried from the request: the reward function's extra columns
        *EPISODE,
        opt("episode_reward", F32),  # the environment's return (the reward of an episode)
        opt("tool_calls", I32),
        opt("env_s", F32),  # seconds the episode waited on its environment
    ],
    key="prompt_id",
    partitions=4,
    doc="One completion of a rollout request (or one episode: its turns, policy and environment "
    "tokens told apart by loss_mask), with the policy version that produced it.",
)

REWARDS = register(
    "rewards",
    1,
    [
        req("request_id", STR),
        req("prompt_id", STR),
        req("sample_idx", I32),
        req("group_size", I32),
        req("task", STR),
        req("reward", F32),
        req("correct", BOOL),
        req("verifier", STR),
        opt("details", STR),
    ],
    key="prompt_id",
    partitions=4,
    doc="The verifier's reward for one rollout.",
)

EXPERIENCE = register(
    "experience",
    2,  # v2: no advantage column (the trainer computes advantages: PPO needs its value head)
    [
        req("request_id", STR),
        req("prompt_id", STR),
        req("sample_idx", I32),
        req("task", STR),
        req("prompt_tokens", TOKENS),
        req("completion_tokens", TOKENS),
        req("logprobs", LOGPROBS),
        req("reward", F32),
        req("correct", BOOL),
        *EPISODE,
    ],
    key="prompt_id",
    partitions=4,
    doc="A complete prompt group (G rollouts joined with their rewards), ready for the trainer.",
)

POLICY_VERSIONS = register(
    "policy_versions",
    1,
    [
        req("version", I64),
        req("checkpoint_uri", STR),
        req("step", I64),
        req("phase", STR),  # pretrain / rl / done
        opt("groups_consumed", I64),  # experience groups the trainer has taken (demand signal)
    ],
    key="run_id",
    partitions=1,
    doc="A new policy checkpoint is in the object store; workers reload from it.",
)

EVAL_RESULTS = register(
    "eval_results",
    1,
    [
        req("step", I64),
        req("task", STR),  # a task family, or "all"
        req("metric", STR),  # greedy_accuracy, pass1, ...
        req("value", F64),
        req("n", I64),
    ],
    key="run_id",
    partitions=1,
    doc="Held-out evaluation of a policy version.",
)

CORPUS = register(
    "corpus",
    1,
    [
        req("doc_id", STR),
        req("text", STR),
        req("source", STR),  # generator / rollout / user
        opt("task", STR),
        opt("dataset", STR),
        opt("split", STR),  # train / validation (the plateau detector's documents)
    ],
    key="doc_id",
    partitions=2,
    doc="Pre-training documents, including verified-correct rollouts fed back.",
)

DEAD_LETTERS = register(
    "dead_letters",
    1,
    [
        req("source_topic", STR),
        req("source_partition", I32),
        req("source_offset", I64),
        req("reason", STR),
        req("error_kind", STR),
        opt("consumer", STR),
        opt("raw_key", pa.binary()),
        req("raw_value", pa.binary()),
        opt("raw_headers", STR),  # JSON object of the original headers
    ],
    key="source_topic",
    partitions=1,
    doc="Messages a consumer rejected, with the reason and the raw bytes; nothing is lost.",
)
