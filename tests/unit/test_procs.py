"""Process plumbing: the second Ctrl-C."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

CHILD = textwrap.dedent(
    """
    import subprocess, sys, time
    from rlstream.ops.stack import procs

    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    plain = subprocess.Popen(sleep)
    # a server in its own process group, as the embedded stack spawns them
    server = subprocess.Popen(sleep, process_group=0)
    procs.kill_all_on_next_interrupt("killed")
    print(plain.pid, server.pid, flush=True)
    time.sleep(600)
    """
)


def test_an_interrupt_after_the_first_kills_every_descendant_and_exits_at_once():
    run = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        pids = [int(p) for p in run.stdout.readline().split()]
        assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
        os.kill(run.pid, signal.SIGINT)
        assert run.wait(timeout=10) == 130
        assert "killed" in run.stderr.read()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)
        assert not [p for p in pids if _alive(p)]
    finally:
        if run.poll() is None:
            run.kill()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_process_started_with_interrupts_ignored_heeds_them_again():
    script = textwrap.dedent(
        """
        import signal, sys, time
        from rlstream.ops.stack import procs

        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # as `cmd &` in a script
        procs.heed_interrupts()
        try:  # the interrupt can come as soon as "ready" is out
            print("ready", flush=True)
            time.sleep(60)
        except KeyboardInterrupt:
            sys.exit(130)
        """
    )

    def ignore():
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    run = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, preexec_fn=ignore)  # fmt: skip
    try:
        assert run.stdout.readline().strip() == "ready", run.stderr.read()
        os.kill(run.pid, signal.SIGINT)
        assert run.wait(timeout=10) == 130
    finally:
        if run.poll() is None:
            run.kill()
