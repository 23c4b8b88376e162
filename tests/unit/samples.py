"""Sample rows for every registered event, for codec tests (pure: no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa

from rlstream.schemas import EventType, rows_to_batch


def sample_value(type_: pa.DataType, i: int):
    if pa.types.is_string(type_):
        return f"s{i}"
    if pa.types.is_integer(type_):
        return i
    if pa.types.is_floating(type_):
        return i / 4
    if pa.types.is_boolean(type_):
        return i % 2 == 0
    if pa.types.is_binary(type_):
        return bytes([i % 256]) * 3
    if pa.types.is_timestamp(type_):
        return datetime(2026, 1, 1, tzinfo=UTC)
    if pa.types.is_list(type_):
        return [sample_value(type_.value_type, j) for j in range(i % 4)]
    raise TypeError(type_)


def sample_batch(event: EventType, rows: int = 3) -> pa.RecordBatch:
    payload = [{f.name: sample_value(f.type, i) for f in event.payload_fields} for i in range(rows)]
    return rows_to_batch(event, payload, run_id="test", policy_version=7)
