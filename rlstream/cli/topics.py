"""Commands over the topics: `publish`, `tail`, `replay`, `topics`, `reprocess`."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import typer
from rich.table import Table

from rlstream.cli.app import (
    SummaryOpt,
    app,
    console,
    endpoints,
    err,
    event_for,
    print_figures,
    write_summary,
)


def _rate_progress():
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    )


@app.command()
def publish(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help=".jsonl, .csv or .parquet"),
    topic: str = typer.Option("prompts", "--topic", "-t", help="Short or full topic name."),
    batch_rows: int = typer.Option(256, min=1, max=100_000, help="Rows per Kafka message."),
    run_id: str = typer.Option("default", help="Run id written into every event's envelope."),
    dataset: str | None = typer.Option(
        None, help="Dataset the rows join (prompts, corpus): `rlstream run --prompts topic:NAME`."
    ),
    summary: Path | None = SummaryOpt,
) -> None:
    """Validate rows from FILE and publish them as Arrow events; bad rows are reported.
    Prompts are also checked for a verifier that can read their answer."""
    import time

    from rlstream.connectors.files import count_rows
    from rlstream.ops.commands.publish import publish_file, verifier_check

    event = event_for(topic)
    if dataset is not None and "dataset" not in event.schema.names:
        raise typer.BadParameter(f"--dataset: {event.topic} rows have no dataset (prompts, corpus)")
    total = count_rows(file)
    with _rate_progress() as progress:
        task = progress.add_task(f"publish → {event.topic}", total=total, rate="")
        started = time.perf_counter()

        def on_progress(rows: int) -> None:
            rate = rows / max(time.perf_counter() - started, 1e-9)
            progress.update(task, completed=rows, rate=f"{rate:,.0f} rows/s")

        report = asyncio.run(
            publish_file(endpoints(), file, event, batch_rows=batch_rows, run_id=run_id,
                         dataset=dataset, check=verifier_check(event), on_progress=on_progress)
        )  # fmt: skip
    for where, reason in report.bad_rows[:50]:
        err.print(f"[yellow]skipped[/] {file.name} {where}: {reason}")
    if len(report.bad_rows) > 50:
        err.print(f"[yellow]... and {len(report.bad_rows) - 50} more bad rows[/]")
    figures = report.summary()
    print_figures(f"published {file.name}", figures)
    write_summary(summary, figures)


def _read_range(from_beginning, since, until, from_offset, follow):
    from rlstream.connectors.reading import ReadRange
    from rlstream.ops.commands.replay import parse_time

    return ReadRange(
        from_beginning=from_beginning,
        from_offset=from_offset,
        since_ms=parse_time(since) if since else None,
        until_ms=parse_time(until) if until else None,
        follow=follow,
    )


def _cell(value) -> str:
    from datetime import datetime

    if isinstance(value, datetime):
        return value.strftime("%H:%M:%S.%f")[:-3]
    if isinstance(value, list):
        return f"[{len(value)} items]"
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _episode_lines(row: dict):
    """A rollout that is an episode, in two lines whatever the terminal's width: who and how it
    ended, then its transcript (the environment's text in cyan)."""
    from rich.text import Text

    head = Text(f"{row['prompt_id']} #{row['sample_idx']} v{row['policy_version']}", style="bold")
    head.append(f"  turns {row['turns']} · stop_reason {row['stop_reason']} · reward "
                f"{row['episode_reward']:g} · tool calls {row['tool_calls']}")  # fmt: skip
    if row.get("env_error"):
        head.append(f" · {row['env_error']}", style="red")
    return head, Text("  ").append(_turns_cell(row, width=None))


def _turns_cell(row: dict, width: int | None = 72):
    """An episode's transcript with the environment's text in cyan, newlines as ⏎ (the policy's
    own text plain), cut to `width` characters (None: whole)."""
    from rich.text import Text

    text, spans = row["completion"], row.get("env_spans") or []
    cell, at = Text(), 0
    for start, end in zip(spans[::2], spans[1::2], strict=True):
        cell.append(text[at:start].replace("\n", "⏎"))
        cell.append(text[start:end].replace("\n", "⏎"), style="cyan")
        at = end
    cell.append(text[at:].replace("\n", "⏎"))
    if width is not None:
        cell.truncate(width, overflow="ellipsis")
    return cell


def _json_value(value):
    import base64
    from datetime import datetime

    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, datetime):
        return value.isoformat()
    return value


@app.command()
def tail(
    topic: str = typer.Argument(..., help="Short (`rollouts`) or full (`rl.rollouts.v1`) name."),
    from_beginning: bool = typer.Option(False, "--from-beginning", help="Start at offset 0."),
    since: str | None = typer.Option(None, help="Start at a time: ISO-8601, `10m`, epoch ms."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep waiting for new events."),
    where: str | None = typer.Option(None, help="SQL filter, e.g. \"reward > 0 AND task='add'\""),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per row, for piping."),
    limit: int | None = typer.Option(None, min=1, help="Stop after this many rows."),
    summary: Path | None = SummaryOpt,
) -> None:
    """Decode and show a topic's events; undecodable messages are shown with their reason."""
    import pyarrow as pa

    from rlstream.ops.commands.replay import RowFilter, decoded_messages

    event = event_for(topic)
    row_filter = RowFilter(event, where) if where else None
    # Without --follow, show what the topic holds; with it and no start, only new events.
    start_at_beginning = from_beginning or not follow
    rng = _read_range(start_at_beginning, since, None, None, follow)
    shown, undecodable = 0, 0
    # the human view leaves out ids and list columns (token ids, logprobs, masks: `--json` has
    # every field); an episode's rows get a view of their own, its transcript readable
    columns = [f.name for f in event.schema if f.name not in ("event_id", "run_id")
               and not pa.types.is_list(f.type)]  # fmt: skip

    async def run() -> None:
        nonlocal shown, undecodable
        first = True
        async for message in decoded_messages(endpoints(), event, rng, row_filter=row_filter):
            where_ = {"_partition": message.partition, "_offset": message.offset}
            if message.error is not None:
                undecodable += 1
                if as_json:
                    print(json.dumps({**where_, "_error": str(message.error),
                                      "_kind": message.error.kind}), flush=True)  # fmt: skip
                else:
                    err.print(f"[red]undecodable[/] p{message.partition}@{message.offset}: "
                              f"{message.error}")  # fmt: skip
                continue
            rows = message.rows.to_pylist()
            if limit is not None:
                rows = rows[: limit - shown]
            if as_json:
                for row in rows:
                    out = {k: _json_value(v) for k, v in row.items()}
                    print(json.dumps({**out, **where_}), flush=True)
            elif rows:
                # an episode by its environment (one that failed at its first step has no
                # environment text, and still is one)
                episodes = [row for row in rows if row.get("environment")]
                for row in episodes:
                    for line in _episode_lines(row):
                        console.print(line, no_wrap=True, overflow="ellipsis", soft_wrap=False)
                rows = [row for row in rows if not row.get("environment")]
                if rows:
                    table = Table(show_header=first, box=None, pad_edge=False)
                    for name in columns:
                        table.add_column(name, no_wrap=True, overflow="ellipsis", min_width=6)
                    for row in rows:
                        table.add_row(*(_cell(row[c]) for c in columns))
                    console.print(table)
                    first = False
                rows = episodes + rows
            shown += len(rows)
            if limit is not None and shown >= limit:
                return

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    write_summary(summary, {"topic": event.topic, "rows": shown, "undecodable": undecodable})


@app.command()
def replay(
    topic: str = typer.Argument(..., help="Short or full topic name."),
    out: Path = typer.Option(..., "--out", "-o", help="Parquet file to write."),
    since: str | None = typer.Option(None, help="From this time: ISO-8601, `10m`, epoch ms."),
    until: str | None = typer.Option(None, help="Up to this time (inclusive)."),
    from_offset: int | None = typer.Option(None, min=0, help="From this offset per partition."),
    summary: Path | None = SummaryOpt,
) -> None:
    """Read a time or offset range of a topic into Parquet for DuckDB, Polars or pandas."""
    from rlstream.ops.commands.replay import replay_to_parquet

    event = event_for(topic)
    rng = _read_range(True, since, until, from_offset, False)
    with _rate_progress() as progress:
        task = progress.add_task(f"replay {event.topic}", total=None, rate="")

        def on_progress(p) -> None:
            progress.update(task, completed=p.read, total=p.total, rate=f"{p.value_bytes:,} B")

        report = asyncio.run(replay_to_parquet(endpoints(), event, rng, out,
                                               on_progress=on_progress))  # fmt: skip
        progress.update(task, total=report.messages, completed=report.messages)
    for partition, offset, reason in report.bad_messages[:20]:
        err.print(f"[yellow]skipped[/] p{partition}@{offset}: {reason}")
    figures = report.summary()
    print_figures(f"replayed into {out}", figures)
    write_summary(summary, figures)


@app.command()
def topics(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Every topic with partitions, message counts and consumer-group lag."""
    from rlstream.ops.commands.topics import describe

    infos = asyncio.run(describe(endpoints()))
    if as_json:
        print(json.dumps([i.__dict__ for i in infos], indent=2))
        return
    table = Table("topic", "event", "partitions", "messages", "consumer-group lag", title="topics")
    for i in infos:
        lag = ", ".join(f"{g}: {n:,}" for g, n in sorted(i.lag.items())) or "-"
        table.add_row(i.topic, i.event or "-", str(i.partitions), f"{i.messages:,}", lag)
    console.print(table)


@app.command()
def reprocess(
    processor: str = typer.Argument(..., help="Processor to re-run: score_rollouts."),
    source: str = typer.Option("rollouts", "--from", help="Recorded topic to read."),
    target: str = typer.Option(..., "--to", help="New topic to write (created if missing)."),
    run_id: str | None = typer.Option(None, help="Only rows of this run."),
    verifier: str = typer.Option("reprocess", help="Verifier name written on the new rewards."),
    reward_rules: Path | None = typer.Option(None, exists=True, help="JSON reward rules file."),
    summary: Path | None = SummaryOpt,
) -> None:
    """Re-run a stream processor over a recorded topic into a new topic, under its own consumer
    group, without touching the live loop (e.g. re-score rollouts with a changed verifier)."""
    from rlstream.ops.commands.reprocess import REPROCESSORS
    from rlstream.ops.commands.reprocess import reprocess as run_reprocess

    if processor not in REPROCESSORS:
        raise typer.BadParameter(f"unknown processor {processor!r}; known: {sorted(REPROCESSORS)}")
    reward_fn = None
    if reward_rules is not None:
        from rlstream.trainers.rewards import build_reward

        reward_fn = build_reward(reward_rules)
    event = event_for(source)
    from rlstream.schemas import all_events

    if target in {e.topic for e in all_events()}:
        raise typer.BadParameter(
            f"--to {target}: a live topic; write to a new one, e.g. {target}.reprocessed"
        )
    report = asyncio.run(
        run_reprocess(
            endpoints(),
            processor,
            target,
            source=event.topic,
            run_id=run_id,
            verifier=verifier,
            reward_fn=reward_fn,
        )
    )
    print_figures(f"reprocessed {report.source} -> {report.target}", report.__dict__)
    write_summary(summary, report.__dict__)
