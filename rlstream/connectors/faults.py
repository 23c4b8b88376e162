"""Failpoints: faults that `rlstream chaos` switches on from outside a process, for a
dependency it cannot break from outside. The embedded Qdrant runs inside the scheduler process,
so "the vector store is unavailable" is a file, `$RLSTREAM_FAULTS_DIR/qdrant`, that makes every
vector-store call raise as a lost connection to a Qdrant server would; each call refused
appends a line to `<name>.refused` beside it, so the chaos run knows the outage was felt. Without
the variable (every run but a chaos run) nothing is checked."""

from __future__ import annotations

import os
from pathlib import Path

FAULTS_DIR = "RLSTREAM_FAULTS_DIR"


class InjectedFault(ConnectionError):
    """A dependency made unavailable by a chaos run."""


def check(name: str) -> None:
    directory = os.environ.get(FAULTS_DIR)
    if directory and (Path(directory) / name).exists():
        with open(Path(directory) / f"{name}.refused", "a") as f:
            f.write(f"{os.getpid()}\n")
        raise InjectedFault(f"{name} unavailable (fault injected by rlstream chaos)")


def refused_calls(directory: Path, name: str) -> int:
    """How many calls the failpoint `name` refused so far."""
    try:
        return len((directory / f"{name}.refused").read_text().splitlines())
    except FileNotFoundError:
        return 0
