"""Training and sampling throughput against bare torch / generate; as `rlstream bench train`.

python benchmarks/bench_train.py --repeats 5 [--device cuda] [--json out.json]
"""

import argparse
import json

from rlstream.trainers.bench import print_table, run_bench

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="auto")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--model", default="preset:tiny")
    p.add_argument("--json")
    a = p.parse_args()
    res = run_bench(a.repeats, a.threads, a.device, a.batch_size, a.model)
    print_table(res)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
