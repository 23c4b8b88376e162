"""The `rlstream` command: stack, publish, tail, replay, topics, bench, train."""

from __future__ import annotations

import typer

from rlstream.trainers import commands as trainer_commands

app = typer.Typer(
    name="rlstream",
    help="Event-streaming RL post-training with predictive prompt selection.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(help="Benchmarks that print tables (median and spread over repeats).")
app.add_typer(bench_app, name="bench")

trainer_commands.register(app, bench_app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
