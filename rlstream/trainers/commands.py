"""CLI commands of the learning core, registered on the main `rlstream` app by rlstream.cli.

Keep heavy imports (torch) inside the command functions so `rlstream --help` stays fast.
"""

import typer


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add the learning-core commands (`train`, `bench train`) to the CLI."""
