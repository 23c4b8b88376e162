"""CLI commands of prompt selection (`rlstream bench selection`), registered by rlstream.cli."""

import typer


def register(bench_app: typer.Typer) -> None:
    """Add `bench selection` to the bench command group."""
