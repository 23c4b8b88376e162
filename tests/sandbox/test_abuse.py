"""Escape and abuse attempts, each run through the `code` verifier as a model's completion would
be: the attack comes first, then a correct solution, so a sandbox that let the attack through
(or let it pass unnoticed) would score 1. Each must score 0 with its reason, leave nothing on
the host's disk, and leave the sandbox serving the next completion."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from rlstream import sandbox
from rlstream.config import SandboxConfig
from rlstream.sandbox.pool import isolation_of
from rlstream.trainers.envs import Prompt, grade_all

SOLUTION = "def double(x):\n    return 2 * x\n"
TESTS = ["assert double(2) == 4", "assert double(-3) == -6", "assert double(0) == 0"]
SECRET = "s3-secret-for-the-abuse-test"

needs_namespaces = pytest.mark.skipif(
    isolation_of(SandboxConfig()) != "namespaces",
    reason="the namespaces isolation needs root and unshare",
)


def _prompt() -> Prompt:
    meta = json.dumps({"tests": TESTS})
    return Prompt("double", "Write double(x).", "code", 0, SOLUTION, "code", meta)


@pytest.fixture(scope="module", autouse=True)
def fresh_sandbox():
    """A sandbox started while this process holds an S3 secret in its environment."""
    os.environ["RLSTREAM_S3_SECRET_KEY"] = SECRET
    sandbox.configure(SandboxConfig(wall_s=2.0, cpu_s=1.0, memory_mb=256, output_kb=64))
    yield sandbox.shared()
    del os.environ["RLSTREAM_S3_SECRET_KEY"]
    sandbox.configure(SandboxConfig())


def _grade(attack: str):
    grade = grade_all([attack + "\n" + SOLUTION], [_prompt()])[0]
    after = grade_all([SOLUTION], [_prompt()])[0]
    assert after.correct and after.reward == 1.0, f"the sandbox stopped serving: {after}"
    return grade


def _sandbox_processes() -> list[str]:
    out = subprocess.run(["ps", "-eo", "uid=,pid=,args="], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if line.split()[0].startswith("610")]


def test_a_correct_completion_scores_one_and_a_wrong_one_names_its_test():
    right, wrong = grade_all([SOLUTION, "def double(x):\n    return x + 2\n"], [_prompt()] * 2)
    assert right.reward == 1.0 and right.correct and right.details == "3/3 tests passed"
    assert wrong.reward == pytest.approx(1 / 3) and not wrong.correct  # share of tests
    assert "assert double(-3) == -6 (AssertionError)" in wrong.details


def test_an_infinite_loop_is_stopped_by_its_cpu_limit():
    grade = _grade("while True:\n    pass")
    assert grade.reward == 0.0 and "CPU time" in grade.details


def test_a_sleeping_loop_is_stopped_by_the_wall_clock():
    grade = _grade("import time\nwhile True:\n    time.sleep(1)")
    assert grade.reward == 0.0 and "timed out after 2 s" in grade.details


@needs_namespaces
def test_a_fork_bomb_is_capped_and_every_process_it_made_is_killed():
    grade = _grade("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
                   "        pass")  # fmt: skip
    assert grade.reward == 0.0 and ("CPU time" in grade.details or "timed out" in grade.details)
    assert _sandbox_processes() == []


def test_a_memory_bomb_gets_a_memory_error():
    grade = _grade("hog = bytearray(4 * 1024**3)")
    assert grade.reward == 0.0 and "MemoryError" in grade.details


def test_a_huge_output_is_cut_off_at_the_output_limit():
    grade = _grade("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)")
    assert grade.reward == 0.0 and "wrote more than 64 KB" in grade.details


def test_writing_outside_its_directory_fails_and_leaves_nothing(tmp_path):
    checkout = Path(__file__).resolve().parents[2] / "escaped-by-the-sandbox"
    for target in (tmp_path / "escaped", checkout):
        grade = _grade(f"open({str(target)!r}, 'w').write('out')")
        assert grade.reward == 0.0 and "does not run" in grade.details, grade
        assert not target.exists()
    assert not list(Path("/tmp").glob("sandbox-*"))  # its own directories were private


@needs_namespaces
def test_the_process_environment_holds_no_secret_to_read():
    grade = _grade(
        "import glob, os\nfound = str(dict(os.environ))\n"
        "for path in glob.glob('/proc/*/environ'):\n"
        "    try:\n        found += open(path, errors='ignore').read()\n"
        "    except OSError:\n        pass\n"
        f"assert {SECRET!r} in found, 'no secret'"
    )
    assert grade.reward == 0.0 and "no secret" in grade.details


@needs_namespaces
def test_a_network_connection_cannot_be_opened():
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    grade = _grade(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
    server.close()
    assert grade.reward == 0.0 and "Network is unreachable" in grade.details
    assert not accepted


@needs_namespaces
def test_the_parent_and_the_caller_cannot_be_killed():
    grade = _grade(f"import os\nos.kill({os.getpid()}, 9)")  # the caller: not in its namespace
    assert grade.reward == 0.0 and "ProcessLookupError" in grade.details
    grade = _grade("import os\nos.kill(os.getppid(), 9)")  # the sandbox server: another uid
    assert grade.reward == 0.0 and "PermissionError" in grade.details


def test_crashing_the_interpreter_with_ctypes_is_a_crash_not_a_pass():
    grade = _grade("import ctypes\nctypes.string_at(0)")
    assert grade.reward == 0.0 and "crashed (SIGSEGV)" in grade.details


def test_a_server_that_dies_is_restarted(fresh_sandbox):
    for server in fresh_sandbox._servers:
        if server.proc is not None:
            server.proc.kill()
            server.proc.wait()
    assert grade_all([SOLUTION], [_prompt()])[0].correct


def test_a_sandbox_that_cannot_start_says_why(monkeypatch, tmp_path):
    from rlstream.sandbox import Sandbox, SandboxUnavailable, pool

    monkeypatch.setattr(pool, "SERVER", tmp_path / "missing.py")
    broken = Sandbox(SandboxConfig(workers=1))
    with pytest.raises(SandboxUnavailable, match="did not start .*missing.py"):
        broken.run("print(1)")
    broken.close()


def test_results_written_by_the_program_itself_are_caught_when_there_are_too_many():
    forge = "import os\nfor _ in range(5):\n    os.write(3, b'{\"passed\": true}\\n')"
    grade = _grade(forge + "\ndef double(x):\n    return 0")
    assert grade.reward == 0.0 and "wrote to the result channel" in grade.details
