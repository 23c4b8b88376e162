"""`rlstream tail` and `rlstream replay`: decoded views of a topic's range.

Both read through `read_topic` (highwater-based end detection) and decode each message; a
message that does not decode is reported with its reason and skipped, never fatal. `--where`
filters rows with a SQL expression evaluated by DuckDB over the decoded Arrow batch.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.reading import ReadProgress, ReadRange, read_topic
from rlstream.schemas import DecodeError, EventType, decode

META_COLUMNS = [
    pa.field("_partition", pa.int32()),
    pa.field("_offset", pa.int64()),
    pa.field("_timestamp", pa.timestamp("ms", tz="UTC")),
]

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


class BadTime(ValueError):
    pass


def parse_time(text: str, now: datetime | None = None) -> int:
    """Epoch milliseconds from ISO-8601 (`2026-11-30T10:00`, UTC if no zone), a duration ago
    (`90s`, `10m`, `2h`, `1d`), `now`, or epoch milliseconds."""
    now = now or datetime.now(UTC)
    text = text.strip()
    if text == "now":
        return int(now.timestamp() * 1000)
    if text.isdigit() and len(text) >= 10:
        return int(text)
    match = _RELATIVE.match(text)
    if match:
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
        return int((now - timedelta(seconds=seconds)).timestamp() * 1000)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise BadTime(
            f"cannot read time {text!r}: use ISO-8601 (2026-11-30T10:00:00), "
            "a duration ago (10m, 2h), 'now', or epoch milliseconds"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


class RowFilter:
    """A SQL boolean expression over an event's columns, checked against the schema up front."""

    def __init__(self, event: EventType, expression: str):
        import duckdb

        self.expression = expression
        self._con = duckdb.connect()
        self._sql = f"SELECT * FROM events WHERE {expression}"
        empty = pa.Table.from_batches([], schema=event.schema)
        try:
            self._con.register("events", empty)
            self._con.sql(self._sql).to_arrow_table()
        except duckdb.Error as exc:
            first = str(exc).splitlines()[0]
            raise ValueError(f"--where {expression!r}: {first}") from None

    def __call__(self, batch: pa.RecordBatch) -> pa.Table:
        self._con.register("events", pa.Table.from_batches([batch]))
        return self._con.sql(self._sql).to_arrow_table()


@dataclass
class DecodedMessage:
    partition: int
    offset: int
    timestamp_ms: int
    rows: pa.Table | None = None
    error: DecodeError | None = None


async def decoded_messages(
    endpoints: Endpoints,
    event: EventType,
    rng: ReadRange,
    progress: ReadProgress | None = None,
    row_filter: RowFilter | None = None,
) -> AsyncIterator[DecodedMessage]:
    async for record in read_topic(endpoints, event.topic, rng, progress):
        message = DecodedMessage(record.partition, record.offset, record.timestamp)
        try:
            batch = decode(record.value, record.headers, expect=(event.name,)).batch
        except DecodeError as exc:
            message.error = exc
        else:
            message.rows = row_filter(batch) if row_filter else pa.Table.from_batches([batch])
        yield message


@dataclass
class ReplayReport:
    topic: str
    out: str
    messages: int = 0
    rows: int = 0
    bad_messages: list[tuple[int, int, str]] = field(default_factory=list)
    value_bytes: int = 0
    wall_s: float = 0.0

    def summary(self) -> dict:
        return {
            "topic": self.topic,
            "out": self.out,
            "messages": self.messages,
            "rows": self.rows,
            "bad_messages": len(self.bad_messages),
            "value_bytes": self.value_bytes,
            "rows_per_s": round(self.rows / self.wall_s, 1) if self.wall_s else 0.0,
            "wall_s": round(self.wall_s, 3),
        }


def with_position(rows: pa.Table, message: DecodedMessage) -> pa.Table:
    n = rows.num_rows
    return (
        rows.append_column(META_COLUMNS[0], pa.array([message.partition] * n, pa.int32()))
        .append_column(META_COLUMNS[1], pa.array([message.offset] * n, pa.int64()))
        .append_column(
            META_COLUMNS[2], pa.array([message.timestamp_ms] * n, pa.timestamp("ms", tz="UTC"))
        )
    )


async def replay_to_parquet(
    endpoints: Endpoints,
    event: EventType,
    rng: ReadRange,
    out: Path,
    *,
    on_progress: Callable[[ReadProgress], None] | None = None,
) -> ReplayReport:
    """Write the decoded rows of a range to one Parquet file (plus partition/offset/timestamp)."""
    report = ReplayReport(topic=event.topic, out=str(out))
    progress = ReadProgress()
    schema = pa.schema(list(event.schema) + META_COLUMNS)
    started = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(out, schema, compression="zstd") as writer:
        async for message in decoded_messages(endpoints, event, rng, progress):
            report.messages += 1
            if message.error is not None:
                report.bad_messages.append((message.partition, message.offset, str(message.error)))
            else:
                writer.write_table(with_position(message.rows, message).cast(schema))
                report.rows += message.rows.num_rows
            if on_progress:
                on_progress(progress)
    report.value_bytes = progress.value_bytes
    report.wall_s = time.perf_counter() - started
    return report
