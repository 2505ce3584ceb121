"""Many topics on one connection, against a real broker that holds thousands of other topics.

The official ``AwaitMessageSensor`` is used with one topic per wait: this is the layout that
must stay cheap. Every wait on a connection shares one fetch consumer (assigned the partitions
of every topic waited on) and one lookup consumer; their metadata requests name the topics
waited on, never the whole cluster; and cancelling a thousand waits in any layout leaves
nothing behind within a second.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka.cluster import ClusterMetadata

from airflow_deferrable_kit import leases
from airflow_deferrable_kit.connections import get_connection
from airflow_deferrable_kit.testing import run_trigger, watch_blocking
from tests.integration.kafka.conftest import (
    CROWD,
    Message,
    PrivateBroker,
    broker_sockets,
    connection_for,
    count_consumers,
    create_topics,
    eventually,
    key_is,
    make,
    produce,
    produce_to_each,
    set_connection,
    unique,
)

N = 300


@pytest.fixture
def crowded_conn(monkeypatch: pytest.MonkeyPatch, crowded_broker: PrivateBroker) -> str:
    return set_connection(monkeypatch, "kafka_crowded", crowded_broker.bootstrap_servers)


@pytest.fixture
def metadata_answers(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The number of topics in every metadata answer the clients of this thread's loop (the
    waits') took in; producers and admin clients run in other threads and are not counted."""
    sizes: list[int] = []
    original = ClusterMetadata.update_metadata
    waits_thread = threading.get_ident()

    def recording(cluster: ClusterMetadata, metadata: Any) -> Any:
        if threading.get_ident() == waits_thread:
            sizes.append(len(metadata.topics))
        return original(cluster, metadata)

    monkeypatch.setattr(ClusterMetadata, "update_metadata", recording)
    yield sizes


def all_waiting(triggers: list[Any]) -> bool:
    return all(t._subscription is not None and set(t.topics) <= set(t._subscription.waiter.attached) for t in triggers)


async def test_waits_on_hundreds_of_topics_share_one_fetch_consumer_on_a_crowded_broker(
    monkeypatch: pytest.MonkeyPatch,
    crowded_broker: PrivateBroker,
    crowded_conn: str,
    metadata_answers: list[int],
    frozen_gc: None,
) -> None:
    bootstrap = crowded_broker.bootstrap_servers
    names = [unique("own") for _ in range(N)]
    await asyncio.to_thread(asyncio.run, create_topics(bootstrap, names, partitions=2))
    started = count_consumers(monkeypatch)
    await get_connection(crowded_conn)  # Airflow's one-off imports, before the loop is watched
    triggers = [make(name, crowded_conn, acceptors=[key_is(name)], poll_interval=5.0) for name in names]
    with watch_blocking(0.2) as blocked:
        tasks = [asyncio.ensure_future(run_trigger(t, timeout=90)) for t in triggers]
        await eventually(lambda: all_waiting(triggers), 60)
        sockets_waiting = await asyncio.to_thread(broker_sockets, crowded_broker.port)
        connection = connection_for(crowded_conn)
        assigned = len(connection._assigned)
        placed = await produce_to_each(bootstrap, [(name, Message({"i": i}, key=name)) for i, name in enumerate(names)])
        payloads = [t.payload for t in await asyncio.gather(*tasks)]
    largest = max(metadata_answers)
    print(f"{N} topics: sockets {sockets_waiting}, consumers {len(started)}, largest metadata answer {largest}")
    for name, payload, where in zip(names, payloads, placed, strict=True):
        assert payload["status"] == "success" and payload["topic"] == name
        assert (payload["partition"], payload["offset"]) == where
    assert assigned == 2 * N  # every partition of every topic waited on, on one consumer
    assert len(started) == 2  # one fetch and one lookup consumer for 300 topics
    assert sockets_waiting <= 2, sockets_waiting  # bounded by the brokers (one here), not the topics
    # No client asked for the whole cluster (N + CROWD topics); every answer named waited topics.
    assert metadata_answers and max(metadata_answers) <= N < CROWD, max(metadata_answers)
    assert blocked == [], blocked
    assert leases.held_keys() == {}
    await eventually(lambda: broker_sockets(crowded_broker.port) == 0)


async def test_one_waits_unknown_topic_fails_only_that_wait(bootstrap: str, kafka_conn: str, topic: str) -> None:
    missing = make(unique("missing"), kafka_conn, acceptors=[key_is("k")])
    fine = make(topic, kafka_conn, acceptors=[key_is("k")])
    both = [make([topic, unique("missing")], kafka_conn, acceptors=[key_is("k")])]
    tasks = [asyncio.ensure_future(run_trigger(t, timeout=20)) for t in (missing, fine, *both)]
    failed = (await tasks[0]).payload
    failed_too = (await tasks[2]).payload
    assert failed["status"] == failed_too["status"] == "error"
    assert failed["error_type"] == failed_too["error_type"] == "not_found"
    await eventually(lambda: fine._subscription is not None and topic in fine._subscription.waiter.attached)
    placed = await produce(bootstrap, topic, Message({"n": 1}, key="k"))
    payload = (await tasks[1]).payload
    assert payload["status"] == "success" and (payload["partition"], payload["offset"]) == placed[0]


async def test_a_topic_created_while_others_are_read_joins_the_same_consumer(
    monkeypatch: pytest.MonkeyPatch, bootstrap: str, kafka_conn: str, topic: str, fast_refresh: None
) -> None:
    started = count_consumers(monkeypatch)
    live = make(topic, kafka_conn, acceptors=[key_is("never")])
    later_name = unique("later")
    later = make(later_name, kafka_conn, wait_for_topic=True, acceptors=[key_is("k")])
    tasks = [asyncio.ensure_future(run_trigger(t, timeout=30)) for t in (live, later)]
    await eventually(lambda: all_waiting([live, later]))
    await asyncio.to_thread(asyncio.run, create_topics(bootstrap, [later_name], partitions=2))
    placed = await produce(bootstrap, later_name, Message({"n": 1}, key="k", partition=1))
    payload = (await tasks[1]).payload
    assert (payload["topic"], payload["partition"], payload["offset"]) == (later_name, *placed[0])
    assert len(started) == 2  # the topic that appeared was added to the same fetch consumer
    tasks[0].cancel()
    await asyncio.gather(tasks[0], return_exceptions=True)


# ------------------------------------------------------------------------------ cancel
LAYOUTS = ("one topic", "a topic each", "catching up")


@pytest.mark.parametrize("layout", LAYOUTS)
async def test_cancelling_a_thousand_waits_leaves_nothing_within_a_second(
    monkeypatch: pytest.MonkeyPatch, crowded_broker: PrivateBroker, crowded_conn: str, layout: str
) -> None:
    n = 1000
    bootstrap = crowded_broker.bootstrap_servers
    if layout == "a topic each":
        names = [unique("each") for _ in range(n)]
        await asyncio.to_thread(asyncio.run, create_topics(bootstrap, names))
    else:
        names = [unique("one")] * n
        await asyncio.to_thread(asyncio.run, create_topics(bootstrap, names[:1], partitions=2))
    if layout == "catching up":  # every wait starts behind the reader: a catch-up pass is running
        await asyncio.to_thread(asyncio.run, produce(bootstrap, names[0], *[Message({"n": i}) for i in range(2000)]))
    await get_connection(crowded_conn)
    started = count_consumers(monkeypatch)
    tasks_before = asyncio.all_tasks()
    start_from = "earliest" if layout == "catching up" else "timestamp"
    triggers = [make(name, crowded_conn, start_from=start_from, acceptors=[key_is("never")]) for name in names]
    tasks = [asyncio.ensure_future(run_trigger(t, timeout=120)) for t in triggers]
    await eventually(lambda: all(t._subscription is not None and t._subscription.waiter.readers for t in triggers), 60)
    connection = connection_for(crowded_conn)
    await eventually(lambda: all(reader.resolved.is_set() for reader in connection.topics.values()), 60)
    if layout == "catching up":
        await eventually(lambda: any(reader.catching_up is not None for reader in connection.topics.values()), 30)
    else:
        await eventually(lambda: all_waiting(triggers), 60)
    assert await asyncio.to_thread(broker_sockets, crowded_broker.port) >= 1

    cancelled_at = time.monotonic()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)

    def nothing_left() -> bool:
        return (
            leases.held_keys() == {}
            and asyncio.all_tasks() - tasks_before - {asyncio.current_task()} == set()
            and all(consumer._closed for consumer in started)
            and broker_sockets(crowded_broker.port) == 0
        )

    await eventually(nothing_left, timeout=5)
    took = time.monotonic() - cancelled_at
    print(f"{layout}: {n} waits, {len(started)} consumers, released in {took:.2f}s")
    assert started, "the waits never started a consumer"
    assert took < 1.0, f"{layout}: {took:.2f}s to release {n} waits"
