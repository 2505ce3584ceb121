"""Where a Kafka wait starts and what it may leave behind: start offsets, log ends, commits.

Everything here asks through an *offsets source*: anything with aiokafka's consumer lookups
(``beginning_offsets``, ``end_offsets``, ``offsets_for_times``). A started consumer is one (the
poke path, the worker's one-off lookups); the shared reader's batcher is another, so thousands
of waits starting at once share a few broker round trips.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from airflow_deferrable_kit._kafka import settings
from airflow_deferrable_kit._kafka.consumers import (
    describe_topics,
    out_of_range_offsets,
    start_admin,
    start_consumer,
)
from airflow_deferrable_kit._kafka.gate import ConnectGates
from airflow_deferrable_kit._kafka.settings import load_options
from airflow_deferrable_kit.errors import ErrorType, TransientError

if TYPE_CHECKING:
    from aiokafka import TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

log = logging.getLogger(__name__)


#: A group's committed offsets for some partitions (-1 where it has none).
CommittedLookup = Callable[[list["TopicPartition"]], Awaitable[dict["TopicPartition", int]]]
#: Per-partition offsets as they travel in trigger kwargs: ``{topic: {"<partition>": offset}}``
#: (JSON object keys are strings).
StartOffsets = Mapping[str, Mapping[str, int]]


class OffsetsSource(Protocol):
    """The offset lookups of an aiokafka consumer (which is one)."""

    async def beginning_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]: ...

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]: ...

    async def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, Any]: ...


class CommittedOffsets:
    """Reads consumer groups' committed offsets through one admin client, started on first use.

    Read-only: no group join, no commit. Call :meth:`close` when done.
    """

    def __init__(self, options: Mapping[str, Any], gates: ConnectGates | None = None) -> None:
        self._options = options
        self._gates = gates
        self._admin: AIOKafkaAdminClient | None = None
        self._lock = asyncio.Lock()

    async def __call__(self, group_id: str, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """``group_id``'s committed offsets for ``tps`` (-1 where it has none)."""
        async with self._lock:
            if self._admin is None:
                self._admin = await start_admin(self._options, topics={tp.topic for tp in tps}, gates=self._gates)
        offsets = await self._admin.list_consumer_group_offsets(group_id, partitions=list(tps))
        return {tp: int(offsets[tp].offset) if tp in offsets and offsets[tp] is not None else -1 for tp in tps}

    async def close(self) -> None:
        if self._admin is not None:
            admin, self._admin = self._admin, None
            await admin.close()


async def resolve_start(
    source: OffsetsSource,
    tps: list[TopicPartition],
    *,
    start_from: str,
    start_after_ms: int | None,
    committed: CommittedLookup | None = None,
    start_offsets: StartOffsets | None = None,
) -> dict[TopicPartition, int]:
    """The first offset to look at in each partition for this start rule.

    ``timestamp`` with ``start_offsets``: those offsets (see :func:`from_start_offsets`).
    ``timestamp`` without: the first message stamped at or after ``start_after_ms`` (the end
    offsets are read *before* the time lookup, so a "not found" answer can safely mean "the end").
    ``committed``: the group's committed offset; partitions without one use the timestamp rule.
    """
    if not tps:
        return {}
    if start_from == "earliest":
        return {tp: int(offset) for tp, offset in (await source.beginning_offsets(tps)).items()}
    if start_from == "timestamp" and start_offsets is not None:
        return await from_start_offsets(source, tps, start_offsets)
    result: dict[TopicPartition, int] = {}
    todo = list(tps)
    if start_from == "committed" and committed is not None:
        for tp, offset in (await committed(todo)).items():
            if offset >= 0:
                result[tp] = offset
        todo = [tp for tp in todo if tp not in result]
    if todo:
        ends = await source.end_offsets(todo)
        found = await source.offsets_for_times(dict.fromkeys(todo, int(start_after_ms or 0)))
        for tp in todo:
            hit = found.get(tp)
            # Apache Kafka answers "no such message" with None; some brokers with timestamp -1.
            if hit is None or hit.offset is None or hit.offset < 0 or hit.timestamp is None or hit.timestamp < 0:
                result[tp] = int(ends[tp])
            else:
                result[tp] = int(hit.offset)
    return result


async def from_start_offsets(
    source: OffsetsSource, tps: list[TopicPartition], start_offsets: StartOffsets
) -> dict[TopicPartition, int]:
    """Where each partition starts given the log end offsets fixed when the task first deferred.

    A partition listed there starts at its offset; one that is not (added since, or its whole
    topic appeared since) holds only newer messages and starts at its beginning. Record
    timestamps play no part. An offset the log no longer covers is moved into it: up to the
    oldest retained one (retention deleted the rest), or down to the log end (the log was cut
    back, or the topic recreated), so the wait neither fails nor skips what comes next.
    """
    begins = await source.beginning_offsets(tps)
    ends = await source.end_offsets(tps)
    result: dict[TopicPartition, int] = {}
    for tp in tps:
        begin, end = int(begins[tp]), int(ends[tp])
        fixed = start_offsets.get(tp.topic, {}).get(str(tp.partition))
        if fixed is None:
            result[tp] = begin
            continue
        if not begin <= fixed <= end:
            log.warning(
                "%s[%d]: start offset %d is outside the log (%d..%d); starting at %d",
                tp.topic,
                tp.partition,
                fixed,
                begin,
                end,
                min(max(fixed, begin), end),
            )
        result[tp] = min(max(fixed, begin), end)
    return result


async def log_end_offsets(kafka_conn_id: str, topics: list[str]) -> dict[str, dict[str, int]]:
    """The log end offset of every partition of every topic now, as trigger kwargs carry them.

    Topics that do not exist are left out (with ``wait_for_topic`` they are read from their
    beginning when they appear). A short-lived group-less consumer, bounded in time, for the
    worker to fix "every message from now on" before it defers. Never creates a topic, and asks
    the broker about these topics only.
    """
    from aiokafka import TopicPartition

    async def lookup() -> dict[str, dict[str, int]]:
        options = await load_options(kafka_conn_id)
        consumer = await start_consumer(options, topics=topics, metadata_max_age_ms=300_000)
        try:
            answer = describe_topics(consumer, topics)
            answer.raise_unauthorized()
            tps = [TopicPartition(t, p) for t, parts in sorted(answer.partitions.items()) for p in sorted(parts)]
            ends = await consumer.end_offsets(tps) if tps else {}
            result: dict[str, dict[str, int]] = {}
            for tp, offset in sorted(ends.items()):
                result.setdefault(tp.topic, {})[str(tp.partition)] = int(offset)
            return result
        finally:
            await consumer.stop()

    try:
        return await asyncio.wait_for(lookup(), settings.LOG_END_LOOKUP_SECONDS)
    except asyncio.TimeoutError as exc:
        raise TransientError(
            f"kafka_conn_id={kafka_conn_id!r}: no answer within "
            f"{settings.LOG_END_LOOKUP_SECONDS:.0f}s looking up the log end",
            error_type=ErrorType.UNAVAILABLE,
        ) from exc


async def clamp_to_log(source: OffsetsSource, exc: Exception) -> dict[TopicPartition, int]:
    """Where reads that fell outside the log resume: the oldest retained offset when retention
    deleted the position, the log end when the position lies beyond it (the log was cut back)."""
    positions = out_of_range_offsets(exc)
    tps = list(positions)
    if not tps:
        return {}
    begins = await source.beginning_offsets(tps)
    ends = await source.end_offsets(tps)
    targets: dict[TopicPartition, int] = {}
    for tp, offset in positions.items():
        begin, end = int(begins[tp]), int(ends[tp])
        if offset < begin:
            log.warning(
                "%s[%d]: offsets %d..%d were deleted before they were read", tp.topic, tp.partition, offset, begin
            )
        targets[tp] = begin if offset < begin else min(offset, end)
    return targets


async def commit_offset(*, kafka_conn_id: str, group_id: str, topic: str, partition: int, offset: int) -> None:
    """Commit ``offset + 1`` for one partition to ``group_id`` (the matched message is consumed).

    Runs where the sensor resumes, after Airflow has stored the event: a crash before this line
    means the message is found again (at-least-once), never lost. No group join: a manual
    assignment commits as a "simple" consumer, so the group should not have live members.
    """
    from aiokafka import TopicPartition
    from aiokafka.structs import OffsetAndMetadata

    options = await load_options(kafka_conn_id)
    consumer = await start_consumer(options, topics=[topic], metadata_max_age_ms=300_000, group_id=group_id)
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        await consumer.commit({tp: OffsetAndMetadata(offset + 1, "airflow-deferrable-kit")})
    finally:
        await consumer.stop()


def group_by_partition(requests: Iterable[tuple[TopicPartition, int]]) -> list[dict[TopicPartition, int]]:
    """Split (partition, timestamp) requests into rounds that name each partition once.

    ``offsets_for_times`` takes one timestamp per partition; waits on the same partition with
    different start moments need one round each.
    """
    rounds: list[dict[TopicPartition, int]] = []
    for tp, timestamp in requests:
        for round_ in rounds:
            if tp not in round_:
                round_[tp] = timestamp
                break
            if round_[tp] == timestamp:
                break
        else:
            rounds.append({tp: timestamp})
    return rounds


__all__ = [
    "CommittedLookup",
    "CommittedOffsets",
    "OffsetsSource",
    "StartOffsets",
    "clamp_to_log",
    "commit_offset",
    "from_start_offsets",
    "group_by_partition",
    "log_end_offsets",
    "resolve_start",
]
