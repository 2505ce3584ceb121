"""The shared topic reader running on fake consumers (no broker): its loop, catch-up passes,
own-pace reads and errors. What aiokafka itself does is covered against tansu elsewhere here."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import TopicAuthorizationFailedError

from airflow_deferrable_kit import _kafka_reader
from airflow_deferrable_kit._kafka_fanout import Waiter
from airflow_deferrable_kit._kafka_messages import KafkaMessage, canonical_acceptors
from airflow_deferrable_kit._kafka_reader import TopicReader, read_on_own
from airflow_deferrable_kit.conditions import Decision
from tests.kafka.conftest import eventually
from tests.kafka.fakes import FakeConsumer, FakeLog, spec

PARTITIONS = 2


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> FakeLog:
    """A two-partition topic ``t``; every consumer the reader opens reads it."""
    log = FakeLog("t", partitions=PARTITIONS)

    async def open_consumer(options: Any) -> FakeConsumer:
        consumer = FakeConsumer(log)
        log.consumers.append(consumer)
        return consumer

    async def topic_partitions(consumer: Any, topic: str) -> set[int] | None:
        return set(range(PARTITIONS)) if topic == log.topic else None

    async def track_topic(consumer: Any, topic: str) -> None:
        return None

    monkeypatch.setattr(_kafka_reader, "open_consumer", open_consumer)
    monkeypatch.setattr(_kafka_reader, "topic_partitions", topic_partitions)
    monkeypatch.setattr(_kafka_reader, "track_topic", track_topic)
    monkeypatch.setattr(_kafka_reader, "FETCH_WAIT_MS", 20)
    return log


@pytest.fixture
async def reader(log: FakeLog) -> AsyncIterator[TopicReader]:
    reader = TopicReader("conn", log.topic, {})
    await reader.start()
    try:
        yield reader
    finally:
        await reader.close()


def collector(cursors: dict[int, int], reader: TopicReader | None = None) -> Waiter:
    """A wait whose predicate must see every message, starting at ``cursors`` (partition: offset).

    The engine only queues messages for a predicate (the trigger runs it), so the queue shows
    everything the wait was handed.
    """
    waiter = Waiter(
        spec([], predicate="tests.kafka.predicates:total_over_100"), start_from="earliest", start_after_ms=None
    )
    waiter.cursor = {TopicPartition("t", partition): offset for partition, offset in cursors.items()}
    if reader is not None:
        waiter.readers[reader.topic] = reader
    return waiter


def seen(waiter: Waiter) -> dict[int, list[int]]:
    found: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    for message, _, _ in waiter.queue:
        found[message.partition].append(message.offset)
    return found


def fill(log: FakeLog, count: int) -> None:
    for n in range(count):
        log.append(n % PARTITIONS, key=f"k{n}")


def join(waiter: Waiter, reader: TopicReader) -> None:
    """What the trigger does on joining a topic: attach, or have the reader catch the wait up."""
    if not waiter.try_attach(reader.topic):
        reader.catch_up(waiter)


# ------------------------------------------------------------------------------ live
async def test_the_reader_starts_at_the_log_end_and_hands_live_messages_to_the_waits_that_match(
    log: FakeLog,
) -> None:
    fill(log, 6)  # before the reader: not handed to anyone
    reader = TopicReader("conn", log.topic, {})
    await reader.start()
    try:
        assert reader.positions == {log.tp(0): 3, log.tp(1): 3}
        wanted = Waiter(spec(canonical_acceptors(success=[{"key": "k7"}])), start_from="earliest", start_after_ms=None)
        wanted.readers["t"] = reader
        everything = collector({0: 3, 1: 3}, reader)
        assert wanted.try_attach("t") and everything.try_attach("t")
        fill(log, 10)  # offsets 3..7 in each partition of keys k0..k9: k7 lands in partition 1
        await eventually(lambda: sum(reader.positions.values()) == 16)
        assert [(m.partition, m.offset, m.key) for m, _, _ in wanted.queue] == [(1, 6, b"k7")]
        assert wanted.finished and wanted not in reader.waiters()
        assert seen(everything) == {0: [3, 4, 5, 6, 7], 1: [3, 4, 5, 6, 7]}
    finally:
        await reader.close()
    assert all(consumer.stopped for consumer in log.consumers) and len(log.consumers) == 2


async def test_a_late_wait_is_caught_up_by_a_shared_pass_and_handed_over_without_loss_or_double(
    log: FakeLog, reader: TopicReader
) -> None:
    fill(log, 80)  # the reader reads these live, before the waits below arrive
    await eventually(lambda: sum(reader.positions.values()) == 80)
    from_start = collector({0: 0, 1: 0}, reader)
    from_middle = collector({0: 12, 1: 5}, reader)
    join(from_start, reader)
    join(from_middle, reader)
    assert "t" not in from_start.attached and "t" not in from_middle.attached

    during_the_pass = 0
    for n in range(80, 140):  # the live stream goes on while the pass reads the gap
        log.append(n % PARTITIONS)
        during_the_pass += reader.catching_up is not None
        await asyncio.sleep(0)
    assert during_the_pass >= 5  # so the hand-over happened with the reader moving
    await eventually(lambda: all(w.attached.get("t") is reader for w in (from_start, from_middle)))
    fill(log, 20)  # and after the hand-over, from the reader alone
    await eventually(lambda: sum(reader.positions.values()) == 160)
    assert seen(from_start) == {0: list(range(80)), 1: list(range(80))}
    assert seen(from_middle) == {0: list(range(12, 80)), 1: list(range(5, 80))}
    assert from_start.stats()["examined"] == 160 and from_middle.stats()["examined"] == 143
    assert reader.passes == 1 and len(log.consumers) == 3  # one catch-up consumer for both waits


async def test_a_wait_that_is_released_stops_receiving(log: FakeLog, reader: TopicReader) -> None:
    waiter = collector({0: 0, 1: 0}, reader)
    join(waiter, reader)
    fill(log, 4)
    await eventually(lambda: sum(len(v) for v in seen(waiter).values()) == 4)
    waiter.detach("t")
    fill(log, 4)
    await eventually(lambda: sum(reader.positions.values()) == 8)
    assert seen(waiter) == {0: [0, 1], 1: [0, 1]}


async def test_a_reader_whose_position_was_deleted_resumes_at_the_oldest_retained_offset(
    log: FakeLog, reader: TopicReader
) -> None:
    waiter = collector({0: 0, 1: 0}, reader)
    join(waiter, reader)
    for _ in range(10):
        log.append(0)
    log.delete_before(0, 6)  # retention ran before the reader fetched
    await eventually(lambda: reader.positions[log.tp(0)] == 10)
    assert seen(waiter) == {0: [6, 7, 8, 9], 1: []}


async def test_a_fatal_error_reaches_every_wait(log: FakeLog, reader: TopicReader) -> None:
    waiter = collector({0: 0, 1: 0}, reader)
    join(waiter, reader)
    log.consumers[0].fail_with = TopicAuthorizationFailedError()
    await eventually(lambda: reader.fatal is not None)
    assert reader.fatal is not None and reader.fatal.error_type == "authorization"
    assert waiter.wake.is_set()


# ------------------------------------------------------------------------- own pace
async def test_an_own_pace_read_stops_at_the_first_outcome_and_resumes_after_it(log: FakeLog) -> None:
    fill(log, 20)
    consumer = FakeConsumer(log, batch=100)
    waiter = Waiter(
        spec(canonical_acceptors(success=[{"key": "k4"}, {"key": "k8"}])), start_from="earliest", start_after_ms=None
    )
    waiter.cursor = {log.tp(0): 0, log.tp(1): 0}
    settled: list[int] = []

    async def settle(message: KafkaMessage, kind: str, decision: Decision | None) -> int | None:
        settled.append(message.offset)
        return message.offset

    found = await read_on_own(consumer, waiter, {log.tp(0): 10}, settle)
    assert found == 2 and settled == [2]  # k4 is partition 0, offset 2
    assert waiter.cursor[log.tp(0)] == 3  # the messages after it are not examined yet
    assert waiter.stats()["examined"] == 3


async def test_an_own_pace_read_from_a_deleted_position_moves_to_the_oldest_retained_offset(log: FakeLog) -> None:
    fill(log, 20)
    log.delete_before(0, 6)
    consumer = FakeConsumer(log)
    waiter = collector({0: 2})

    async def settle(message: KafkaMessage, kind: str, decision: Decision | None) -> int | None:
        return None

    assert await read_on_own(consumer, waiter, {log.tp(0): 10}, settle) is None
    assert waiter.cursor[log.tp(0)] == 6
    await read_on_own(consumer, waiter, {log.tp(0): 10}, settle)
    assert waiter.cursor[log.tp(0)] == 10 and waiter.stats()["examined"] == 4
