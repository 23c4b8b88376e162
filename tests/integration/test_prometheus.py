"""Prometheus for real: the session's stack runs it (`rlstream stack up --prometheus`); a live
run's processes are scraped through the file_sd targets it writes, the alert rules are loaded
and evaluated, and the fuzzer's short form (`rlstream fuzz --attach`) in the middle of the run is
dead-lettered by every owner and makes RlstreamDeadLetters fire."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from rlstream.connectors.endpoints import Endpoints
from rlstream.ops.launcher.figures import _run_rows
from tests.integration.conftest import cli
from tests.integration.test_loop import SMALL

pytestmark = pytest.mark.integration
RUN = "prom-it"
FUZZ = 4 * 82  # four rounds of every (defect, topic) pair rlstream fuzz has


def _query(url: str, promql: str) -> list[dict]:
    response = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=10).json()
    assert response["status"] == "success", response
    return response["data"]["result"]


def _firing(url: str, name: str) -> list[dict]:
    alerts = httpx.get(f"{url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
    return [a for a in alerts if a["labels"]["alertname"] == name and a["state"] == "firing"]


def test_a_live_run_is_scraped_and_a_dead_letter_fires_its_alert(stack_home, tmp_path):
    from rlstream.schemas import get

    endpoints = Endpoints.from_env()
    url = endpoints.prometheus_url
    assert url, "the session stack runs Prometheus"
    deadline, loaded = time.monotonic() + 30, {}
    while time.monotonic() < deadline:  # "unknown" until the first evaluation
        rules = httpx.get(f"{url}/api/v1/rules", timeout=10).json()["data"]["groups"]
        loaded = {r["name"]: r["health"] for g in rules for r in g["rules"]}
        if loaded and set(loaded.values()) == {"ok"}:
            break
        time.sleep(0.5)
    assert loaded.get("RlstreamGradNormHigh") == "ok" and loaded["RlstreamDeadLetters"] == "ok"
    args = [sys.executable, "-m", "rlstream.cli", "run", "--rl-steps", "200", "--run-id", RUN,
            "--out", str(tmp_path), *SMALL]  # fmt: skip
    run = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           env=os.environ.copy(), start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            rows = asyncio.run(_run_rows(endpoints, "policy_versions", RUN))
            if any(r["phase"] == "rl" and r["step"] >= 2 for r in rows):
                break
            time.sleep(1)
        targets = os.path.join(endpoints.prometheus_targets, f"{RUN}.json")
        assert os.path.exists(targets)
        steps = []
        deadline = time.monotonic() + 60
        while not steps and time.monotonic() < deadline:
            steps = _query(url, f'rlstream_trainer_steps_total{{run_id="{RUN}",phase="rl"}}')
            time.sleep(1)
        assert steps and float(steps[0]["value"][1]) >= 1
        assert steps[0]["metric"]["process"] == "trainer"
        up = _query(url, f'up{{run_id="{RUN}"}}')
        assert {s["metric"]["process"] for s in up} >= {"trainer", "scheduler", "processors"}
        # the design notes' views: loss per phase, entropy, interactions per task, and each
        # process's CPU and memory
        losses = _query(url, f'rlstream_trainer_loss{{run_id="{RUN}"}}')
        assert {(s["metric"]["phase"], s["metric"]["kind"]) for s in losses} >= {
            ("pretrain", "val_loss"), ("rl", "pg_loss")
        }  # fmt: skip
        assert _query(url, f'rlstream_trainer_policy_entropy{{run_id="{RUN}"}}')
        by_task = _query(
            url, f'sum by (task) (rlstream_rollout_worker_completions_total{{run_id="{RUN}"}})'
        )
        assert {s["metric"]["task"] for s in by_task} == {"add", "sub"}
        memory = _query(url, f'process_resident_memory_bytes{{run_id="{RUN}"}}')
        cpu = _query(url, f'process_cpu_seconds_total{{run_id="{RUN}"}}')
        kinds = {"trainer", "scheduler", "processors", "rollouts-1", "rollouts-2"}
        assert {s["metric"]["process"] for s in memory} == kinds
        assert {s["metric"]["process"] for s in cpu} == kinds
        # the fuzzer's short form mid-run: every class of malformed message on every topic the
        # loop consumes, each owner dead-letters what it owns, nothing restarts; the alert fires
        letters = f'sum(rlstream_consumer_dead_letters_total{{run_id="{RUN}"}}) or vector(0)'
        time.sleep(3)  # a scrape after the run's start-up (it dead-letters older garbage too)
        before = float(_query(url, letters)[0]["value"][1])
        report = tmp_path / "fuzz.json"
        fuzzed = cli("fuzz", "--attach", RUN, "--out", str(tmp_path), "--messages", str(FUZZ),
                     "--summary", str(report), check=False)  # fmt: skip
        figures = json.loads(report.read_text())
        assert figures["messages_sent"] == FUZZ and fuzzed.returncode == 0, fuzzed.stdout[-4000:]
        outcomes = figures["outcomes"]
        assert not outcomes.get("missed") and not outcomes.get("dead_lettered_wrongly")
        assert outcomes["dead_lettered"] > FUZZ // 2 and outcomes["left_alone"] > 0
        assert figures["crashes"] == 0
        kinds = set(figures["dead_letters_by_reason"])
        assert {"not_arrow", "unknown_event", "unexpected_event", "schema_mismatch",
                "missing_required", "refused_row", "untrainable_row"} <= kinds  # fmt: skip
        assert "| nan_reward @ rewards |" in fuzzed.stdout  # the table per class
        firing, after = [], before
        deadline = time.monotonic() + 60
        while not (firing and after >= before + FUZZ // 2) and time.monotonic() < deadline:
            time.sleep(1)
            after = float(_query(url, letters)[0]["value"][1])
            firing = _firing(url, "RlstreamDeadLetters")
        assert after >= before + FUZZ // 2  # every owner's dead letters, counted
        assert firing, "RlstreamDeadLetters did not fire"
        # (rl.experience.v2 may fire too: the trainer dead-letters earlier tests' garbage there)
        assert get("rewards").topic in {a["labels"]["topic"] for a in firing}
        assert all(a["labels"]["severity"] == "warning" for a in firing)
    finally:
        os.killpg(run.pid, signal.SIGINT)  # Ctrl-C: the run stops every process
        run.wait(timeout=60)
    assert run.returncode == 130, run.stderr.read()[-2000:]
    assert not os.path.exists(targets)  # a stopped run is no longer a scrape target
