"""The fuzzer's messages: each one of a class of defect (see `fuzz.py`), built from a
well-formed event of its topic, with the consumers that must dead-letter it."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pyarrow as pa

from rlstream.config import Config
from rlstream.schemas import encode, get, rows_to_batch
from rlstream.schemas.codec import headers_for

OTHER_RUN = "fuzz-other-run"
OWNERS = {  # event -> the process kinds that must dead-letter a bad message on its topic
    "prompts": ("scheduler",),
    "rollout_requests": ("rollout-workers",),
    "rollouts": ("processors",),
    "rewards": ("processors", "scheduler"),
    "experience": ("trainer",),
}
FOLLOWED = ("corpus", "policy_versions")  # read whole by every process, owned by none
ENCODING = ("random_bytes", "truncated_arrow", "no_headers", "unknown_event", "unknown_version",
            "other_event_headers", "missing_column", "null_required", "wrong_topic")  # fmt: skip
ROWS = {  # row defects and the events whose rows carry the field
    "nan_reward": ("rewards", "experience"),
    "inf_reward": ("rewards", "experience"),
    "empty_completion": ("rollouts", "experience"),
    "long_completion": ("rollouts", "experience"),
    "token_outside_vocab": ("rollouts", "experience"),
    "negative_group_size": ("rollout_requests", "rollouts", "rewards"),
    "huge_group_size": ("rollout_requests", "rollouts", "rewards"),
}


@dataclass
class FuzzMessage:
    cls: str
    event: str  # the topic's event
    value: bytes | None
    headers: list[tuple[str, bytes]]
    owners: tuple[str, ...]  # who must dead-letter it; () for skipped or left alone
    where: tuple[str, int, int] | None = None  # (topic, partition, offset) once sent


def plan(n: int, seed: int) -> list[tuple[str, str]]:
    """`n` (class, event) pairs cycling through every pair that applies, in a seeded order."""
    pairs = [(c, e) for e in OWNERS for c in ENCODING]
    pairs += [(c, e) for c, events in ROWS.items() for e in events]
    pairs += [("other_run", e) for e in OWNERS]
    pairs += [(c, e) for e in FOLLOWED for c in ENCODING if c != "wrong_topic"]
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    while len(out) < n:
        rng.shuffle(pairs)
        out += pairs
    return out[:n]


def template(event: str, run_id: str, cfg: Config, i: int) -> dict:
    """A well-formed row of `event` for this run (its ids are the fuzzer's own)."""
    req, g = f"fuzz-{i:06d}", cfg.rl.group_size
    common = {"event_id": f"fuzz-{event}-{i}", "run_id": run_id, "request_id": req,
              "prompt_id": f"fuzz-p{i}", "task": "add"}  # fmt: skip
    tokens = {"prompt_tokens": [5, 6, 7], "completion_tokens": [8, 1], "logprobs": [-0.5, -0.1]}
    rows = {
        "prompts": {
            "prompt_id": f"fuzz-p{i}",
            "text": "1+2=",
            "task": "add",
            "answer": "3",
            "dataset": f"fuzz-{i}",
        },  # fmt: skip
        "rollout_requests": common
        | {"text": "1+2=", "answer": "3", "group_size": g, "sampler": "fuzz"},  # fmt: skip
        "rollouts": common
        | {
            "sample_idx": 0,
            "group_size": g,
            "prompt_text": "1+2=",
            "answer": "3",
            "completion": "3",
            **tokens,
        },  # fmt: skip
        "rewards": common
        | {
            "sample_idx": 0,
            "group_size": g,
            "reward": 1.0,
            "correct": True,
            "verifier": "fuzz",
        },  # fmt: skip
        "experience": common | {"sample_idx": 0, "reward": 1.0, "correct": True, **tokens},
        "corpus": {"doc_id": f"fuzz-d{i}", "text": "1+2=3", "source": "fuzz"},
        "policy_versions": {
            "version": 10**6 + i,
            "checkpoint_uri": "s3://nowhere/x",
            "step": 1,
            "phase": "rl",
        },  # fmt: skip
    }[event]
    return {"run_id": run_id} | rows


def defective_row(cls: str, row: dict, cfg: Config) -> dict:
    """`row` with the defect `cls`."""
    long = cfg.model.block_size * 4
    change = {
        "nan_reward": {"reward": math.nan},
        "inf_reward": {"reward": math.inf},
        "empty_completion": {"completion": "", "completion_tokens": [], "logprobs": []},
        "long_completion": {
            "completion": "1" * long,
            "completion_tokens": [8] * long,
            "logprobs": [-0.1] * long,
        },  # fmt: skip
        "token_outside_vocab": {"completion_tokens": [8, 10**6]},
        "negative_group_size": {"group_size": -4},
        "huge_group_size": {"group_size": 2**31 - 1},
    }[cls]
    return row | {k: v for k, v in change.items() if k in row}


def build(cls: str, event_name: str, cfg: Config, rng: random.Random, i: int) -> FuzzMessage:
    """One malformed message of class `cls` for the topic of `event_name`."""
    event = get(event_name)
    owners = OWNERS.get(event_name, ())
    if cls == "other_run":
        row = template(event_name, OTHER_RUN, cfg, i)
        value, headers = encode(event, rows_to_batch(event, [row], run_id=OTHER_RUN))
        return FuzzMessage(cls, event_name, value, headers, ())
    row = template(event_name, cfg.run_id, cfg, i)
    if cls in ROWS:
        bad = defective_row(cls, row, cfg)
        value, headers = encode(event, rows_to_batch(event, [bad], run_id=cfg.run_id))
        return FuzzMessage(cls, event_name, value, headers, owners)
    value, headers = encode(event, rows_to_batch(event, [row], run_id=cfg.run_id))
    if cls == "random_bytes":
        value = rng.randbytes(rng.randrange(0, 2048))
        headers = headers if rng.random() < 0.5 else []
    elif cls == "truncated_arrow":
        value = value[: rng.randrange(1, len(value))]
    elif cls == "no_headers":
        headers = []
    elif cls == "unknown_event":
        headers = [("event", b"fuzz_nonsense"), ("schema_version", b"1")]
    elif cls == "unknown_version":
        headers = [("event", event_name.encode()), ("schema_version", b"999")]
    elif cls == "other_event_headers":
        other = "rewards" if event_name != "rewards" else "rollouts"
        headers = headers_for(get(other))
    elif cls == "missing_column":
        batch = rows_to_batch(event, [row], run_id=cfg.run_id)
        required = [f.name for f in event.payload_fields if not f.nullable]
        value = _ipc(batch.drop_columns([rng.choice(required)]))
    elif cls == "null_required":
        batch = rows_to_batch(event, [row], run_id=cfg.run_id)
        name = rng.choice([f.name for f in event.payload_fields if not f.nullable])
        value = _ipc(_nulled(batch, name))
    elif cls == "wrong_topic":  # a good event of another kind: decodes, but not here
        other = "rewards" if event_name != "rewards" else "rollouts"
        o = get(other)
        value, headers = encode(o, rows_to_batch(o, [template(other, cfg.run_id, cfg, i)]))
    else:
        raise ValueError(f"unknown fuzz class {cls!r}")
    return FuzzMessage(cls, event_name, value, headers, owners)


def _ipc(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _nulled(batch: pa.RecordBatch, name: str) -> pa.RecordBatch:
    """`batch` with column `name` all null (its field made nullable, as a careless producer's)."""
    i = batch.schema.get_field_index(name)
    schema = batch.schema.set(i, batch.schema.field(i).with_nullable(True))
    columns = list(batch.columns)
    columns[i] = pa.nulls(batch.num_rows, type=columns[i].type)
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def messages(cfg: Config, n: int, seed: int) -> list[FuzzMessage]:
    rng = random.Random(seed)
    return [build(c, e, cfg, rng, i) for i, (c, e) in enumerate(plan(n, seed))]
