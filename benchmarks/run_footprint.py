"""The main job's footprint from outside: start-up (launch to the first pre-training figures in
live.json) and the memory of every process of the run (RSS and PSS, sampled every few seconds),
for any `rlstream` executable, so two versions of the code compare on the same machine.

    python benchmarks/run_footprint.py --rlstream .venv/bin/rlstream --out /tmp/fp -- --seed 0

Prints one JSON object: startup_s, wall_s, and per process (by role) the last seen and the
largest RSS and PSS in MiB, with sums over the loop's processes (the stack's servers apart).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

import psutil

ROLES = (
    "rlstream.ops.launcher.forkserver",
    "rlstream.streams.trainer",
    "rlstream.streams.scheduler",
    "rlstream.streams.worker",
    "rlstream.streams.rollout_worker",
    "weed",
    "tansu",
    "kafka.Kafka",
)  # the fork server first: its command line names the others


def role(proc: psutil.Process) -> str | None:
    try:
        line = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    for name in ROLES:
        if name in line:
            worker = line.split("--worker-id ")[1].split()[0] if "--worker-id" in line else ""
            return name.rsplit(".", 1)[-1] + (f"-{worker}" if worker else "")
    return None


def sample(root: psutil.Process) -> dict[str, tuple[float, float]]:
    out = {}
    for proc in root.children(recursive=True):
        name = role(proc)
        if name is None:
            continue
        try:
            mem = proc.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        out[name] = (mem.rss / 2**20, mem.pss / 2**20)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rlstream", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--run-id", default="footprint")
    parser.add_argument("args", nargs="*")
    a = parser.parse_args()
    env = os.environ | {"RLSTREAM_HOME": str(a.out / "home")}
    env = {k: v for k, v in env.items() if k != "RLSTREAM_KAFKA_BOOTSTRAP"}
    cmd = [a.rlstream, "run", "--out", str(a.out), "--run-id", a.run_id, *a.args]
    started = time.monotonic()
    run = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    root = psutil.Process(run.pid)
    live = a.out / a.run_id / "live.json"
    startup, last, peak, at = None, {}, {}, 0.0
    while run.poll() is None:
        if startup is None and live.exists():
            try:
                if json.loads(live.read_text()).get("phase") not in (None, "starting"):
                    startup = time.monotonic() - started
            except ValueError:
                pass
        if time.monotonic() - at > 5:
            at = time.monotonic()
            now = sample(root)
            last |= now  # each process as last seen alive
            for name, (rss, pss) in now.items():
                old = peak.get(name, (0.0, 0.0))
                peak[name] = (max(old[0], rss), max(old[1], pss))
        time.sleep(0.25)
    loop = [n for n in last if n not in ("weed", "tansu", "Kafka")]
    print(
        json.dumps(
            {
                "returncode": run.returncode,
                "startup_s": None if startup is None else round(startup, 1),
                "wall_s": round(time.monotonic() - started, 1),
                "last_mib": {n: [round(r), round(p)] for n, (r, p) in sorted(last.items())},
                "peak_mib": {n: [round(r), round(p)] for n, (r, p) in sorted(peak.items())},
                "loop_rss_last_mib": round(sum(last[n][0] for n in loop)),
                "loop_pss_last_mib": round(sum(last[n][1] for n in loop)),
                "loop_pss_peaks_mib": round(sum(peak[n][1] for n in loop)),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
