"""faust apps built by make_app use the short-fetch transport and keep data out of the cwd."""

from __future__ import annotations

import asyncio
import time

from rlstream.connectors.endpoints import Endpoints
from rlstream.streams import transport
from rlstream.streams.app import make_app


def test_faust_worker_consumers_park_fetches_briefly(tmp_path, monkeypatch):
    monkeypatch.setenv("RLSTREAM_FAUST_DIR", str(tmp_path / "run" / "faust"))
    app = make_app("unit-transport", Endpoints(kafka_bootstrap="127.0.0.1:9"))
    assert isinstance(app.transport, transport.Transport)
    assert app.conf.datadir == tmp_path / "run" / "faust" / "unit-transport-data"
    app.conf.datadir.mkdir()  # what faust does on start: only the last level

    async def build():  # aiokafka clients are built inside a running loop; nothing connects
        async def noop(*args):
            return None

        consumer = app.transport.create_consumer(
            callback=noop, on_partitions_revoked=noop, on_partitions_assigned=noop
        )
        thread = consumer._new_consumer_thread()
        assert isinstance(thread, transport.ConsumerThread)
        client = thread._create_worker_consumer(app.transport)
        return client._fetch_max_wait_ms

    # faust's own driver would say 1500 (Tansu then parks each fetch ~380 ms at the median)
    assert asyncio.run(build()) == transport.FETCH_MAX_WAIT_MS == 50


def test_a_hole_below_the_acked_offsets_is_found_unless_the_log_lacks_those_offsets():
    from intervaltree import IntervalTree

    none = IntervalTree()
    assert not transport.hole_below(5, 5, none)  # the lowest acked is the next to read
    assert not transport.hole_below(5, None, none)  # nothing known below
    assert transport.hole_below(6, 5, none)  # one message: faust's own check lets it through
    assert transport.hole_below(9, 5, none)
    assert not transport.hole_below(9, 5, IntervalTree.from_tuples([(5, 9)]))  # not in the log
    assert transport.hole_below(9, 5, IntervalTree.from_tuples([(5, 8)]))


def test_commits_stop_below_a_message_no_agent_acked(tmp_path, monkeypatch):
    """faust commits past a single skipped message and past any before its first commit."""
    from faust.types import TP

    monkeypatch.setenv("RLSTREAM_FAUST_DIR", str(tmp_path / "faust"))
    app = make_app("unit-commits", Endpoints(kafka_bootstrap="127.0.0.1:9"))
    tp = TP("rl.rollouts.v1", 0)

    async def offsets():
        async def noop(*args):
            return None

        consumer = app.transport.create_consumer(
            callback=noop, on_partitions_revoked=noop, on_partitions_assigned=noop
        )
        seen = []
        consumer._first_fetched[tp] = 0  # the first fetch started at the log's start
        consumer._acked[tp] = [0, 2, 3]  # offset 1 was skipped in a rebalance
        seen.append(consumer._new_offset(tp))  # offset 0 is done: next to read is 1
        consumer._committed_offset[tp] = seen[-1]
        seen.append(consumer._new_offset(tp))  # 2 and 3 wait for 1
        held = tp in consumer._held_since
        consumer._acked[tp].append(1)  # fetched again after the rebalance's seek
        seen.append(consumer._new_offset(tp))
        consumer._committed_offset[tp] = None  # before any commit: offset 0 skipped
        consumer._acked[tp] = [1, 2]
        seen.append(consumer._new_offset(tp))
        return seen, held

    assert asyncio.run(offsets()) == ([1, None, 4, None], True)


def test_a_hole_in_a_partition_a_rebalance_took_is_not_sought(tmp_path, monkeypatch):
    """Seeking a partition no longer assigned raises in faust's drain loop and crashes the
    worker: a held hole of a revoked partition is forgotten, and a seek that loses the race
    with a rebalance is let go."""
    from aiokafka.errors import IllegalStateError
    from aiokafka.structs import TopicPartition

    monkeypatch.setenv("RLSTREAM_FAUST_DIR", str(tmp_path / "faust"))
    app = make_app("unit-revoked", Endpoints(kafka_bootstrap="127.0.0.1:9"))
    kept, taken = TopicPartition("t", 0), TopicPartition("t", 1)
    sought = []

    async def run():
        async def noop(*args):
            return None

        consumer = app.transport.create_consumer(
            callback=noop, on_partitions_revoked=noop, on_partitions_assigned=noop
        )

        async def seek(tp, offset):
            if tp != kept:
                raise IllegalStateError(f"No current assignment for partition {tp}")
            sought.append((tp, offset))

        consumer.assignment = lambda: {kept}
        consumer.seek = seek
        long_ago = time.monotonic() - 2 * transport.RESEEK_AFTER_S
        consumer._held_since = {kept: (long_ago, 5), taken: (long_ago, 7)}
        await consumer._refetch_holes()
        assert consumer._held_since == {}  # kept was sought back; taken forgotten
        await consumer._seek_back(taken, 7)  # revoked between a check and the seek: no raise

    asyncio.run(run())
    assert sought == [(kept, 5)]
