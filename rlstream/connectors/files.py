"""Reading user files (JSONL, CSV, Parquet) as numbered rows for `rlstream publish`.

Each row comes with a human locator (`line 12`, `row 7`) so a bad row can be reported by where
it is in the file. A line that is not valid JSON is yielded as an error, not raised.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv"}
FORMATS[".parquet"] = FORMATS[".pq"] = "parquet"


class UnsupportedFile(ValueError):
    pass


@dataclass(frozen=True)
class SourceRow:
    where: str  # "line 12" / "row 7"
    data: dict | None
    error: str | None = None


def detect_format(path: Path) -> str:
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise UnsupportedFile(
            f"{path.name}: unknown file type {path.suffix!r}; use .jsonl, .csv or .parquet"
        )
    return fmt


def count_rows(path: Path) -> int | None:
    """Rows in the file, for a progress total (None if not cheap to know)."""
    fmt = detect_format(path)
    if fmt == "parquet":
        return pq.ParquetFile(path).metadata.num_rows
    with open(path, "rb") as f:
        lines = sum(1 for line in f if line.strip())
    return lines - 1 if fmt == "csv" else lines


def read_rows(path: Path) -> Iterator[SourceRow]:
    path = Path(path)
    fmt = detect_format(path)
    if fmt == "jsonl":
        yield from _read_jsonl(path)
    elif fmt == "csv":
        yield from _read_csv(path)
    else:
        yield from _read_parquet(path)


def _read_jsonl(path: Path) -> Iterator[SourceRow]:
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"line {number}"
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                yield SourceRow(where, None, f"not valid JSON ({exc.msg} at column {exc.colno})")
                continue
            if not isinstance(data, dict):
                yield SourceRow(where, None, f"expected a JSON object, got {type(data).__name__}")
                continue
            yield SourceRow(where, data)


def _read_csv(path: Path) -> Iterator[SourceRow]:
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        for data in reader:
            where = f"line {reader.line_num}"
            if None in data:  # more cells than header columns
                yield SourceRow(where, None, f"{len(data[None])} cell(s) beyond the header")
                continue
            yield SourceRow(where, {k: v for k, v in data.items() if v != ""})


def _read_parquet(path: Path) -> Iterator[SourceRow]:
    number = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
        for data in batch.to_pylist():
            number += 1
            yield SourceRow(f"row {number}", {k: v for k, v in data.items() if v is not None})
