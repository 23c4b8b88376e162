"""`rlstream stack up | down | status`: the embedded stack's supervisor."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from rlstream.cli.app import (
    StateDirOpt,
    console,
    stack_app,
    state_dir_or_default,
)


@stack_app.command("up")
def stack_up(
    state_dir: Path | None = StateDirOpt,
    durable: bool = typer.Option(False, help="Keep the broker's log in the S3 server."),
    prometheus: bool = typer.Option(
        False, help="Also run Prometheus: it scrapes every run on the stack, with the alert rules."
    ),
    foreground: bool = typer.Option(False, help="Run in this terminal; Ctrl-C stops it."),
    broker: str = typer.Option(
        None, help="tansu or kafka (Apache Kafka, KRaft) [default: $RLSTREAM_STACK_BROKER, tansu]"
    ),
    nodes: int = typer.Option(
        None, help="Kafka nodes: 1, or 3 (replication 3, min ISR 2) [default: 1]"
    ),
    sasl: bool = typer.Option(
        False, help="Kafka: clients authenticate with SCRAM-SHA-256 (the password in secrets.json)."
    ),
    tls: bool = typer.Option(
        False, help="Kafka: clients speak TLS to the brokers (the stack's CA in kafka/tls/ca.pem)."
    ),
) -> None:
    """Start the broker and the S3 server (once: a running stack is reused). Apache Kafka's
    jars are fetched from Maven Central the first time (Java 17 and Maven needed)."""
    from rlstream.ops.stack import supervisor as stackctl

    directory = state_dir_or_default(state_dir)
    if foreground:
        raise typer.Exit(
            stackctl.supervise(directory, durable, prometheus, broker, nodes, sasl, tls)
        )
    state, started = stackctl.up(directory, durable=durable, prometheus=prometheus, broker=broker,
                                 nodes=nodes, sasl=sasl, tls=tls)  # fmt: skip
    verb = "started" if started else "already running"
    console.print(f"[green]stack {verb}[/] in {directory}")
    _print_endpoints(state["endpoints"])


def _print_endpoints(public: dict) -> None:
    table = Table(show_header=False, box=None)
    for key, value in public.items():
        table.add_row(key, str(value))
    console.print(table)


@stack_app.command("down")
def stack_down(state_dir: Path | None = StateDirOpt) -> None:
    """Stop every server of the stack; no process or port is left behind."""
    from rlstream.ops.stack import supervisor as stackctl

    stopped = stackctl.down(state_dir_or_default(state_dir))
    console.print(f"stopped: {', '.join(stopped)}" if stopped else "no stack was running")


@stack_app.command("status")
def stack_status(
    state_dir: Path | None = StateDirOpt,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Each server's pid, port, uptime and resident memory, and the total."""
    from rlstream.ops.stack import supervisor as stackctl

    rows = stackctl.status(state_dir_or_default(state_dir))
    total = round(sum(r["rss_mb"] for r in rows), 1)
    if as_json:
        print(json.dumps({"servers": rows, "total_rss_mb": total}, indent=2))
        return
    if not rows:
        console.print("no stack is running (start one with `rlstream stack up`)")
        raise typer.Exit(1)
    table = Table("server", "pid", "port", "alive", "uptime", "RSS MB", title="rlstream stack")
    for r in rows:
        alive = "[green]yes[/]" if r["alive"] else "[red]no[/]"
        table.add_row(
            r["server"], str(r["pid"]), str(r["port"]), alive, f"{r['uptime_s']:.0f}s",
            f"{r['rss_mb']:.1f}",
        )  # fmt: skip
    table.add_row("total", "", "", "", "", f"{total:.1f}", style="bold")
    console.print(table)
