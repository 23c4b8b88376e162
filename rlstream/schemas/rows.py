"""From Python rows (user files, processor outputs) to validated event batches.

`coerce_row` checks and converts one user-supplied row against an event schema, so `publish`
can report a bad row with its reason and still publish the good ones. `rows_to_batch` fills the
envelope: a missing `event_id` is derived from the row's content, so re-publishing the same row
yields the same id and idempotent sinks drop the duplicate.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from rlstream.schemas.errors import RowError
from rlstream.schemas.registry import ENVELOPE_NAMES, EventType


def make_event_id(*parts: object) -> str:
    """A deterministic 32-hex-digit id from the given parts (same parts, same id)."""
    digest = hashlib.blake2b(digest_size=16)
    for part in parts:
        digest.update(str(part).encode())
        digest.update(b"\x1f")
    return digest.hexdigest()


def now_ms() -> int:
    return int(time.time() * 1000)


def envelope_columns(
    n: int, *, run_id: str, policy_version: int = 0, produced_at_ms: int | None = None
) -> dict[str, Any]:
    """Envelope columns (all but event_id) for `n` rows, as Arrow arrays."""
    at = now_ms() if produced_at_ms is None else produced_at_ms
    return {
        "run_id": pa.array([run_id] * n, pa.string()),
        "policy_version": pa.array([policy_version] * n, pa.int64()),
        "produced_at": pa.array([at] * n, pa.timestamp("ms", tz="UTC")),
    }


def _to_int(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError("a boolean is not an integer")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    raise TypeError(f"expected an integer, got {value!r}")


def _to_float(value: Any) -> float:
    if isinstance(value, bool):
        raise TypeError("a boolean is not a number")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise TypeError(f"expected a number, got {value!r}")


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise TypeError(f"expected true or false, got {value!r}")


def _to_str(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)  # CSV and JSON give ids and answers as numbers; text is what we keep
    raise TypeError(f"expected a string, got {type(value).__name__}")


def _to_list(convert):
    def to_list(value: Any) -> list:
        if isinstance(value, str):
            value = json.loads(value)
        if not isinstance(value, list | tuple):
            raise TypeError(f"expected a list, got {type(value).__name__}")
        return [convert(v) for v in value]

    return to_list


def _to_datetime(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value / 1000, tz=UTC)
    if isinstance(value, str):
        return datetime.fromisoformat(value)
    raise TypeError(f"expected a timestamp, got {type(value).__name__}")


def _to_int_of(type_: pa.DataType):
    """An integer that fits `type_` (int8 .. int64), else TypeError naming the range."""
    bits = type_.bit_width
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1

    def to_int(value: Any) -> int:
        number = _to_int(value)
        if not low <= number <= high:
            raise TypeError(f"{number} is outside the {bits}-bit range {low}..{high}")
        return number

    return to_int


def _converter(type_: pa.DataType):
    if pa.types.is_string(type_):
        return _to_str
    if pa.types.is_integer(type_):
        return _to_int_of(type_)
    if pa.types.is_floating(type_):
        return _to_float
    if pa.types.is_boolean(type_):
        return _to_bool
    if pa.types.is_timestamp(type_):
        return _to_datetime
    if pa.types.is_binary(type_):
        return lambda v: v if isinstance(v, bytes) else str(v).encode()
    if pa.types.is_list(type_):
        return _to_list(_converter(type_.value_type))
    raise TypeError(f"no converter for Arrow type {type_}")


def coerce_row(event: EventType, row: Mapping[str, Any]) -> dict[str, Any]:
    """Check and convert one row's payload fields; raise RowError naming the bad field.

    Columns the schema does not know go into `metadata` (as JSON) when the event has one,
    and are an error otherwise. Envelope fields in the row are kept when valid.
    """
    known = set(event.schema.names)
    out: dict[str, Any] = {}
    extras = {k: v for k, v in row.items() if k not in known}
    for field in event.schema:
        value = row.get(field.name)
        if value is None or (isinstance(value, str) and value == "" and field.nullable):
            if field.name in event.required and field.name not in ENVELOPE_NAMES:
                raise RowError(f"missing required field {field.name!r}")
            continue
        try:
            out[field.name] = _converter(field.type)(value)
        except (TypeError, ValueError) as exc:
            raise RowError(f"field {field.name!r}: {exc}") from None
    if extras:
        if "metadata" not in known:
            raise RowError(f"unknown fields {sorted(extras)} for event {event.name!r}")
        merged = json.loads(out.get("metadata") or "{}")
        if not isinstance(merged, dict):
            raise RowError("field 'metadata': must be a JSON object")
        merged.update(extras)
        out["metadata"] = json.dumps(merged, sort_keys=True, default=str)
    return out


_KEY_FROM_TEXT = {"prompt_id", "doc_id"}  # ids that may be derived from the text when absent


def prepare_row(event: EventType, data: dict, dataset: str | None = None) -> dict:
    """Coerce a user row and derive a missing text-keyed id (prompt_id, doc_id). With a
    dataset, the row carries it (unless it names its own) and a missing event id derives from
    (dataset, key): publishing the same prompt to the dataset again does not duplicate it."""
    if event.key in _KEY_FROM_TEXT and not data.get(event.key) and data.get("text"):
        data = {**data, event.key: make_event_id(event.name, data["text"])[:16]}
    row = coerce_row(event, data)
    if dataset is not None and "dataset" in event.schema.names:
        row.setdefault("dataset", dataset)
        if row.get("event_id") is None and row.get(event.key) is not None:
            row["event_id"] = make_event_id(event.name, row["dataset"], row[event.key])
    return row


def rows_to_batch(
    event: EventType,
    rows: Sequence[Mapping[str, Any]],
    *,
    run_id: str = "default",
    policy_version: int = 0,
    produced_at_ms: int | None = None,
) -> pa.RecordBatch:
    """Build a batch of `event` from payload rows, filling envelope fields the rows lack."""
    at = now_ms() if produced_at_ms is None else produced_at_ms
    produced_at = datetime.fromtimestamp(at / 1000, tz=UTC)
    filled = []
    for row in rows:
        full = dict(row)
        full.setdefault("run_id", run_id)
        full.setdefault("policy_version", policy_version)
        full.setdefault("produced_at", produced_at)
        if full.get("event_id") is None:
            payload = {k: full.get(k) for k in event.schema.names if k not in ENVELOPE_NAMES}
            full["event_id"] = make_event_id(
                event.name, full["run_id"], json.dumps(payload, sort_keys=True, default=str)
            )
        filled.append(full)
    return pa.RecordBatch.from_pylist(filled, schema=event.schema)
