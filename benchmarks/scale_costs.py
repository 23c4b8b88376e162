"""Per-event and per-version costs, measured here, behind the scale estimate (docs/scale.md).

    rlstream stack up    # part 2 uploads to its S3 server
    python benchmarks/scale_costs.py [--repeats 5] [--presets tiny,qwen2-0.5b]

1. Events: one group's rollouts (G = 8 rows, 256-token prompts) and experience messages with
   completions of T = 256, 1,024 and 4,096 tokens (token ids drawn over a 151,936 vocabulary,
   Qwen2's; float32 logprobs), encoded as the loop encodes them (Arrow IPC, `schemas.codec`):
   bytes per message and per completion token, encode and decode time per message.
2. Weight sync: a policy version from the trainer's hands to a worker's, by model size (presets
   from scratch, fp32 on CPU): `upload_policy` (save as a Hugging Face directory, put to S3),
   then `fetch_policy` (get, load), median of repeats, with the bytes and MB/s.

Prints tables; writes benchmarks/results/scale-costs.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlstream.schemas import decode, get, rows_to_batch  # noqa: E402
from rlstream.schemas.codec import encode  # noqa: E402

VOCAB, PROMPT, GROUP = 151_936, 256, 8


def _rows(event: str, completion: int, rng: random.Random) -> list[dict]:
    prompt_tokens = [rng.randrange(VOCAB) for _ in range(PROMPT)]
    rows = []
    for k in range(GROUP):
        tokens = [rng.randrange(VOCAB) for _ in range(completion)]
        row = {"request_id": "req-000001", "prompt_id": "p-000001", "sample_idx": k,
               "group_size": GROUP, "task": "gsm8k", "prompt_text": "x" * PROMPT * 4,
               "prompt_tokens": prompt_tokens, "completion": "y" * completion * 4,
               "completion_tokens": tokens, "answer": "42", "finish_reason": "length",
               "logprobs": [-rng.random() * 3 for _ in tokens], "worker_id": "w1"}  # fmt: skip
        if event == "experience":
            row |= {"reward": float(k % 2), "correct": bool(k % 2)}
        rows.append(row)
    return rows


def _median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def events(repeats: int) -> list[dict]:
    rng, out = random.Random(0), []
    for name in ("rollouts", "experience"):
        event = get(name)
        for completion in (256, 1024, 4096):
            rows = _rows(name, completion, rng)
            keep = {f.name for f in event.schema}
            rows = [{k: v for k, v in r.items() if k in keep} for r in rows]
            batch = rows_to_batch(event, rows, run_id="scale", policy_version=1)
            value, headers = encode(event, batch)
            enc = _median_s(lambda b=batch, e=event: encode(e, b), repeats)
            dec = _median_s(lambda v=value, h=headers: decode(v, h), repeats)
            per_token = round(len(value) / (GROUP * completion), 2)
            out.append({"event": name, "completion_tokens": completion, "rows": GROUP,
                        "bytes": len(value), "bytes_per_completion_token": per_token,
                        "encode_ms": round(enc * 1e3, 3),
                        "decode_ms": round(dec * 1e3, 3)})  # fmt: skip
    return out


def weight_sync(presets: list[str], repeats: int) -> list[dict]:
    import tempfile

    from rlstream.config import load_config
    from rlstream.connectors.endpoints import Endpoints
    from rlstream.connectors.objectstore import ObjectStore
    from rlstream.streams.policystore import fetch_policy, preload, upload_policy
    from rlstream.trainers.core import TrainState

    preload()
    store, out = ObjectStore(Endpoints.from_env()), []
    for name in presets:
        cfg = load_config(None, [f"model.path=preset:{name}", "model.backend=torch"])
        policy = TrainState(cfg, threads=2).policy()
        params = sum(p.numel() for p in policy.model.parameters())
        prefix = f"scale-costs/{name}/"
        ups, gets = [], []
        for _ in range(repeats):
            started = time.perf_counter()
            upload_policy(store, prefix, policy)
            ups.append(time.perf_counter() - started)
            started = time.perf_counter()
            fetch_policy(store, f"s3://{store.bucket}/{prefix}")
            gets.append(time.perf_counter() - started)
        with tempfile.TemporaryDirectory() as d:
            from rlstream.trainers.policy import save_policy

            size = sum(p.stat().st_size for p in save_policy(policy, d).iterdir())
        up, get_ = statistics.median(ups), statistics.median(gets)
        out.append({"preset": name, "parameters": params, "bytes": size,
                    "upload_s": round(up, 2), "upload_spread_s": round(max(ups) - min(ups), 2),
                    "fetch_load_s": round(get_, 2),
                    "fetch_spread_s": round(max(gets) - min(gets), 2),
                    "publish_to_loaded_s": round(up + get_, 2),
                    "mb_per_s": round(size / 1e6 / (up + get_), 1)})  # fmt: skip
        print(f"  {name}: {params / 1e6:.1f} M parameters, {size / 1e6:.0f} MB, "
              f"{up + get_:.2f} s", flush=True)  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--presets", default="tiny,qwen2-0.5b")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/scale-costs.json")
    args = ap.parse_args()
    ev = events(args.repeats)
    print("| event | completion tokens | bytes/message (8 rows) | bytes/token | encode ms | "
          "decode ms |\n|---|---|---|---|---|---|")  # fmt: skip
    for r in ev:
        print(
            f"| {r['event']} | {r['completion_tokens']} | {r['bytes']:,} | "
            f"{r['bytes_per_completion_token']} | {r['encode_ms']} | {r['decode_ms']} |"
        )
    print(f"weight sync ({args.repeats} repeats)")
    ws = weight_sync(args.presets.split(","), args.repeats)
    print("| preset | parameters | bytes | upload s | fetch+load s | publish to loaded s | "
          "MB/s |\n|---|---|---|---|---|---|---|")  # fmt: skip
    for r in ws:
        print(
            f"| {r['preset']} | {r['parameters'] / 1e6:.1f} M | {r['bytes'] / 1e6:.0f} MB | "
            f"{r['upload_s']} (±{r['upload_spread_s']}) | {r['fetch_load_s']} "
            f"(±{r['fetch_spread_s']}) | {r['publish_to_loaded_s']} | {r['mb_per_s']} |"
        )
    args.out.write_text(json.dumps({"events": ev, "weight_sync": ws}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
