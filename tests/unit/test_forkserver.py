"""The fork server: children forked from one process that imported torch run as `python -m` would
start them (their arguments, environment, log, exit code), share its pages, and die with it."""

import json
import os
import signal
import sys
import time

import psutil
import pytest

from rlstream.ops.launcher.forkserver import ForkServer, ForkServerError, top_level_imports
from rlstream.ops.stack.procs import command_line

PROBE = """
import json, os, sys, time
print(json.dumps({"ppid": os.getppid(), "x": os.environ.get("PROBE_X"), "args": sys.argv[1:],
                  "torch": "torch" in sys.modules, "name": __name__}), flush=True)
if sys.argv[1] == "sleep":
    time.sleep(60)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def server(tmp_path):
    (tmp_path / "probe_child.py").write_text("import torch\n" + PROBE)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    fork = ForkServer(tmp_path / "logs", "tiny", env, ["probe_child"])
    yield fork
    fork.close()


def _argv(*args):
    return [sys.executable, "-m", "probe_child", *args]


def test_a_forked_child_runs_as_python_m_would(server, tmp_path):
    log = tmp_path / "logs" / "probe.log"
    child = server.spawn(_argv("3"), log, env=dict(os.environ, PROBE_X="y"))
    assert child.wait(timeout=30) == 3
    seen = json.loads(log.read_text().splitlines()[-1])
    assert seen == {"ppid": server.pid, "x": "y", "args": ["3"], "torch": True,
                    "name": "__main__"}  # fmt: skip
    assert server.starts == 1


def test_a_forked_child_shows_its_own_command_line(server, tmp_path):
    child = server.spawn(_argv("sleep"), tmp_path / "s.log", dict(os.environ))
    deadline = time.monotonic() + 10
    while command_line(psutil.Process(child.pid)) != _argv("sleep"):
        assert time.monotonic() < deadline, psutil.Process(child.pid).cmdline()
        time.sleep(0.1)
    child.kill()


def test_children_share_the_servers_pages_and_are_killed_as_popen_kills(server, tmp_path):
    children = [server.spawn(_argv("sleep"), tmp_path / f"s{i}.log", dict(os.environ))
                for i in range(2)]  # fmt: skip
    time.sleep(1.0)
    for child in children:  # a forked copy of the server: most of its memory is the server's
        memory = psutil.Process(child.pid).memory_full_info()
        assert memory.pss < 0.6 * memory.rss, memory
        assert child.poll() is None
    children[0].kill()
    assert children[0].wait(timeout=10) == -signal.SIGKILL
    children[1].terminate()
    assert children[1].wait(timeout=10) == -signal.SIGTERM


def test_a_dead_server_takes_its_children_and_is_started_again(server, tmp_path):
    child = server.spawn(_argv("sleep"), tmp_path / "a.log", dict(os.environ))
    os.kill(server.pid, signal.SIGKILL)
    assert child.wait(timeout=10) == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while psutil.pid_exists(child.pid) and psutil.Process(child.pid).status() != "zombie":
        assert time.monotonic() < deadline, "the child outlived its fork server"
        time.sleep(0.1)
    again = server.spawn(_argv("0"), tmp_path / "b.log", dict(os.environ))
    assert again.wait(timeout=30) == 0
    assert server.starts == 2


def test_every_preset_has_its_model_family():
    from rlstream.config.modelpath import PRESET_NAMES
    from rlstream.ops.launcher.forkserver import FAMILY, model_family

    assert set(FAMILY) == set(PRESET_NAMES)
    assert model_family("preset:tiny-llama") == "llama"


def test_top_level_imports_reads_the_source():
    found = top_level_imports("rlstream.ops.launcher.forkserver")
    assert "json" in found and "socket" in found
    assert "runpy" not in found  # imported inside a function


def test_a_server_that_cannot_start_says_where_its_log_is(tmp_path):
    (tmp_path / "broken_child.py").write_text("import no_such_module_anywhere\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    fork = ForkServer(tmp_path / "logs", "tiny", env, ["broken_child"])
    with pytest.raises(ForkServerError, match="forkserver.log"):
        fork.spawn(_argv("0"), tmp_path / "c.log", dict(os.environ))
    assert "no_such_module_anywhere" in (tmp_path / "logs" / "forkserver.log").read_text()
    fork.close()
