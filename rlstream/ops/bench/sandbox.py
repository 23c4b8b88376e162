"""`rlstream bench sandbox`: code verification's executions per second and latency (p50, p99),
sandboxed against unsandboxed, one execution at a time against several at once.

The workload is the built-in code family's: a one-line function and its five hidden tests
(`fn`), the verdict read from the test results. The arms, by isolation:

    in-process    exec() in the verifier's own process (no isolation at all: the baseline)
    subprocess    a fresh `python -I` per execution (isolation by process only, no limits)
    rlimits       the sandbox's fork server: limits, scrubbed environment, own directory
    namespaces    the sandbox as `rlstream run` uses it: its own PID, network and mount
                  namespaces and an unprivileged uid besides (root only)
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from rlstream.ops.bench.broker import Figure

HARNESS = """
import json, sys
job = json.loads(sys.stdin.read())
ns = {}
exec(job["code"], ns)
ok = 0
for test in job["tests"]:
    try:
        exec(test, ns)
        ok += 1
    except Exception:
        pass
print(ok)
"""


@dataclass
class Arm:
    isolation: str
    concurrent: int
    per_s: Figure = field(default_factory=Figure)
    latencies_ms: list[float] = field(default_factory=list)

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _jobs(n: int) -> list[tuple[str, list[str]]]:
    from rlstream.trainers.envs import get_task

    family, rng = get_task("fn"), random.Random(0)
    prompts = [family.generate(rng, rng.choice((1, 2))) for _ in range(n)]
    return [(p.text + p.answer, json.loads(p.metadata)["tests"]) for p in prompts]


def _in_process(code: str, tests: list[str]) -> int:
    namespace: dict = {}
    exec(code, namespace)  # the baseline: no isolation, on purpose
    passed = 0
    for test in tests:
        try:
            exec(test, namespace)
            passed += 1
        except Exception:  # noqa: BLE001  (a failing test)
            pass
    return passed


def _subprocess(code: str, tests: list[str]) -> int:
    done = subprocess.run([sys.executable, "-I", "-c", HARNESS], capture_output=True, text=True,
                          input=json.dumps({"code": code, "tests": tests}), timeout=30)  # fmt: skip
    return int(done.stdout.strip() or 0)


def sandbox_bench(isolations: list[str], concurrency: list[int], executions: int,
                  repeats: int) -> list[Arm]:  # fmt: skip
    """Every (isolation, concurrency) arm, `repeats` times, `executions` verifications each."""
    from rlstream.config import SandboxConfig
    from rlstream.sandbox import Sandbox

    jobs = _jobs(executions)
    arms = []
    for isolation in isolations:
        for n in concurrency:
            arm, sandbox = Arm(isolation, n), None
            if isolation in ("rlimits", "namespaces"):
                sandbox = Sandbox(SandboxConfig(workers=n, isolation=isolation))

                def verify(job, sandbox=sandbox):
                    run = sandbox.run(job[0], tests=job[1])
                    return sum(t["passed"] for t in run.tests)
            else:
                verify = _in_process if isolation == "in-process" else _subprocess
                verify = (lambda fn: lambda job: fn(*job))(verify)

            def timed(job, verify=verify):
                started = time.perf_counter()
                passed = verify(job)
                return passed, (time.perf_counter() - started) * 1000

            with ThreadPoolExecutor(n) as pool:
                list(pool.map(timed, jobs[: 2 * n]))  # warm: servers started, imports done
                for _ in range(repeats):
                    started = time.perf_counter()
                    results = list(pool.map(timed, jobs))
                    arm.per_s.values.append(len(jobs) / (time.perf_counter() - started))
                    arm.latencies_ms += [ms for _, ms in results]
                    if any(passed != 5 for passed, _ in results):
                        raise RuntimeError(f"{isolation}: a correct solution failed its tests")
            if sandbox is not None:
                sandbox.close()
            arms.append(arm)
    return arms
