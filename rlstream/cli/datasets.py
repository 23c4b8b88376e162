"""`rlstream datasets export`: prompt files from other sources."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from rlstream.cli.app import (
    datasets_app,
    print_figures,
)


@datasets_app.command("export")
def datasets_export(
    source: str = typer.Argument(..., help="rg:NAME, a reasoning-gym dataset (e.g. rg:gcd)."),
    size: int = typer.Option(1000, min=1, help="Prompts to write."),
    seed: int = typer.Option(0, help="The dataset generator's seed."),
    out: Path = typer.Option(..., help="The JSONL prompt file to write."),
    fmt: str = typer.Option(
        "direct",
        "--format",
        help="direct (the completion is the answer) or cot (the verifier reads only the final "
        "<answer>...</answer> of a worked completion: verifier cot:rg:NAME).",
    ),
) -> None:
    """Write a reasoning-gym task as a prompt file with its verifier named, to publish and
    train on like any user file (`rlstream run --prompts FILE`)."""
    if not source.startswith("rg:") or source == "rg:":
        raise typer.BadParameter(f"{source!r}: give rg:NAME (a reasoning-gym dataset)")
    if fmt not in ("direct", "cot"):
        raise typer.BadParameter(f"{fmt!r}: choose direct or cot", param_hint="--format")
    from rlstream.trainers.envs.rgym import export_rows

    try:
        rows = export_rows(source.removeprefix("rg:"), size, seed)
    except (KeyError, ValueError) as exc:
        raise typer.BadParameter(f"{source}: {exc}") from None
    if fmt == "cot":
        rows = [r | {"verifier": f"cot:{r['verifier']}"} for r in rows]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    longest = max(len(r["text"]) for r in rows)
    print_figures(f"exported {source}", {"prompts": len(rows), "file": str(out),
                  "verifier": rows[0]["verifier"], "longest_text_chars": longest})  # fmt: skip
