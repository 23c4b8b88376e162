"""`rlstream run` as a child process, for the commands that drive a run from outside (`rlstream
chaos`, `rlstream fuzz`): its command line, its live view, waiting on it with progress lines,
and its summary."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rlstream.config import Config

PROGRESS_EVERY_S = 10.0


class RunFailed(RuntimeError):
    """The child run exited badly or a wait on it timed out; the message names its log."""


class Live:
    """The run's live.json (rewritten about once a second by `rlstream run`)."""

    def __init__(self, path: Path):
        self.path = path

    def read(self) -> dict:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def step(self) -> int:
        return int(self.read().get("rl_step") or 0)

    def phase(self) -> str:
        return self.read().get("phase") or ""

    def running(self, name: str) -> bool:
        return bool(self.read().get("processes", {}).get(name, {}).get("alive"))


def wait_for(
    predicate, timeout_s: float, what: str, live: Live | None = None, say=None, who: str = "chaos"
) -> None:
    """Poll predicate every 0.2 s; a plain progress line every PROGRESS_EVERY_S meanwhile."""
    deadline = time.monotonic() + timeout_s
    said = time.monotonic()
    while not predicate():
        if time.monotonic() > deadline:
            raise RunFailed(f"timed out after {timeout_s:.0f} s waiting for {what}")
        if say and time.monotonic() - said > PROGRESS_EVERY_S:
            said = time.monotonic()
            state = live.read() if live else {}
            say(f"{who}: {time.strftime('%H:%M:%S')} waiting for {what}: phase "
                f"{state.get('phase')}, rl step {state.get('rl_step')}")  # fmt: skip
        time.sleep(0.2)


class ChildRun:
    """`rlstream run` of `cfg` under `out_root/<run id>/`, started on entry (its own session,
    so a Ctrl-C reaches every process of it) and killed on exit if it still runs. `name`
    prefixes its config and log files (`<name>-config.json`, `<name>-run.log`)."""

    def __init__(self, cfg: Config, out_root: Path, env: dict, name: str):
        self.cfg, self.out_root, self.env, self.name = cfg, out_root, env, name
        self.dir = out_root / cfg.run_id
        self.live = Live(self.dir / "live.json")
        self.log_path = self.dir / f"{name}-run.log"
        self.summary_path = self.dir / "run-summary.json"
        self.proc: subprocess.Popen | None = None
        self.interrupted_at: float | None = None  # monotonic, the first Ctrl-C
        self.exited_at: float | None = None  # monotonic, when the exit was first seen

    def __enter__(self) -> ChildRun:
        self.dir.mkdir(parents=True, exist_ok=True)
        cfg_file = self.dir / f"{self.name}-config.json"
        self.cfg.write(cfg_file)
        cmd = [sys.executable, "-m", "rlstream.cli", "run", "--config", str(cfg_file),
               "--run-id", self.cfg.run_id, "--out", str(self.out_root),
               "--summary", str(self.summary_path)]  # fmt: skip
        self._log = open(self.log_path, "w")  # noqa: SIM115  (closed on exit)
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=self.env, start_new_session=True)  # fmt: skip
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._log.close()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def ended(self) -> bool:
        if self.proc.poll() is None:
            return False
        self.exited_at = self.exited_at or time.monotonic()
        return True

    def interrupt(self) -> None:
        """Ctrl-C, as a terminal sends it: to every process of the run."""
        self.interrupted_at = self.interrupted_at or time.monotonic()
        os.killpg(self.proc.pid, signal.SIGINT)

    @property
    def stop_s(self) -> float | None:
        """Seconds from the first Ctrl-C to the exit (as polled: 0.2 s resolution)."""
        if self.interrupted_at is None or self.exited_at is None:
            return None
        return round(self.exited_at - self.interrupted_at, 1)

    def wait(self, timeout_s: float, say=None, who: str = "run") -> int:
        """Wait for the run's end (progress lines meanwhile); its exit code."""
        wait_for(self.ended, timeout_s, f"the end of run {self.cfg.run_id}", self.live, say, who)
        return self.proc.wait()

    def summary(self) -> dict:
        """The summary of a run that exited 0, else RunFailed naming its log."""
        code = self.proc.poll()
        if code != 0 or not self.summary_path.exists():
            raise RunFailed(f"`rlstream run` exited with {code}: see {self.log_path}")
        return json.loads(self.summary_path.read_text())
