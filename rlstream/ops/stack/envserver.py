"""An `rlstream env serve NAME` process on a loopback port: an environment the loop plays over
OpenEnv's protocol (`env.servers`), started, killed and started again on the same port, as the
chaos suite's `kill:env` does to it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from rlstream.ops.stack.procs import free_ports, port_open, spawn, terminate


class EnvServerError(RuntimeError):
    """The environment server did not start."""


class EnvServer:
    def __init__(self, name: str, log_dir: Path, options: str = "", port: int | None = None):
        self.name, self.log_dir, self.options = name, log_dir, options
        self.port = port or free_ports(1)[0]
        self.process = None
        self.starts = 0

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> None:
        """Start it and wait until it listens (openenv-core takes seconds to import)."""
        self.starts += 1
        cmd = [sys.executable, "-m", "rlstream.cli", "env", "serve", self.name,
               "--port", str(self.port), "--options", self.options]  # fmt: skip
        log = self.log_dir / f"env-{self.name}-{self.starts}.log"
        self.process = spawn(cmd, log=log)
        deadline = time.monotonic() + timeout_s
        while not port_open(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text()[-1500:] if log.exists() else ""
                raise EnvServerError(f"environment server {self.name} did not start:\n{tail}")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL: its open sessions drop mid-episode; new ones are refused until `start`."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            terminate(self.process.pid)

    def __enter__(self) -> EnvServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
