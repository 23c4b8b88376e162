"""Secrets stay secret: a live run on the session's stack, with the stack's S3 keys and a broker
password in its environment, leaves neither in any file it writes (logs, report, summary,
configs, live figures, checkpoints), on any metrics page, or on any process's command line; its
servers and metrics endpoints listen on loopback only."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from rlstream.connectors.endpoints import Endpoints

pytestmark = pytest.mark.integration
PASSWORD = "broker-pw-7f3a9c"  # a broker credential: unused on the PLAINTEXT broker, still secret
TINY = [
    *("--rl-steps", "2", "--set", "pretrain.max_steps=20", "--set", "eval.prompts=16"),
    *("--set", "prompts_per_step=4", "--set", "group_size=4", "--set", "eval.interval=2"),
    *("--set", "data.corpus_docs=1000", "--set", "data.pool_size=100"),
    *("--set", "target_in_flight=8", "--set", "checkpoint.every=1"),
]


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def test_no_secret_reaches_a_file_a_metrics_page_or_a_command_line(stack_home, tmp_path):
    endpoints = Endpoints.from_env()
    secrets = [endpoints.s3_secret_key, endpoints.s3_access_key, PASSWORD]
    assert all(len(s) >= 8 for s in secrets)
    out = tmp_path / "runs"
    env = os.environ | {"RLSTREAM_KAFKA_USERNAME": "trainer", "RLSTREAM_KAFKA_PASSWORD": PASSWORD}
    args = [sys.executable, "-m", "rlstream.cli", "run", "--run-id", "secrets-it", "--out",
            str(out), *TINY]  # fmt: skip
    log = tmp_path / "run.log"
    with open(log, "w") as sink:
        run = subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT, env=env)
    seen: dict[str, str] = {}  # what was visible while it ran: command lines, metrics pages
    listening: set[tuple[str, int]] = set()
    carried = set()  # processes that got the password: where a leak would come from
    deadline = time.monotonic() + 600
    while run.poll() is None and time.monotonic() < deadline:
        for proc in _tree(run.pid):
            try:
                seen[f"cmdline {proc.pid}"] = " ".join(proc.cmdline())
                if proc.environ().get("RLSTREAM_KAFKA_PASSWORD") == PASSWORD:
                    carried.add(proc.pid)
                listening |= {(c.laddr.ip, c.laddr.port) for c in proc.net_connections("tcp")
                              if c.status == psutil.CONN_LISTEN}  # fmt: skip
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        pages = out / "secrets-it" / "metrics.json"
        if pages.exists():
            for name, url in json.loads(pages.read_text()).items():
                with contextlib.suppress(httpx.HTTPError):
                    seen[f"metrics {name}"] = httpx.get(url, timeout=2).text
        time.sleep(0.5)
    run.wait(timeout=60)
    output = log.read_text()
    assert run.returncode == 0, output[-3000:]
    seen["stdout"] = output
    assert any(k.startswith("metrics ") for k in seen) and len(seen) > 4
    assert len(carried) >= 4  # the run and its children held it (by environment)
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) > 10 and any(p.name == "report.md" for p in files)
    for path in files:
        seen[f"file {path.relative_to(out)}"] = path.read_bytes().decode("latin-1")
    leaks = [(where, s) for where, text in seen.items() for s in secrets if s in text]
    assert not leaks, leaks
    assert listening and all(ip in ("127.0.0.1", "::1") for ip, _ in listening), listening


def test_the_stacks_key_files_are_owner_only(stack_home):
    for name in ("endpoints.json", "secrets.json"):
        found = list(Path(stack_home).rglob(name))
        assert found, name
        assert all(p.stat().st_mode & 0o077 == 0 for p in found), found
