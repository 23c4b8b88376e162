"""`rlstream bench broker`: the codec's cost through the real broker, against raw bytes.

One run measures, on fresh topics, produce+consume throughput of 64-row rollout events through
codec and broker (encode before send, decode after receive) next to raw bytes of the same sizes
through the same broker, alternating the two arms across repeats; and the codec alone on one
core (encode and decode of the same batch, Arrow threads off). Each figure is a median with its
min and max over repeats; the ratio is codec+broker over raw bytes.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
import uuid
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from aiokafka import TopicPartition
from aiokafka.admin import NewTopic

from rlstream.connectors.endpoints import Endpoints
from rlstream.connectors.kafka import admin, consumer, producer
from rlstream.schemas import decode, encode, get, rows_to_batch

ROLLOUTS = get("rollouts")
PARTITIONS = 4


def rollout_batch(rows: int = 64, completion_tokens: int = 48, seed: int = 0) -> pa.RecordBatch:
    """A realistic rollout group batch: G completions of one prompt with tokens and logprobs."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(rows):
        n = int(rng.integers(completion_tokens // 2, completion_tokens + 1))
        out.append(
            {
                "request_id": f"req-{seed}",
                "prompt_id": f"prompt-{seed}",
                "sample_idx": i,
                "group_size": rows,
                "task": "add",
                "prompt_text": "012+034=",
                "answer": "12345",
                "prompt_tokens": rng.integers(0, 64, 16).tolist(),
                "completion": "".join(rng.choice(list("0123456789+-="), n)),
                "completion_tokens": rng.integers(0, 64, n).tolist(),
                "logprobs": (-rng.random(n)).astype(np.float32).tolist(),
                "finish_reason": "stop",
                "worker_id": "bench",
            }
        )
    return rows_to_batch(ROLLOUTS, out, run_id="bench")


@dataclass
class Figure:
    values: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def spread(self) -> str:
        return f"{min(self.values):,.0f}-{max(self.values):,.0f}"


def codec_rates(batch: pa.RecordBatch, iterations: int) -> tuple[float, float]:
    """(encode rows/s, decode rows/s) for `iterations` round trips of `batch` on this thread."""
    started = time.perf_counter()
    encoded = [encode(ROLLOUTS, batch) for _ in range(iterations)]
    encode_s = time.perf_counter() - started
    started = time.perf_counter()
    for value, headers in encoded:
        decode(value, headers)
    decode_s = time.perf_counter() - started
    rows = batch.num_rows * iterations
    return rows / encode_s, rows / decode_s


async def _pipeline(endpoints: Endpoints, topic: str, values, headers, use_codec, batch) -> float:
    """Seconds to produce `len(values)` messages and consume them all (concurrently)."""
    n = len(values)
    c = consumer(endpoints, fetch_max_wait_ms=20)
    p = producer(endpoints)
    await asyncio.gather(c.start(), p.start())
    try:
        tps = [TopicPartition(topic, i) for i in range(PARTITIONS)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)

        async def produce() -> None:
            futures = []
            for i in range(n):
                value = encode(ROLLOUTS, batch)[0] if use_codec else values[i]
                futures.append(await p.send(topic, value, partition=i % PARTITIONS,
                                            headers=headers))  # fmt: skip
            await asyncio.gather(*futures)

        async def consume() -> None:
            seen = 0
            while seen < n:
                for records in (await c.getmany(timeout_ms=200)).values():
                    for r in records:
                        if use_codec:
                            decode(r.value, r.headers)
                    seen += sum(1 for _ in records)

        started = time.perf_counter()
        await asyncio.gather(produce(), consume())
        return time.perf_counter() - started
    finally:
        await asyncio.gather(c.stop(), p.stop())


async def broker_bench(
    endpoints: Endpoints, *, messages: int = 2000, repeats: int = 5, rows: int = 64
) -> dict:
    batch = rollout_batch(rows)
    value, headers = encode(ROLLOUTS, batch)
    raw_values = [os.urandom(len(value)) for _ in range(64)]
    raw_values = [raw_values[i % 64] for i in range(messages)]
    client = admin(endpoints)
    await client.start()
    arms = {"codec+broker": Figure(), "raw bytes": Figure()}
    try:
        for repeat in range(repeats):
            order = (
                ["codec+broker", "raw bytes"] if repeat % 2 == 0 else ["raw bytes", "codec+broker"]
            )
            for arm in order:
                topic = f"bench.{arm.split('+')[0].split()[0]}.{uuid.uuid4().hex[:8]}"
                await client.create_topics(
                    [NewTopic(topic, PARTITIONS, endpoints.replication_factor)]
                )
                use_codec = arm == "codec+broker"
                # Both arms carry the same headers: the comparison isolates encode + decode.
                seconds = await _pipeline(endpoints, topic, raw_values, headers, use_codec, batch)
                arms[arm].values.append(messages * rows / seconds)
                await client.delete_topics([topic])
    finally:
        await client.close()
    return {"arms": arms, "message_bytes": len(value), "rows": rows, "messages": messages}


def codec_bench(repeats: int = 5, iterations: int = 3000, rows: int = 64) -> dict:
    batch = rollout_batch(rows)
    enc, dec = Figure(), Figure()
    for _ in range(repeats):
        e, d = codec_rates(batch, iterations)
        enc.values.append(e)
        dec.values.append(d)
    return {"encode": enc, "decode": dec}
