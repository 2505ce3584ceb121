"""Sharing never becomes shared fate, against the real broker: every compression codec is read,
and a record that cannot be decoded, a topic we may not read or a fetch that fails for no
nameable reason ends (or delays) nobody but the waits it concerns, among twenty healthy ones.

Faults are injected where the broker cannot produce them: aiokafka kept from decoding lz4 in
this thread (the producer, in another thread, still encodes it), a partition's records raising
``CorruptRecordException`` as aiokafka's unpacking does, and the fetch consumer's ``getmany``
raising once.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import aiokafka.codec
import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.consumer import fetcher as aiokafka_fetcher
from aiokafka.errors import CorruptRecordException, TopicAuthorizationFailedError

from airflow_deferrable_kit._kafka.consumers import CODEC_FIX
from airflow_deferrable_kit.leases import held_keys
from airflow_deferrable_kit.testing_events import Watch, WatcherHarness
from airflow_deferrable_kit.triggers.kafka_events import KafkaMessageEventTrigger

from .conftest import (
    Message,
    connection_for,
    create_topics,
    eventually,
    key_is,
    make,
    produce_to_each,
    unique,
    waiting,
)

CODECS = ("gzip", "snappy", "lz4", "zstd")
HEALTHY_TOPICS = 4
WAITS_PER_TOPIC = 5  # 20 healthy waits


async def produce_compressed(bootstrap: str, topic: str, codec: str, keys: list[str]) -> list[tuple[int, int]]:
    """One batch of ``codec``-compressed records, produced from another thread and loop."""

    async def send() -> list[tuple[int, int]]:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type=codec, linger_ms=20)
        await producer.start()
        try:
            futures = [
                await producer.send(topic, value=b'{"codec": "%s"}' % codec.encode(), key=k.encode()) for k in keys
            ]
            return [((meta := await f).partition, meta.offset) for f in futures]
        finally:
            await producer.stop()

    return await asyncio.to_thread(asyncio.run, send())


async def healthy_waits(bootstrap: str, conn: str) -> tuple[list[str], list[Any], list[asyncio.Future[Any]]]:
    """Twenty waits on four healthy topics of ``conn``, each for its own key, all attached."""
    topics = await create_topics(bootstrap, [unique("healthy") for _ in range(HEALTHY_TOPICS)], 1)
    triggers = [make(topics[i % HEALTHY_TOPICS], conn, acceptors=[key_is(f"k{i}")]) for i in range(20)]
    tasks = [await waiting(t, t.topics[0]) for t in triggers]
    return topics, triggers, tasks


async def feed_healthy(bootstrap: str, topics: list[str]) -> None:
    await produce_to_each(bootstrap, [(topics[i % HEALTHY_TOPICS], Message({"n": i}, key=f"k{i}")) for i in range(20)])


async def all_found(tasks: list[asyncio.Future[Any]], topics: list[str]) -> None:
    payloads = [(await task).payload for task in tasks]
    assert [p["status"] for p in payloads] == ["success"] * 20, payloads
    assert [(p["topic"], p["key"]) for p in payloads] == [(topics[i % HEALTHY_TOPICS], f"k{i}") for i in range(20)]


#: These tests are about what fires, not how events are spaced (see
#: tests/integration/s3/test_events.py::test_one_look_is_one_event_and_events_are_min_event_interval_apart).
QUICK_EVENTS = 0.5


def watcher(topic: str, conn: str, **kwargs: Any) -> KafkaMessageEventTrigger:
    kwargs.setdefault("min_event_interval", QUICK_EVENTS)
    return KafkaMessageEventTrigger(topics=[topic], kafka_conn_id=conn, poll_interval=0.2, **kwargs)


async def started(watch: Watch, asset: str) -> None:
    await eventually(lambda: watch.stores[asset].writes >= 1, timeout=20)


# ------------------------------------------------------------------------------ codecs
async def test_every_codec_is_read_by_waits_and_watchers(bootstrap: str, kafka_conn: str) -> None:
    """The ``kafka`` extra brings aiokafka's codecs: gzip, snappy, lz4 and zstd batches match."""
    assert all(getattr(aiokafka.codec, f"has_{codec}")() for codec in CODECS)
    topics = await create_topics(bootstrap, [unique(codec) for codec in CODECS], 1)
    triggers = [make(topics[i % 4], kafka_conn, acceptors=[key_is(f"k{i}")]) for i in range(24)]
    async with WatcherHarness() as triggerer:
        watches = [await triggerer.start(watcher(t, kafka_conn), assets=(f"a{i}",)) for i, t in enumerate(topics)]
        for i, watch in enumerate(watches):
            await started(watch, f"a{i}")
        tasks = [await waiting(t, t.topics[0]) for t in triggers]
        for n, (topic, codec) in enumerate(zip(topics, CODECS, strict=True)):
            await produce_compressed(bootstrap, topic, codec, [f"k{i}" for i in range(n, 24, 4)])
        payloads = [(await task).payload for task in tasks]
        for watch in watches:
            await watch.wait_for_items(6)
    assert [p["status"] for p in payloads] == ["success"] * 24, payloads
    assert [(p["topic"], p["key"], p["value"]) for p in payloads] == [
        (topics[i % 4], f"k{i}", {"codec": CODECS[i % 4]}) for i in range(24)
    ]
    for watch, codec in zip(watches, CODECS, strict=True):
        assert sorted(p["key"] for p in watch.items) == sorted(f"k{i}" for i in range(CODECS.index(codec), 24, 4))
        assert {p["value"]["codec"] for p in watch.items} == {codec}
    assert held_keys() == {}


# ------------------------------------------------------------------ undecodable records
def keep_from_decoding(monkeypatch: pytest.MonkeyPatch, fault: str, topic: str) -> None:
    """Make this thread's aiokafka fail on ``topic``'s records as it does without the codec, or
    on a corrupt batch (the producer's thread is left alone)."""
    here = threading.current_thread()
    if fault == "codec":
        has_lz4 = aiokafka.codec.has_lz4
        monkeypatch.setattr(aiokafka.codec, "has_lz4", lambda: has_lz4() and threading.current_thread() is not here)
        return
    unpack = aiokafka_fetcher.PartitionRecords.__next__

    def corrupt(self: Any) -> Any:
        if self._tp.topic == topic and threading.current_thread() is here:
            raise CorruptRecordException(f"Invalid CRC - {self._tp}")
        return unpack(self)

    monkeypatch.setattr(aiokafka_fetcher.PartitionRecords, "__next__", corrupt)


@pytest.mark.parametrize("fault", ["codec", "corrupt"])
async def test_an_undecodable_batch_fails_only_its_topics_waits_among_twenty_healthy_ones(
    monkeypatch: pytest.MonkeyPatch, bootstrap: str, kafka_conn: str, fault: str
) -> None:
    (poisoned,) = await create_topics(bootstrap, [unique("poisoned")], 1)
    topics, _, healthy = await healthy_waits(bootstrap, kafka_conn)
    doomed = [await waiting(make(poisoned, kafka_conn, acceptors=[key_is(f"p{i}")]), poisoned) for i in range(3)]
    connection = connection_for(kafka_conn)
    keep_from_decoding(monkeypatch, fault, poisoned)
    await produce_compressed(bootstrap, poisoned, "lz4", ["p0", "p1", "p2"])
    errors = [(await task).payload for task in doomed]
    await feed_healthy(bootstrap, topics)
    await all_found(healthy, topics)
    assert [e["status"] for e in errors] == ["error"] * 3
    message = errors[0]["message"]
    assert f"{poisoned}[0]" in message, message
    if fault == "codec":
        assert errors[0]["error_type"] == "bad_configuration" and "lz4" in message and CODEC_FIX in message
    else:
        assert errors[0]["error_type"] == "protocol" and "corrupt" in message
    assert connection.fetch_restarts == 0 and connection.loop_restarts == 0
    # A later wait on a healthy topic still finds its message.
    later = await waiting(make(topics[0], kafka_conn, acceptors=[key_is("later")]), topics[0])
    await produce_to_each(bootstrap, [(topics[0], Message({"n": 99}, key="later"))])
    assert (await later).payload["status"] == "success"
    assert held_keys() == {}


async def test_a_watcher_of_another_topic_goes_on_past_an_undecodable_batch(
    monkeypatch: pytest.MonkeyPatch, bootstrap: str, kafka_conn: str
) -> None:
    """The event stream shares the connection's fetch: a poisoned topic stops its own watcher only."""
    poisoned, *topics = await create_topics(bootstrap, [unique("poisoned")] + [unique("ok") for _ in range(4)], 1)
    async with WatcherHarness() as triggerer:
        bad = await triggerer.start(watcher(poisoned, kafka_conn), assets=("bad",))
        good = [
            await triggerer.start(watcher(topics[i % 4], kafka_conn, acceptors=[key_is(f"k{i}")]), assets=(f"a{i}",))
            for i in range(20)
        ]
        await started(bad, "bad")
        for i, watch in enumerate(good):
            await started(watch, f"a{i}")
        keep_from_decoding(monkeypatch, "codec", poisoned)
        await produce_compressed(bootstrap, poisoned, "lz4", ["p0"])
        await eventually(lambda: connection_for(kafka_conn).topics.get(poisoned) is None
                         or connection_for(kafka_conn).topics[poisoned].fatal is not None, timeout=20)  # fmt: skip
        for round_ in range(2):  # before and after the poisoned stream was opened again
            await produce_to_each(
                bootstrap, [(topics[i % 4], Message({"round": round_}, key=f"k{i}")) for i in range(20)]
            )
            for watch in good:
                await watch.wait_for_items(round_ + 1)
        assert bad.items == []
    assert [[p["value"]["round"] for p in watch.items] for watch in good] == [[0, 1]] * 20
    assert held_keys() == {}


# ----------------------------------------------------------------- forbidden topic, dead fetch
def fail_fetch_once(monkeypatch: pytest.MonkeyPatch, conn: str, error: BaseException) -> dict[str, int]:
    """The connection's fetch consumer raises ``error`` from its next ``getmany``, once."""
    consumer = connection_for(conn).fetch
    assert consumer is not None
    getmany = consumer.getmany
    raised = {"count": 0}

    async def once(*partitions: TopicPartition, **kwargs: Any) -> Any:
        if not raised["count"]:
            raised["count"] += 1
            raise error
        return await getmany(*partitions, **kwargs)

    monkeypatch.setattr(consumer, "getmany", once)
    return raised


async def test_a_forbidden_topic_fails_only_its_own_waits_among_twenty_healthy_ones(
    monkeypatch: pytest.MonkeyPatch, bootstrap: str, kafka_conn: str
) -> None:
    (forbidden,) = await create_topics(bootstrap, [unique("forbidden")], 1)
    topics, _, healthy = await healthy_waits(bootstrap, kafka_conn)
    doomed = [await waiting(make(forbidden, kafka_conn), forbidden) for _ in range(3)]
    connection = connection_for(kafka_conn)
    raised = fail_fetch_once(monkeypatch, kafka_conn, TopicAuthorizationFailedError(forbidden))  # as aiokafka raises it
    errors = [(await task).payload for task in doomed]
    await feed_healthy(bootstrap, topics)
    await all_found(healthy, topics)
    assert raised["count"] == 1
    assert [(e["status"], e["error_type"]) for e in errors] == [("error", "authorization")] * 3
    assert connection.fetch_restarts == 0 and connection.loop_restarts == 0
    assert held_keys() == {}


async def test_a_fetch_that_fails_for_no_nameable_reason_is_restarted_and_twenty_waits_find_their_messages(
    monkeypatch: pytest.MonkeyPatch, bootstrap: str, kafka_conn: str
) -> None:
    topics, _, healthy = await healthy_waits(bootstrap, kafka_conn)
    connection = connection_for(kafka_conn)
    first = connection.fetch
    raised = fail_fetch_once(monkeypatch, kafka_conn, RuntimeError("poisoned"))
    await eventually(lambda: raised["count"] == 1 and connection.fetch is not None and connection.fetch is not first)
    await feed_healthy(bootstrap, topics)
    await all_found(healthy, topics)
    assert connection.fetch_restarts == 1
    assert held_keys() == {}
