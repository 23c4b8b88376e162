"""`rlstream publish`: user files in, validated Arrow events out.

Rows are checked one by one against the event schema; bad rows are collected with their line
numbers and reasons while the good rows are batched (`batch_rows` per message, split by key
partition) and published.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.files import SourceRow, read_rows
from rlstream.connectors.kafka import EventProducer
from rlstream.schemas import EventType, RowError, prepare_row, rows_to_batch


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


async def publish_file(endpoints: Endpoints, path: Path, event: EventType, **options):
    """Publish every good row of the file at `path` as `event` (see `publish_rows`)."""
    return await publish_rows(endpoints, read_rows(path), event, **options)


async def publish_rows(
    endpoints: Endpoints,
    source: Iterable[SourceRow] | list[dict],
    event: EventType,
    *,
    batch_rows: int = 256,
    run_id: str = "default",
    dataset: str | None = None,
    check: Callable[[dict], None] | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> PublishReport:
    """Publish every good row as `event`; report the bad ones. `source` is a file's rows
    (`read_rows`) or plain dicts (e.g. a JSON body), which are located as `row N`.

    `dataset` tags every row (see `prepare_row`); `check(row)` may refuse a row by raising
    RowError (`rlstream run` refuses prompts it cannot train on); `on_progress(rows_read)` is
    called after each published message.
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

        for row in _located(source):
            report.rows_read += 1
            if row.error is not None:
                report.bad_rows.append((row.where, row.error))
                continue
            try:
                prepared = prepare_row(event, row.data, dataset)
                if check is not None:
                    check(prepared)
                pending.append(prepared)
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


def _located(source) -> Iterator[SourceRow]:
    for i, row in enumerate(source):
        if isinstance(row, SourceRow):
            yield row
        elif isinstance(row, dict):
            yield SourceRow(f"row {i}", row)
        else:
            yield SourceRow(f"row {i}", None, f"expected an object, got {type(row).__name__}")


def verifier_check(event: EventType) -> Callable[[dict], None] | None:
    """For prompts: refuse a row no verifier can check (`verifier_problem`)."""
    if event.name != "prompts":
        return None
    from rlstream.trainers.datasets import verifier_problem

    def check(row: dict) -> None:
        problem = verifier_problem(row)
        if problem:
            raise RowError(problem)

    return check
