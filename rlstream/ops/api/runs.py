"""The runs of `rlstream serve`: child processes under one directory, found again by a restarted
server from what they wrote there (serve.json, live.json, summary.json)."""

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from rlstream.config import Config, ConfigError, format_defaults, from_dict
from rlstream.ops.launcher.live import LIVE_FILE

SERVE_FILE = "serve.json"  # per run: the child's pid and command, written by the server


class RunNotFound(KeyError):
    pass


class RunConflict(ValueError):
    pass


@dataclass
class Runs:
    """The runs under `out`: submitted, started, stopped and resumed as child processes."""

    out: Path
    env: dict[str, str]

    def __post_init__(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self._children: dict[int, subprocess.Popen] = {}

    def submit(self, body: dict) -> dict:
        """Validate a config (ConfigError names the field) and start it as a run."""
        if not isinstance(body, dict):
            raise ConfigError("the body must be a JSON object: the run's config")
        body = dict(body)
        body.setdefault("run_id", datetime.now(UTC).strftime("run-%Y%m%d-%H%M%S-%f"))
        cfg = from_dict(Config, format_defaults(body))  # the shape --config reads
        if not cfg.run_id.replace("-", "").replace("_", "").isalnum():
            raise ConfigError(f"run_id: {cfg.run_id!r} must be letters, digits, - and _")
        run_dir = self.out / cfg.run_id
        if run_dir.exists():
            raise RunConflict(f"run {cfg.run_id!r} exists; resume it or choose another run_id")
        run_dir.mkdir(parents=True)
        config = cfg.write(run_dir / "submitted.json")
        self._start(cfg.run_id, ["--config", str(config), "--run-id", cfg.run_id])
        return self.status(cfg.run_id)

    def resume(self, run_id: str) -> dict:
        state = self.status(run_id)["state"]
        if state in ("running", "finished"):
            raise RunConflict(f"run {run_id!r} is {state}; only a stopped or failed run resumes")
        self._start(run_id, ["--resume", run_id])
        return self.status(run_id)

    def stop(self, run_id: str) -> dict:
        """SIGINT to the run's process group: `rlstream run` stops every child, exits 130."""
        info = self._serve_info(run_id)
        if self._alive(info):
            os.killpg(info["pid"], signal.SIGINT)
            deadline = time.monotonic() + 20
            while self._alive(info) and time.monotonic() < deadline:
                time.sleep(0.2)
        return self.status(run_id)

    def all(self) -> list[dict]:
        dirs = sorted(p for p in self.out.iterdir() if (p / SERVE_FILE).exists())
        return [self.status(p.name) for p in dirs]

    def status(self, run_id: str) -> dict:
        info = self._serve_info(run_id)
        run_dir = self.out / run_id
        live = read_json(run_dir / LIVE_FILE) or {}
        summary = read_json(run_dir / "summary.json")
        if self._alive(info):
            state = "running" if live else "submitted"
        elif summary is not None:  # each start removes it: it is this start's
            state = "finished" if summary.get("completed") else "failed"
        else:  # Ctrl-C (130), or a server that no longer knows the exit code
            state = "stopped" if info.get("exit_code") in (130, None) else "failed"
        figures = {k: v for k, v in live.items() if k not in ("evals", "trace")}
        if summary is not None:
            figures["idle_share"] = summary.get("trainer_idle_share")
            figures["final_accuracy"] = summary.get("final_accuracy")
        return {"run_id": run_id, "state": state, "started_at": info.get("started_at"),
                "starts": info.get("starts", 1), **figures}  # fmt: skip

    def path(self, run_id: str, name: str) -> Path:
        self._serve_info(run_id)
        return self.out / run_id / name

    # --- the child processes ------------------------------------------------------------------
    def _start(self, run_id: str, args: list[str]) -> None:
        run_dir = self.out / run_id
        summary = run_dir / "summary.json"
        summary.unlink(missing_ok=True)
        command = [sys.executable, "-m", "rlstream.cli", "run", *args, "--out", str(self.out),
                   "--summary", str(summary)]  # fmt: skip
        log = open(run_dir / "serve.log", "ab")  # noqa: SIM115 (the child owns it from here)
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=self.env, start_new_session=True,
        )  # fmt: skip
        log.close()
        previous = read_json(run_dir / SERVE_FILE) or {}
        info = {"pid": proc.pid, "command": command, "started_at": time.time(),
                "starts": previous.get("starts", 0) + 1}  # fmt: skip
        (run_dir / SERVE_FILE).write_text(json.dumps(info))
        self._children[proc.pid] = proc

    def _serve_info(self, run_id: str) -> dict:
        info = read_json(self.out / run_id / SERVE_FILE)
        if info is None:
            raise RunNotFound(run_id)
        proc = self._children.get(info["pid"])
        if proc is not None and proc.poll() is not None and "exit_code" not in info:
            info["exit_code"] = proc.returncode  # reap it and remember how it ended
            (self.out / run_id / SERVE_FILE).write_text(json.dumps(info))
        return info

    def _alive(self, info: dict) -> bool:
        """The run's process is still going (for runs a previous server started: a live pid
        whose command line is that run's)."""
        import psutil

        if "exit_code" in info:
            return False
        proc = self._children.get(info["pid"])
        if proc is not None:
            return proc.poll() is None
        try:
            return psutil.Process(info["pid"]).cmdline() == info["command"]
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False


def read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
