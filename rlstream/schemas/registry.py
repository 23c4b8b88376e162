"""The registry of versioned event schemas and the topics that carry them.

An `EventType` is the pair (name, version) plus its Arrow schema, the set of required fields,
the Kafka key field, and the topic's partition count. Registering the same (name, version) twice
is an error. Topic names follow `rl.<plural-noun>.v<major>`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pyarrow as pa

ENVELOPE: tuple[pa.Field, ...] = (
    pa.field("event_id", pa.string(), nullable=False),
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("policy_version", pa.int64(), nullable=False),
    pa.field("produced_at", pa.timestamp("ms", tz="UTC"), nullable=False),
)
ENVELOPE_NAMES = tuple(f.name for f in ENVELOPE)


@dataclass(frozen=True)
class EventType:
    """One versioned event: its schema (envelope first), key field and topic."""

    name: str
    version: int
    schema: pa.Schema
    key: str
    partitions: int
    doc: str = ""
    derived_topic: str | None = None
    """set for a topic outside the live loop that carries this event (`reprocess --to`)"""
    required: frozenset[str] = field(init=False)
    required_indices: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        required = [i for i, f in enumerate(self.schema) if not f.nullable]
        object.__setattr__(self, "required", frozenset(self.schema.names[i] for i in required))
        object.__setattr__(self, "required_indices", tuple(required))

    @property
    def topic(self) -> str:
        return self.derived_topic or topic_name(self.name, self.version)

    def on_topic(self, topic: str) -> EventType:
        """This event as carried by another topic (e.g. `rl.rewards.v1.rescored`)."""
        return self if topic == self.topic else replace(self, derived_topic=topic)

    @property
    def payload_fields(self) -> list[pa.Field]:
        return [f for f in self.schema if f.name not in ENVELOPE_NAMES]


def topic_name(name: str, version: int) -> str:
    return f"rl.{name}.v{version}"


_REGISTRY: dict[tuple[str, int], EventType] = {}


def register(
    name: str,
    version: int,
    fields: list[pa.Field],
    *,
    key: str,
    partitions: int,
    doc: str = "",
) -> EventType:
    """Register an event; fields exclude the envelope, which is prepended."""
    if (name, version) in _REGISTRY:
        raise ValueError(f"event {name!r} version {version} is already registered")
    schema = pa.schema(list(ENVELOPE) + list(fields))
    if key not in schema.names:
        raise ValueError(f"event {name!r}: key field {key!r} is not in the schema")
    event = EventType(name, version, schema, key, partitions, doc)
    _REGISTRY[(name, version)] = event
    return event


def get(name: str, version: int | None = None) -> EventType:
    """The registered event `name` at `version` (the latest when None)."""
    if version is None:
        versions = [v for (n, v) in _REGISTRY if n == name]
        if not versions:
            raise KeyError(name)
        version = max(versions)
    return _REGISTRY[(name, version)]


def is_registered(name: str, version: int | None = None) -> bool:
    if version is None:
        return any(n == name for (n, _) in _REGISTRY)
    return (name, version) in _REGISTRY


def all_events() -> list[EventType]:
    """Every registered event, one per (name, version), sorted by topic."""
    return sorted(_REGISTRY.values(), key=lambda e: e.topic)


def latest_events() -> list[EventType]:
    """The latest version of every event name."""
    return [get(name) for name in sorted({n for (n, _) in _REGISTRY})]


def resolve_topic(name_or_topic: str) -> EventType:
    """Accept a short name (`rollouts`) or a full topic (`rl.rollouts.v1`); raise KeyError."""
    if name_or_topic.startswith("rl.") and ".v" in name_or_topic:
        body, _, ver = name_or_topic[3:].rpartition(".v")
        if ver.isdigit() and is_registered(body, int(ver)):
            return get(body, int(ver))
        raise KeyError(name_or_topic)
    if is_registered(name_or_topic):
        return get(name_or_topic)
    raise KeyError(name_or_topic)
