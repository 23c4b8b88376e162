"""Integration fixtures: one embedded stack (real Tansu and SeaweedFS) for the session,
started and stopped through the project's own CLI, as a user would."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlstream.connectors.endpoints import Endpoints

RLSTREAM = [sys.executable, "-m", "rlstream.cli"]


def cli(*args: str, env: dict | None = None, timeout: float = 120, check: bool = True):
    """Run `rlstream ARGS` in a subprocess; return the CompletedProcess."""
    result = subprocess.run(
        [*RLSTREAM, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    if check and result.returncode != 0:
        raise AssertionError(f"rlstream {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(scope="session")
def stack_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("rlstream-home")
    saved = {k: os.environ.get(k) for k in ("RLSTREAM_HOME", "RLSTREAM_SESSION_TIMEOUT_MS")}
    os.environ["RLSTREAM_HOME"] = str(home)
    os.environ["RLSTREAM_SESSION_TIMEOUT_MS"] = "6000"  # INFRA.md: first join waits ~half
    cli("stack", "up", "--prometheus")  # Prometheus scrapes every run of the suite
    yield home
    cli("stack", "down")
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def endpoints(stack_home) -> Endpoints:
    return Endpoints.from_env()


def run(coro):
    return asyncio.run(coro)
