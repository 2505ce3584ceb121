"""The event base: edges, watermarks saved only behind stored events, restarts, errors, sharing.

Triggers run through Airflow's own ``SharedStreamManager`` in ack mode (``WatcherHarness``), the
way the triggerer of Airflow 3.3 runs ``AssetWatcher`` triggers, with in-memory state stores.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable

import pytest
from airflow.sdk import Asset, AssetWatcher

from airflow_deferrable_kit._asset_state import MemoryStateStore, WatermarkStore
from airflow_deferrable_kit._event_streams import live_boards
from airflow_deferrable_kit.leases import held_keys
from airflow_deferrable_kit.testing import watch_blocking
from airflow_deferrable_kit.testing_events import WatcherHarness
from airflow_deferrable_kit.triggers.base import deadline_after
from airflow_deferrable_kit.triggers.events import (
    EDGE_LOOK_AHEAD,
    MAX_EVENT_BYTES,
    ConditionEventTrigger,
    EventTrigger,
    item_events,
)
from tests import REPO
from tests.unit.event_sample import CHECKS, ITEMS, LOOKS, SWITCHES, NumberedItemsEventTrigger, SwitchTrigger

# Airflow 3.3's SharedStreamManager and asset state store run these triggers.
pytestmark = pytest.mark.airflow_3_3

FAST = 0.02


async def eventually(predicate: Callable[[], bool], *, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        if loop.time() > end:
            raise AssertionError("the condition did not come true in time")
        await asyncio.sleep(0.01)


async def quiet(seconds: float = 0.2) -> None:
    """Let several polls pass (to show that nothing more fires)."""
    await asyncio.sleep(seconds)


def switch(state: str = "off") -> str:
    name = f"s-{uuid.uuid4().hex[:8]}"
    SWITCHES[name] = state
    return name


def watcher(name: str, **options: object) -> ConditionEventTrigger:
    trigger = SwitchTrigger(switch=name, poll_interval=FAST).as_event_trigger(**options)
    assert isinstance(trigger, ConditionEventTrigger)
    return trigger


# ---------------------------------------------------------------------------- the form
def test_any_wait_becomes_an_event_trigger_an_asset_watcher_accepts() -> None:
    trigger = SwitchTrigger(switch="a", label="x", poll_interval=7, max_backoff=9).as_event_trigger(backfill=True)
    asset = Asset(name="switch_a", watchers=[AssetWatcher(name="a_on", trigger=trigger)])
    assert asset.watchers[0].trigger is trigger
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_deferrable_kit.triggers.events.ConditionEventTrigger"
    assert kwargs == {
        "poll_interval": 7,
        "max_backoff": 9,
        "backfill": True,
        "wait_classpath": "tests.unit.event_sample.SwitchTrigger",
        "wait_params": {"switch": "a", "label": "x"},
    }
    rebuilt = ConditionEventTrigger(**json.loads(json.dumps(kwargs)))
    assert rebuilt == trigger
    assert rebuilt.watermark_key() == trigger.watermark_key()


def test_a_wait_with_a_deadline_or_a_task_to_end_cannot_become_one() -> None:
    with pytest.raises(ValueError, match="build the wait without deadline"):
        SwitchTrigger(switch="a", deadline=deadline_after(60)).as_event_trigger()
    with pytest.raises(ValueError, match="build the wait without end_from_trigger"):
        SwitchTrigger(switch="a", end_from_trigger=True).as_event_trigger()
    with pytest.raises(ValueError, match="takes no deadline"):
        ConditionEventTrigger(wait_classpath="tests.unit.event_sample.SwitchTrigger", deadline=deadline_after(9))
    with pytest.raises(ValueError, match="cannot be imported"):
        ConditionEventTrigger(wait_classpath="tests.core.nowhere.Trigger")
    with pytest.raises(ValueError, match="switch must be a non-empty name"):  # the wait's own validation
        ConditionEventTrigger(wait_classpath="tests.unit.event_sample.SwitchTrigger", wait_params={"switch": ""})
    with pytest.raises(ValueError, match="wait_params may not hold poll_interval"):
        ConditionEventTrigger(
            wait_classpath="tests.unit.event_sample.SwitchTrigger", wait_params={"switch": "a", "poll_interval": 1}
        )


def test_the_watermark_key_names_what_is_watched_not_how_often() -> None:
    base = watcher("k")
    assert base.watermark_key() == watcher("k", poll_interval=99, max_backoff=5, backfill=True).watermark_key()
    assert base.watermark_key() != watcher("other").watermark_key()
    assert base.watermark_key().startswith("airflow_deferrable_kit/ConditionEventTrigger/")


# ---------------------------------------------------------------------------- edges
async def test_fires_once_each_time_the_condition_becomes_true_never_while_it_stays_true() -> None:
    name = switch("off")
    async with WatcherHarness() as triggerer:
        watch = await triggerer.start(watcher(name))
        await quiet()
        assert watch.payloads == []
        SWITCHES[name] = "on"
        [event] = await watch.wait_for_events(1)
        assert event["switch"] == name
        assert event["event_id"].startswith("ready-after@") and event["event_id"] != "ready-after@start"
        await quiet()
        assert len(watch.events) == 1  # still true: no second event
        SWITCHES[name] = "failed"  # a failure condition is "not ready", definitely
        await quiet()
        SWITCHES[name] = "on"
        await watch.wait_for_events(2)
        checks = CHECKS[name]
        await quiet()
        assert len(watch.events) == 2 and CHECKS[name] > checks  # still polling, nothing fired


async def test_an_error_never_fires_nor_ends_the_watcher_nor_counts_as_a_change() -> None:
    name = switch("on")
    async with WatcherHarness() as triggerer:
        watch = await triggerer.start(watcher(name, max_backoff=0.05))
        await quiet()
        assert watch.payloads == []  # already true at the start: the starting point
        for failing in ("transient", "fatal", "on", "transient", "on"):
            SWITCHES[name] = failing
            await quiet(0.3)
        assert watch.payloads == []  # on -> error -> on is not a new edge
        assert watch.task is not None and not watch.task.done()
        SWITCHES[name] = "off"
        await quiet()
        SWITCHES[name] = "on"
        await watch.wait_for_events(1)


async def test_with_backfill_a_condition_already_true_at_the_start_fires() -> None:
    name = switch("on")
    async with WatcherHarness() as triggerer:
        watch = await triggerer.start(watcher(name, backfill=True))
        [event] = await watch.wait_for_events(1)
        await quiet()
        assert len(watch.events) == 1 and event["event_id"] == "ready-after@start"


# ------------------------------------------------------------------- storage and restarts
async def test_the_watermark_is_saved_only_once_the_event_is_stored() -> None:
    name = switch("off")
    triggerer = WatcherHarness(auto_store=False)
    async with triggerer:
        watch = await triggerer.start(watcher(name))
        await quiet()
        store = triggerer.stores.get("asset")
        saved = json.dumps(store.values)
        SWITCHES[name] = "on"
        await watch.wait_for_events(1)
        await quiet()
        assert json.dumps(store.values) == saved  # fired, not stored: the watermark did not move
        assert triggerer.store_events() == 1
        await eventually(lambda: json.dumps(store.values) != saved)
        [value] = store.values.values()
        assert value["state"]["ready"] is True


async def test_a_triggerer_that_dies_before_the_event_is_stored_fires_it_again_never_loses_it() -> None:
    name = switch("off")
    first = WatcherHarness(auto_store=False)
    async with first:
        watch = await first.start(watcher(name))
        await quiet()
        SWITCHES[name] = "on"
        await watch.wait_for_events(1)
    # dead: the event was never stored (or stored, its watermark not saved: the same to the watcher)
    [fired] = watch.payloads
    async with WatcherHarness(stores=first.stores) as second:
        watch = await second.start(watcher(name))
        [again] = await watch.wait_for_events(1)
        assert again["switch"] == name
        # Fired again later, from the same saved state: the same event_id (what a consumer
        # deduplicates on), another became_ready_at.
        assert again["event_id"] == fired["event_id"] and again["became_ready_at"] != fired["became_ready_at"]
        await eventually(lambda: second.stores.get("asset").writes >= 2)
    # stored this time: a third start fires nothing, however long it runs
    async with WatcherHarness(stores=second.stores) as third:
        watch = await third.start(watcher(name))
        await quiet(0.3)
        assert watch.payloads == []


async def test_a_restart_sees_what_changed_while_it_was_down() -> None:
    name = switch("off")
    async with WatcherHarness() as first:
        watch = await first.start(watcher(name))
        await quiet()
    SWITCHES[name] = "on"  # became true while no triggerer ran
    async with WatcherHarness(stores=first.stores) as second:
        watch = await second.start(watcher(name))
        await watch.wait_for_events(1)


async def test_one_trigger_feeding_two_assets_keeps_the_watermark_in_both() -> None:
    name = switch("off")
    async with WatcherHarness() as first:
        watch = await first.start(watcher(name), assets=("a", "b"))
        await quiet()
        SWITCHES[name] = "on"
        await watch.wait_for_events(1)
        a, b = first.stores.get("a"), first.stores.get("b")
        await eventually(lambda: bool(a.values) and a.values == b.values)
    stores = first.stores
    stores.by_asset["a"] = MemoryStateStore()  # one copy lost: the other one is used
    async with WatcherHarness(stores=stores) as second:
        watch = await second.start(watcher(name), assets=("a", "b"))
        await quiet(0.3)
        assert watch.payloads == []


async def test_the_copy_written_last_wins() -> None:
    store_a, store_b = MemoryStateStore(), MemoryStateStore()

    class Both:
        _by_name = {"a": store_a, "b": store_b}
        _by_uri: dict[str, MemoryStateStore] = {}

    writer = WatermarkStore(Both(), "k")
    await writer.save({"n": 1})
    only_a = WatermarkStore(store_a, "k")
    await only_a.load()
    await only_a.save({"n": 2})
    assert await WatermarkStore(Both(), "k").load() == {"n": 2}
    store_b.values["k"] = {"unknown": "shape"}
    assert await WatermarkStore(store_b, "k").load() is None


# ---------------------------------------------------------------------------- sharing
async def test_watchers_of_one_upstream_share_one_poll() -> None:
    name = switch("off")
    triggers = [watcher(name, backfill=bool(i % 2)) for i in range(40)]
    assert len({t.shared_stream_key() for t in triggers}) == 1
    async with WatcherHarness() as triggerer:
        watches = [await triggerer.start(t, assets=(f"asset-{i}",)) for i, t in enumerate(triggers)]
        before = CHECKS.get(name, 0)
        await quiet(0.5)
        polled = CHECKS[name] - before
        assert 0 < polled <= 0.5 / FAST + 2  # one check per round for all forty, not forty
        SWITCHES[name] = "on"
        for watch in watches:
            await watch.wait_for_events(1)
    assert live_boards() == {}
    assert held_keys() == {}


async def test_the_standalone_run_path_fires_edges_too() -> None:
    name = switch("on")
    trigger = watcher(name, backfill=True)
    events = trigger.run()
    with watch_blocking(0.05) as blocked:
        first = await asyncio.wait_for(events.__anext__(), 10)
    await events.aclose()
    await trigger.cleanup()
    assert first.payload["switch"] == name
    assert blocked == []
    assert live_boards() == {}


def test_event_triggers_are_event_triggers_only() -> None:
    assert EventTrigger.supports_triggerer_queue is False
    assert "deadline" not in ConditionEventTrigger.parameter_names()


def test_lists_of_objects_travel_so_that_airflow_attaches_the_watcher() -> None:
    from airflow.models.trigger import Trigger
    from airflow.serialization.encoders import encode_trigger
    from airflow.triggers.base import BaseEventTrigger

    from airflow_deferrable_kit.triggers.http_events import HttpBatchReadyEventTrigger

    trigger = HttpBatchReadyEventTrigger(
        http_conn_id="api", success=[{"path": "state", "equals": "ready"}], json_body=[{"a": [{"b": 1}]}]
    )
    _, kwargs = trigger.serialize()
    assert kwargs["success"] == {"__adk_list__": [{"path": "state", "equals": "ready"}]}
    assert kwargs["select"] == [] and kwargs["not_yet_codes"] == [404]  # lists of plain values stay lists
    rebuilt = HttpBatchReadyEventTrigger(**kwargs)
    assert rebuilt.success == [{"path": "state", "equals": "ready"}] and rebuilt == trigger
    encoded = encode_trigger(trigger)
    row = Trigger(classpath=encoded["classpath"], kwargs=encoded["kwargs"])
    assert BaseEventTrigger.hash(*encoded.values()) == BaseEventTrigger.hash(row.classpath, row.kwargs)
    # Airflow's own problem, which the wrapping avoids (if this starts failing, Airflow fixed it):
    plain = {"success": [{"path": "state"}]}
    encoded_plain = encode_trigger({"classpath": "x.Y", "kwargs": plain})
    row = Trigger(classpath="x.Y", kwargs=encoded_plain["kwargs"])
    assert BaseEventTrigger.hash("x.Y", encoded_plain["kwargs"]) != BaseEventTrigger.hash("x.Y", row.kwargs)


def test_the_example_dags_parse_and_airflow_would_attach_each_watcher() -> None:
    import runpy

    from airflow.models.trigger import Trigger
    from airflow.sdk import DAG
    from airflow.serialization.encoders import encode_trigger
    from airflow.triggers.base import BaseEventTrigger

    path = REPO / "dags" / "example_events.py"
    namespace = runpy.run_path(str(path))
    assets = [value for value in namespace.values() if isinstance(value, Asset)]
    assert sorted(asset.name for asset in assets) == ["demo_batch_ready", "finished_batches", "landed_orders"]
    for asset in assets:
        [watcher] = asset.watchers
        encoded = encode_trigger(watcher.trigger)
        row = Trigger(classpath=encoded["classpath"], kwargs=encoded["kwargs"])
        assert BaseEventTrigger.hash(*encoded.values()) == BaseEventTrigger.hash(row.classpath, row.kwargs)
    dags = {value.dag_id for value in namespace.values() if isinstance(value, DAG)}
    assert len(dags) == 3


async def test_watchers_judging_one_look_take_turns_instead_of_holding_the_loop() -> None:
    import time

    from airflow_deferrable_kit._event_streams import judging_gate

    gate = judging_gate()
    late = [0.0]

    async def ticker() -> None:
        # CPU time, not the wall clock, between two ticks: what the loop did in between, however
        # busy the machine is (a descheduled process would look like a stalled loop).
        while True:
            start = time.thread_time()
            await asyncio.sleep(0.005)
            late[0] = max(late[0], time.thread_time() - start)

    async def watcher() -> None:
        started = await gate.enter(1000)  # a page of a thousand rows
        end = time.thread_time() + 0.002  # judging it costs 2 ms of CPU
        while time.thread_time() < end:
            pass
        gate.leave(1000, started)

    tick = asyncio.ensure_future(ticker())
    await asyncio.sleep(0.02)
    await asyncio.gather(*(watcher() for _ in range(200)))  # 0.4 s of work fanned out at once
    tick.cancel()
    assert late[0] < 0.1  # alone in one iteration it would be 0.4 s
    assert 1e-6 < gate.unit_cost < 1e-5  # it learned what a unit costs


def test_an_event_of_items_fits_its_limit_as_airflows_json_column_stores_it() -> None:
    # Many small values: Airflow stores ``json.dumps`` with a space after every "," and ":", so
    # events cut to 512 KiB of compact JSON were up to 536,393 bytes in the metadata database.
    items = [{"key": f"in/{i:06d}.csv", "size": i, "etag": "e"} for i in range(60_000)]
    events = item_events(items)
    assert [item for event in events for item in event["items"]] == items and len(events) > 1
    sizes = [len(json.dumps(event)) for event in events]
    assert max(sizes) <= MAX_EVENT_BYTES and min(sizes[:-1]) > 0.95 * MAX_EVENT_BYTES, sizes
    assert all(event["count"] == len(event["items"]) for event in events)


async def test_looks_go_on_while_events_wait_to_be_stored_and_stop_only_when_many_do() -> None:
    # Airflow's ack timeout runs from each batch's broadcast, but a batch that fired nothing is
    # done with as soon as the watcher moves past it: only the batches that fired an event wait
    # for storage. An edge watcher keeps looking (a look skipped could miss a transition) until
    # EDGE_LOOK_AHEAD of its events wait to be stored, then waits.
    name = switch("off")
    triggerer = WatcherHarness(auto_store=False)
    async with triggerer:
        watch = await triggerer.start(watcher(name, min_event_interval=0))
        await eventually(lambda: CHECKS.get(name, 0) >= 3)  # looking every poll interval (FAST)
        SWITCHES[name] = "on"
        await watch.wait_for_events(1)
        looks = CHECKS[name]
        await eventually(lambda: CHECKS[name] >= looks + 3 * EDGE_LOOK_AHEAD)  # one unstored: looking on
        for fired in range(2, EDGE_LOOK_AHEAD + 2):
            SWITCHES[name] = "off"
            looks = CHECKS[name]
            await eventually(lambda looks=looks: CHECKS[name] >= looks + 2)
            SWITCHES[name] = "on"
            await watch.wait_for_events(fired)
        looks = CHECKS[name]
        await quiet(10 * FAST)
        stalled = CHECKS[name]
        assert stalled - looks <= 1  # EDGE_LOOK_AHEAD + 1 events unstored: no further look
        await quiet(10 * FAST)
        assert CHECKS[name] == stalled
        assert triggerer.store_events() == EDGE_LOOK_AHEAD + 1
        await eventually(lambda: CHECKS[name] >= stalled + 3)  # stored: looking again


async def test_transitions_while_storage_lags_far_behind_the_looks_are_all_fired() -> None:
    # A triggerer busy storing bursts of 1,000 items (or a slow metadata DB) stores a watcher's
    # events many looks late; each transition held a few looks is still seen and fired.
    name = switch("off")
    triggerer = WatcherHarness(auto_store=False)
    async with triggerer:
        watch = await triggerer.start(watcher(name, min_event_interval=0))
        await eventually(lambda: CHECKS.get(name, 0) >= 3)
        for state in ("on", "off") * 3:
            looks = CHECKS[name]
            SWITCHES[name] = state
            await eventually(lambda looks=looks: CHECKS[name] >= looks + 3 * EDGE_LOOK_AHEAD)
        assert triggerer.store_events() == 3
        await quiet()
        assert len(watch.events) == 3


async def test_an_item_watcher_never_looks_while_a_batch_is_not_done_with() -> None:
    triggerer = WatcherHarness(auto_store=False)
    async with triggerer:
        source = f"items-{uuid.uuid4().hex[:8]}"
        ITEMS[source] = []
        watch = await triggerer.start(
            NumberedItemsEventTrigger(source=source, poll_interval=FAST, min_event_interval=0)
        )
        await eventually(lambda: LOOKS.get(source, 0) >= 3)
        ITEMS[source].append("a")
        await watch.wait_for_events(1)
        looks = LOOKS[source]
        await quiet(20 * FAST)
        assert LOOKS[source] == looks  # fired, not stored: no further look
        assert triggerer.store_events() == 1
        await eventually(lambda: LOOKS[source] >= looks + 3)
