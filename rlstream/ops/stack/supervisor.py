"""`rlstream stack up | down | status`: a detached supervisor owning the embedded stack.

The supervisor (`python -m rlstream.ops.stack.supervisor --dir DIR`) starts the servers, writes
stack.json and endpoints.json, then waits. SIGTERM or SIGINT stops the servers and removes both
files; if the supervisor dies any other way, the kernel kills the servers (parent-death signal)
and the next `up` clears the stale files. A lock file makes concurrent `up`s start one stack.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import psutil

from rlstream.connectors.endpoints import ENDPOINTS_FILE, Endpoints
from rlstream.ops.stack import kafka, procs
from rlstream.ops.stack.embedded import (
    STACK_FILE,
    EmbeddedStack,
    Server,
    StackError,
    broker_choice,
)


@contextmanager
def _locked(directory: Path):
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "stack.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def read_state(directory: Path) -> dict | None:
    path = directory / STACK_FILE
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


def is_running(state: dict | None) -> bool:
    """The supervisor is alive and every server is alive and listening on its port."""
    if not state or not procs.pid_alive(state["supervisor_pid"]):
        return False
    return all(procs.pid_alive(s["pid"]) and procs.port_open(s["port"]) for s in state["servers"])


def _clear_stale(directory: Path, state: dict | None) -> None:
    if state:
        for pid in [s["pid"] for s in state.get("servers", [])] + [state["supervisor_pid"]]:
            procs.terminate(pid, timeout_s=5)
    for name in (STACK_FILE, ENDPOINTS_FILE):
        (directory / name).unlink(missing_ok=True)


def up(
    directory: Path,
    *,
    durable: bool = False,
    prometheus: bool = False,
    broker: str | None = None,
    nodes: int | None = None,
    sasl: bool = False,
    tls: bool = False,
    timeout_s: float = 180.0,
) -> tuple[dict, bool]:
    """Start the stack unless it already runs; return (state, started_now). `broker` and
    `nodes` as `EmbeddedStack` takes them (a first Kafka start fetches its jars)."""
    broker, nodes = broker_choice(broker, nodes, Path(directory))
    if sasl and broker != "kafka":
        raise StackError("--sasl: SCRAM authentication runs on Apache Kafka (--broker kafka)")
    if tls and broker != "kafka":
        raise StackError("--tls: the TLS listener runs on Apache Kafka (--broker kafka)")
    if broker == "kafka":  # here, so a missing Java or Maven is one line, not a log's tail
        try:
            kafka.classpath()
        except kafka.KafkaInstallError as exc:
            raise StackError(str(exc)) from None
    directory = Path(directory).resolve()
    with _locked(directory):
        state = read_state(directory)
        if is_running(state):
            return state, False
        _clear_stale(directory, state)
        log = directory / "logs" / "supervisor.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "rlstream.ops.stack.supervisor", "--dir", str(directory)]
        cmd += ["--durable"] if durable else []
        cmd += ["--prometheus"] if prometheus else []
        cmd += ["--broker", broker, "--nodes", str(nodes)] + (["--sasl"] if sasl else [])
        cmd += ["--tls"] if tls else []
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,  # outlives this command; `stack down` stops it
            )  # fmt: skip

        def ready() -> bool:
            s = read_state(directory)
            return proc.poll() is not None or bool(s and s["supervisor_pid"] == proc.pid)

        if not procs.wait_until(ready, timeout_s, interval_s=0.1) or proc.poll() is not None:
            procs.terminate(proc.pid)
            raise StackError(f"the stack did not come up:\n{procs.tail_text(log)}")
        return read_state(directory), True


def down(directory: Path, timeout_s: float = 30.0) -> list[str]:
    """Stop the stack; return what was stopped. Leaves no process and no listening port."""
    directory = Path(directory).resolve()
    with _locked(directory):
        state = read_state(directory)
        if not state:
            return []
        pids = [state["supervisor_pid"]] + [s["pid"] for s in state["servers"]]
        ports = [p for s in state["servers"] for p in s.get("ports", [s["port"]])]
        procs.terminate(state["supervisor_pid"], timeout_s=timeout_s)
        for pid in pids:  # the supervisor stops its servers; make sure of it
            procs.terminate(pid, timeout_s=5)
        procs.wait_until(lambda: not any(procs.port_open(p) for p in ports), 10)
        _clear_stale(directory, None)
        return [s["name"] for s in state["servers"]]


def status(directory: Path) -> list[dict]:
    """One row per server: pid, port, alive, uptime and resident memory."""
    state = read_state(Path(directory).resolve())
    if not state:
        return []
    rows = []
    for s in state["servers"]:
        alive = procs.pid_alive(s["pid"])
        rss = 0
        if alive:
            p = psutil.Process(s["pid"])
            rss = sum(q.memory_info().rss for q in [p, *p.children(recursive=True)])
        rows.append(
            {
                "server": s["name"],
                "pid": s["pid"],
                "port": s["port"],
                "alive": alive and procs.port_open(s["port"]),
                "uptime_s": round(time.time() - s["started_at"], 1) if alive else 0.0,
                "rss_mb": round(rss / 2**20, 1),
            }
        )
    return rows


def supervise(
    directory: Path,
    durable: bool,
    prometheus: bool = False,
    broker: str | None = None,
    nodes: int | None = None,
    sasl: bool = False,
    tls: bool = False,
) -> int:
    stop = False

    def on_signal(signum, frame):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stack = EmbeddedStack(directory, durable=durable, prometheus=prometheus, broker=broker,
                          nodes=nodes, sasl=sasl, tls=tls)  # fmt: skip
    endpoints: Endpoints = stack.start()
    endpoints.write(stack.directory)
    state = {
        "supervisor_pid": _pid(),
        "started_at": time.time(),
        "durable": durable,
        "broker": stack.broker,
        "nodes": stack.nodes,
        "endpoints": endpoints.public(),
        "servers": [asdict(s) for s in stack.servers],
    }
    tmp = stack.directory / (STACK_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(stack.directory / STACK_FILE)
    print(f"stack up: {endpoints.public()}", flush=True)
    code = 0
    while not stop:
        dead = stack.dead_servers()
        if dead:
            print(f"server(s) exited: {dead}; stopping the stack", flush=True)
            code = 1
            break
        time.sleep(0.2)
    stack.stop()
    for name in (STACK_FILE, ENDPOINTS_FILE):
        (stack.directory / name).unlink(missing_ok=True)
    print("stack down", flush=True)
    return code


def _pid() -> int:
    import os

    return os.getpid()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="rlstream embedded-stack supervisor")
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--durable", action="store_true")
    parser.add_argument("--prometheus", action="store_true")
    parser.add_argument("--broker", choices=("tansu", "kafka"))
    parser.add_argument("--nodes", type=int)
    parser.add_argument("--sasl", action="store_true")
    parser.add_argument("--tls", action="store_true")
    args = parser.parse_args(argv)
    return supervise(args.dir, args.durable, args.prometheus, args.broker, args.nodes, args.sasl,
                     args.tls)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["Server", "down", "is_running", "read_state", "status", "up"]
