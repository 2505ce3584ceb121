"""The shared connection reader running on fake consumers (no broker): one fetch consumer for
every topic, its loops, catch-up passes, own-pace reads and errors. What aiokafka itself does is
covered against tansu elsewhere here."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import TopicAuthorizationFailedError

from airflow_deferrable_kit._kafka import catchup as _kafka_catchup
from airflow_deferrable_kit._kafka import reader as _kafka_reader
from airflow_deferrable_kit._kafka import settings as kafka_settings
from airflow_deferrable_kit._kafka.catchup import read_on_own
from airflow_deferrable_kit._kafka.consumers import TopicsAnswer
from airflow_deferrable_kit._kafka.fanout import TopicReader, Waiter
from airflow_deferrable_kit._kafka.messages import KafkaMessage, canonical_acceptors
from airflow_deferrable_kit._kafka.reader import ConnectionReader
from airflow_deferrable_kit.conditions import Decision
from tests.integration.kafka.conftest import eventually
from tests.unit.kafka.fakes import FakeCluster, FakeConsumer, FakeLog, spec

PARTITIONS = 2


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    """Fake topics; every consumer the shared reader starts reads them, and its metadata
    requests name the topics asked about (recorded in ``cluster.asked``)."""
    cluster = FakeCluster()
    cluster.asked = []  # type: ignore[attr-defined]

    async def start_consumer(options: Any, *, topics: Iterable[str], **kwargs: Any) -> FakeConsumer:
        cluster.asked.append(sorted(topics))  # type: ignore[attr-defined]  # its bootstrap asks about these
        consumer = FakeConsumer(cluster)
        cluster.consumers.append(consumer)
        return consumer

    def describe_topics(consumer: Any, topics: Iterable[str]) -> TopicsAnswer:
        answer = TopicsAnswer()
        for topic in topics:
            log = cluster.logs.get(topic)
            if log is None:
                answer.missing.add(topic)
            else:
                answer.partitions[topic] = set(range(len(log.records)))
        return answer

    async def refresh_topics(consumer: Any, topics: Iterable[str]) -> TopicsAnswer:
        cluster.asked.append(sorted(topics))  # type: ignore[attr-defined]
        return describe_topics(consumer, topics)

    for module in (_kafka_reader, _kafka_catchup):
        monkeypatch.setattr(module, "start_consumer", start_consumer)
    monkeypatch.setattr(_kafka_reader, "describe_topics", describe_topics)
    monkeypatch.setattr(_kafka_reader, "refresh_topics", refresh_topics)
    monkeypatch.setattr(kafka_settings, "FETCH_WAIT_MS", 20)
    monkeypatch.setattr(kafka_settings, "GATHER_SECONDS", 0.0)
    return cluster


@pytest.fixture
def log(cluster: FakeCluster) -> FakeLog:
    """A two-partition topic ``t``."""
    return cluster.add("t", partitions=PARTITIONS)


@pytest.fixture
async def connection(cluster: FakeCluster) -> AsyncIterator[ConnectionReader]:
    connection = ConnectionReader("conn", {})
    try:
        yield connection
    finally:
        await connection.close()


async def joined(connection: ConnectionReader, topic: str) -> TopicReader:
    """A topic joined as a wait joins it, once the broker has answered about it and its
    partitions are in the fetch consumer's assignment."""
    reader = connection.join(topic)
    await reader.resolved.wait()
    await eventually(lambda: set(reader.positions) <= connection._assigned)
    return reader


def collector(cursors: dict[int, int], reader: TopicReader | None = None, topic: str = "t") -> Waiter:
    """A wait whose predicate must see every message, starting at ``cursors`` (partition: offset).

    The engine only queues messages for a predicate (the trigger runs it), so the queue shows
    everything the wait was handed.
    """
    waiter = Waiter(
        spec([], predicate="tests.integration.kafka.predicates:total_over_100"),
        start_from="earliest",
        start_after_ms=None,
    )
    waiter.cursor = {TopicPartition(topic, partition): offset for partition, offset in cursors.items()}
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
async def test_a_topic_starts_at_the_log_end_and_live_messages_go_to_the_waits_that_match(
    log: FakeLog, connection: ConnectionReader
) -> None:
    fill(log, 6)  # before the topic was joined: not handed to anyone
    reader = await joined(connection, "t")
    assert reader.known and reader.positions == {log.tp(0): 3, log.tp(1): 3}
    wanted = Waiter(spec(canonical_acceptors(success=[{"key": "k7"}])), start_from="earliest", start_after_ms=None)
    wanted.readers["t"] = reader
    everything = collector({0: 3, 1: 3}, reader)
    assert wanted.try_attach("t") and everything.try_attach("t")
    fill(log, 10)  # offsets 3..7 in each partition of keys k0..k9: k7 lands in partition 1
    await eventually(lambda: sum(reader.positions.values()) == 16)
    assert [(m.partition, m.offset, m.key) for m, _, _ in wanted.queue] == [(1, 6, b"k7")]
    assert wanted.finished and wanted not in reader.waiters()
    assert seen(everything) == {0: [3, 4, 5, 6, 7], 1: [3, 4, 5, 6, 7]}
    await connection.close()
    assert all(consumer.stopped for consumer in log.consumers) and len(log.consumers) == 2  # fetch + lookups


async def test_one_fetch_consumer_reads_every_topic_waited_on_and_drops_those_nobody_waits_on(
    cluster: FakeCluster, connection: ConnectionReader
) -> None:
    logs = [cluster.add(name, partitions=PARTITIONS) for name in ("a", "b", "c")]
    cluster.add("unrelated", partitions=4)  # on the broker, waited on by nobody
    readers = [connection.join(log.topic) for log in logs]  # in the same turn: one lookup for all
    for reader in readers:
        await reader.resolved.wait()
    await eventually(lambda: len(connection._assigned) == 6)
    waiters = [collector({0: 0, 1: 0}, reader, topic=reader.topic) for reader in readers]
    assert all(waiter.try_attach(waiter_topic) for waiter, waiter_topic in zip(waiters, "abc", strict=True))
    for log in logs:
        fill(log, 4)
    await eventually(lambda: all(sum(len(v) for v in seen(w).values()) == 4 for w in waiters))
    assert [{m.topic for m, _, _ in w.queue} for w in waiters] == [{"a"}, {"b"}, {"c"}]
    assert len(cluster.consumers) == 2  # one fetch consumer and one for lookups, for three topics
    # Each consumer's bootstrap named the three topics waited on, and nothing else was asked.
    assert cluster.asked == [["a", "b", "c"], ["a", "b", "c"]] and connection.metadata_requests == 0
    fetch = connection.fetch
    assert fetch is not None and fetch.assignment() == {TopicPartition(t, p) for t in "abc" for p in range(2)}

    waiters[2].detach("c")
    connection.leave(readers[2])  # its last wait left: dropped at the next turn of the fetch loop
    await eventually(lambda: fetch.assignment() == {TopicPartition(t, p) for t in "ab" for p in range(2)})
    fill(logs[0], 2)
    await eventually(lambda: sum(len(v) for v in seen(waiters[0]).values()) == 6)
    assert "c" not in connection.topics


async def test_a_topic_joined_later_is_looked_up_and_added_to_the_same_consumer(
    cluster: FakeCluster, connection: ConnectionReader
) -> None:
    first = await joined(connection, cluster.add("first", partitions=1).topic)
    second_log = cluster.add("second", partitions=1)
    second = await joined(connection, "second")
    waiter = collector({0: 0}, second, topic="second")
    assert waiter.try_attach("second")
    second_log.append(0, key="x")
    await eventually(lambda: len(waiter.queue) == 1)
    assert first.known and len(cluster.consumers) == 2
    # The bootstraps of the lookup and fetch consumers, then one request for both topics.
    assert cluster.asked == [["first"], ["first"], ["first", "second"]]


async def test_a_missing_topic_is_answered_and_read_from_its_beginning_once_it_appears(
    monkeypatch: pytest.MonkeyPatch, cluster: FakeCluster, connection: ConnectionReader
) -> None:
    monkeypatch.setattr(kafka_settings, "PARTITION_REFRESH_SECONDS", 0.05)
    reader = connection.join("later")
    await reader.resolved.wait()
    assert not reader.known and reader.fatal is None
    waiter = collector({}, reader, topic="later")
    assert waiter.try_attach("later")  # nothing to be behind of yet
    log = cluster.add("later", partitions=1)
    log.append(0, key="first")  # before the reader saw the topic: still new to every wait
    await eventually(lambda: len(waiter.queue) == 1)
    assert reader.known and reader.origins == {log.tp(0): 0}


async def test_a_late_wait_is_caught_up_by_a_shared_pass_and_handed_over_without_loss_or_double(
    log: FakeLog, connection: ConnectionReader
) -> None:
    reader = await joined(connection, "t")
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


async def test_late_waits_on_different_topics_are_caught_up_on_one_consumer(
    cluster: FakeCluster, connection: ConnectionReader
) -> None:
    logs = [cluster.add(name, partitions=PARTITIONS) for name in ("x", "y")]
    readers = [await joined(connection, log.topic) for log in logs]
    for log, reader in zip(logs, readers, strict=True):
        fill(log, 30)
        await eventually(lambda reader=reader: sum(reader.positions.values()) == 30)
    late = [collector({0: 0, 1: 0}, reader, topic=reader.topic) for reader in readers]
    for waiter, reader in zip(late, readers, strict=True):
        join(waiter, reader)
    await eventually(lambda: all(w.attached.get(r.topic) is r for w, r in zip(late, readers, strict=True)))
    for waiter, topic in zip(late, "xy", strict=True):
        assert {m.topic for m, _, _ in waiter.queue} == {topic}
        assert seen(waiter) == {0: list(range(15)), 1: list(range(15))}
    assert len(cluster.consumers) == 3  # fetch, lookups, and one catch-up consumer for both topics
    assert connection.catch_ups.consumers_started == 1


async def test_a_wait_that_is_released_stops_receiving(log: FakeLog, connection: ConnectionReader) -> None:
    reader = await joined(connection, "t")
    waiter = collector({0: 0, 1: 0}, reader)
    join(waiter, reader)
    fill(log, 4)
    await eventually(lambda: sum(len(v) for v in seen(waiter).values()) == 4)
    waiter.detach("t")
    fill(log, 4)
    await eventually(lambda: sum(reader.positions.values()) == 8)
    assert seen(waiter) == {0: [0, 1], 1: [0, 1]}


async def test_a_reader_whose_position_was_deleted_resumes_at_the_oldest_retained_offset(
    log: FakeLog, connection: ConnectionReader
) -> None:
    reader = await joined(connection, "t")
    waiter = collector({0: 0, 1: 0}, reader)
    join(waiter, reader)
    fetch = connection.fetch
    assert fetch is not None
    fetch.batch = 0  # hold the fetches back while the log is written and cut
    for _ in range(10):
        log.append(0)
    log.delete_before(0, 6)  # retention ran before the reader fetched
    fetch.batch = 7
    await eventually(lambda: reader.positions[log.tp(0)] == 10)
    assert seen(waiter) == {0: [6, 7, 8, 9], 1: []}


async def test_an_error_naming_no_topic_that_keeps_coming_back_ends_every_wait(
    monkeypatch: pytest.MonkeyPatch, log: FakeLog, connection: ConnectionReader
) -> None:
    """Restarted on a fresh consumer ``FETCH_RESTARTS`` times, each after a backoff; then it is the
    connection's error, and the loop is still there for the waits that come next."""
    monkeypatch.setattr(kafka_settings, "FETCH_RESTARTS", 2)
    connection.gates.hold_cap(0.05)  # a wait that asked for a short backoff
    reader = await joined(connection, "t")

    async def broken(self: FakeConsumer, **kwargs: Any) -> Any:
        await asyncio.sleep(0)
        raise RuntimeError("broken")  # names no topic: every consumer, fresh or not

    monkeypatch.setattr(FakeConsumer, "getmany", broken)
    waiter = collector({0: 0, 1: 0}, reader)
    join(waiter, reader)
    await eventually(lambda: reader.fatal is not None)
    assert reader.fatal is not None and reader.fatal.error_type == "internal"
    assert waiter.wake.is_set()
    assert connection.fetch_restarts == 2 and connection.loop_restarts == 0


async def test_an_access_error_naming_no_topic_is_the_connections_and_ends_every_wait_at_once(
    log: FakeLog, connection: ConnectionReader
) -> None:
    reader = await joined(connection, "t")
    waiter = collector({0: 0, 1: 0}, reader)
    join(waiter, reader)
    assert connection.fetch is not None
    connection.fetch.fail_with = TopicAuthorizationFailedError()
    await eventually(lambda: reader.fatal is not None)
    assert reader.fatal is not None and reader.fatal.error_type == "authorization"
    assert waiter.wake.is_set() and connection.fetch_restarts == 0


async def test_a_fetch_poisoned_once_is_restarted_and_twenty_waits_on_five_topics_miss_nothing(
    cluster: FakeCluster, connection: ConnectionReader
) -> None:
    logs = [cluster.add(f"t{i}", partitions=PARTITIONS) for i in range(5)]
    readers = [await joined(connection, log.topic) for log in logs]
    waiters = [collector({0: 0, 1: 0}, readers[i % 5], topic=f"t{i % 5}") for i in range(20)]
    for waiter in waiters:
        join(waiter, next(iter(waiter.readers.values())))
    for log in logs:
        fill(log, 4)
    await eventually(lambda: all(len(w.queue) == 4 for w in waiters))
    first = connection.fetch
    assert first is not None
    first.fail_with = RuntimeError("poisoned")  # a bug, an error nobody can be blamed for
    for log in logs:
        fill(log, 4)
    await eventually(lambda: all(len(w.queue) == 8 for w in waiters))
    assert connection.fetch is not first and first.stopped and connection.fetch_restarts == 1
    assert all(r.fatal is None for r in readers)
    # Every message once, none lost with the consumer that failed, none twice.
    assert {tuple(sorted((m.partition, m.offset) for m, _, _ in w.queue)) for w in waiters} == {
        tuple(sorted((p, o) for p in range(PARTITIONS) for o in range(4)))
    }


async def test_a_fetch_loop_that_dies_is_started_again_and_its_waits_get_their_messages(
    monkeypatch: pytest.MonkeyPatch, cluster: FakeCluster, connection: ConnectionReader
) -> None:
    from aiokafka.errors import OffsetOutOfRangeError

    logs = [cluster.add(f"t{i}", partitions=PARTITIONS) for i in range(4)]
    readers = [await joined(connection, log.topic) for log in logs]
    waiters = [collector({0: 0, 1: 0}, readers[i % 4], topic=f"t{i % 4}") for i in range(24)]
    for waiter in waiters:
        join(waiter, next(iter(waiter.readers.values())))
    handled = connection._out_of_range

    async def broken(exc: Exception) -> None:  # the handler of an error fails: the loop task ends
        monkeypatch.setattr(connection, "_out_of_range", handled)
        raise RuntimeError("the handler broke")

    monkeypatch.setattr(connection, "_out_of_range", broken)
    assert connection.fetch is not None
    connection.fetch.fail_with = OffsetOutOfRangeError({})
    await eventually(lambda: connection.loop_restarts == 1)
    for log in logs:
        fill(log, 6)
    await eventually(lambda: all(len(w.queue) == 6 for w in waiters))
    assert all(r.fatal is None for r in readers)


async def test_a_topic_we_may_not_read_fails_only_its_own_waits(
    cluster: FakeCluster, connection: ConnectionReader
) -> None:
    open_logs = [cluster.add(f"open{i}", partitions=1) for i in range(4)]
    closed_log = cluster.add("closed", partitions=1)
    allowed = [await joined(connection, log.topic) for log in open_logs]
    refused = await joined(connection, "closed")
    healthy = [collector({0: 0}, allowed[i % 4], topic=f"open{i % 4}") for i in range(20)]
    doomed = [collector({0: 0}, refused, topic="closed") for _ in range(3)]
    assert all(w.try_attach(next(iter(w.readers))) for w in healthy + doomed)
    fetch = connection.fetch
    assert fetch is not None
    fetch.fail_with = TopicAuthorizationFailedError("closed")  # what aiokafka's fetcher raises
    await eventually(lambda: refused.fatal is not None)
    fetch.fail_with = None
    await eventually(lambda: fetch.assignment() == {log.tp(0) for log in open_logs})
    for log in open_logs:
        log.append(0)
    closed_log.append(0)
    await eventually(lambda: all(len(w.queue) == 1 for w in healthy))
    assert all(r.fatal is None for r in allowed) and connection.fetch_restarts == 0
    assert all(w.wake.is_set() and not w.queue for w in doomed)
    assert refused.fatal is not None and refused.fatal.details == {"topic": "closed"}


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
