"""The hand-out engine with fake records and no broker: who gets which message, and when."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from typing import Any

import pytest
from aiokafka import TopicPartition

from airflow_deferrable_kit._kafka import settings as kafka_settings
from airflow_deferrable_kit._kafka.catchup import CatchUpPass
from airflow_deferrable_kit._kafka.fanout import TopicReader, Waiter
from airflow_deferrable_kit._kafka.messages import canonical_acceptors
from airflow_deferrable_kit._kafka.reader import ConnectionReader
from tests.unit.kafka.fakes import record, spec

TP = TopicPartition("t", 0)


def keyed(offset: int, *, value: bytes = b'{"n": 1}') -> Any:
    return record(value, key=f"k{offset}".encode(), offset=offset)


def waiter_for(key: str, cursor: int, reader: TopicReader) -> Waiter:
    waiter = Waiter(spec(canonical_acceptors(success=[{"key": key}])), start_from="timestamp", start_after_ms=0)
    waiter.cursor[TP] = cursor
    waiter.readers["t"] = reader
    return waiter


def reader_at(position: int) -> TopicReader:
    """Topic ``t``'s hand-out on a connection that never talks to a broker (nothing joined)."""
    reader = TopicReader(ConnectionReader("conn", {}), "t")
    reader.positions[TP] = position
    return reader


async def test_a_catch_up_pass_counts_each_wait_from_its_own_start_and_hands_it_over() -> None:
    reader = reader_at(10)
    early = waiter_for("k3", 0, reader)  # its message is in the gap
    late = waiter_for("k3", 6, reader)  # the same key, but before its start: not its message
    other = waiter_for("k8", 6, reader)
    run = CatchUpPass(reader, [early, late, other])
    assert run.positions == {TP: 0}  # the earliest start of the three
    assert all(waiter.join(run) for waiter in (early, late, other))
    await run._dispatch({TP: [keyed(o, value=b"not json" if o == 7 else b'{"n": 1}') for o in range(10)]})
    assert [m.offset for m, _, _ in early.queue] == [3] and early.stats()["examined"] == 4
    assert [m.offset for m, _, _ in other.queue] == [8] and other.stats()["examined"] == 3
    assert not late.queue and not late.finished
    assert run.level() and run.hand_over()
    assert late.attached["t"] is reader and late.cursor[TP] == 10
    assert late.stats() == {
        "examined": 4,  # offsets 6..9, counted from its own start although the pass read from 0
        "skipped": {"tombstone": 0, "undecodable": 0, "malformed": 1, "predicate_error": 0},
    }
    await reader._dispatch({TP: [keyed(10)]})
    assert late.stats()["examined"] == 5  # and on from there by the reader


async def test_a_wait_ahead_of_the_reader_counts_only_from_its_own_position() -> None:
    reader = reader_at(0)
    ahead = waiter_for("k1", 3, reader)  # e.g. a pass read a little further than the reader
    assert ahead.try_attach("t")
    await reader._dispatch({TP: [keyed(o) for o in range(5)]})
    assert not ahead.queue  # k1 at offset 1 lies before its position
    assert ahead.stats()["examined"] == 2


async def test_a_burst_of_matches_wakes_a_batch_of_waits_per_loop_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_settings, "WAKES_PER_SLICE", 8)
    reader = reader_at(0)
    waiters = [waiter_for(f"k{i}", 0, reader) for i in range(100)]
    assert all(waiter.try_attach("t") for waiter in waiters)
    samples: list[int] = []

    async def sample() -> None:
        while True:
            samples.append(reader.evaluations)
            await asyncio.sleep(0)

    sampler = asyncio.ensure_future(sample())
    await asyncio.sleep(0)
    await reader._dispatch({TP: [keyed(o) for o in range(100)]})
    sampler.cancel()
    assert all(waiter.finished for waiter in waiters)
    turns = [after - before for before, after in itertools.pairwise(samples)]
    assert len(turns) >= 100 // 8 and max(turns) <= 8  # the loop got a turn after every 8 wake-ups


async def test_a_fetch_spanning_many_topics_paces_its_wake_ups_across_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """One fetch with a record for each of 100 topics: every topic's fan-out wakes one wait, so
    only a pace shared by all of them ever reaches its budget and gives the loop a turn."""
    monkeypatch.setattr(kafka_settings, "WAKES_PER_SLICE", 8)
    connection = ConnectionReader("conn", {})
    readers, woken = [], []
    for i in range(100):
        reader = TopicReader(connection, f"t{i}")
        reader.known = True
        tp = TopicPartition(reader.topic, 0)
        reader.positions[tp] = 0
        waiter = Waiter(spec(canonical_acceptors(success=[{"key": "k0"}])), start_from="earliest", start_after_ms=None)
        waiter.cursor[tp] = 0
        waiter.readers[reader.topic] = reader
        assert waiter.try_attach(reader.topic)
        connection.topics[reader.topic], readers = reader, [*readers, reader]
        woken.append(waiter)
    samples: list[int] = []

    async def sample() -> None:
        while True:
            samples.append(sum(w.finished for w in woken))
            await asyncio.sleep(0)

    sampler = asyncio.ensure_future(sample())
    await asyncio.sleep(0)
    batch = {TopicPartition(r.topic, 0): [dataclasses.replace(keyed(0), topic=r.topic)] for r in readers}
    await connection._dispatch(batch)
    sampler.cancel()
    assert all(waiter.finished for waiter in woken)
    turns = [after - before for before, after in itertools.pairwise(samples)]
    assert len(turns) >= 100 // 8 and max(turns) <= 8  # a turn after every 8 wake-ups, across topics


async def test_a_pass_hands_waits_over_a_slice_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_settings, "DISPATCH_SLICE_SECONDS", 0.0)
    reader = reader_at(5)
    waiters = [waiter_for("never", 5, reader) for _ in range(3)]
    run = CatchUpPass(reader, waiters)
    assert all(waiter.join(run) for waiter in waiters) and run.level()
    moved = []
    while not run.hand_over():
        moved.append(sum(waiter.attached["t"] is reader for waiter in waiters))
    assert moved == [1, 2]
    assert all(waiter.attached["t"] is reader for waiter in waiters)


# ------------------------------------------------------------------ delivery rules
def collector(reader: TopicReader, *, start_from: str = "earliest", start_after_ms: int | None = None) -> Waiter:
    """A wait whose predicate must see every message; the engine only queues messages for a
    predicate (the trigger runs it), so the queue shows everything handed to the wait."""
    waiter = Waiter(
        spec([], predicate="tests.integration.kafka.predicates:total_over_100"),
        start_from=start_from,
        start_after_ms=start_after_ms,
    )
    waiter.readers["t"] = reader
    return waiter


def offsets(waiter: Waiter, tp: TopicPartition = TP) -> list[int]:
    return [message.offset for message, _, _ in waiter.queue if message.partition == tp.partition]


def waiter_on(reader: TopicReader, success: list[dict[str, Any]], value_format: str = "json") -> Waiter:
    waiter = Waiter(
        spec(canonical_acceptors(success=success), value_format=value_format),
        start_from="earliest",
        start_after_ms=None,
    )
    waiter.cursor[TP] = 0
    waiter.readers["t"] = reader
    return waiter


async def test_each_message_goes_only_to_the_waits_whose_conditions_match_it() -> None:
    reader = reader_at(0)
    by_key = waiter_on(reader, [{"key": "a"}])
    by_path = waiter_on(reader, [{"path": "n", "equals": 2}])
    by_header = waiter_on(reader, [{"header": "event", "in": ["done"]}])
    by_text = waiter_on(reader, [{"value": "plain"}], value_format="text")
    everything = collector(reader)
    everything.cursor[TP] = 0
    assert all(w.try_attach("t") for w in (by_key, by_path, by_header, by_text, everything))
    batch = [
        record(b'{"n": 1}', key=b"a", offset=0),
        record(b'{"n": 2}', key=b"b", offset=1),
        record(b'{"n": 3}', key=b"c", headers=[("event", b"done")], offset=2),
        record(b"plain", key=b"d", offset=3),  # not JSON: only the text wait can look at it
        record(b'{"n": 2}', key=b"a", offset=4),  # matches two waits that have already finished
    ]
    await reader._dispatch({TP: batch})
    assert [offsets(w) for w in (by_key, by_path, by_header, by_text)] == [[0], [1], [2], [3]]
    assert all(w.finished and "t" not in w.attached for w in (by_key, by_path, by_header, by_text))
    assert offsets(everything) == [0, 1, 2, 4] and not everything.finished
    # The index handed each message to its candidates only: 4 data waits once each, the
    # predicate wait 4 times; never the 5 x 5 of asking every wait about every message.
    assert reader.evaluations == 8
    assert reader.positions[TP] == 5


async def test_waits_sharing_a_value_come_and_go_without_losing_each_other() -> None:
    """A value's waiters are one waiter, then a set of them, then one again as they leave."""
    reader = reader_at(0)
    first, second, third = (waiter_on(reader, [{"key": "a"}]) for _ in range(3))
    alone = waiter_on(reader, [{"key": "b"}])
    assert all(w.try_attach("t") for w in (first, second, third, alone))
    for leaving in (first, second):
        leaving.detach("t")
    await reader._dispatch({TP: [record(b'{"n": 1}', key=b"a", offset=0), record(b'{"n": 1}', key=b"b", offset=1)]})
    assert [offsets(w) for w in (first, second, third, alone)] == [[], [], [0], [1]]
    assert reader.evaluations == 2
    assert not reader.groups  # both finished and left: nothing indexed any more
    assert reader.waiters() == []


async def test_one_alarm_serves_every_sleep_of_a_check_however_often_messages_wake_it() -> None:
    """A predicate wait can be woken by every message of a busy topic; each sleep of its check
    shares the check's one alarm instead of making (and dropping) a timer of its own."""

    class CountingFuture(asyncio.Future[None]):
        callbacks = 0

        def add_done_callback(self, fn: Any, *, context: Any = None) -> None:
            CountingFuture.callbacks += 1
            super().add_done_callback(fn, context=context)

    waiter = collector(reader_at(0))
    alarm = CountingFuture()
    for _ in range(500):  # woken by a message each time, before the alarm rings
        waiter.wake.clear()
        sleeping = asyncio.ensure_future(waiter.wake.wait_until(alarm))
        await asyncio.sleep(0)
        waiter.wake.set()
        assert await sleeping is True
    waiter.wake.clear()
    sleeping = asyncio.ensure_future(waiter.wake.wait_until(alarm))
    await asyncio.sleep(0)
    alarm.set_result(None)  # the check's time is up
    assert await sleeping is False
    assert await waiter.wake.wait_until(alarm) is False  # and stays up
    assert CountingFuture.callbacks == 1


async def test_a_wait_gets_nothing_before_its_start() -> None:
    start = 1_700_000_000_000
    reader = reader_at(0)
    waiter = collector(reader, start_from="timestamp", start_after_ms=start)
    waiter.cursor[TP] = 5  # resolved from its start moment
    assert waiter.try_attach("t")
    other = TopicPartition("t", 1)  # a partition that appeared after it started: no cursor
    stamps = [start - 2, start - 1, start, start + 1]
    await reader._dispatch(
        {
            TP: [record(b"{}", offset=o) for o in range(10)],
            other: [
                dataclasses.replace(record(b"{}", offset=o), partition=1, timestamp=t) for o, t in enumerate(stamps)
            ],
        }
    )
    assert offsets(waiter) == [5, 6, 7, 8, 9]
    assert offsets(waiter, other) == [2, 3]  # kept only what was stamped at or after its start


async def test_a_detached_wait_gets_nothing_more_and_its_counts_stop() -> None:
    reader = reader_at(0)
    staying, leaving = collector(reader), collector(reader)
    for waiter in (staying, leaving):
        waiter.cursor[TP] = 0
        assert waiter.try_attach("t")
    await reader._dispatch({TP: [record(b"{}", offset=o) for o in range(3)]})
    leaving.detach("t")
    await reader._dispatch({TP: [record(b"{}", offset=o) for o in range(3, 6)]})
    assert offsets(leaving) == [0, 1, 2] and leaving.stats()["examined"] == 3
    assert offsets(staying) == [0, 1, 2, 3, 4, 5] and staying.stats()["examined"] == 6
    assert reader.waiters() == [staying]


async def test_a_wait_handed_over_while_the_reader_moves_sees_every_message_once() -> None:
    """The reader moves on while a pass reads the gap; the pass follows until level, then the
    wait moves onto the reader: every offset from its start exactly once, in order."""
    log = [record(b"{}", offset=o) for o in range(20)]
    reader = reader_at(10)
    waiter = collector(reader)
    waiter.cursor[TP] = 0
    assert not waiter.try_attach("t")  # behind the reader
    run = CatchUpPass(reader, [waiter])
    assert waiter.join(run)
    await run._dispatch({TP: log[0:10]})
    await reader._dispatch({TP: log[10:13]})  # meanwhile, the live stream goes on
    assert not run.level()
    await run._dispatch({TP: log[8:13]})  # a fetch overlapping what the pass already handed out
    assert run.level() and run.hand_over()
    assert waiter.attached["t"] is reader
    await reader._dispatch({TP: log[13:20]})
    assert offsets(waiter) == list(range(20))
    assert waiter.stats()["examined"] == 20
