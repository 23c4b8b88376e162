"""The `rlstream` app, its command groups, and what the command modules share: consoles,
common options, figure tables and summaries. Imports nothing heavy: every command imports what
it runs inside its body, so `rlstream --help`, `tail` and `topics` start without torch."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    name="rlstream",
    help="Event-streaming RL post-training with predictive prompt selection.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    add_completion=False,
)
stack_app = typer.Typer(help="The embedded stack: Tansu or Apache Kafka, SeaweedFS S3, Qdrant.")
bench_app = typer.Typer(help="Benchmarks that print tables (median and spread over repeats).")
config_app = typer.Typer(help="The run settings: every default, nested by concern.")
app.add_typer(stack_app, name="stack")
app.add_typer(bench_app, name="bench")
app.add_typer(config_app, name="config")
datasets_app = typer.Typer(help="Prompt files from other sources, ready for `rlstream publish`.")
app.add_typer(datasets_app, name="datasets")

console = Console(width=None if sys.stdout.isatty() else 160)  # piped: whole table rows
err = Console(stderr=True, soft_wrap=True)  # whole lines: logs and greps stay readable

SummaryOpt = typer.Option(None, "--summary", help="Write the headline figures here as JSON.")
StateDirOpt = typer.Option(
    None, "--state-dir", help="Stack state directory [default: $RLSTREAM_HOME or ./.rlstream]."
)


def print_figures(title: str, figures: dict) -> None:
    """A run's or a command's headline figures as a two-column table."""
    table = Table("figure", "value", title=title)
    for key, value in figures.items():
        shown = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else value
        if isinstance(value, list) and len(value) > 12:  # a series: the summary file has it
            shown = f"{len(value)} entries (in --summary)"
        table.add_row(key, str(shown))
    console.print(table)


def write_summary(path: Path | None, figures: dict) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(figures, indent=2, default=str) + "\n")


def state_dir_or_default(path: Path | None) -> Path:
    from rlstream.connectors.endpoints import state_dir

    return (path or state_dir()).resolve()


def event_for(topic: str):
    """A topic argument: the short name (`rollouts`), the full name (`rl.rollouts.v1`), or any
    topic on the broker whose messages carry a registered event (`rl.rewards.v1.rescored`)."""
    from rlstream.ops.commands.topics import carried_event
    from rlstream.schemas import latest_events

    event = asyncio.run(carried_event(endpoints(), topic))
    if event is None:
        names = ", ".join(e.name for e in latest_events())
        raise typer.BadParameter(
            f"unknown topic {topic!r}: not an event name ({names}), and no topic of that name "
            "holds messages with rlstream event headers (see `rlstream topics`)"
        ) from None
    return event


def endpoints():
    from rlstream.connectors.endpoints import Endpoints

    return Endpoints.from_env()


def _version(value: bool) -> None:
    if value:
        from rlstream import __version__

        print(f"rlstream {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),  # fmt: skip
) -> None:
    """Event-streaming RL post-training with predictive prompt selection."""
