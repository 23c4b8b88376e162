"""A pool of sandbox servers (`server.py`): bounded concurrency for untrusted code.

Each server runs one execution at a time; `Sandbox.run` takes a free one (blocking while all
are busy), `Sandbox.map` runs a batch across all of them. A server that dies (a job killed it,
or it never started) is replaced on the next call; that call's execution reports
`sandbox_error` with the reason instead of raising, so a verifier scores it 0 and goes on. A
server that cannot start at all raises `SandboxUnavailable` naming why.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import select
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from rlstream import metrics
from rlstream.config import SandboxConfig

log = logging.getLogger(__name__)

SERVER = Path(__file__).with_name("server.py")
NAMESPACES = ["--fork", "--pid", "--mount-proc", "--net", "--mount", "--ipc", "--uts"]
START_TIMEOUT_S = 10.0
REPLY_MARGIN_S = 5.0  # a reply later than the job's wall clock plus this: the server is stuck


class SandboxUnavailable(RuntimeError):
    """No sandbox server could be started; the message says why."""


@dataclass
class Execution:
    """What one execution did. `status`: ok, failed (exit status not 0), timeout, cpu_limit,
    output_limit, crashed (killed by a signal) or sandbox_error."""

    status: str
    exit_code: int | None = None
    signal: str | None = None
    stdout: str = ""
    stderr: str = ""
    tests: list[dict] = field(default_factory=list)
    load_error: str | None = None
    wall_s: float = 0.0
    reason: str = ""

    def why(self, limits: SandboxConfig) -> str:
        """One line on how it ended, for a reward's details ('' when it exited cleanly)."""
        reasons = {
            "timeout": f"timed out after {limits.wall_s:g} s (wall clock)",
            "cpu_limit": f"ran past its CPU time ({limits.cpu_s:g} s)",
            "output_limit": f"wrote more than {limits.output_kb} KB",
            "crashed": f"crashed ({self.signal})",
            "sandbox_error": f"sandbox error: {self.reason}",
        }
        if self.status == "failed":
            tail = self.stderr.strip().splitlines()[-1:] or [""]
            return f"exit status {self.exit_code}" + (f": {tail[0][:200]}" if tail[0] else "")
        return reasons.get(self.status, "")


def isolation_of(cfg: SandboxConfig) -> str:
    """The isolation the config asks for, resolved: `auto` is namespaces where this process
    may create them (root, `unshare` installed), else rlimits."""
    can = os.geteuid() == 0 and shutil.which("unshare") is not None
    if cfg.isolation == "namespaces" and not can:
        raise SandboxUnavailable("sandbox.isolation=namespaces needs root and util-linux's "
                                 "unshare; use sandbox.isolation=rlimits")  # fmt: skip
    if cfg.isolation == "auto":
        return "namespaces" if can else "rlimits"
    return cfg.isolation


class _Server:
    def __init__(self, slot: int, isolation: str):
        self.slot, self.isolation, self.proc = slot, isolation, None

    def start(self) -> None:
        command = [sys.executable, "-I", "-S", str(SERVER), str(self.slot), self.isolation]
        if self.isolation == "namespaces":
            command = [shutil.which("unshare"), *NAMESPACES, "--", *command]
        try:
            self.proc = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env={}, text=True, bufsize=1, start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            raise SandboxUnavailable(f"cannot start a sandbox server: {exc}") from None
        ready = self._read(START_TIMEOUT_S)
        if not ready or not ready.get("ready"):
            err = self._stderr()
            self.stop()
            raise SandboxUnavailable(f"the sandbox server did not start ({err or 'no output'})")

    def call(self, job: dict, timeout_s: float) -> Execution:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            self.stop()
            return Execution("sandbox_error", reason=f"server gone ({exc})")
        reply = self._read(timeout_s)
        if reply is None:
            self.stop()
            return Execution("sandbox_error", reason="the server stopped answering; restarted")
        return Execution(**{k: v for k, v in reply.items() if k in Execution.__annotations__})

    def _read(self, timeout_s: float) -> dict | None:
        out = self.proc.stdout
        ready, _, _ = select.select([out], [], [], timeout_s)
        line = out.readline() if ready else ""
        try:
            return json.loads(line) if line else None
        except ValueError:
            return None

    def _stderr(self) -> str:
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "it is running but said nothing"
        lines = (self.proc.stderr.read() or "").strip().splitlines()
        return lines[-1][:300] if lines else f"exit status {self.proc.returncode}"

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                pipe.close()
            self.proc = None


class Sandbox:
    """`workers` sandbox servers with the config's limits (`SandboxConfig`)."""

    def __init__(self, cfg: SandboxConfig | None = None):
        self.cfg = cfg or SandboxConfig()
        self.isolation = isolation_of(self.cfg)
        self._free: queue.Queue[_Server] = queue.Queue()
        self._servers = [_Server(slot, self.isolation) for slot in range(self.cfg.workers)]
        for server in self._servers:
            self._free.put(server)
        self._threads = ThreadPoolExecutor(self.cfg.workers, thread_name_prefix="sandbox")

    @property
    def limits(self) -> dict:
        c = self.cfg
        return {"wall_s": c.wall_s, "cpu_s": c.cpu_s, "memory_bytes": c.memory_mb << 20,
                "output_bytes": c.output_kb << 10, "processes": c.processes,
                "open_files": 64}  # fmt: skip

    def run(self, code: str, stdin: str = "", tests: list[str] | None = None) -> Execution:
        """Run `code` as a program (stdin given), or with `tests`: as a module, then each test
        statement in its namespace (Execution.tests: one {passed, error} per test run)."""
        job = {"code": code, "stdin": stdin, "tests": tests, "limits": self.limits}
        started = time.perf_counter()
        server = self._free.get()
        try:
            execution = server.call(job, self.cfg.wall_s + REPLY_MARGIN_S)
        finally:
            self._free.put(server)
        metrics.SANDBOX_EXECUTIONS.labels(execution.status).inc()
        metrics.SANDBOX_SECONDS.inc(time.perf_counter() - started)
        return execution

    def map(self, jobs: list[dict]) -> list[Execution]:
        """`run(**job)` for each job, up to `workers` at once, in order."""
        return list(self._threads.map(lambda job: self.run(**job), jobs))

    def close(self) -> None:
        for server in self._servers:
            server.stop()
        self._threads.shutdown(wait=False)


_default: Sandbox | None = None
_default_cfg = SandboxConfig()
_lock = threading.Lock()


def configure(cfg: SandboxConfig) -> None:
    """The settings this process's shared sandbox uses (its next start)."""
    global _default_cfg, _default
    with _lock:
        _default_cfg = cfg
        if _default is not None and _default.cfg != cfg:
            _default.close()
            _default = None


def shared() -> Sandbox:
    """This process's sandbox, started on first use with the configured settings."""
    global _default
    with _lock:
        if _default is None:
            _default = Sandbox(_default_cfg)
        return _default
