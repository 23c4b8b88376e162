"""A fork server for the loop's torch processes: one process imports torch, transformers and the
loop's libraries once, and every trainer rank, scheduler and rollout worker is forked from it, so
the libraries' pages (~420 MiB a process, most of it the CUDA libraries' relocated data, written
once at load) stay shared instead of being copied into each process. Android's zygote and
`multiprocessing`'s forkserver do the same.

The server only imports: it runs no torch op, so no thread pool exists yet (a fork copies only
the thread that calls it), and it refuses to serve if an import started a thread.
It is the parent of every process it forks: it reaps them and reports each exit code to the
supervisor, which holds a `Forked` handle per child (a `subprocess.Popen`'s poll, wait,
terminate and kill). A forked child dies with the server (parent-death signal) as the server
dies with the supervisor, so a SIGKILLed run leaves no process behind; the supervisor restarts
a server that died, and the children with it.

Protocol, one JSON object a line over a socket pair: the server says `{"ready"}` once it has
imported everything; the supervisor sends `{"module", "args", "argv", "env", "log"}`; the
server answers `{"pid"}`, and `{"exit": pid, "code": c}` whenever a child ends (c < 0: killed
by signal -c, as Popen says).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

_PR_SET_PDEATHSIG = 1
READY_TIMEOUT_S = 120.0  # the imports, on a loaded machine
FAMILY = {"tiny": "gpt2", "tiny-llama": "llama", "qwen2-0.5b": "qwen2"}  # preset -> model type


class ForkServerError(RuntimeError):
    """The server could not start or fork; the supervisor starts the process itself instead."""


# ---- the server ------------------------------------------------------------------------------


def preload(model_path: str, modules: list[str]) -> None:
    """Import what the modules to be run import at their top level (not the modules: each runs
    as `__main__`), transformers' generation and the model family's classes."""
    for name in sorted({dep for module in modules for dep in top_level_imports(module)}):
        importlib.import_module(name)
    from rlstream.trainers.lm import prepare_transformers

    prepare_transformers()
    importlib.import_module("transformers.generation")
    family = model_family(model_path)
    if family:
        with contextlib.suppress(ImportError):
            importlib.import_module(f"transformers.models.{family}.modeling_{family}")


def top_level_imports(module: str) -> list[str]:
    """The modules a module's source imports at its top level (pure: reads, imports nothing
    but the module's parent packages, to find it)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec(module)
    tree = ast.parse(Path(spec.origin).read_text())
    found = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level:  # relative: from the package
            base = module.rsplit(".", node.level)[0]
            found.append(f"{base}.{node.module}" if node.module else base)
    return [name for name in found if name != "__future__"]


def model_family(path: str) -> str | None:
    """The transformers model type of a preset name or a checkpoint directory, if known."""
    path = path.removeprefix("preset:")
    if path in FAMILY:
        return FAMILY[path]
    try:
        return json.loads((Path(path) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return None


def serve(fd: int, model_path: str, modules: list[str]) -> dict | None:
    """Preload, then fork children on request, read from the socket `fd` (one end of a pair
    whose other end the supervisor holds), until the supervisor hangs up. Returns a job
    only in a forked child (the caller runs it, out of every frame of the server's)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the children; the supervisor
    # stops the server after them
    # an import that asks whether CUDA is there asks NVML, not the CUDA runtime: a process
    # that initialised the runtime cannot fork children that use CUDA
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    gc.disable()  # no collection leaves freed holes between the imports' objects, and
    preload(model_path, modules)
    gc.freeze()  # no collection in a child writes to their headers: their pages stay shared
    if threading.active_count() > 1:
        names = [t.name for t in threading.enumerate()]
        raise SystemExit(f"fork server: an import started threads {names}; not forking")
    conn = socket.socket(fileno=fd)
    print(f"fork server {os.getpid()}: preloaded {len(sys.modules)} modules", flush=True)
    _send(conn, {"ready": os.getpid()})
    buffer = b""
    while True:
        _reap(conn)
        ready, _, _ = select.select([conn], [], [], 0.1)
        if not ready:
            continue
        try:
            data = conn.recv(65536)
        except ConnectionResetError:  # hung up with our exit news unread
            data = b""
        if not data:  # the supervisor is gone or done: the children stop with their parent
            return None
        buffer += data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            job = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                conn.close()
                return job
            _send(conn, {"pid": pid})


def _reap(conn: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(conn, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _send(conn: socket.socket, message: dict) -> None:
    with contextlib.suppress(OSError):  # the supervisor hung up: nobody to tell
        conn.sendall(json.dumps(message).encode() + b"\n")


def become(job: dict, server_pid: int) -> None:
    """In the forked child: die with the server, take the job's output, environment, signals
    and command line, as `python -m module args` would start."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != server_pid:  # the server died before the signal was armed
        os._exit(1)
    # the title `ps` shows (procs.command_line reads it), set while the environment is still
    # the one the process started with (setproctitle finds the arguments' space from it), and
    # in that space only: /proc/PID/environ stays readable (the server's, which the child's
    # extends)
    os.environ["SPT_NOENV"] = "1"
    import setproctitle

    setproctitle.setproctitle(" ".join(job["argv"]))
    log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.environ.clear()
    os.environ.update(job["env"])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    gc.enable()
    if "numpy" in sys.modules:  # `random` reseeds itself after a fork; numpy's global state not
        sys.modules["numpy"].random.seed()
    sys.argv = [job["module"], *job["args"]]


def main() -> None:
    fd, model_path, modules = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    server_pid = os.getpid()
    job = serve(fd, model_path, modules)
    if job is None:
        return
    become(job, server_pid)
    import runpy

    runpy.run_module(job["module"], run_name="__main__", alter_sys=True)


# ---- the supervisor's side -------------------------------------------------------------------


class Forked:
    """A child of the fork server, handled as `subprocess.Popen` handles its own."""

    def __init__(self, server: ForkServer, pid: int, args: list[str]):
        self.server, self.pid, self.args, self.returncode = server, pid, args, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The supervisor's connection to its fork server, started on first use and again after it
    died. `spawn(argv, log, env)` takes `[python, "-m", module, *args]`; `modules`, the modules
    it will be asked to run, whose imports it preloads."""

    def __init__(self, log_dir: Path, model_path: str, env: dict[str, str], modules: list[str]):
        self.log_dir, self.model_path, self.env = log_dir, model_path, env
        self.modules = modules
        self.proc = None  # the server (a subprocess.Popen)
        self._conn: socket.socket | None = None
        self._buffer = b""
        self._exits: dict[int, int] = {}
        self._children: set[int] = set()
        self.starts = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def start(self) -> None:
        from rlstream.ops.stack import procs

        ours, theirs = socket.socketpair()
        argv = [sys.executable, "-u", "-m", __name__, str(theirs.fileno()), self.model_path,
                *self.modules]  # fmt: skip
        log = self.log_dir / "forkserver.log"
        try:
            self.proc = procs.spawn(argv, log=log, env=self.env, pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        self.starts += 1
        self._conn, self._buffer = ours, b""
        try:
            ready = self._read(lambda m: "ready" in m, timeout_s=READY_TIMEOUT_S)
        except OSError:
            ready = None
        if ready is None:
            self.close()
            raise ForkServerError(f"the fork server did not start: see {log}")

    def spawn(self, argv: list[str], log: Path, env: dict[str, str]) -> Forked:
        if argv[1:2] != ["-m"]:
            raise ForkServerError(f"the fork server runs modules only, not {argv}")
        if self.pid is None or self._conn is None:
            self._lost()
            self.start()
        log.parent.mkdir(parents=True, exist_ok=True)
        job = {"module": argv[2], "args": argv[3:], "argv": argv, "env": env, "log": str(log)}
        try:
            self._conn.sendall(json.dumps(job).encode() + b"\n")
            reply = self._read(lambda m: "pid" in m, timeout_s=30.0)
        except OSError as e:
            raise ForkServerError(f"the fork server is gone: {e}") from None
        if reply is None or "pid" not in reply:
            raise ForkServerError(f"the fork server did not fork: {reply}")
        self._children.add(reply["pid"])
        return Forked(self, reply["pid"], argv)

    def exit_code(self, pid: int) -> int | None:
        if self._conn is not None:
            try:
                self._read(lambda m: False, timeout_s=0.0)
            except OSError:  # it hung up: it died, and its children with it
                self._lost()
        return self._exits.get(pid)

    def _lost(self) -> None:
        """The server is gone (or never started): its children were killed with it."""
        self.close()
        for pid in self._children - set(self._exits):
            with contextlib.suppress(ProcessLookupError):  # not yet delivered: make it so
                os.kill(pid, signal.SIGKILL)
            self._exits[pid] = -signal.SIGKILL

    def _read(self, wanted, timeout_s: float) -> dict | None:
        """Take every message waiting (exits are recorded); return the first `wanted` one."""
        deadline = time.monotonic() + timeout_s
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                message = json.loads(line)
                if "exit" in message:
                    self._exits[message["exit"]] = message["code"]
                if wanted(message):
                    return message
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._conn], [], [], max(left, 0.0))
            if not ready:
                return None
            data = self._conn.recv(65536)
            if not data:
                raise OSError("the fork server hung up")
            self._buffer += data

    def close(self) -> None:
        """Hang up (the server exits; children still running die with it) and reap it."""
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
            self._conn = None
        if self.proc is not None:
            with contextlib.suppress(Exception):
                self.proc.wait(timeout=10)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


if __name__ == "__main__":
    main()
