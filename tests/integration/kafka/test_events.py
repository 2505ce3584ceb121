"""KafkaMessageEventTrigger against the real tansu broker: one event per matching message, the
per-partition watermark in the asset state store across restarts, one read for a hundred
watchers of one topic, partitions added later.

Triggers run through Airflow's own ``SharedStreamManager`` in ack mode (``WatcherHarness``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from airflow.sdk import Asset, AssetWatcher

from airflow_deferrable_kit._event_streams import live_boards
from airflow_deferrable_kit._kafka import settings as kafka_settings
from airflow_deferrable_kit._kafka.stream import StreamWaiter
from airflow_deferrable_kit.leases import held_keys
from airflow_deferrable_kit.testing import watch_blocking
from airflow_deferrable_kit.testing_events import Watch, WatcherHarness
from airflow_deferrable_kit.triggers.kafka_events import KafkaMessageEventTrigger
from tests import REPO

from .conftest import (
    Message,
    connection_for,
    count_consumers,
    create_topic,
    eventually,
    key_is,
    path_is,
    produce,
    recreate_topic,
    unique,
)

FAST = 0.2


#: These tests are about what fires, not how events are spaced (see
#: tests/integration/s3/test_events.py::test_one_look_is_one_event_and_events_are_min_event_interval_apart).
QUICK_EVENTS = 0.5


def watcher(topic: str | list[str], conn: str, **kwargs: Any) -> KafkaMessageEventTrigger:
    kwargs.setdefault("min_event_interval", QUICK_EVENTS)
    kwargs.setdefault("poll_interval", FAST)
    return KafkaMessageEventTrigger(topics=[topic] if isinstance(topic, str) else topic, kafka_conn_id=conn, **kwargs)


def coordinates(watch: Watch) -> list[tuple[int, int]]:
    return sorted((p["partition"], p["offset"]) for p in watch.items)


def stream_waiters(conn: str, topic: str) -> list[StreamWaiter]:
    """The streams reading ``topic`` through the connection's shared reader."""
    return [w for w in connection_for(conn).topics[topic].waiters() if isinstance(w, StreamWaiter)]


async def started(watch: Watch, store: str = "asset") -> None:
    """Wait until the watcher has saved its starting point (its first watermark)."""
    await eventually(lambda: watch.stores[store].writes >= 1, timeout=20)


async def quiet(seconds: float = 0.6) -> None:
    await asyncio.sleep(seconds)


# ---------------------------------------------------------------------------- the trigger
def test_it_is_an_asset_watcher_trigger_that_round_trips() -> None:
    trigger = KafkaMessageEventTrigger(
        topics=["orders"], kafka_conn_id="events", acceptors=[key_is("eu")], backfill=True
    )
    Asset(name="orders", watchers=[AssetWatcher(name="eu_orders", trigger=trigger)])
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_deferrable_kit.triggers.kafka_events.KafkaMessageEventTrigger"
    assert not {"start_from", "start_offsets", "start_after_ms", "group_id", "deadline"} & set(kwargs)
    rebuilt = KafkaMessageEventTrigger(**json.loads(json.dumps(kwargs)))
    assert rebuilt == trigger and rebuilt.serialize() == (classpath, kwargs)
    assert rebuilt.acceptors == trigger.acceptors and rebuilt.acceptors[0]["expected"] == "eu"
    # A later parse builds the same kwargs (no "now" in them), so Airflow keeps the same watcher.
    assert KafkaMessageEventTrigger(topics=["orders"], kafka_conn_id="events").serialize() == (
        KafkaMessageEventTrigger(topics=["orders"], kafka_conn_id="events").serialize()
    )
    # Watchers of one topic share one stream whatever they accept; the watermark is per condition.
    other = KafkaMessageEventTrigger(topics=["orders"], kafka_conn_id="events", acceptors=[key_is("us")])
    assert other.shared_stream_key() == trigger.shared_stream_key()
    assert other.watermark_key() != trigger.watermark_key()
    assert (
        other.watermark_key()
        == KafkaMessageEventTrigger(
            topics=["orders"], kafka_conn_id="events", acceptors=[key_is("us")], poll_interval=30
        ).watermark_key()
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"start_from": "earliest"}, "takes no start_from: a watcher starts from its watermark"),
        ({"start_after_ms": 1}, "takes no start_after_ms"),
        ({"group_id": "g"}, "takes no group_id"),
        ({"start_offsets": {"orders": {"0": 1}}}, "takes no start_offsets"),
        ({"deadline": "2030-01-01T00:00:00+00:00"}, "takes no deadline"),
        ({"topics": ["bad topic"]}, "not a legal Kafka topic name"),  # the wait's own validation
        ({"value_format": "xml"}, "value_format must be one of"),
    ],
)
def test_bad_arguments_are_refused_at_parse_time(kwargs: dict[str, Any], message: str) -> None:
    kwargs = {"topics": ["orders"], **kwargs}
    with pytest.raises(ValueError, match=message):
        KafkaMessageEventTrigger(**kwargs)


# ---------------------------------------------------------------------------- events
async def test_each_matching_message_fires_once_with_its_coordinates_and_old_ones_never(
    bootstrap: str, kafka_conn: str, topic: str
) -> None:
    await produce(bootstrap, topic, *(Message({"n": i}, key="eu", partition=i % 3) for i in range(3)))
    trigger = watcher(topic, kafka_conn, acceptors=[path_is("kind", "order")])
    async with WatcherHarness() as triggerer:
        with watch_blocking(0.1) as blocked:
            watch = await triggerer.start(trigger)
            await started(watch)
            made = await produce(
                bootstrap,
                topic,
                *(Message({"kind": "order", "n": i}, key=f"k{i}", partition=i % 3) for i in range(6)),
                Message({"kind": "refund"}, partition=0),  # not matched
                Message(b"not json", raw=True, partition=1),  # not JSON: never fires
                Message(None, key="gone", partition=2),  # a tombstone: never fires
                Message({"kind": "order", "n": 6}, key="k6", partition=1),
            )
            await watch.wait_for_items(7)
            await quiet()
        assert blocked == []
    expected = [made[i] for i in (*range(6), 9)]
    assert coordinates(watch) == sorted(expected)
    first = next(p for p in watch.items if p["key"] == "k0")
    assert first["topic"] == topic and first["value"] == {"kind": "order", "n": 0}
    assert first["event_id"] == f"{topic}[{first['partition']}]@{first['offset']}"
    assert first["kafka_conn_id"] == kafka_conn and first["value_format"] == "json"
    assert first["matched"]["argument"] == "kind" and first["matched"]["actual"] == "order"
    assert first["value_truncated"] is False and first["timestamp"] > 0
    # In offset order per partition.
    for partition in range(3):
        offsets = [p["offset"] for p in watch.items if p["partition"] == partition]
        assert offsets == sorted(offsets)
    assert held_keys() == {} and live_boards() == {}


async def test_with_no_condition_every_message_fires_and_backfill_reads_the_retained_log(
    bootstrap: str, kafka_conn: str, topic: str
) -> None:
    old = await produce(bootstrap, topic, *(Message({"n": i}, partition=i % 3) for i in range(5)))
    async with WatcherHarness() as triggerer:
        watch = await triggerer.start(watcher(topic, kafka_conn, backfill=True))
        await watch.wait_for_items(5)
        new = await produce(bootstrap, topic, Message({"n": 5}, partition=0))
        await watch.wait_for_items(6)
        await quiet()
    assert coordinates(watch) == sorted(old + new)
    assert watch.items[0]["matched"]["comparator"] == "every message"


async def test_failure_conditions_and_a_raising_predicate_do_not_fire(
    bootstrap: str, kafka_conn: str, topic: str
) -> None:
    trigger = watcher(
        topic,
        kafka_conn,
        acceptors=[path_is("state", "failed", state="failure"), path_is("state", "done")],
    )
    judged = watcher(topic, kafka_conn, predicate="tests.integration.kafka.predicates:total_over_100")
    async with WatcherHarness() as triggerer:
        watch = await triggerer.start(trigger, assets=("a",))
        other = await triggerer.start(judged, assets=("b",))
        await started(watch, "a")
        await started(other, "b")
        made = await produce(
            bootstrap,
            topic,
            Message({"state": "failed", "items": [200]}, partition=0),  # a failure condition: no event
            Message({"state": "done", "items": [500]}, partition=0),
            Message({"state": "done", "items": "lots"}, partition=0),  # the predicate raises
            Message({"state": "done", "items": [5]}, partition=0),  # the predicate says no
            Message({"state": "done", "items": [60, 60]}, partition=0),
        )
        await watch.wait_for_items(4)
        await other.wait_for_items(2)
        await quiet()
    assert coordinates(watch) == made[1:]
    assert coordinates(other) == [made[0], made[1], made[4]]


# ------------------------------------------------------------------------- restarts
async def test_a_restart_neither_repeats_stored_events_nor_skips_what_arrived_while_down(
    bootstrap: str, kafka_conn: str, topic: str
) -> None:
    async with WatcherHarness() as first:
        watch = await first.start(watcher(topic, kafka_conn))
        await started(watch)
        before = await produce(bootstrap, topic, *(Message({"n": i}, partition=i % 3) for i in range(6)))
        await watch.wait_for_items(6)
        saved = watch.stores["asset"]
        await eventually(lambda: _saved_offsets(saved) == _next_offsets(before))
    assert coordinates(watch) == sorted(before)
    down = await produce(bootstrap, topic, *(Message({"n": i}, partition=i % 3) for i in range(6, 10)))
    second = WatcherHarness(stores=first.stores, auto_store=False)
    async with second:
        watch = await second.start(watcher(topic, kafka_conn))
        await watch.wait_for_items(4)
        await quiet()
        assert coordinates(watch) == sorted(down)  # what arrived while down; nothing stored before
        # dies before the events are stored
    assert _saved_offsets(first.stores.get("asset")) == _next_offsets(before)
    async with WatcherHarness(stores=second.stores) as third:
        watch = await third.start(watcher(topic, kafka_conn))
        await watch.wait_for_items(4)
        later = await produce(bootstrap, topic, Message({"n": 10}, partition=1))
        await watch.wait_for_items(5)
        await quiet()
    assert coordinates(watch) == sorted(down + later)  # fired again, never lost; nothing older


def _saved_offsets(store: Any) -> dict[str, int] | None:
    [envelope] = list(store.values.values()) or [None]  # the one watcher's watermark
    if envelope is None:
        return None
    [(_, partitions)] = envelope["state"]["offsets"].items()
    return {p: o for p, o in partitions.items() if o}


def _next_offsets(made: list[tuple[int, int]]) -> dict[str, int]:
    ends: dict[str, int] = {}
    for partition, offset in made:
        ends[str(partition)] = max(ends.get(str(partition), 0), offset + 1)
    return ends


async def test_a_watcher_that_joins_later_from_an_older_watermark_gets_the_stream_read_again(
    bootstrap: str, kafka_conn: str, topic: str
) -> None:
    async with WatcherHarness() as first:
        watch = await first.start(watcher(topic, kafka_conn, acceptors=[key_is("b")]), assets=("b",))
        await started(watch, "b")
    # "b" is stopped; "a" runs on and reads past what "b" has not seen yet.
    async with WatcherHarness(stores=first.stores) as second:
        a = await second.start(watcher(topic, kafka_conn, acceptors=[key_is("a")]), assets=("a",))
        await started(a, "a")
        made = await produce(bootstrap, topic, *(Message({"n": i}, key="ab"[i % 2], partition=0) for i in range(8)))
        await a.wait_for_items(4)
        b = await second.start(watcher(topic, kafka_conn, acceptors=[key_is("b")]), assets=("b",))
        await b.wait_for_items(4)
        await quiet()
    assert coordinates(a) == made[0::2] and coordinates(b) == made[1::2]


# ---------------------------------------------------------------------- sharing and growth
async def test_a_hundred_watchers_of_one_topic_share_one_consumer(
    bootstrap: str, kafka_conn: str, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    consumers = count_consumers(monkeypatch)
    watchers = [watcher(topic, kafka_conn, acceptors=[key_is(f"k{i:03d}")]) for i in range(100)]
    assert len({w.shared_stream_key() for w in watchers}) == 1
    polls: list[int] = []
    original = KafkaMessageEventTrigger.poll

    async def counted(self: KafkaMessageEventTrigger, board: Any) -> Any:
        polls.append(id(self))
        return await original(self, board)

    monkeypatch.setattr(KafkaMessageEventTrigger, "poll", counted)
    async with WatcherHarness() as triggerer:
        watches = [await triggerer.start(w, assets=(f"asset-{i}",)) for i, w in enumerate(watchers)]
        for i, watch in enumerate(watches):
            await started(watch, f"asset-{i}")
        made = await produce(bootstrap, topic, *(Message({"n": i}, key=f"k{i:03d}") for i in range(100)))
        for watch in watches:
            await watch.wait_for_items(1)
        await quiet()
        waiters = stream_waiters(kafka_conn, topic)
    for i, watch in enumerate(watches):
        assert coordinates(watch) == [made[i]]
    assert len(set(polls)) == 1  # one producer polls for all of them
    assert len(waiters) == 1  # one waiter on the shared reader
    # The shared reader's fetch and lookup consumers, and at most one of the stream's own (its start).
    assert len(consumers) <= 3, consumers
    assert held_keys() == {} and live_boards() == {}


async def test_partitions_added_later_are_read_from_their_beginning(
    bootstrap: str, kafka_conn: str, fast_refresh: None
) -> None:
    name = await create_topic(bootstrap, unique("grow"), partitions=1)
    async with WatcherHarness() as triggerer:
        watch = await triggerer.start(watcher(name, kafka_conn))
        await started(watch)
        await recreate_topic(bootstrap, name, partitions=3)  # tansu has no CreatePartitions
        await eventually(lambda: len(connection_for(kafka_conn).topics[name].positions) == 3)
        made = await produce(bootstrap, name, *(Message({"n": p}, partition=p) for p in range(3)))
        await watch.wait_for_items(2)
        await quiet(1.0)
    fired = coordinates(watch)
    assert (1, made[1][1]) in fired and (2, made[2][1]) in fired  # the new partitions, from offset 0


async def test_a_topic_created_later_is_waited_for_and_read_from_its_beginning(
    bootstrap: str, kafka_conn: str, fast_refresh: None
) -> None:
    name = unique("later")
    async with WatcherHarness() as triggerer:
        watch = await triggerer.start(watcher(name, kafka_conn, wait_for_topic=True))
        await started(watch)
        await create_topic(bootstrap, name, partitions=1)
        made = await produce(bootstrap, name, Message({"n": 1}, partition=0), Message({"n": 2}, partition=0))
        await watch.wait_for_items(2)
    assert coordinates(watch) == made


async def test_a_burst_larger_than_the_stream_queue_is_read_on_at_its_own_pace_without_loss(
    bootstrap: str, kafka_conn: str, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:

    monkeypatch.setattr(kafka_settings, "STREAM_QUEUE_MESSAGES", 25)
    async with WatcherHarness() as triggerer:
        watch = await triggerer.start(watcher(topic, kafka_conn))
        await started(watch)
        made = await produce(bootstrap, topic, *(Message({"n": i}, partition=i % 3) for i in range(600)))
        await watch.wait_for_items(600)
        await quiet()
        [waiter] = stream_waiters(kafka_conn, topic)
    assert coordinates(watch) == sorted(made)  # each once
    assert waiter.counts["fell_behind"] >= 1  # the queue overflowed and the stream caught up on its own


async def test_messages_that_fire_nothing_do_not_write_the_watermark_each_batch(
    bootstrap: str, kafka_conn: str, topic: str
) -> None:
    async with WatcherHarness() as triggerer:
        watch = await triggerer.start(watcher(topic, kafka_conn, acceptors=[key_is("wanted")]))
        await started(watch)
        store = watch.stores["asset"]
        for i in range(5):  # five batches the watcher skips
            await produce(bootstrap, topic, Message({"n": i}, key="other", partition=0))
            await quiet(0.4)
        assert store.writes == 1  # only the starting point: skipped messages move it in memory
        made = await produce(bootstrap, topic, Message({"n": 5}, key="wanted", partition=0))
        await watch.wait_for_items(1)
        await eventually(lambda: store.writes == 2)
        assert _saved_offsets(store) == _next_offsets(made)  # the skipped ones are covered too


async def test_a_log_end_reported_below_the_stream_never_fires_a_message_twice(
    bootstrap: str, kafka_conn: str, topic: str, fast_refresh: None, caplog: pytest.LogCaptureFixture
) -> None:
    """tansu sometimes answers a burst's log end far below what was read (as a new leader can);
    the shared reader then moves back, and the watchers must not fire again what they fired."""
    from aiokafka import AIOKafkaProducer

    async with WatcherHarness() as triggerer:
        watch = await triggerer.start(watcher(topic, kafka_conn))
        await started(watch)
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
        await producer.start()
        try:
            sent = [await producer.send(topic, json.dumps({"n": i}).encode()) for i in range(1000)]
            await asyncio.gather(*sent)
        finally:
            await producer.stop()
        await watch.wait_for_items(1000)
        await eventually(lambda: "went below the watched position" in caplog.text, timeout=20)
        await quiet(1.0)
    assert "past the log end" in caplog.text  # the reader moved back...
    assert len(watch.items) == len(set(coordinates(watch))) == 1000  # ...and nothing fired twice


def test_the_example_dag_parses_and_airflow_would_attach_its_watcher() -> None:
    import runpy

    from airflow.models.trigger import Trigger
    from airflow.sdk import DAG
    from airflow.serialization.encoders import encode_trigger
    from airflow.triggers.base import BaseEventTrigger

    path = REPO / "dags" / "example_kafka_events.py"
    namespace = runpy.run_path(str(path))
    [asset] = [value for value in namespace.values() if isinstance(value, Asset)]
    [watcher] = asset.watchers
    encoded = encode_trigger(watcher.trigger)
    row = Trigger(classpath=encoded["classpath"], kwargs=encoded["kwargs"])
    assert BaseEventTrigger.hash(*encoded.values()) == BaseEventTrigger.hash(row.classpath, row.kwargs)
    assert [value.dag_id for value in namespace.values() if isinstance(value, DAG)] == [
        "example_load_announced_batches"
    ]


async def test_a_read_that_fails_midway_is_read_again_nothing_skipped(
    bootstrap: str, kafka_conn: str, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiokafka.errors import KafkaConnectionError

    from airflow_deferrable_kit._kafka.stream import TopicsStream

    async with WatcherHarness() as first:
        watch = await first.start(watcher(topic, kafka_conn))
        await started(watch)
    backlog = await produce(bootstrap, topic, *(Message({"n": i}, partition=i % 3) for i in range(30)))
    original = TopicsStream._catch_up
    failures: list[int] = []

    async def fails_once_after_reading(self: TopicsStream, messages: list[Any]) -> bool:
        read = await original(self, messages)
        if messages and not failures:
            failures.append(len(messages))
            raise KafkaConnectionError("the broker went away mid-read")  # a fault a real broker cannot time
        return read

    monkeypatch.setattr(TopicsStream, "_catch_up", fails_once_after_reading)
    async with WatcherHarness(stores=first.stores) as second:
        watch = await second.start(watcher(topic, kafka_conn, max_backoff=0.2))
        await watch.wait_for_items(30)
        await quiet()
    assert failures and failures[0] > 0
    assert coordinates(watch) == sorted(backlog)  # each once: the failed read's messages were read again


async def test_a_watcher_of_two_topics_restarts_on_both_from_its_watermark(bootstrap: str, kafka_conn: str) -> None:
    first_topic = await create_topic(bootstrap, unique("one"), partitions=2)
    second_topic = await create_topic(bootstrap, unique("two"), partitions=1)
    topics = [first_topic, second_topic]
    async with WatcherHarness() as first:
        watch = await first.start(watcher(topics, kafka_conn))
        await started(watch)
        await produce(bootstrap, first_topic, Message({"n": 0}, partition=0))
        await produce(bootstrap, second_topic, Message({"n": 1}, partition=0))
        await watch.wait_for_items(2)
        await eventually(lambda: first.stores.get("asset").writes >= 2)
        await quiet()
    await produce(bootstrap, first_topic, Message({"n": 2}, partition=1), Message({"n": 3}, partition=0))
    await produce(bootstrap, second_topic, Message({"n": 4}, partition=0))
    async with WatcherHarness(stores=first.stores) as second:
        watch = await second.start(watcher(list(reversed(topics)), kafka_conn))  # the same watcher
        await watch.wait_for_items(3)
        await quiet()
    assert sorted(p["value"]["n"] for p in watch.items) == [2, 3, 4]


class SmallEventsTrigger(KafkaMessageEventTrigger):
    """Events of 2 KiB at most (a few messages each): a catch-up of a few hundred messages is
    dozens of events, as a busy topic's is at the defaults."""

    max_event_bytes = 2 * 1024


async def test_a_catch_up_of_many_events_never_meets_the_ack_timeout_nor_fires_a_message_twice(
    bootstrap: str, kafka_conn: str, topic: str
) -> None:
    # 300 retained messages read with backfill: about 60 events. Fired 0.05 s apart inside their
    # batches they outran the ack timeout (scaled down to 0.5 s), and the watcher, re-created,
    # read and fired them all again. Now one event per batch; the rest is read again later.
    made = await produce(bootstrap, topic, *(Message({"n": i, "pad": "p" * 300}, partition=i % 3) for i in range(300)))
    trigger = SmallEventsTrigger(
        topics=[topic], kafka_conn_id=kafka_conn, poll_interval=FAST, min_event_interval=0.05, backfill=True
    )
    async with WatcherHarness(ack_timeout=0.5) as triggerer:
        watch = await triggerer.start(trigger)
        await watch.wait_for_items(300, timeout=90)
        await eventually(lambda: _saved_offsets(watch.stores["asset"]) == _next_offsets(made), timeout=20)
        await quiet()  # an ack timeout still pending would fail the watcher now
        assert watch.task is not None and not watch.task.done()
    assert coordinates(watch) == sorted(made) and len(watch.items) == 300  # each message once
    assert len(watch.events) >= 30
