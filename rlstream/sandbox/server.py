"""The sandbox server: runs untrusted Python one job at a time, each in a forked child.

Standard library only, started as `python -I -S server.py SLOT MODE` by `rlstream.sandbox.pool`
(never imported by rlstream), so it holds no rlstream state and no credentials: it starts with
an empty environment. It reads one JSON job per line on stdin and writes one JSON result per
line on stdout. MODE `namespaces` (root, under `unshare`): the server is PID 1 of its own PID,
network, mount, IPC and UTS namespaces; it mounts private tmpfs over /tmp, /var/tmp and /dev/shm
and runs every child as an unprivileged uid of its own (61000 + SLOT). MODE `rlimits`: the
child gets the limits, the scrubbed environment and its own directory only.

A child: a new session, its own empty directory (the only place it may write), resource limits
(CPU seconds, address space, file size, processes, open files, no core dumps), stdin from the
job, stdout and stderr to files capped by the file-size limit, the environment scrubbed. After
it ends, or runs past its wall clock, every process of its uid is killed and everything it
wrote is deleted.
"""

import contextlib
import json
import os
import resource
import select
import shutil
import signal
import sys
import time
import traceback

UID_BASE = 61000
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")
PRIVATE = "/tmp/.sandbox-server"  # root only: the child's output files, out of its reach
# (rlimits: a fresh directory of the host's /tmp, removed when the server ends)
PYTHON = "/tmp/.sandbox-python"  # the standard library, bound read-only where the uid can read it
KEEP = (PRIVATE, PYTHON)  # the namespaces' scratch wipe spares these
MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096


def main() -> None:
    slot, mode = int(sys.argv[1]), sys.argv[2]
    isolated = mode == "namespaces"
    if isolated:
        for where in SCRATCH:
            _mount(b"tmpfs", where, b"tmpfs", 0, b"size=256m,mode=1777")
        _expose_python()
    global PRIVATE
    if isolated:
        os.makedirs(PRIVATE, mode=0o700)
    else:  # the host's /tmp, shared with other servers: a directory of its own
        import tempfile

        PRIVATE = tempfile.mkdtemp(prefix="rlstream-sandbox-")
    uid = UID_BASE + slot if isolated else None
    _reply({"ready": True, "pid": os.getpid(), "mode": mode})
    try:
        serve(uid)
    finally:
        if not isolated:
            shutil.rmtree(PRIVATE, ignore_errors=True)


def serve(uid: int | None) -> None:
    for line in sys.stdin:
        try:
            job = json.loads(line)
        except ValueError as exc:
            _reply({"status": "sandbox_error", "reason": f"bad job line: {exc}"})
            continue
        try:
            result = run(job, uid)
        except Exception as exc:  # the server itself failed on this job: say so, keep serving
            result = {"status": "sandbox_error", "reason": f"server: {exc!r}"}
        _reply(result)


def _reply(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _mount(source: bytes, where: str, kind: bytes | None, flags: int, data: bytes | None) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if os.path.isdir(where) and libc.mount(source, where.encode(), kind, flags, data) != 0:
        raise OSError(ctypes.get_errno(), f"mount {source.decode()} on {where}")


def _expose_python() -> None:
    """The interpreter's standard library may sit where the child's uid cannot read (pyenv
    under /root): bind it read-only at PYTHON, which the child's sys.path names instead."""
    os.makedirs(PYTHON, mode=0o755)
    _mount(sys.base_prefix.encode(), PYTHON, None, MS_BIND, None)
    _mount(b"none", PYTHON, None, MS_BIND | MS_REMOUNT | MS_RDONLY, None)
    sys.path[:] = [p.replace(sys.base_prefix, PYTHON, 1) for p in sys.path]
    for module in list(sys.modules.values()):  # packages imported already (encodings)
        path = getattr(module, "__path__", None)
        if isinstance(path, list):
            path[:] = [p.replace(sys.base_prefix, PYTHON, 1) for p in path]
    sys.path_importer_cache.clear()


def run(job: dict, uid: int | None) -> dict:
    limits = job["limits"]
    workdir = os.path.join("/tmp", f"sandbox-{os.getpid()}-{time.monotonic_ns()}")
    os.makedirs(workdir, mode=0o700)
    if uid is not None:
        os.chown(workdir, uid, uid)
    paths = {name: os.path.join(PRIVATE, name) for name in ("in", "out", "err", "res")}
    fds = {name: os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
           for name, path in paths.items()}  # fmt: skip
    os.write(fds["in"], (job.get("stdin") or "").encode())
    os.lseek(fds["in"], 0, os.SEEK_SET)
    start = time.monotonic()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        _child(job, uid, workdir, fds, limits)
    for fd in fds.values():
        os.close(fd)
    status, sig, timed_out = _wait(pid, limits["wall_s"])
    wall = time.monotonic() - start
    _kill_all(pid, uid)
    cap = limits["output_bytes"]
    out = {name: _read(paths[name], cap) for name in ("out", "err", "res")}
    shutil.rmtree(workdir, ignore_errors=True)
    if uid is not None:
        _wipe_scratch()
    tests = [json.loads(line) for line in out["res"].splitlines() if line.startswith("{")]
    return {
        "status": _status(status, sig, timed_out, tests, job),
        "exit_code": status,
        "signal": signal.Signals(sig).name if sig else None,
        "stdout": out["out"],
        "stderr": out["err"][-2000:],
        "tests": [t for t in tests if "passed" in t],
        "load_error": next((t["load_error"] for t in tests if "load_error" in t), None),
        "wall_s": round(wall, 4),
    }


def _status(status, sig, timed_out, tests, job) -> str:
    if timed_out:
        return "timeout"
    if sig == signal.SIGXCPU:
        return "cpu_limit"
    if sig == signal.SIGXFSZ:
        return "output_limit"
    if sig:
        return "crashed"
    return "ok" if status == 0 else "failed"


def _wait(pid: int, wall_s: float) -> tuple[int | None, int | None, bool]:
    """(exit status, signal, timed out): waits up to wall_s, then kills the child."""
    pidfd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([pidfd], [], [], wall_s)
    finally:
        os.close(pidfd)
    timed_out = not ready
    if timed_out:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    _, raw = os.waitpid(pid, 0)
    if os.WIFSIGNALED(raw):
        return None, os.WTERMSIG(raw), timed_out
    return os.WEXITSTATUS(raw), None, timed_out


def _kill_all(pid: int, uid: int | None) -> None:
    """Kill whatever the child left running: every process of its uid (namespaces), else its
    process group; then reap them (the server is their init in its PID namespace)."""
    if uid is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        return
    deadline = time.monotonic() + 5.0
    while _processes_of(uid) and time.monotonic() < deadline:
        killer = os.fork()
        if killer == 0:
            try:
                os.setuid(uid)
                os.kill(-1, signal.SIGKILL)
            finally:
                os._exit(0)
        os.waitpid(killer, 0)  # reaped here: a killer left running would count as the uid's
        _reap()


def _processes_of(uid: int) -> bool:
    """Whether any process (a zombie too) runs as uid: /proc/PID/status, as the directory's
    own owner is root for a process that changed its uid (not dumpable)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as f:
                    for line in f:
                        if line.startswith("Uid:"):
                            if int(line.split()[1]) == uid:
                                return True
                            break
            except (FileNotFoundError, ProcessLookupError):
                continue
    return False


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _wipe_scratch() -> None:
    for where in SCRATCH:
        for entry in os.listdir(where):
            path = os.path.join(where, entry)
            if path in KEEP:
                continue
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)


def _read(path: str, cap: int) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(cap).decode("utf-8", "replace")
    except OSError:
        return ""


def _child(job: dict, uid: int | None, workdir: str, fds: dict, limits: dict) -> None:
    try:
        os.setsid()
        for fd, name in ((0, "in"), (1, "out"), (2, "err"), (3, "res")):
            os.dup2(fds[name], fd)
        os.closerange(4, 4096)
        os.chdir(workdir)
        cpu = max(1, int(limits["cpu_s"] + 0.999))
        for what, value in (
            (resource.RLIMIT_CPU, (cpu, cpu + 1)),
            (resource.RLIMIT_AS, (limits["memory_bytes"],) * 2),
            (resource.RLIMIT_FSIZE, (limits["output_bytes"],) * 2),
            (resource.RLIMIT_NOFILE, (limits["open_files"],) * 2),
            (resource.RLIMIT_CORE, (0, 0)),
        ):
            resource.setrlimit(what, value)
        if uid is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"],) * 2)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        os.environ.clear()
        os.environ.update({"PATH": "/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8",
                           "TMPDIR": workdir})  # fmt: skip
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115  (the child's own, until it exits)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        _execute(job)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    os._exit(code)


def _execute(job: dict) -> None:
    """Run the program as __main__; with `tests`, run it as a module, then each test in its
    namespace, one result line per test on fd 3 (passed, else the error)."""
    if job.get("tests") is None:
        program = compile(job["code"], "<solution>", "exec")
        exec(program, {"__name__": "__main__", "__builtins__": __builtins__})
        return
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        exec(compile(job["code"], "<solution>", "exec"), namespace)
    except BaseException as exc:
        _result({"load_error": _describe(exc)})
        raise
    for test in job["tests"]:
        try:
            exec(compile(test, "<test>", "exec"), namespace)
        except BaseException as exc:
            _result({"passed": False, "error": _describe(exc)})
        else:
            _result({"passed": True})


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:300]


def _result(obj: dict) -> None:
    os.write(3, (json.dumps(obj) + "\n").encode())


if __name__ == "__main__":
    main()
