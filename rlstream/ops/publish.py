"""`rlstream publish`: user files in, validated Arrow events out.

Rows are checked one by one against the event schema; bad rows are collected with their line
numbers and reasons while the good rows are batched (`batch_rows` per message, split by key
partition) and published.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.files import read_rows
from rlstream.connectors.kafka import EventProducer
from rlstream.schemas import EventType, RowError, coerce_row, make_event_id, rows_to_batch

_KEY_FROM_TEXT = {"prompt_id", "doc_id"}  # ids that may be derived from the text when absent


@dataclass
class PublishReport:
    topic: str
    rows_read: int = 0
    rows_published: int = 0
    messages: int = 0
    value_bytes: int = 0
    bad_rows: list[tuple[str, str]] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def rows_per_s(self) -> float:
        return self.rows_published / self.wall_s if self.wall_s else 0.0

    def summary(self) -> dict:
        return {
            "topic": self.topic,
            "rows_read": self.rows_read,
            "rows_published": self.rows_published,
            "bad_rows": len(self.bad_rows),
            "messages": self.messages,
            "value_bytes": self.value_bytes,
            "rows_per_s": round(self.rows_per_s, 1),
            "wall_s": round(self.wall_s, 3),
        }


def prepare_row(event: EventType, data: dict) -> dict:
    """Coerce a user row and derive a missing text-keyed id (prompt_id, doc_id)."""
    if event.key in _KEY_FROM_TEXT and not data.get(event.key) and data.get("text"):
        data = {**data, event.key: make_event_id(event.name, data["text"])[:16]}
    return coerce_row(event, data)


async def publish_file(
    endpoints: Endpoints,
    path: Path,
    event: EventType,
    *,
    batch_rows: int = 256,
    run_id: str = "default",
    on_progress: Callable[[int], None] | None = None,
) -> PublishReport:
    """Publish every good row of `path` as `event`; report the bad ones.

    `on_progress(rows_read)` is called after each published message.
    """
    report = PublishReport(topic=event.topic)
    started = time.perf_counter()
    pending: list[dict] = []
    async with EventProducer(endpoints) as producer:

        async def flush() -> None:
            batch = rows_to_batch(event, pending, run_id=run_id)
            await producer.send(event, batch)
            report.messages, report.value_bytes = producer.messages, producer.value_bytes
            report.rows_published += len(pending)
            pending.clear()
            if on_progress:
                on_progress(report.rows_read)

        for row in read_rows(path):
            report.rows_read += 1
            if row.error is not None:
                report.bad_rows.append((row.where, row.error))
                continue
            try:
                pending.append(prepare_row(event, row.data))
            except RowError as exc:
                report.bad_rows.append((row.where, str(exc)))
                continue
            if len(pending) >= batch_rows:
                await flush()
        if pending:
            await flush()
    if on_progress:
        on_progress(report.rows_read)
    report.wall_s = time.perf_counter() - started
    return report
