"""The Kafka message codec: one Arrow IPC stream holding one RecordBatch per message value.

Headers `event` and `schema_version` let a consumer route or reject a message without decoding
it. `decode` checks, in order: size, event header, version header, Arrow framing, schema, and
required values, raising a distinct `DecodeError` subclass for each.

Small batches are the common case (a 64-row rollout group is ~22 KB), so IPC options disable
Arrow's thread pool: for messages this size the pool costs more than it saves.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

import pyarrow as pa

from rlstream.schemas import errors, registry
from rlstream.schemas.registry import EventType

DEFAULT_MAX_MESSAGE_BYTES = 1_000_000  # the broker's default message.max.bytes is ~1 MB

Headers = Sequence[tuple[str, bytes]]

_WRITE_OPTIONS = pa.ipc.IpcWriteOptions(use_threads=False)
_READ_OPTIONS = pa.ipc.IpcReadOptions(use_threads=False)


@dataclass(frozen=True)
class Decoded:
    """A validated message: its event type and its rows."""

    event: EventType
    batch: pa.RecordBatch

    def to_pylist(self) -> list[dict]:
        return self.batch.to_pylist()


def headers_for(event: EventType) -> list[tuple[str, bytes]]:
    return [("event", event.name.encode()), ("schema_version", str(event.version).encode())]


def conform(event: EventType, data: pa.RecordBatch | pa.Table) -> pa.RecordBatch:
    """Return `data` as one RecordBatch with exactly the event's schema, or raise SchemaMismatch.

    Columns may be in any order and of castable types (int64 -> int32, say); a missing optional
    column is all null; a missing required column or an extra one is an error. Required columns
    must hold no nulls (MissingRequiredValues).
    """
    if isinstance(data, pa.Table):
        data = data.combine_chunks()
        batches = data.to_batches()
        data = batches[0] if batches else pa.RecordBatch.from_pylist([], schema=event.schema)
    data = with_optional_columns(event, data)
    schema = data.schema
    if schema.equals(event.schema):
        pass
    elif not _same_types(schema, event.schema):
        problem = _schema_diff(data.schema, event.schema)
        if problem.startswith("missing") or problem.startswith("unexpected"):
            raise errors.SchemaMismatch(f"event {event.name!r} v{event.version}: {problem}")
        try:
            columns = [data.column(f.name).cast(f.type) for f in event.schema]
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise errors.SchemaMismatch(
                f"event {event.name!r} v{event.version}: {problem} and cannot be cast ({exc})"
            ) from None
        data = pa.RecordBatch.from_arrays(columns, schema=event.schema)
    else:  # same names and types, other nullability or metadata
        data = pa.RecordBatch.from_arrays(data.columns, schema=event.schema)
    _check_required(event, data)
    return data


def with_optional_columns(event: EventType, batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch` with the event's optional columns it lacks added as nulls, in schema order.

    This is the compatible evolution within a schema version: a field added as optional
    leaves older producers' messages (and producers that omit optional columns) valid.
    Anything else (a missing required column, an extra column) is left for the caller.
    """
    names = set(batch.schema.names)
    missing = [f for f in event.schema if f.name not in names]
    if not missing or any(not f.nullable for f in missing) or names - set(event.schema.names):
        return batch
    columns = [
        batch.column(f.name) if f.name in names else pa.nulls(batch.num_rows, f.type)
        for f in event.schema
    ]
    fields = [batch.schema.field(f.name) if f.name in names else f for f in event.schema]
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields))


def encode(event: EventType, data: pa.RecordBatch | pa.Table) -> tuple[bytes, list]:
    """Encode a batch of `event` rows as (message value, headers)."""
    batch = conform(event, data)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, event.schema, options=_WRITE_OPTIONS) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes(), headers_for(event)


def decode(
    value: bytes | None,
    headers: Headers | None,
    *,
    max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    expect: Collection[str] | None = None,
) -> Decoded:
    """Decode and validate one message value; raise a DecodeError subclass if it is bad, or if
    it is an event other than the `expect`ed ones (a consumer's topics carry only those)."""
    if value is None:
        raise errors.NotArrow("message has no value (a tombstone), not an Arrow stream")
    if len(value) > max_bytes:
        raise errors.OversizeMessage(
            f"message is {len(value):,} bytes, over the {max_bytes:,}-byte limit; "
            "publish smaller batches (--batch-rows)"
        )
    event = event_from_headers(headers)
    if expect is not None and event.name not in expect:
        raise errors.UnexpectedEvent(
            f"a {event.name!r} event where this consumer takes {' or '.join(map(repr, expect))}"
        )
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(value), options=_READ_OPTIONS)
        batches = list(reader)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
        raise errors.NotArrow(f"value is not an Arrow IPC stream: {exc}") from None
    if len(batches) != 1:
        raise errors.NotArrow(f"Arrow stream holds {len(batches)} record batches, expected 1")
    batch = with_optional_columns(event, batches[0])
    schema = batch.schema
    if not schema.equals(event.schema) and not _same_types(schema, event.schema):
        raise errors.SchemaMismatch(
            f"event {event.name!r} v{event.version}: {_schema_diff(batch.schema, event.schema)}"
        )
    _check_required(event, batch)
    return Decoded(event, batch)


def event_from_headers(headers: Headers | None) -> EventType:
    """The registered event a message's `event` and `schema_version` headers name."""
    found = {k: v for k, v in (headers or ())}
    raw_name = found.get("event")
    if raw_name is None:
        raise errors.UnknownEvent(
            "message has no 'event' header (not written by an rlstream codec)"
        )
    name = raw_name.decode(errors="replace")
    if not registry.is_registered(name):
        known = ", ".join(sorted({e.name for e in registry.all_events()}))
        raise errors.UnknownEvent(f"unknown event {name!r}; known events: {known}")
    raw_version = found.get("schema_version")
    if raw_version is None or not raw_version.isdigit():
        raise errors.UnknownVersion(
            f"event {name!r}: 'schema_version' header is {raw_version!r}, expected an integer"
        )
    version = int(raw_version)
    if not registry.is_registered(name, version):
        known = sorted(e.version for e in registry.all_events() if e.name == name)
        raise errors.UnknownVersion(
            f"event {name!r} has no schema version {version} (known: {known}); "
            "upgrade rlstream or check the producer"
        )
    return registry.get(name, version)


def _same_types(actual: pa.Schema, expected: pa.Schema) -> bool:
    return actual.names == expected.names and all(
        a.type.equals(e.type) for a, e in zip(actual, expected, strict=True)
    )


def _schema_diff(actual: pa.Schema, expected: pa.Schema) -> str:
    missing = [n for n in expected.names if n not in actual.names]
    if missing:
        return f"missing fields {missing}"
    extra = [n for n in actual.names if n not in expected.names]
    if extra:
        return f"unexpected fields {extra}"
    wrong = [
        f"{f.name}: {actual.field(f.name).type} (expected {f.type})"
        for f in expected
        if not actual.field(f.name).type.equals(f.type)
    ]
    if wrong:
        return "wrong types: " + "; ".join(wrong)
    return f"fields out of order {actual.names} (expected {expected.names})"


def _check_required(event: EventType, batch: pa.RecordBatch) -> None:
    columns = batch.columns
    for i in event.required_indices:
        column = columns[i]
        if column.null_count:
            name = event.schema.names[i]
            rows = [i for i, v in enumerate(column.is_null().to_pylist()) if v][:5]
            raise errors.MissingRequiredValues(
                f"event {event.name!r}: required field {name!r} has {column.null_count} "
                f"null value(s), first at rows {rows}"
            )


def iter_rows(batches: Iterable[pa.RecordBatch]) -> Iterable[dict]:
    for batch in batches:
        yield from batch.to_pylist()
