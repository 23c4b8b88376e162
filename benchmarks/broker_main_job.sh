#!/usr/bin/env bash
# The main job (`rlstream run`, defaults) on each embedded broker, one after the other on the same
# machine, then a table: start-up, wall time, accuracy, the loop's memory and the broker's.
#   bash benchmarks/broker_main_job.sh [SEED] [OUT]
# writes benchmarks/results/main-job-<broker>.json (each run's summary) and main-job-brokers.json.
set -euo pipefail
cd "$(dirname "$0")/.."
seed="${1:-0}"
out="${2:-$(mktemp -d)}"
mkdir -p "$out"
for broker in tansu kafka; do
  RLSTREAM_HOME="$out/home-$broker" RLSTREAM_STACK_BROKER="$broker" CI=true \
    .venv/bin/python -m rlstream.cli run --seed "$seed" --out "$out" --run-id "main-$broker" \
    --summary "benchmarks/results/main-job-$broker.json" > "$out/main-$broker.log" 2>&1
done
.venv/bin/python - <<'PY'
import json
rows, keep = {}, {}
for broker in ("tansu", "kafka"):
    s = json.load(open(f"benchmarks/results/main-job-{broker}.json"))
    keep[broker] = {
        "startup_s": s["startup_s"], "wall_s": s["wall_s"],
        "pretrain_accuracy": s["pretrain_accuracy"], "final_accuracy": s["final_accuracy"],
        "loop_pss_mb": s["pss_mb_loop_total_end"], "broker_rss_mb": s["rss_mb_end"].get("broker"),
        "request_to_experience_p50_ms": s["request_to_experience_p50_ms"],
        "trainer_idle_share": s["trainer_idle_share"],
    }
print("| figure | Tansu | Apache Kafka (one node) |")
print("|---|---|---|")
for key in keep["tansu"]:
    print(f"| {key} | {keep['tansu'][key]} | {keep['kafka'][key]} |")
json.dump(keep, open("benchmarks/results/main-job-brokers.json", "w"), indent=2)
PY
