"""faust's aiokafka transport, registered as the `rlkafka://` scheme, with three changes.

A short fetch wait. faust fixes the worker consumer's `fetch_max_wait_ms` at 1500. Tansu parks a
fetch with too little data for most of that wait instead of answering when a record arrives, so
each faust hop cost ~380 ms at the median (measured: one produce -> one fetch, p50 381 ms at
1500 ms against 4 ms at 100 ms). On a Kafka broker a shorter wait only means more, cheaper fetch
requests.

Changelog ends from a fetch. faust recovers a table by reading its changelog up to the
partitions' highwaters, which it takes from ListOffsets (`end_offsets`); Tansu answers those
short on s3 storage (INFRA.md), so a restarted assembler recovered its table without the last
writes and dropped the half-joined group they held, while the input offsets that had built it
were already committed (`rlstream chaos`: one group lost after a processors kill, on a durable
stack). Here the highwaters come from a fetch response, which is always right (on Apache
Kafka, whose ListOffsets is right, from ListOffsets as faust takes them).

Commits that never pass a message no agent acked. faust commits the first run of consecutive
acked offsets, and its check for an unacked head allows a hole of exactly one message
(`min(acked) - committed > 1`, where `committed` is already the next offset to read) and none at
all before the first commit (offset 0 reads as "no commit"). A stream skips the messages it
holds when a rebalance suspends flow control, and recovery resumes the flow for a moment to
read changelogs, so a later message can be processed and acked while the one before it was
skipped: the commit moved past it, the seek after recovery started beyond it, and it was lost
(`rlstream chaos`: a rollouts message never joined, the rewards for its group waiting in the
assembler's table for good). Here a commit stops below the lowest offset not acked, so the seek
to committed offsets after a rebalance fetches the skipped message again (a repeat of the ones
after it is harmless: every processor is idempotent by event id). Should a hole outlive
`RESEEK_AFTER_S` with no message in flight to fill it, the partition is sought back to it; so
is a partition whose messages since its last commit were all fetched and none served for that
long (a dropped message with nothing acked after it leaves no hole: a partition's only
rollouts message after a restart was never joined).

Such a drop is waited out for 10 s, not longer: a message is tracked as unacked when faust hands
it to its streams, so "fetched, none tracked, none acked" holds for a live worker only while the
one message being handed over waits for flow control or a full producer buffer; a seek then
fetches it again (a repeat, harmless). At 30 s, a restarted assembler that hit the drop (1 run
in 5 of the killed-assembler test) took 40 s to assemble its first group.
"""

from __future__ import annotations

import logging
import time

from aiokafka.errors import IllegalStateError
from faust.transport.drivers import TRANSPORTS
from faust.transport.drivers import aiokafka as driver

from rlstream.connectors.kafka import highwaters

log = logging.getLogger(__name__)

SCHEME = "rlkafka"
FETCH_MAX_WAIT_MS = 50
"""the longest a fetch with no new records is parked on the broker"""
RESEEK_AFTER_S = 10.0
"""how long a hole below the acked offsets, or fetched offsets none served, may stand before
they are fetched again (checked at each commit, every `commit_interval`)"""
ENDPOINTS_ATTR = "rlstream_endpoints"
"""the app attribute holding its Endpoints (`make_app` sets it), for the highwater fetches"""


def hole_below(lowest_acked: int, base: int | None, gaps) -> bool:
    """Whether an offset in [base, lowest_acked) is neither acked nor a known gap in the log.

    `base` is the next offset to read after the last commit (None when unknown); `gaps` holds
    faust's intervals of offsets the log does not have (an `IntervalTree`, ends excluded)."""
    if base is None or lowest_acked <= base:
        return False
    covered = set()
    for interval in gaps.overlap(base, lowest_acked):
        covered.update(range(max(interval.begin, base), min(interval.end, lowest_acked)))
    return len(covered) < lowest_acked - base


class ConsumerThread(driver.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport):
        consumer = super()._create_worker_consumer(transport)
        # read by AIOKafkaConsumer.start() when it builds its fetcher (not started yet here)
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS
        return consumer

    async def _highwaters(self, partitions):
        endpoints = getattr(self.app, ENDPOINTS_ATTR, None)
        if endpoints is None or endpoints.is_kafka or self.consumer.in_transaction:
            return await super()._highwaters(partitions)  # ListOffsets: right on Kafka
        return await highwaters(endpoints, list(partitions))


class Consumer(driver.Consumer):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._first_fetched: dict = {}  # tp -> lowest offset fetched: the base before a commit
        self._fetched_to: dict = {}  # tp -> highest offset fetched
        self._held_since: dict = {}  # tp -> (monotonic time a hole began holding commits, base)
        self._unserved_since: dict = {}  # tp -> (monotonic time, the unserved offsets)

    def _new_consumer_thread(self) -> ConsumerThread:
        return ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def getmany(self, timeout: float):
        first = self._first_fetched
        async for tp, message in super().getmany(timeout):
            if message.offset < first.get(tp, message.offset + 1):
                first[tp] = message.offset
            if self.app.topics.acks_enabled_for(tp.topic):  # a stream's, not a changelog's
                self._fetched_to[tp] = max(message.offset, self._fetched_to.get(tp, -1))
            yield tp, message

    def _base(self, tp) -> int | None:
        committed = self._committed_offset[tp]  # faust reads a commit at 0 as None
        return committed if committed is not None else self._first_fetched.get(tp)

    def _new_offset(self, tp):
        acked = self._acked[tp]
        if acked:
            base = self._base(tp)
            if hole_below(min(acked), base, self._gap[tp]):
                self._held_since.setdefault(tp, (time.monotonic(), base))
                return None
        self._held_since.pop(tp, None)
        return super()._new_offset(tp)

    async def commit(self, topics=None, start_new_transaction: bool = True) -> bool:
        committed = await super().commit(topics, start_new_transaction=start_new_transaction)
        await self._refetch_holes()
        await self._refetch_unserved()
        return committed

    def _unserved(self, tp) -> tuple[int, int] | None:
        """The offsets fetched from `tp` past its last commit when no agent holds any of them
        and none is acked: messages faust dropped while the flow was suspended with nothing
        acked after them, which the hole check never sees (a partition's only message)."""
        base, top = self._base(tp), self._fetched_to.get(tp)
        if base is None or top is None or top < base or self._acked[tp]:
            return None
        if any(m.tp == tp and base <= m.offset <= top for m in list(self._unacked_messages)):
            return None
        return base, top

    async def _refetch_unserved(self) -> None:
        now, assigned = time.monotonic(), self.assignment()
        for tp in list(self._fetched_to):
            span = self._unserved(tp) if tp in assigned else None
            since, seen = self._unserved_since.get(tp, (now, None))
            if span is None or span != seen:
                self._unserved_since.pop(tp, None)
                if span is not None:
                    self._unserved_since[tp] = (now, span)
                continue
            if now - since < RESEEK_AFTER_S:
                continue
            log.warning("offsets %d-%d of %s fetched, never served: fetching again", *span, tp)
            del self._unserved_since[tp], self._fetched_to[tp]
            await self._seek_back(tp, span[0])

    async def _refetch_holes(self) -> None:
        now, assigned = time.monotonic(), self.assignment()
        for tp, (since, base) in list(self._held_since.items()):
            if tp not in assigned:  # a rebalance took it: its new owner reads from the commit
                del self._held_since[tp]
                continue
            if now - since < RESEEK_AFTER_S:
                continue
            lowest = min(self._acked[tp], default=base)
            in_flight = any(
                m.tp == tp and base <= m.offset < lowest and not m.acked
                for m in list(self._unacked_messages)
            )
            if in_flight:
                continue
            log.warning("offsets %d-%d of %s never acked: fetching again", base, lowest - 1, tp)
            del self._held_since[tp]
            await self._seek_back(tp, base)

    async def _seek_back(self, tp, offset: int) -> None:
        """Seek `tp` back to `offset` unless a rebalance has taken it meanwhile: aiokafka
        raises IllegalStateError for a partition not assigned, which here is raised in faust's
        drain loop and crashes the worker (`rlstream chaos`: a rollout worker, once in 60
        faults, after a rebalance that revoked a partition holding a hole)."""
        try:
            await self.seek(tp, offset)
        except IllegalStateError:
            log.info("%s was revoked before it could be fetched again", tp)


class Transport(driver.Transport):
    Consumer = Consumer


TRANSPORTS.aliases.setdefault(SCHEME, f"{__name__}:Transport")
