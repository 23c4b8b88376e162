"""`rlstream bench stop`: how long Ctrl-C takes to stop `rlstream run`, every process of it and
the embedded stack it started, and what it leaves behind.

Each repeat runs the loop on its own embedded stack (a fresh state directory, so the run starts
and stops the servers itself), waits until RL is `at_step` steps in, sends SIGINT to the run's
process group as a terminal's Ctrl-C does, and times the exit. The run's processes and the
stack's servers are taken from the process tree before the signal; any of them alive after the
exit is a leftover. The second arm sends another SIGINT `second_after_s` later: the run must
then kill what is left at once instead of waiting out the children's grace period.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from rlstream.config import Config
from rlstream.connectors.endpoints import ENDPOINT_VARIABLES
from rlstream.ops.launcher.childrun import ChildRun, wait_for

STOP_TARGET_S = 10.0  # the bound: every child and the embedded stack


@dataclass
class StopArgs:
    repeats: int = 3
    at_step: int = 2
    second_after_s: float = 1.0
    run_timeout_s: float = 900.0


def stop_once(cfg: Config, out_root: Path, args: StopArgs, second: bool, say=print) -> dict:
    """One run stopped with Ctrl-C (twice if `second`): seconds to exit, exit code, leftovers."""
    with tempfile.TemporaryDirectory(prefix="rlstream-stop-") as home:
        env = {k: v for k, v in os.environ.items() if k not in ENDPOINT_VARIABLES}
        env["RLSTREAM_HOME"] = home  # no running stack: the run starts its embedded one
        with ChildRun(cfg, out_root, env, "stop") as run:
            live = run.live

            def in_rl() -> bool:
                return run.ended() or (live.phase() == "rl" and live.step() >= args.at_step)

            wait_for(in_rl, args.run_timeout_s, f"rl step {args.at_step}", live, say, who="stop")
            if run.ended():
                return {"exit_code": run.proc.returncode, "stop_s": None, "left": []}
            tree = psutil.Process(run.pid).children(recursive=True)
            step = live.step()
            interrupted = time.monotonic()
            run.interrupt()
            if second:
                time.sleep(args.second_after_s)
                if not run.ended():
                    run.interrupt()
            code = run.proc.wait(timeout=120)
            stopped = time.monotonic() - interrupted
            time.sleep(0.5)  # a process reparented at the exit gets a moment to go too
            left = sorted({_name(p) for p in tree if _alive(p)})
    return {"exit_code": code, "stop_s": round(stopped, 2), "at_step": step,
            "processes": len(tree), "left": left}  # fmt: skip


def run_stop_bench(cfg: Config, out_root: Path, args: StopArgs, say=print) -> dict:
    """Both arms, `repeats` runs each; the figures."""
    out_root = out_root.resolve()
    arms: dict[str, list[dict]] = {"one Ctrl-C": [], "two Ctrl-C": []}
    for i in range(args.repeats):
        for arm, runs in arms.items():
            run_id = f"{cfg.run_id}-{'two' if arm.startswith('two') else 'one'}-{i}"
            say(f"stop: {arm}, repeat {i + 1}/{args.repeats} ({run_id})")
            runs.append(stop_once(replace(cfg, run_id=run_id), out_root, args,
                                  arm.startswith("two"), say))  # fmt: skip
    figures: dict = {"repeats": args.repeats, "target_s": STOP_TARGET_S, "runs": arms}
    for arm, runs in arms.items():
        times = sorted(r["stop_s"] for r in runs if r["stop_s"] is not None)
        key = "second" if arm.startswith("two") else "first"
        figures[f"{key}_stop_s_median"] = statistics.median(times) if times else None
        figures[f"{key}_stop_s_max"] = times[-1] if times else None
        figures[f"{key}_stop_s_min"] = times[0] if times else None
        figures[f"{key}_exit_130"] = sum(r["exit_code"] == 130 for r in runs)
        figures[f"{key}_leftovers"] = sorted({n for r in runs for n in r["left"]})
    figures["met"] = bool(
        figures["first_stop_s_max"] is not None and figures["first_stop_s_max"] <= STOP_TARGET_S
        and figures["first_exit_130"] == args.repeats and not figures["first_leftovers"]
        and not figures["second_leftovers"]
    )  # fmt: skip
    return figures


def table(figures: dict) -> str:
    """The two arms as a Markdown table."""
    lines = ["| arm | stop s (median) | min - max | exit 130 | left behind |",
             "|---|---|---|---|---|"]  # fmt: skip
    for key, arm in (("first", "one Ctrl-C"), ("second", "two Ctrl-C")):
        left = ", ".join(figures[f"{key}_leftovers"]) or "nothing"
        lines.append(f"| {arm} | {figures[f'{key}_stop_s_median']} | "
                     f"{figures[f'{key}_stop_s_min']} - {figures[f'{key}_stop_s_max']} | "
                     f"{figures[f'{key}_exit_130']}/{figures['repeats']} | {left} |")  # fmt: skip
    verdict = "met" if figures["met"] else "missed"
    lines.append(f"\ntarget: every run stopped within {STOP_TARGET_S:g} s of its first Ctrl-C, "
                 f"exit 130, nothing left behind: {verdict}")  # fmt: skip
    return "\n".join(lines)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _name(p: psutil.Process) -> str:
    """A process's kind: its rlstream module, else its program (tansu, weed; no version)."""
    from rlstream.ops.stack.procs import command_line

    try:
        cmd = command_line(p)
    except psutil.NoSuchProcess:
        return f"pid {p.pid}"
    module = next((a for a in cmd if a.startswith("rlstream.")), None)
    return module or (Path(cmd[0]).name.split("-")[0] if cmd else f"pid {p.pid}")
