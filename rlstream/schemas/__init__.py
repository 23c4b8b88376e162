"""Versioned Arrow event schemas, their registry, and the Kafka message codec."""

from rlstream.schemas import events  # noqa: F401  (registers every event)
from rlstream.schemas.codec import (
    DEFAULT_MAX_MESSAGE_BYTES,
    Decoded,
    conform,
    decode,
    encode,
    event_from_headers,
)
from rlstream.schemas.errors import (
    DecodeError,
    MissingRequiredValues,
    NotArrow,
    OversizeMessage,
    RowError,
    SchemaMismatch,
    UnknownEvent,
    UnknownVersion,
)
from rlstream.schemas.registry import EventType, all_events, get, latest_events, resolve_topic
from rlstream.schemas.rows import (
    coerce_row,
    envelope_columns,
    make_event_id,
    prepare_row,
    rows_to_batch,
)

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "Decoded",
    "DecodeError",
    "EventType",
    "MissingRequiredValues",
    "NotArrow",
    "OversizeMessage",
    "RowError",
    "SchemaMismatch",
    "UnknownEvent",
    "UnknownVersion",
    "all_events",
    "coerce_row",
    "conform",
    "decode",
    "encode",
    "event_from_headers",
    "envelope_columns",
    "get",
    "latest_events",
    "make_event_id",
    "prepare_row",
    "resolve_topic",
    "rows_to_batch",
]
