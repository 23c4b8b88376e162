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
    source: str = typer.Argument(
        ...,
        help="rg:NAME, a reasoning-gym dataset (e.g. rg:gcd), "
        "or a built-in family (fn, add, calc, ...).",
    ),
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
    """Write a reasoning-gym task or a built-in family as a prompt file with its verifier named
    (a code family's tests as columns), to publish and train on like any user file
    (`rlstream run --prompts FILE`)."""
    from rlstream.trainers.envs import TASKS

    builtin = source in TASKS and not source.startswith("rg:")
    builtin = builtin and getattr(TASKS[source], "generates", True)
    if not builtin and (not source.startswith("rg:") or source == "rg:"):
        known = ", ".join(n for n, f in sorted(TASKS.items()) if getattr(f, "generates", True))
        raise typer.BadParameter(f"{source!r}: give rg:NAME (a reasoning-gym dataset) or a "
                                 f"built-in family ({known})")  # fmt: skip
    if fmt not in ("direct", "cot"):
        raise typer.BadParameter(f"{fmt!r}: choose direct or cot", param_hint="--format")
    from rlstream.trainers.envs.rgym import export_rows

    try:
        rows = family_rows(source, size, seed) if builtin else export_rows(
            source.removeprefix("rg:"), size, seed)  # fmt: skip
    except (KeyError, ValueError) as exc:
        raise typer.BadParameter(f"{source}: {exc}") from None
    if fmt == "cot":
        rows = [r | {"verifier": f"cot:{r['verifier']}"} for r in rows]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    longest = max(len(r["text"]) for r in rows)
    print_figures(f"exported {source}", {"prompts": len(rows), "file": str(out),
                  "verifier": rows[0].get("verifier") or rows[0]["task"],
                  "longest_text_chars": longest})  # fmt: skip


def family_rows(name: str, size: int, seed: int) -> list[dict]:
    """Up to `size` distinct prompts of a built-in family as prompt rows, a row's metadata
    (a code prompt's tests) spread into columns the way a user's file has them."""
    import random

    from rlstream.trainers.envs import get_task

    family, rng, rows = get_task(name), random.Random(seed), {}
    for _ in range(50 * size):
        if len(rows) == size:
            break
        prompt = family.generate(rng, rng.choice(family.difficulties))
        row = prompt.to_row()
        rows[prompt.prompt_id] = row | json.loads(row.pop("metadata", None) or "{}")
    return list(rows.values())
