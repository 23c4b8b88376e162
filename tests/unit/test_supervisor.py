"""The supervisor: a metrics port free at every start; a crash loop the run cannot survive ends
it."""

from __future__ import annotations

import socket
import sys

from rlstream.config import Config
from rlstream.config.files import with_values
from rlstream.ops.launcher.supervisor import Supervisor, wait_for_trainer

CRASH = [  # says where it would serve, then crashes: the supervisor restarts it
    sys.executable, "-c", "import os, sys; print(os.environ['RLSTREAM_METRICS_PORT']); sys.exit(1)"
]  # fmt: skip


def supervisor(tmp_path, **settings) -> Supervisor:
    cfg = with_values(Config(), **{"loop.fork_server": False, **settings})
    sup = Supervisor(cfg.write(tmp_path / "config.json"), {}, tmp_path / "logs")
    for child in sup.children:
        child.argv = CRASH
    return sup


SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_child_whose_port_was_taken_starts_on_another_and_the_targets_follow(tmp_path):
    sup = supervisor(tmp_path)
    assert sup.metrics_endpoints() == {}  # nothing serves before it starts
    sup.start(("trainer",))
    trainer = sup.trainer()
    assert trainer.proc.wait(10) == 1
    first = trainer.metrics_port
    assert trainer.log.read_text().split() == [str(first)]
    assert sup.metrics_endpoints() == {"trainer": f"http://127.0.0.1:{first}/metrics"}
    assert sup.ports_moved

    sup.ports_moved = False
    with socket.socket() as other:  # another process took the port since
        other.bind(("127.0.0.1", first))
        other.listen()
        assert "trainer exited with 1; restart 1" in sup.poll()
        assert trainer.proc.wait(10) == 1
    assert trainer.metrics_port != first
    assert trainer.log.read_text().split()[-1] == str(trainer.metrics_port)
    assert sup.ports_moved  # the loop rewrites metrics.json and Prometheus's targets

    sup.ports_moved = False
    port = trainer.metrics_port
    assert "trainer exited with 1; restart 2" in sup.poll()  # free still: it keeps its port
    assert trainer.proc.wait(10) == 1
    assert trainer.metrics_port == port and not sup.ports_moved
    sup.stop()


def test_a_process_the_run_needs_in_a_crash_loop_ends_the_run_a_rollout_worker_does_not(
    tmp_path,
):
    sup = supervisor(tmp_path, **{"loop.max_restarts": 1})
    worker = sup.rollout_children()[0]
    scheduler = next(c for c in sup.children if c.name == "scheduler")
    for child in sup.children:
        child.argv = CRASH if child is worker else SLEEP
    sup.start()
    for _ in range(2):  # the first rollout worker crashes past its restarts: another is left
        worker.proc.wait(10)
        sup.poll()
    assert worker.finished and sup.live_workers() == 1 and sup.stopped is None
    scheduler.argv = CRASH
    scheduler.proc.kill()
    for _ in range(2):
        scheduler.proc.wait(10)
        sup.poll()
    assert sup.stopped.startswith("scheduler crashed 2 times")  # the trainer would wait forever
    assert wait_for_trainer(sup, lambda news: None, timeout_s=30) is False
    sup.stop()
    assert all(c.proc.poll() is not None for c in sup.children)  # stopped with the run
