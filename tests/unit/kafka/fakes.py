"""Stand-ins for aiokafka's records and consumer, for testing the reader engine with no broker.

They do only what the engine asks of them: a record has the fields :class:`KafkaMessage` reads;
a consumer assigns, seeks, fetches in order from an in-memory log (waiting for new records up
to the fetch timeout, like a long poll) and answers offset lookups. A read from an offset that
retention deleted raises aiokafka's own ``OffsetOutOfRangeError``, shaped as aiokafka raises it.
A :class:`FakeCluster` holds several topics for the consumers of a shared reader. The
real-broker tests in this folder cover aiokafka itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import OffsetOutOfRangeError

from airflow_deferrable_kit._kafka.messages import MATCHERS, MatchSpec
from airflow_deferrable_kit.conditions import ConditionSet

BASE_TIMESTAMP = 1_700_000_000_000


@dataclasses.dataclass(frozen=True)
class FakeRecord:
    """The fields of aiokafka's ``ConsumerRecord`` that the engine reads."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]] = ()


def record(value: bytes | None, *, key: bytes | None = b"k", headers: Any = (), offset: int = 0) -> FakeRecord:
    """A record of topic ``t``, partition 0."""
    return FakeRecord("t", 0, offset, BASE_TIMESTAMP, key, value, tuple(headers))


def spec(acceptors: list[dict[str, Any]], predicate: str | None = None, value_format: str = "json") -> MatchSpec:
    """A wait's condition from canonical acceptors, as the trigger builds it."""
    return MatchSpec(ConditionSet.load(acceptors, predicate, matchers=MATCHERS), value_format)


@dataclasses.dataclass(frozen=True)
class OffsetAndTimestamp:
    offset: int
    timestamp: int


class FakeCluster:
    """Topics (each a :class:`FakeLog`) and the consumers reading them."""

    def __init__(self) -> None:
        self.logs: dict[str, FakeLog] = {}
        self.consumers: list[FakeConsumer] = []
        self._appended: list[asyncio.Future[None]] = []

    def add(self, topic: str, partitions: int = 1) -> FakeLog:
        log = self.logs[topic] = FakeLog(topic, partitions, cluster=self)
        return log

    def appended(self) -> None:
        for waiting in self._appended:
            if not waiting.done():
                waiting.set_result(None)
        self._appended.clear()

    async def wait_for_append(self, timeout: float) -> None:
        waiting = asyncio.get_running_loop().create_future()
        self._appended.append(waiting)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(waiting, timeout)


class FakeLog:
    """One topic's partitions as lists of records; tests append, consumers read."""

    def __init__(self, topic: str = "t", partitions: int = 1, *, cluster: FakeCluster | None = None) -> None:
        self.topic = topic
        self.records: list[list[FakeRecord]] = [[] for _ in range(partitions)]
        #: Per partition, the oldest offset retention has kept.
        self.begin = [0] * partitions
        if cluster is None:
            cluster = FakeCluster()
            cluster.logs[topic] = self
        self.cluster = cluster

    def tp(self, partition: int) -> TopicPartition:
        return TopicPartition(self.topic, partition)

    def append(
        self, partition: int, *, key: str | None = None, value: bytes = b"{}", timestamp: int | None = None
    ) -> FakeRecord:
        offset = len(self.records[partition])
        stamp = BASE_TIMESTAMP + offset if timestamp is None else timestamp
        added = FakeRecord(self.topic, partition, offset, stamp, None if key is None else key.encode(), value)
        self.records[partition].append(added)
        self.cluster.appended()
        return added

    def delete_before(self, partition: int, offset: int) -> None:
        """Retention: offsets below ``offset`` are gone."""
        self.begin[partition] = offset

    def end(self, partition: int) -> int:
        return len(self.records[partition])

    @property
    def consumers(self) -> list[FakeConsumer]:
        return self.cluster.consumers


class FakeConsumer:
    """Stands in for ``AIOKafkaConsumer`` as far as the reader and its passes use it."""

    def __init__(self, source: FakeLog | FakeCluster, *, batch: int = 7) -> None:
        self.cluster = source.cluster if isinstance(source, FakeLog) else source
        self.batch = batch
        self.positions: dict[TopicPartition, int] = {}
        self.fetches = 0
        self.stopped = False
        #: Set by a test to make the next fetch fail with it.
        self.fail_with: BaseException | None = None

    # ------------------------------------------------------------------- fetching
    def assign(self, tps: Iterable[TopicPartition]) -> None:
        tps = list(tps)
        self.positions = {tp: self.positions.get(tp, 0) for tp in tps}

    def assignment(self) -> set[TopicPartition]:
        return set(self.positions)

    def unsubscribe(self) -> None:
        self.positions = {}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        assert tp in self.positions, f"seek on unassigned {tp}"
        self.positions[tp] = offset

    async def getmany(self, *, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[FakeRecord]]:
        await asyncio.sleep(0)  # a fetch is a round trip: other tasks run meanwhile
        self.fetches += 1
        if self.fail_with is not None:
            raise self.fail_with
        batch = self._take(min(max_records, self.batch))
        if not batch:
            await self.cluster.wait_for_append(timeout_ms / 1000)
            batch = self._take(min(max_records, self.batch))
        return batch

    def _log(self, tp: TopicPartition) -> FakeLog:
        return self.cluster.logs[tp.topic]

    def _take(self, limit: int) -> dict[TopicPartition, list[FakeRecord]]:
        for tp, position in self.positions.items():
            if position < self._log(tp).begin[tp.partition]:
                raise OffsetOutOfRangeError({tp: position})
        batch: dict[TopicPartition, list[FakeRecord]] = {}
        for tp, position in self.positions.items():
            taken = self._log(tp).records[tp.partition][position : position + limit]
            if taken:
                batch[tp] = taken
                self.positions[tp] = taken[-1].offset + 1
                limit -= len(taken)
            if limit <= 0:
                break
        return batch

    # ------------------------------------------------------------------- lookups
    async def beginning_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self._log(tp).begin[tp.partition] for tp in tps}

    async def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self._log(tp).end(tp.partition) for tp in tps}

    async def offsets_for_times(self, times: dict[TopicPartition, int]) -> dict[TopicPartition, Any]:
        found: dict[TopicPartition, Any] = {}
        for tp, wanted in times.items():
            log = self._log(tp)
            kept = log.records[tp.partition][log.begin[tp.partition] :]
            hit = next((r for r in kept if r.timestamp >= wanted), None)
            found[tp] = None if hit is None else OffsetAndTimestamp(hit.offset, hit.timestamp)
        return found

    async def stop(self) -> None:
        self.stopped = True
