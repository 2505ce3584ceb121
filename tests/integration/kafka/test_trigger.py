"""The Kafka trigger against a real Kafka-protocol broker (tansu) on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from airflow_deferrable_kit import leases
from airflow_deferrable_kit._kafka import (
    catchup as _kafka_catchup,
)
from airflow_deferrable_kit._kafka import (
    messages as _kafka_messages,
)
from airflow_deferrable_kit._kafka import settings as kafka_settings
from airflow_deferrable_kit.connections import get_connection
from airflow_deferrable_kit.payload import MAX_PAYLOAD_BYTES
from airflow_deferrable_kit.testing import run_trigger, watch_blocking
from airflow_deferrable_kit.triggers.kafka import KafkaMessageTrigger
from tests.integration.kafka.conftest import (
    Message,
    PrivateBroker,
    broker_sockets,
    commit,
    committed,
    count_consumers,
    create_topic,
    eventually,
    hours_ago,
    key_is,
    make,
    path_is,
    produce,
    produce_elsewhere,
    reader_for,
    recreate_topic,
    set_connection,
    unique,
    waiting,
)


# ------------------------------------------------------------------------------- matching
async def test_matches_by_key_on_a_message_produced_while_waiting(bootstrap: str, kafka_conn: str, topic: str) -> None:
    trigger = make(topic, kafka_conn, acceptors=[key_is("batch-42")])
    task = asyncio.ensure_future(run_trigger(trigger, timeout=20))
    await eventually(lambda: trigger._subscription is not None and topic in trigger._subscription.waiter.attached)
    placed = await produce(
        bootstrap,
        topic,
        Message({"n": 1}, key="batch-41"),
        Message({"n": 2}, key="batch-42", headers=[("source", b"loader")]),
    )
    payload = (await task).payload
    assert payload["status"] == "success"
    assert (payload["partition"], payload["offset"]) == placed[1]
    assert payload["key"] == "batch-42"
    assert payload["value"] == {"n": 2}
    assert payload["headers"] == {"source": "loader"}
    assert payload["matched"]["matcher"] == "key" and payload["matched"]["actual"] == "batch-42"
    assert leases.held_keys() == {}


async def test_matches_json_field_equals_and_in(bootstrap: str, kafka_conn: str, topic: str) -> None:
    start = int(time.time() * 1000)
    await produce(
        bootstrap,
        topic,
        Message({"batch": {"id": 41, "state": "done"}}, partition=0),
        Message({"batch": {"id": "42", "state": "done"}}, partition=0),  # a string, not the number 42
        Message({"batch": {"id": 42, "state": "running"}}, partition=0),
        Message({"batch": {"id": 42, "state": "done"}}, partition=0),
    )
    equals = make(topic, kafka_conn, start_after_ms=start, acceptors=[path_is("batch.id", 42)])
    one_of = make(
        topic,
        kafka_conn,
        start_after_ms=start,
        acceptors=[path_is("batch.id", 42), path_is("batch.state", ["done", "closed"], comparator="in")],
    )
    both = make(
        topic,
        kafka_conn,
        start_after_ms=start,
        acceptors=[
            path_is("batch.state", ["running"], state="retry", comparator="in"),
            path_is("batch.id", 42),
        ],
    )
    first, second, third = await asyncio.gather(*(run_trigger(t, timeout=20) for t in (equals, one_of, both)))
    assert first.payload["value"] == {"batch": {"id": 42, "state": "running"}} and first.payload["offset"] == 2
    assert second.payload["value"] == {"batch": {"id": 41, "state": "done"}} and second.payload["offset"] == 0
    assert second.payload["matched"]["argument"] == "batch.state"
    assert second.payload["matched"]["comparator"] == "in"
    assert third.payload["value"] == {"batch": {"id": 42, "state": "done"}} and third.payload["offset"] == 3


async def test_matches_header_and_text_value(bootstrap: str, kafka_conn: str, topic: str) -> None:
    header = make(
        topic,
        kafka_conn,
        value_format="text",
        acceptors=[{"state": "success", "matcher": "header", "argument": "event", "expected": "closed"}],
    )
    text = make(
        topic, kafka_conn, value_format="text", acceptors=[{"state": "success", "matcher": "value", "expected": "DONE"}]
    )
    tasks = [asyncio.ensure_future(run_trigger(t, timeout=20)) for t in (header, text)]
    await eventually(
        lambda: all(t._subscription is not None and topic in t._subscription.waiter.attached for t in (header, text))
    )
    await produce(
        bootstrap,
        topic,
        Message(b"opened", raw=True, headers=[("event", b"opened")], partition=0),
        Message(b"payload", raw=True, headers=[("event", b"opened"), ("event", b"closed")], partition=0),
        Message(b"DONE", raw=True, partition=0),
    )
    by_header, by_text = (t.payload for t in await asyncio.gather(*tasks))
    assert by_header["value"] == "payload"  # the last "event" header wins
    assert by_header["headers"] == {"event": "closed"}
    assert by_text["value"] == "DONE" and by_text["offset"] == 2


async def test_predicates_sync_async_and_raising(bootstrap: str, kafka_conn: str, topic: str) -> None:
    start = int(time.time() * 1000)
    await produce(
        bootstrap,
        topic,
        *[Message({"n": n, "items": [n] * 3, "state": "running"}, partition=0) for n in range(12)],
        Message({"n": 12, "items": [50, 60], "state": "done"}, partition=0),
    )
    sync = make(topic, kafka_conn, start_after_ms=start, predicate="tests.integration.kafka.predicates:total_over_100")
    a_sync = make(topic, kafka_conn, start_after_ms=start, predicate="tests.integration.kafka.predicates.async_status")
    raising = make(
        topic, kafka_conn, start_after_ms=start, predicate="tests.integration.kafka.predicates:explodes_on_odd"
    )
    filtered = make(
        topic,
        kafka_conn,
        start_after_ms=start,
        acceptors=[path_is("state", "done")],
        predicate="tests.integration.kafka.predicates:total_over_100",
    )
    results = [
        e.payload
        for e in await asyncio.gather(*(run_trigger(t, timeout=20) for t in (sync, a_sync, raising, filtered)))
    ]
    assert [r["status"] for r in results] == ["success", "success", "error", "success"]
    assert results[0]["value"]["n"] == 12 and results[0]["matched"]["argument"].endswith("total_over_100")
    assert results[0]["matched"]["returned"] == "True"
    assert results[1]["value"]["n"] == 12
    # A predicate that raises ends the wait at once, naming the predicate and the message (n = 1).
    assert results[2]["error_type"] == "predicate_error"
    assert "explodes_on_odd" in results[2]["message"] and "RuntimeError: odd 1" in results[2]["message"]
    assert f"{topic}[0]@1" in results[2]["message"]
    assert results[3]["value"]["n"] == 12 and results[3]["matched"]["candidate"]["argument"] == "state"


async def test_failure_condition_ends_with_the_message_coordinates(bootstrap: str, kafka_conn: str, topic: str) -> None:
    start = int(time.time() * 1000)
    placed = await produce(bootstrap, topic, Message({"id": 7, "state": "failed"}, key="b7"))
    trigger = make(
        topic,
        kafka_conn,
        start_after_ms=start,
        acceptors=[
            path_is("state", ["failed", "cancelled"], state="failure", comparator="in"),
            path_is("state", "done"),
        ],
    )
    payload = (await run_trigger(trigger, timeout=20)).payload
    assert payload["status"] == "error"
    assert payload["error_type"] == "condition_failed"
    assert (payload["partition"], payload["offset"]) == placed[0]
    assert payload["topic"] == topic and payload["key"] == "b7"
    assert payload["matched"]["state"] == "failure"


async def test_async_predicate_can_fail_the_wait(bootstrap: str, kafka_conn: str, topic: str) -> None:
    start = int(time.time() * 1000)
    await produce(bootstrap, topic, Message({"state": "running"}), Message({"state": "broken"}, partition=1))
    trigger = make(topic, kafka_conn, start_after_ms=start, predicate="tests.integration.kafka.predicates:async_status")
    payload = (await run_trigger(trigger, timeout=20)).payload
    assert payload["error_type"] == "condition_failed" and payload["value"] == {"state": "broken"}


# ------------------------------------------------------------------------- start positions
async def test_default_start_skips_older_messages_and_finds_newer_ones(
    bootstrap: str, kafka_conn: str, topic: str
) -> None:
    await produce(bootstrap, topic, Message({"n": 1}, key="k", partition=0))
    await asyncio.sleep(0.01)
    start = int(time.time() * 1000)
    await asyncio.sleep(0.01)
    placed = await produce(bootstrap, topic, Message({"n": 2}, key="k", partition=0))
    payload = (
        await run_trigger(make(topic, kafka_conn, start_after_ms=start, acceptors=[key_is("k")]), timeout=20)
    ).payload
    assert payload["value"] == {"n": 2} and payload["offset"] == placed[0][1] == 1


async def test_earliest_start_finds_an_old_message(bootstrap: str, kafka_conn: str, topic: str) -> None:
    placed = await produce(bootstrap, topic, Message({"n": 1}, key="old"), Message({"n": 2}, key="other"))
    payload = (
        await run_trigger(make(topic, kafka_conn, start_from="earliest", acceptors=[key_is("old")]), timeout=20)
    ).payload
    assert (payload["partition"], payload["offset"]) == placed[0]
    assert payload["start"]["from"] == "earliest"


async def test_committed_start_reads_offsets_without_touching_them(bootstrap: str, kafka_conn: str, topic: str) -> None:
    group = unique("group")
    await produce(bootstrap, topic, *[Message({"n": n}, key="k", partition=0) for n in range(3)])
    await commit(bootstrap, group, topic, {0: 2})  # n=0 and n=1 are consumed; n=2 is not
    trigger = make(topic, kafka_conn, start_from="committed", group_id=group, acceptors=[key_is("k")])
    payload = (await run_trigger(trigger, timeout=20)).payload
    assert payload["value"] == {"n": 2} and payload["offset"] == 2
    # Read-only: the group's offsets are exactly as they were.
    assert await committed(bootstrap, group, topic, 3) == {0: 2, 1: -1, 2: -1}


async def test_committed_start_uses_the_timestamp_where_the_group_has_no_offset(
    bootstrap: str, kafka_conn: str, topic: str
) -> None:
    group = unique("group")
    await produce(bootstrap, topic, Message({"n": 0}, key="k", partition=1))
    start = int(time.time() * 1000) + 1
    await asyncio.sleep(0.01)
    await produce(bootstrap, topic, Message({"n": 1}, key="k", partition=1))
    trigger = make(
        topic, kafka_conn, start_from="committed", group_id=group, start_after_ms=start, acceptors=[key_is("k")]
    )
    payload = (await run_trigger(trigger, timeout=20)).payload
    assert payload["value"] == {"n": 1}


async def test_restart_keeps_the_start_moment(bootstrap: str, kafka_conn: str, topic: str) -> None:
    """A trigger rebuilt from its kwargs (triggerer restart) starts from the same moment."""
    original = make(topic, kafka_conn, acceptors=[key_is("late")])
    _, kwargs = original.serialize()
    placed = await produce(bootstrap, topic, Message({"n": 1}, key="late"))
    rebuilt = KafkaMessageTrigger(**json.loads(json.dumps(kwargs)))
    assert rebuilt.start_after_ms == original.start_after_ms
    payload = (await run_trigger(rebuilt, timeout=20)).payload
    assert (payload["partition"], payload["offset"]) == placed[0]


async def test_start_offsets_start_each_partition_there_and_unlisted_ones_at_zero(
    bootstrap: str, kafka_conn: str, topic: str
) -> None:
    """Partition 2 is not in the offsets (it was added after the deferral): read from offset 0.
    The listed ones start at their offsets, whatever the records' timestamps say."""
    await produce(bootstrap, topic, Message({"n": 0}, key="k", partition=0), Message({"n": 1}, key="k", partition=1))
    stamped = hours_ago(5)
    placed = await produce(bootstrap, topic, Message({"n": 2}, key="k", partition=2, timestamp_ms=stamped))
    trigger = make(topic, kafka_conn, start_offsets={topic: {"0": 1, "1": 1}}, acceptors=[key_is("k")])
    assert trigger.start_after_ms is None
    payload = (await run_trigger(trigger, timeout=20)).payload
    assert (payload["partition"], payload["offset"]) == placed[0] == (2, 0)
    assert payload["examined"] == 1 and payload["timestamp"] == stamped


async def test_a_topic_that_did_not_exist_at_the_deferral_is_read_from_zero(
    bootstrap: str, kafka_conn: str, fast_refresh: None
) -> None:
    """Its messages are all new, even those stamped before the deferral (the moment rule kept
    only messages stamped after it here, and missed this one)."""
    name = unique("later")
    trigger = make(name, kafka_conn, wait_for_topic=True, start_offsets={}, acceptors=[key_is("k")])
    task = await waiting(trigger, name)
    await create_topic(bootstrap, name, partitions=2)
    placed = await produce(bootstrap, name, Message({"n": 1}, key="k", partition=1, timestamp_ms=hours_ago(8)))
    payload = (await task).payload
    assert (payload["partition"], payload["offset"]) == placed[0] == (1, 0)


async def test_partitions_added_while_waiting_are_read_from_zero_whatever_their_timestamps(
    bootstrap: str, kafka_conn: str, fast_refresh: None
) -> None:
    name = await create_topic(bootstrap, unique("grow"), partitions=1)
    trigger = make(name, kafka_conn, start_offsets={name: {"0": 0}}, acceptors=[key_is("k")])
    task = await waiting(trigger, name)
    await recreate_topic(bootstrap, name, partitions=3)
    placed = await produce(bootstrap, name, Message({"n": 1}, key="k", partition=2, timestamp_ms=hours_ago(8)))
    payload = (await task).payload
    assert (payload["partition"], payload["offset"]) == placed[0] == (2, 0)


async def test_a_start_offset_past_the_log_end_starts_at_the_log_end(
    bootstrap: str, kafka_conn: str, topic: str
) -> None:
    """The log was cut back or the topic recreated since the deferral: nothing after is skipped."""
    await produce(bootstrap, topic, Message({"n": 0}, key="k", partition=0))
    trigger = make(topic, kafka_conn, start_offsets={topic: {"0": 999, "1": 0, "2": 0}}, acceptors=[key_is("k")])
    task = await waiting(trigger, topic)
    placed = await produce(bootstrap, topic, Message({"n": 1}, key="k", partition=0))
    payload = (await task).payload
    assert (payload["partition"], payload["offset"]) == placed[0] == (0, 1)


async def test_a_trigger_stored_by_the_previous_version_still_runs(bootstrap: str, kafka_conn: str, topic: str) -> None:
    """Kwargs without ``start_offsets`` (stored before it existed) keep the moment rule."""
    start = int(time.time() * 1000)
    _, kwargs = make(topic, kafka_conn, start_after_ms=start, acceptors=[key_is("k")]).serialize()
    del kwargs["start_offsets"]
    await asyncio.sleep(0.01)
    placed = await produce(bootstrap, topic, Message({"n": 1}, key="k"))
    stored = KafkaMessageTrigger(**json.loads(json.dumps(kwargs)))
    assert stored.start_offsets is None and stored.start_after_ms == start
    payload = (await run_trigger(stored, timeout=20)).payload
    assert (payload["partition"], payload["offset"]) == placed[0]
    assert payload["start"]["after_ms"] == start and payload["start"]["offsets"] is None


async def test_the_poke_path_scans_from_the_start_offsets(bootstrap: str, kafka_conn: str, topic: str) -> None:
    await produce(bootstrap, topic, Message({"n": 0}, key="k", partition=0))
    placed = await produce(bootstrap, topic, Message({"n": 1}, key="k", partition=0, timestamp_ms=hours_ago(2)))
    trigger = make(topic, kafka_conn, start_offsets={topic: {"0": 1, "1": 0, "2": 0}}, acceptors=[key_is("k")])
    payload = await trigger.poll_once()
    assert payload is not None and (payload["partition"], payload["offset"]) == placed[0] == (0, 1)
    assert payload["examined"] == 1


# ------------------------------------------------------------------------ robustness
async def test_malformed_undecodable_and_tombstones_are_skipped_and_counted(
    bootstrap: str, kafka_conn: str, topic: str
) -> None:
    start = int(time.time() * 1000)
    await produce(
        bootstrap,
        topic,
        Message(b"{not json", raw=True, key="k", partition=0),
        Message(b"\xff\xfe\x00", raw=True, key="k", partition=0),
        Message(None, key="k", partition=0),
        Message(b"NaN", raw=True, key="k", partition=0),
        Message({"ok": True}, key="k", partition=0),
    )
    payload = (
        await run_trigger(make(topic, kafka_conn, start_after_ms=start, acceptors=[key_is("k")]), timeout=20)
    ).payload
    assert payload["value"] == {"ok": True} and payload["offset"] == 4
    assert payload["skipped"] == {"tombstone": 1, "undecodable": 1, "malformed": 2, "predicate_error": 0}
    assert payload["examined"] == 5


async def test_malformed_messages_are_counted_on_the_shared_reader_too(
    bootstrap: str, kafka_conn: str, topic: str
) -> None:
    trigger = make(topic, kafka_conn, acceptors=[key_is("k")])
    task = asyncio.ensure_future(run_trigger(trigger, timeout=20))
    await eventually(lambda: trigger._subscription is not None and topic in trigger._subscription.waiter.attached)
    await produce(
        bootstrap,
        topic,
        Message(b"<xml/>", raw=True, key="k", partition=2),
        Message(None, key="k", partition=2),
        Message([1, 2], key="k", partition=2),
    )
    payload = (await task).payload
    assert payload["value"] == [1, 2]
    assert payload["skipped"]["malformed"] == 1 and payload["skipped"]["tombstone"] == 1
    assert payload["examined"] == 3


async def test_bytes_format_matches_binary_values_by_key(bootstrap: str, kafka_conn: str, topic: str) -> None:
    start = int(time.time() * 1000)
    await produce(bootstrap, topic, Message(b"\x00\x01avro\xff", raw=True, key="bin"))
    payload = (
        await run_trigger(
            make(topic, kafka_conn, start_after_ms=start, value_format="bytes", acceptors=[key_is("bin")]), timeout=20
        )
    ).payload
    assert payload["value"] == "AAFhdnJv/w==" and payload["value_format"] == "bytes"


async def test_payload_is_capped(bootstrap: str, kafka_conn: str, topic: str) -> None:
    start = int(time.time() * 1000)
    big = {"text": "é" * 100_000, "id": 1}
    await produce(
        bootstrap,
        topic,
        Message(big, key="k" * 5000, headers=[(f"h{i}", b"v" * 1000) for i in range(40)], partition=0),
    )
    payload = (
        await run_trigger(make(topic, kafka_conn, start_after_ms=start, acceptors=[path_is("id", 1)]), timeout=20)
    ).payload
    assert payload["status"] == "success"
    assert payload["value_truncated"] is True and isinstance(payload["value"], str)
    assert payload["size"] > 100_000
    assert len(payload["headers"]) == _kafka_messages.MAX_HEADERS
    assert len(json.dumps(payload)) < MAX_PAYLOAD_BYTES


async def test_unknown_topic_is_fatal_by_default(kafka_conn: str) -> None:
    payload = (await run_trigger(make(unique("missing"), kafka_conn), timeout=20)).payload
    assert payload["status"] == "error" and payload["error_type"] == "not_found"


async def test_waits_for_a_topic_created_later(bootstrap: str, kafka_conn: str, fast_refresh: None) -> None:
    name = unique("later")
    trigger = make(name, kafka_conn, wait_for_topic=True, acceptors=[key_is("k")])
    task = await waiting(trigger, name)
    await create_topic(bootstrap, name, partitions=2)
    placed = await produce(bootstrap, name, Message({"n": 1}, key="k", partition=1))
    payload = (await task).payload
    assert (payload["partition"], payload["offset"]) == placed[0]


async def test_partitions_that_appear_while_waiting_are_read(
    bootstrap: str, kafka_conn: str, fast_refresh: None
) -> None:
    """The reader sees partitions 1 and 2 appear (see :func:`recreate_topic`)."""
    name = await create_topic(bootstrap, unique("grow"), partitions=1)
    trigger = make(name, kafka_conn, acceptors=[key_is("k")])
    task = await waiting(trigger, name)
    reader = reader_for(kafka_conn, name)
    await recreate_topic(bootstrap, name, partitions=3)
    placed = await produce(bootstrap, name, Message({"n": 1}, key="k", partition=2))
    payload = (await task).payload
    assert (payload["partition"], payload["offset"]) == placed[0] == (2, 0)
    assert len(reader.positions) == 3


async def test_bad_credentials_are_fatal(monkeypatch: pytest.MonkeyPatch, authenticating_broker: PrivateBroker) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_KAFKA_AUTH",
        json.dumps(
            {
                "conn_type": "kafka",
                "login": "nobody",
                "password": "s3cret-pw",
                "extra": {
                    "bootstrap.servers": authenticating_broker.bootstrap_servers,
                    "security.protocol": "SASL_PLAINTEXT",
                    "sasl.mechanism": "SCRAM-SHA-256",
                },
            }
        ),
    )
    trigger = make("anything", "kafka_auth", poll_interval=5)
    assert "s3cret-pw" not in json.dumps(trigger.serialize())
    payload = (await run_trigger(trigger, timeout=20)).payload
    assert payload["status"] == "error" and payload["error_type"] == "authentication"
    assert "s3cret-pw" not in json.dumps(payload)


# --------------------------------------------------------------------------- sharing
async def test_two_hundred_waiters_share_one_reader(
    bootstrap: str, kafka_broker: Any, kafka_conn: str, topic: str, frozen_gc: None
) -> None:
    n = 200
    triggers = [make(topic, kafka_conn, acceptors=[key_is(f"batch-{i}")], poll_interval=1.0) for i in range(n)]
    # Airflow imports modules on its first async connection lookup (~0.3 s, once per process):
    # do that before watching, so what is measured is this wait's own work.
    await get_connection(kafka_conn)
    with watch_blocking(0.2) as blocked:
        tasks = [asyncio.ensure_future(run_trigger(t, timeout=60)) for t in triggers]
        await eventually(
            lambda: all(t._subscription is not None and topic in t._subscription.waiter.attached for t in triggers), 30
        )
        reader = reader_for(kafka_conn, topic)
        sockets_waiting = await asyncio.to_thread(broker_sockets, kafka_broker.port)
        placed = await produce_elsewhere(
            bootstrap, topic, *[Message({"i": i}, key=f"batch-{i}") for i in reversed(range(n))]
        )
        payloads = [t.payload for t in await asyncio.gather(*tasks)]
    expected = dict(zip(reversed(range(n)), placed, strict=True))
    for i, payload in enumerate(payloads):
        assert payload["value"] == {"i": i}
        assert (payload["partition"], payload["offset"]) == expected[i]
    # One fetching consumer + one lookup connection for all 200 waits.
    assert sockets_waiting <= 2, sockets_waiting
    # The fan-out evaluated each message for the waiter whose key it carries, not for all 200.
    assert reader.evaluations <= 2 * n, reader.evaluations
    assert blocked == [], blocked
    assert leases.held_keys() == {}
    await eventually(lambda: broker_sockets(kafka_broker.port) == 0)


async def test_a_waiter_behind_the_reader_catches_up_then_joins(bootstrap: str, kafka_conn: str, topic: str) -> None:
    live = make(topic, kafka_conn, acceptors=[key_is("never")])
    live_task = asyncio.ensure_future(run_trigger(live, timeout=30))
    await eventually(lambda: live._subscription is not None and topic in live._subscription.waiter.attached)
    start = int(time.time() * 1000)
    await produce(bootstrap, topic, *[Message({"n": n}, key=f"k{n}") for n in range(30)])
    reader = reader_for(kafka_conn, topic)
    await eventually(lambda: sum(reader.positions.values()) >= 30)
    late = make(topic, kafka_conn, start_after_ms=start, acceptors=[key_is("k40")])
    late_task = asyncio.ensure_future(run_trigger(late, timeout=30))
    await eventually(lambda: late._subscription is not None and late._subscription.waiter.attached.get(topic) is reader)
    assert late._subscription.waiter.counts["examined"] == 30  # the gap, read by a catch-up pass
    assert reader.passes == 1 and late._subscription.own_pace.consumers == {}  # shared, not a consumer of its own
    placed = await produce(bootstrap, topic, Message({"n": 40}, key="k40"))
    payload = (await late_task).payload
    assert (payload["partition"], payload["offset"]) == placed[0]
    assert payload["examined"] == 31  # the gap, then the live message from the shared reader
    live_task.cancel()
    await asyncio.gather(live_task, return_exceptions=True)
    await live.cleanup()


async def test_many_late_waiters_share_one_catch_up_read(
    monkeypatch: pytest.MonkeyPatch, bootstrap: str, kafka_conn: str, topic: str, frozen_gc: None
) -> None:
    """Waits that start behind the shared reader (a mass deferral, a triggerer restart) read the
    gap together: one more consumer for all of them, their start looked up a few times, not once
    each, exact offsets and counts, and the loop never blocked."""
    started = count_consumers(monkeypatch)
    await get_connection(kafka_conn)
    live = make(topic, kafka_conn, acceptors=[key_is("never")])
    live_task = asyncio.ensure_future(run_trigger(live, timeout=60))
    await eventually(lambda: live._subscription is not None and topic in live._subscription.waiter.attached)
    reader = reader_for(kafka_conn, topic)
    lookups_before = reader.connection.lookups.batches
    start = int(time.time() * 1000)
    gap = await produce_elsewhere(bootstrap, topic, *[Message({"n": n}, key=f"k{n}", partition=0) for n in range(30)])
    await eventually(lambda: sum(reader.positions.values()) >= 30)
    n = 100
    late = [
        make(topic, kafka_conn, start_after_ms=start, poll_interval=1.0, acceptors=[key_is(f"k{i}")]) for i in range(n)
    ]
    with watch_blocking(0.2) as blocked:
        tasks = [asyncio.ensure_future(run_trigger(t, timeout=60)) for t in late]
        await eventually(
            lambda: all(
                t._subscription is not None and t._subscription.waiter.attached.get(topic) is reader for t in late[30:]
            )
        )
        fresh = await produce_elsewhere(
            bootstrap, topic, *[Message({"n": i}, key=f"k{i}", partition=0) for i in range(30, n)]
        )
        payloads = [t.payload for t in await asyncio.gather(*tasks)]
    placed = gap + fresh
    for i, payload in enumerate(payloads):
        assert (payload["partition"], payload["offset"]) == placed[i]
        assert payload["examined"] == i + 1  # everything from its start up to its message, nothing twice
    assert len(started) == 3  # the reader's two consumers and one catch-up consumer, for 100 late waits
    assert 1 <= reader.connection.lookups.batches - lookups_before < 10  # 100 starts: a few lookups, not 100
    assert blocked == [], blocked
    live_task.cancel()
    await asyncio.gather(live_task, return_exceptions=True)
    assert leases.held_keys() == {}


async def test_cancelling_late_waiters_mid_catch_up_releases_everything(
    bootstrap: str, kafka_broker: Any, kafka_conn: str, topic: str
) -> None:
    await produce(bootstrap, topic, *[Message({"n": n}) for n in range(200)])
    waiters = [make(topic, kafka_conn, start_from="earliest", acceptors=[key_is("never")]) for _ in range(50)]
    tasks = [asyncio.ensure_future(run_trigger(t, timeout=60)) for t in waiters]
    await eventually(lambda: any(t._subscription is not None and t._subscription.waiter.readers for t in waiters))
    reader = reader_for(kafka_conn, topic)
    await eventually(lambda: reader.passes >= 1)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert leases.held_keys() == {}
    await eventually(lambda: broker_sockets(kafka_broker.port) == 0)


async def test_a_fatal_error_while_catching_up_ends_the_late_waits_with_it(
    monkeypatch: pytest.MonkeyPatch, bootstrap: str, kafka_conn: str, topic: str
) -> None:
    from aiokafka.errors import TopicAuthorizationFailedError

    started: list[Any] = []
    start_consumer = _kafka_catchup.start_consumer

    async def refuse(*args: Any, **kwargs: Any) -> Any:
        raise TopicAuthorizationFailedError()

    async def start(options: Any, **kwargs: Any) -> Any:
        consumer = await start_consumer(options, **kwargs)
        started.append(consumer)
        monkeypatch.setattr(consumer, "getmany", refuse)
        return consumer

    monkeypatch.setattr(_kafka_catchup, "start_consumer", start)
    await produce(bootstrap, topic, Message({"n": 1}))
    waiters = [make(topic, kafka_conn, start_from="earliest", acceptors=[key_is("never")]) for _ in range(3)]
    payloads = [event.payload for event in await asyncio.gather(*(run_trigger(t, timeout=20) for t in waiters))]
    assert [p["error_type"] for p in payloads] == ["authorization"] * 3
    assert len(started) == 1 and leases.held_keys() == {}  # one catch-up consumer for the three


async def test_a_slow_predicate_waiter_falls_behind_and_still_finds_its_match(
    monkeypatch: pytest.MonkeyPatch, bootstrap: str, kafka_conn: str, topic: str
) -> None:
    monkeypatch.setattr(kafka_settings, "WAITER_QUEUE_MESSAGES", 5)
    trigger = make(topic, kafka_conn, predicate="tests.integration.kafka.predicates:slow_is_last")
    task = asyncio.ensure_future(run_trigger(trigger, timeout=30))
    await eventually(lambda: trigger._subscription is not None and topic in trigger._subscription.waiter.attached)
    placed = await produce(
        bootstrap, topic, *[Message({"n": n}, partition=0) for n in range(60)], Message({"last": True}, partition=0)
    )
    payload = (await task).payload
    assert (payload["partition"], payload["offset"]) == placed[-1]
    assert trigger._subscription is not None and trigger._subscription.waiter.counts["fell_behind"] >= 1
    assert len(trigger._subscription.waiter.queue) <= 5


async def test_two_triggerers_running_the_same_trigger_leave_no_trace(
    bootstrap: str, kafka_conn: str, topic: str
) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    async def groups() -> list[Any]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            return sorted(map(str, await admin.list_consumer_groups()))
        finally:
            await admin.close()

    before = await groups()
    first = make(topic, kafka_conn, acceptors=[key_is("k")])
    second = KafkaMessageTrigger(**first.serialize()[1])
    tasks = [asyncio.ensure_future(run_trigger(t, timeout=20)) for t in (first, second)]
    await eventually(
        lambda: all(t._subscription is not None and topic in t._subscription.waiter.attached for t in (first, second))
    )
    await produce(bootstrap, topic, Message({"n": 1}, key="k"))
    a, b = (t.payload for t in await asyncio.gather(*tasks))
    assert (a["partition"], a["offset"]) == (b["partition"], b["offset"])
    assert await groups() == before  # no group joined, nothing committed


async def test_broker_restart_mid_wait_resumes_from_the_last_position(
    monkeypatch: pytest.MonkeyPatch, durable_broker: PrivateBroker
) -> None:
    conn = set_connection(monkeypatch, "kafka_durable", durable_broker.bootstrap_servers)
    started = count_consumers(monkeypatch)
    bootstrap = durable_broker.bootstrap_servers
    name = await create_topic(bootstrap, unique("restart"), partitions=1)
    trigger = make(name, conn, acceptors=[key_is("after")], poll_interval=0.2)
    task = asyncio.ensure_future(run_trigger(trigger, timeout=60))
    await eventually(lambda: trigger._subscription is not None and name in trigger._subscription.waiter.attached)
    await produce(bootstrap, name, *[Message({"n": n}, key="before") for n in range(3)])
    reader = reader_for(conn, name)
    await eventually(lambda: sum(reader.positions.values()) == 3)
    durable_broker.kill()
    await asyncio.sleep(0.5)  # let the reader notice the broker is gone (not an assertion)
    durable_broker.start()
    placed = await produce(bootstrap, name, Message({"n": 3}, key="after"))
    payload = (await task).payload
    assert payload["status"] == "success"
    assert payload["offset"] == placed[0][1] == 3
    assert payload["examined"] == 4  # nothing re-read from the start, nothing skipped
    assert len(started) == 2  # the same fetch and lookup consumers resumed; no new group, no re-seek to 0


async def test_waiters_that_must_see_every_message_never_block_the_loop(
    bootstrap: str, kafka_conn: str, topic: str, frozen_gc: None
) -> None:
    """``exists`` conditions cannot be indexed: every message is evaluated for every such waiter,
    and the fan-out yields to the loop instead of holding it for the whole batch."""
    await get_connection(kafka_conn)
    waiters = [
        make(
            topic,
            kafka_conn,
            acceptors=[{"state": "success", "matcher": "path", "argument": f"f{i}", "comparator": "exists"}],
        )
        for i in range(50)
    ]
    with watch_blocking(0.2) as blocked:
        tasks = [asyncio.ensure_future(run_trigger(t, timeout=60)) for t in waiters]
        await eventually(
            lambda: all(t._subscription is not None and topic in t._subscription.waiter.attached for t in waiters), 30
        )
        reader = reader_for(kafka_conn, topic)
        await produce_elsewhere(bootstrap, topic, *[Message({"n": n}, partition=0) for n in range(1000)])
        await produce_elsewhere(bootstrap, topic, Message({f"f{i}": True for i in range(50)}, partition=0))
        payloads = [t.payload for t in await asyncio.gather(*tasks)]
    assert {p["offset"] for p in payloads} == {1000}
    assert [p["examined"] for p in payloads] == [1001] * 50
    assert reader.evaluations == 50 * 1001
    assert blocked == [], blocked


async def test_cancelling_a_wait_releases_its_consumers(
    bootstrap: str, kafka_broker: Any, kafka_conn: str, topic: str
) -> None:
    trigger = make(topic, kafka_conn, start_from="earliest", acceptors=[key_is("never")])
    await produce(bootstrap, topic, *[Message({"n": n}) for n in range(5)])
    task = asyncio.ensure_future(run_trigger(trigger, timeout=60))
    await eventually(lambda: trigger._subscription is not None and topic in trigger._subscription.waiter.attached)
    assert await asyncio.to_thread(broker_sockets, kafka_broker.port) >= 1
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert leases.held_keys() == {}
    await eventually(lambda: broker_sockets(kafka_broker.port) == 0)
