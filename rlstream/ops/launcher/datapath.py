"""`rlstream run`: the main job on the embedded default stack (or external endpoints).

Today it runs the data path end to end — bring up the stack, publish the prompt file, read the
run's events back as a live consumer would, replay them into Parquet, archive that and a report
in the object store, and bring the stack down. The streaming RL loop (score -> select -> roll out
-> reward -> experience -> train) plugs in here as its processors land.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path

from rlstream.connectors.endpoints import ENDPOINTS_FILE, Endpoints, state_dir
from rlstream.connectors.objectstore import ObjectStore
from rlstream.connectors.reading import ReadRange
from rlstream.ops.commands.publish import publish_file
from rlstream.ops.commands.replay import RowFilter, decoded_messages, replay_to_parquet
from rlstream.schemas import get


def sample_prompts() -> Path:
    """The bundled sample prompt file (arithmetic prompts with answers)."""
    return Path(str(resources.files("rlstream") / "data" / "sample_prompts.jsonl"))


@dataclass
class RunArgs:
    prompts: Path = field(default_factory=sample_prompts)
    """JSONL/CSV/Parquet prompt file to publish."""
    out: Path = Path("runs")
    """Directory for the run's report and Parquet files (one subdirectory per run)."""
    run_id: str = ""
    """Run id; generated from the time when empty."""
    show_rows: int = 8
    """How many of the run's events to show from the live read-back."""


def external_stack() -> bool:
    """Whether runs use configured endpoints or a running stack, not an embedded one."""
    return "RLSTREAM_KAFKA_BOOTSTRAP" in os.environ or (state_dir() / ENDPOINTS_FILE).exists()


def resumable(durable_stack: bool) -> bool:
    """Whether a stopped run's topics outlive it: on an external stack, a durable embedded one,
    or an embedded Apache Kafka (its log is on disk under the run's stack); Tansu's memory log
    ends with the run."""
    from rlstream.ops.stack.embedded import broker_choice

    return durable_stack or external_stack() or broker_choice()[0] == "kafka"


def how_to_continue(run_id: str, out: Path, durable_stack: bool) -> str:
    """What a stopped run's message tells its user to do next."""
    if resumable(durable_stack):
        return f"continue it with `rlstream run --resume {run_id} --out {out}`"
    return ("its broker log was in memory (loop.durable_stack=false) and ended with it, so it "
            "cannot be resumed; `--set loop.durable_stack=true` makes a run resumable")  # fmt: skip


@contextlib.contextmanager
def stack_or_endpoints(directory: Path, durable: bool = False) -> Iterator[tuple[Endpoints, bool]]:
    """Endpoints of a configured or running stack, else an embedded stack in `directory` for
    this block (`durable`: the broker's log in its S3 server, there again when the same
    directory is used again)."""
    if external_stack():
        yield Endpoints.from_env(), False
        return
    from rlstream.ops.stack.embedded import EmbeddedStack

    with EmbeddedStack(directory, durable=durable) as stack:
        yield stack.endpoints, True


SERVE_STACK, SERVE_ENDPOINTS = "_stack", "_serve"
"""Under `rlstream serve --out DIR`: the embedded stack it starts for its runs (DIR/_stack), and
its endpoints while it is up (DIR/_serve/endpoints.json), so other commands find its runs."""


@contextlib.contextmanager
def run_stack(runs: Path, run_id: str) -> Iterator[Endpoints]:
    """The stack that holds a run's topics and objects, wherever `rlstream run` or `rlstream
    serve` ran it: a configured or running stack; else a live server's over `runs`; else the
    embedded stack the run used (its own, or the server's), started for this block."""
    live = _live_server(runs / SERVE_ENDPOINTS)
    own, served = runs / run_id / "stack", runs / SERVE_STACK
    if not external_stack() and live is not None:
        yield live
        return
    with stack_or_endpoints(served if served.is_dir() and not own.is_dir() else own) as (ends, _):
        yield ends


def _live_server(directory: Path) -> Endpoints | None:
    """A running server's endpoints (None if none, or if the one that wrote them is gone)."""
    import psutil

    try:
        alive = psutil.pid_exists(int((directory / "pid").read_text()))
    except (OSError, ValueError):
        return None
    return Endpoints.from_state_file(directory) if alive else None


async def _read_back(endpoints: Endpoints, run_id: str, limit: int) -> tuple[int, list[dict]]:
    event = get("prompts")
    only_run = RowFilter(event, f"run_id = '{run_id}'")
    count, shown = 0, []
    async for message in decoded_messages(endpoints, event, ReadRange(), row_filter=only_run):
        if message.rows is not None:
            rows = message.rows.to_pylist()
            count += len(rows)
            shown += rows[: max(0, limit - len(shown))]
    return count, shown


def run_data_path(
    args: RunArgs, say: Callable[[str], None] = print, show: Callable[[list], None] = print
) -> dict:
    """Run the job; return its headline figures (also written to summary.json)."""
    run_id = args.run_id or datetime.now(UTC).strftime("run-%Y%m%d-%H%M%S")
    out = (args.out / run_id).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with stack_or_endpoints(out / "stack") as (endpoints, embedded):
        say(f"stack: {'embedded, started for this run' if embedded else 'running'} "
            f"(broker {endpoints.kafka_bootstrap}, S3 {endpoints.s3_endpoint})")  # fmt: skip
        figures = asyncio.run(_data_path(endpoints, args, run_id, out, say, show))
        figures["embedded_stack"] = embedded
        store = ObjectStore(endpoints)
        figures["archive"] = store.put_file(
            f"{run_id}/replays/prompts.parquet", out / "prompts.parquet"
        )
        figures["wall_s"] = round(time.perf_counter() - started, 2)
        report = _write_report(out, figures, figures.pop("_bad_rows"))
        figures["report"] = str(report)
        figures["report_archive"] = store.put_file(f"{run_id}/reports/report.md", report)
    (out / "summary.json").write_text(json.dumps(figures, indent=2))
    return figures


async def _data_path(endpoints, args: RunArgs, run_id: str, out: Path, say, show) -> dict:
    published = await publish_file(endpoints, args.prompts, get("prompts"), run_id=run_id)
    say(f"published {published.rows_published} prompts ({len(published.bad_rows)} bad rows)")
    read_back, rows = await _read_back(endpoints, run_id, args.show_rows)
    show(rows)
    replayed = await replay_to_parquet(
        endpoints, get("prompts"), ReadRange(), out / "prompts.parquet"
    )
    return {
        "run_id": run_id,
        "prompts_published": published.rows_published,
        "bad_rows": len(published.bad_rows),
        "read_back": read_back,
        "replayed_rows": replayed.rows,
        "publish_rows_per_s": round(published.rows_per_s, 1),
        "_bad_rows": published.bad_rows,
    }


def _write_report(out: Path, figures: dict, bad_rows: list) -> Path:
    lines = [f"# rlstream run {figures['run_id']}", "", "| figure | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in figures.items()]
    if bad_rows:
        lines += ["", "## Rows rejected at publish", ""]
        lines += [f"- {where}: {reason}" for where, reason in bad_rows]
    lines += ["", "Parquet: `prompts.parquet` (all prompt events, with partition/offset/time)."]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
