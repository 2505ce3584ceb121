"""S3KeyEventTrigger against the real S3 API server: one event per new object, watermarks in the
asset state store across restarts, one listing per round for a hundred watchers of a prefix.

Triggers run through Airflow's own ``SharedStreamManager`` (``WatcherHarness``); requests are
counted by the fault proxy in front of the server.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import pytest
from airflow.sdk import Asset, AssetWatcher

from airflow_deferrable_kit._event_streams import live_boards
from airflow_deferrable_kit._s3.poller import Listing
from airflow_deferrable_kit.leases import held_keys
from airflow_deferrable_kit.testing import watch_blocking
from airflow_deferrable_kit.testing_events import WatcherHarness
from airflow_deferrable_kit.triggers.s3_events import MAX_SEEN_OBJECTS, S3KeyEventTrigger, _Snapshot
from tests.integration.s3.conftest import put_many
from tests.integration.s3.fault_proxy import FaultProxy, settle

FAST = 0.1


#: These tests are about what fires, not how events are spaced (see
#: tests/integration/s3/test_events.py::test_one_look_is_one_event_and_events_are_min_event_interval_apart).
QUICK_EVENTS = 0.5


def watcher(bucket: str, conn: str, key: str = "in/*.csv", **kwargs: Any) -> S3KeyEventTrigger:
    kwargs.setdefault("min_event_interval", QUICK_EVENTS)
    kwargs.setdefault("wildcard_match", True)
    return S3KeyEventTrigger(bucket_key=f"s3://{bucket}/{key}", aws_conn_id=conn, poll_interval=FAST, **kwargs)


async def quiet(seconds: float = 0.5) -> None:
    await asyncio.sleep(seconds)


def keys(payloads: list[dict[str, Any]]) -> list[str]:
    return [p["key"] for p in payloads]


# ---------------------------------------------------------------------------- events
def test_it_is_an_asset_watcher_trigger_that_round_trips() -> None:
    trigger = S3KeyEventTrigger(bucket_key="s3://bucket-a/in/*.csv", wildcard_match=True, lookback=60, backfill=True)
    Asset(name="incoming", watchers=[AssetWatcher(name="csv", trigger=trigger)])
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_deferrable_kit.triggers.s3_events.S3KeyEventTrigger"
    assert "deadline" not in kwargs and kwargs["lookback"] == 60 and kwargs["backfill"] is True
    assert S3KeyEventTrigger(**json.loads(json.dumps(kwargs))) == trigger
    with pytest.raises(ValueError, match="bucket_name"):  # the wait's own validation
        S3KeyEventTrigger(bucket_key="relative/key")
    with pytest.raises(ValueError, match="takes no soft_fail"):
        S3KeyEventTrigger(bucket_key="s3://bucket-a/k", soft_fail=True)


async def test_each_new_object_fires_once_with_key_size_etag_and_time_and_old_ones_never(
    admin: Any, bucket: str, moto_conn: str
) -> None:
    await put_many(admin, bucket, ["in/old-1.csv", "in/old-2.csv", "other/x.csv"])
    async with WatcherHarness() as triggerer:
        with watch_blocking(0.1) as blocked:
            watch = await triggerer.start(watcher(bucket, moto_conn))
            await quiet()
            assert watch.items == []  # what was there first is the starting point
            await admin.put_object(Bucket=bucket, Key="in/new-1.csv", Body=b"12345")
            await admin.put_object(Bucket=bucket, Key="in/skip.txt", Body=b"x")
            await admin.put_object(Bucket=bucket, Key="in/new-2.csv", Body=b"1")
            await watch.wait_for_items(2)
            await quiet()
        assert sorted(keys(watch.items)) == ["in/new-1.csv", "in/new-2.csv"]
        head = await admin.head_object(Bucket=bucket, Key="in/new-1.csv")
        [first] = [p for p in watch.items if p["key"] == "in/new-1.csv"]
        assert first == {
            "bucket": bucket,
            "key": "in/new-1.csv",
            "size": 5,
            "etag": head["ETag"].strip('"'),
            "last_modified": head["LastModified"].astimezone(dt.timezone.utc).isoformat(),
            "event_id": f"s3://{bucket}/in/new-1.csv#{head['ETag'].strip(chr(34))}@{first['last_modified']}",
        }
        assert blocked == []
    assert held_keys() == {} and live_boards() == {}


async def test_one_look_is_one_event_and_events_are_min_event_interval_apart(
    admin: Any, bucket: str, moto_conn: str
) -> None:
    """What one look finds is one event; what comes soon after waits for min_event_interval.

    Airflow 3.3.2 queues one DAG run per asset at a time and an event stored while that run is
    queued joins no run until another event comes (docs/events.md): so a burst is one event, and
    a watcher's events are spaced.
    """
    gap = 2.0
    # The burst is there before the first look (backfill fires it): puts spread over several polls
    # on a busy machine would otherwise make two looks of it.
    await put_many(admin, bucket, [f"in/burst-{i}.csv" for i in range(5)])
    async with WatcherHarness() as triggerer:
        watch = await triggerer.start(watcher(bucket, moto_conn, min_event_interval=gap, backfill=True))
        [first] = await watch.wait_for_events(1)
        first_at = asyncio.get_running_loop().time()
        assert first["count"] == 5 and sorted(keys(first["items"])) == [f"in/burst-{i}.csv" for i in range(5)]
        await put_many(admin, bucket, ["in/next-1.csv"])
        await asyncio.sleep(0.3)  # several polls' worth: the watcher does not look yet
        await put_many(admin, bucket, ["in/next-2.csv"])
        await watch.wait_for_events(2, timeout=gap + 10)
        second_at = asyncio.get_running_loop().time()
        await quiet(gap + 0.5)
        assert len(watch.events) == 2  # the two objects after the burst: one event, not two
        assert sorted(keys(watch.payloads[1]["items"])) == ["in/next-1.csv", "in/next-2.csv"]
        assert second_at - first_at >= gap - 0.3  # held back until the interval passed


async def test_backfill_fires_for_what_is_already_there_oldest_first(admin: Any, bucket: str, moto_conn: str) -> None:
    await put_many(admin, bucket, ["in/a.csv"])
    await asyncio.sleep(1.1)  # S3 times have second precision
    await put_many(admin, bucket, ["in/b.csv"])
    async with WatcherHarness() as triggerer:
        watch = await triggerer.start(watcher(bucket, moto_conn, backfill=True))
        await watch.wait_for_items(2)
        await quiet()
        assert keys(watch.items) == ["in/a.csv", "in/b.csv"]


async def test_an_overwritten_key_and_a_new_version_of_an_exact_key_fire_again(
    admin: Any, bucket: str, moto_conn: str
) -> None:
    await admin.put_object(Bucket=bucket, Key="exports/_SUCCESS", Body=b"1")
    async with WatcherHarness() as triggerer:
        exact = await triggerer.start(watcher(bucket, moto_conn, key="exports/_SUCCESS", wildcard_match=False))
        await quiet()
        assert exact.items == []
        await admin.put_object(Bucket=bucket, Key="exports/_SUCCESS", Body=b"2")
        await admin.put_object(Bucket=bucket, Key="exports/_SUCCESS.tmp", Body=b"2")  # another key
        [event] = await exact.wait_for_items(1)
        assert event["key"] == "exports/_SUCCESS"
        await quiet()
        assert len(exact.items) == 1


async def test_a_restart_fires_what_arrived_while_down_and_nothing_it_fired_before(
    admin: Any, bucket: str, moto_conn: str
) -> None:
    async with WatcherHarness() as first:
        watch = await first.start(watcher(bucket, moto_conn))
        await quiet()
        await put_many(admin, bucket, ["in/1.csv", "in/2.csv"])
        await watch.wait_for_items(2)
        store = first.stores.get("asset")
        await settle(lambda: store.writes >= 2)  # the baseline, then the two objects (stored)
    await put_many(admin, bucket, ["in/3.csv"])  # while no triggerer runs
    async with WatcherHarness(stores=first.stores) as second:
        watch = await second.start(watcher(bucket, moto_conn))
        await watch.wait_for_items(1)
        await put_many(admin, bucket, ["in/4.csv"])
        await watch.wait_for_items(2)
        await quiet()
        assert keys(watch.items) == ["in/3.csv", "in/4.csv"]


async def test_events_not_yet_stored_when_the_triggerer_dies_fire_again_after_the_restart(
    admin: Any, bucket: str, moto_conn: str
) -> None:
    first = WatcherHarness(auto_store=False)
    async with first:
        watch = await first.start(watcher(bucket, moto_conn))
        await quiet()
        first.store_events()  # the baseline
        await put_many(admin, bucket, ["in/1.csv"])
        await watch.wait_for_items(1)
        first.store_events()  # in/1.csv is stored ...
        await settle(lambda: first.stores.get("asset").writes >= 2)
        await put_many(admin, bucket, ["in/2.csv"])
        await watch.wait_for_items(2)  # ... in/2.csv fired, but the triggerer dies before storing it
    async with WatcherHarness(stores=first.stores) as second:
        watch = await second.start(watcher(bucket, moto_conn))
        await watch.wait_for_items(1)
        await quiet()
        assert keys(watch.items) == ["in/2.csv"]  # fired again, never lost; in/1.csv not again


async def test_a_missing_bucket_fires_nothing_and_the_watcher_recovers_when_it_appears(
    admin: Any, bucket: str, moto_conn: str
) -> None:
    missing = f"{bucket}-later"
    async with WatcherHarness() as triggerer:
        watch = await triggerer.start(watcher(missing, moto_conn, max_backoff=0.2))
        await quiet()
        assert watch.task is not None and not watch.task.done()
        await admin.create_bucket(Bucket=missing)
        await quiet(0.5)  # the first listing that works is the starting point
        await admin.put_object(Bucket=missing, Key="in/1.csv", Body=b"x")
        [event] = await watch.wait_for_items(1)
        assert event["key"] == "in/1.csv"


# ------------------------------------------------------------------------ one listing
async def test_a_hundred_watchers_of_one_prefix_cost_one_listing_per_round(
    admin: Any, bucket: str, proxy: FaultProxy, proxy_conn: str
) -> None:
    rounds: list[float] = []

    class Counted(S3KeyEventTrigger):
        async def poll(self, board: Any) -> Any:
            rounds.append(asyncio.get_running_loop().time())
            return await super().poll(board)

    await put_many(admin, bucket, [f"drop/noise-{i}.bin" for i in range(30)])
    watchers = [
        Counted(bucket_key=f"s3://{bucket}/drop/*-{i:03d}.csv", wildcard_match=True, aws_conn_id=proxy_conn,
                poll_interval=0.2)
        for i in range(100)
    ]  # fmt: skip
    async with WatcherHarness() as triggerer:
        watches = [await triggerer.start(t, assets=(f"asset-{i}",)) for i, t in enumerate(watchers)]
        await settle(lambda: len(rounds) >= 5)
        await put_many(admin, bucket, [f"drop/file-{i:03d}.csv" for i in range(100)])
        for watch in watches:
            await watch.wait_for_items(1)
        await quiet()
        lists, polls = proxy.count("GET"), len(rounds)
    for i, watch in enumerate(watches):
        assert keys(watch.items) == [f"drop/file-{i:03d}.csv"]  # its own object, once
    # One listing a round for all hundred (each on its own would list: 100 a round); the last
    # round's listing may still be in flight when counted.
    assert polls - 1 <= lists <= polls
    assert {s.path for s in proxy.seen} == {f"/{bucket}"}
    assert 5 <= polls <= (rounds[-1] - rounds[0]) / 0.2 + 2


# -------------------------------------------------------------------- the watermark itself
def listing(objects: list[tuple[str, str]]) -> dict[tuple[str, str], _Snapshot]:
    """A listing of ``in/`` in bucket ``b``: ``(key, LastModified as S3 writes it)``."""
    ordered = sorted(objects)
    keys_ = tuple(key for key, _ in ordered)
    details = tuple((1, f'"{key}-etag"', modified) for key, modified in ordered)
    return {("bucket-b", "in/"): _Snapshot(Listing(keys_, details))}


def at(seconds: int) -> str:
    moment = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=seconds)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.000Z")


async def test_a_late_object_counts_within_lookback_of_the_newest_and_not_before() -> None:
    trigger = S3KeyEventTrigger(bucket_key="s3://bucket-b/in/*", wildcard_match=True, lookback=60)
    seen = [("in/a", at(0)), ("in/b", at(100))]
    events, state = await trigger.derive(listing(seen), None)
    assert events == [] and state["floor"] == "2030-01-01T00:00:40.000+00:00"
    # a multipart upload that started 50 s before the newest one: late but within lookback
    events, state = await trigger.derive(listing([*seen, ("in/late", at(50))]), state)
    assert keys(events) == ["in/late"]
    # one that started 70 s before: older than lookback allows, never fires
    events, state = await trigger.derive(listing([*seen, ("in/late", at(50)), ("in/older", at(30))]), state)
    assert events == []
    # same second as the newest, a different key: new
    events, state = await trigger.derive(listing([*seen, ("in/late", at(50)), ("in/c", at(100))]), state)
    assert keys(events) == ["in/c"]
    # nothing changes: nothing fires and the watermark stays the same
    again, same = await trigger.derive(listing([*seen, ("in/late", at(50)), ("in/c", at(100))]), state)
    assert again == [] and same == state


async def test_the_seen_set_is_capped_without_making_anything_new_again() -> None:
    trigger = S3KeyEventTrigger(bucket_key="s3://bucket-b/in/*", wildcard_match=True, lookback=3600)
    many = [(f"in/{i:05d}", at(i // 10)) for i in range(MAX_SEEN_OBJECTS + 500)]
    events, state = await trigger.derive(listing(many), None)
    assert len(state["seen"]) <= MAX_SEEN_OBJECTS
    assert len(json.dumps(state)) < 64 * 1024  # the state store's policy limit
    again, _ = await trigger.derive(listing(many), state)
    assert again == []  # nothing forgotten became new
    events, _ = await trigger.derive(listing([*many, ("in/zzz", at(10_000))]), state)
    assert keys(events) == ["in/zzz"]


class SmallEventsTrigger(S3KeyEventTrigger):
    """Events of 2 KiB at most (about six objects each): a backfill of a few hundred objects is
    dozens of events, as a prefix of a hundred thousand is at the defaults."""

    max_event_bytes = 2 * 1024


async def test_a_backfill_of_many_events_never_meets_the_ack_timeout_and_its_watermark_is_saved(
    admin: Any, bucket: str, moto_conn: str
) -> None:
    # 300 objects in one listing: about 50 events. Fired 0.05 s apart inside one batch they took
    # 2.5 s, five ack timeouts (scaled down to 0.5 s): the watcher was failed before its
    # watermark was saved and, re-created, fired the whole backfill again, for ever.
    await put_many(admin, bucket, [f"in/{i:03d}.csv" for i in range(300)])
    trigger = SmallEventsTrigger(
        bucket_key=f"s3://{bucket}/in/*.csv", aws_conn_id=moto_conn, wildcard_match=True, poll_interval=FAST,
        min_event_interval=0.05, backfill=True,
    )  # fmt: skip
    async with WatcherHarness(ack_timeout=0.5) as triggerer:
        watch = await triggerer.start(trigger)
        await watch.wait_for_items(300, timeout=60)
        store = watch.stores["asset"]
        await settle(lambda: any(len(v["state"]["seen"]) == 300 for v in store.values.values()))
        await quiet()  # an ack timeout still pending would fail the watcher now
        assert watch.task is not None and not watch.task.done()
    assert sorted(keys(watch.items)) == [f"in/{i:03d}.csv" for i in range(300)]  # each object once
    assert len(watch.items) == 300 and len(watch.events) >= 30
