"""Every way a Kafka message can be bad, each with its own exception class.

A consumer catches `DecodeError` (the base) and sends the message to the dead-letter topic with
`str(error)` as the reason and `error.kind` as a stable machine-readable label.
"""

from __future__ import annotations


class DecodeError(ValueError):
    """A message that cannot be turned into a valid event batch."""

    kind = "decode_error"


class NotArrow(DecodeError):
    """The message value is not a readable Arrow IPC stream."""

    kind = "not_arrow"


class UnknownEvent(DecodeError):
    """The `event` header is missing or names no registered event."""

    kind = "unknown_event"


class UnknownVersion(DecodeError):
    """The event is known but the `schema_version` header is missing or not registered."""

    kind = "unknown_version"


class UnexpectedEvent(DecodeError):
    """A well-formed event of a kind this consumer does not take (the wrong topic)."""

    kind = "unexpected_event"


class SchemaMismatch(DecodeError):
    """The Arrow schema in the message differs from the registered one (names or types)."""

    kind = "schema_mismatch"


class MissingRequiredValues(DecodeError):
    """A required column holds nulls."""

    kind = "missing_required"


class OversizeMessage(DecodeError):
    """The message is larger than the configured maximum."""

    kind = "oversize"


class RowError(ValueError):
    """A user-supplied row (publish) that does not fit the event schema."""
