"""HttpBatchReadyEventTrigger against a real aiohttp server: one event each time the endpoint
says ready, none while it stays ready; the last state in the asset state store across
restarts; error statuses that change nothing; one request a round for a hundred watchers.

Triggers run through Airflow's own ``SharedStreamManager`` (``WatcherHarness``); the server
counts the requests.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from airflow.sdk import Asset, AssetWatcher

from airflow_deferrable_kit._backoff import MIN_RETRY_DELAY
from airflow_deferrable_kit._event_streams import live_boards
from airflow_deferrable_kit.leases import held_keys
from airflow_deferrable_kit.testing import watch_blocking
from airflow_deferrable_kit.testing_events import WatcherHarness
from airflow_deferrable_kit.triggers.http import HttpBatchReadyTrigger
from airflow_deferrable_kit.triggers.http_events import HttpBatchReadyEventTrigger

from .conftest import Seen, Server, reply

FAST = 0.05
TOKEN = "http-events-secret-token-0042"


class Batch:
    """What the batch API answers: a state, or an error status."""

    def __init__(self, state: str = "running") -> None:
        self.state = state
        self.status = 200

    def handle(self, seen: Seen) -> Any:
        if self.status != 200:
            return reply(self.status, {"error": "busy"}, headers={"Retry-After": "0"})
        return reply(200, {"state": self.state, "rows": 7})


@pytest.fixture
def batch(serve: Callable[..., Server], connection: Callable[..., str]) -> tuple[Batch, Server, str]:
    api = Batch()
    server = serve(api.handle)
    conn_id = connection("batch_events", host=server.url, password=TOKEN, extra={"auth_type": "bearer"})
    return api, server, conn_id


def watcher(conn_id: str, **kwargs: Any) -> HttpBatchReadyEventTrigger:
    kwargs.setdefault("success", [{"path": "state", "equals": "ready"}])
    kwargs.setdefault("failure", [{"path": "state", "equals": "failed"}])
    return HttpBatchReadyEventTrigger(http_conn_id=conn_id, endpoint="v1/batches/b1", poll_interval=FAST, **kwargs)


async def quiet(seconds: float = 0.3) -> None:
    await asyncio.sleep(seconds)


async def starting_point_saved(triggerer: WatcherHarness, timeout: float = 30.0) -> None:
    """Wait until the watcher saved its first look (its starting point), however slow a first request is."""
    end = asyncio.get_running_loop().time() + timeout
    while triggerer.stores.get("asset").writes == 0:
        assert asyncio.get_running_loop().time() < end, "no starting point saved"
        await asyncio.sleep(0.01)


def test_the_wait_becomes_its_event_trigger_and_it_round_trips() -> None:
    wait = HttpBatchReadyTrigger(
        http_conn_id="api",
        endpoint="v1/status",
        acceptors=[{"state": "success", "matcher": "path", "argument": "state", "expected": "ready"}],
    )
    trigger = wait.as_event_trigger(backfill=True)
    assert isinstance(trigger, HttpBatchReadyEventTrigger)
    Asset(name="batch", watchers=[AssetWatcher(name="ready", trigger=trigger)])
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_deferrable_kit.triggers.http_events.HttpBatchReadyEventTrigger"
    assert kwargs["backfill"] is True and kwargs["poll_interval"] == 60.0 and "deadline" not in kwargs
    assert HttpBatchReadyEventTrigger(**json.loads(json.dumps(kwargs))) == trigger
    with pytest.raises(ValueError, match=r"success\[0\]"):  # the shorthand, checked as the sensor does
        HttpBatchReadyEventTrigger(http_conn_id="api", success=[{"path": "state"}])
    with pytest.raises(ValueError, match="could never succeed"):
        HttpBatchReadyEventTrigger(http_conn_id="api", failure=[{"path": "state", "equals": "failed"}])


async def test_fires_when_the_batch_becomes_ready_not_on_every_poll_while_it_is(
    batch: tuple[Batch, Server, str],
) -> None:
    api, server, conn_id = batch
    async with WatcherHarness() as triggerer:
        with watch_blocking(0.1) as blocked:
            watch = await triggerer.start(watcher(conn_id, select=["rows"]))
            await starting_point_saved(triggerer)  # the first look saw "running" (a cold start can be slow)
            assert watch.payloads == []
            api.state = "ready"
            [event] = await watch.wait_for_events(1)
            polls = len(server.requests)
            await quiet()
            assert len(watch.events) == 1 and len(server.requests) > polls  # polled on, fired once
            api.state = "failed"  # a failure condition: not ready
            await quiet()
            api.state = "ready"
            await watch.wait_for_events(2)
        assert event["status_code"] == 200 and event["fields"] == {"rows": 7}
        assert event["decision"]["expected"] == "ready"
        assert event["event_id"].startswith("ready-after@") and event["event_id"] != "ready-after@start"
        assert TOKEN not in json.dumps(watch.payloads)
        assert all(seen.headers["Authorization"] == f"Bearer {TOKEN}" for seen in server.requests)
        assert blocked == []
    assert held_keys() == {} and live_boards() == {}


async def test_an_error_status_changes_nothing_and_backs_the_poll_off(batch: tuple[Batch, Server, str]) -> None:
    api, server, conn_id = batch
    api.state = "ready"
    async with WatcherHarness() as triggerer:
        watch = await triggerer.start(watcher(conn_id, max_backoff=0.4))
        await quiet()
        assert watch.payloads == []  # ready at the start: the starting point
        api.status = 503
        start = len(server.requests)
        await quiet(1.0)
        during = len(server.requests) - start
        api.status = 200  # ready -> 503 -> ready is not a new edge
        await quiet()
        assert watch.payloads == []
        # Backed off: each retry waits at least MIN_RETRY_DELAY (0.1 s), not one request every poll (0.05 s).
        assert during <= 1.0 / MIN_RETRY_DELAY + 1 < 1.0 / FAST
        api.state = "running"
        await quiet()
        api.state = "ready"
        await watch.wait_for_events(1)


async def test_the_last_state_survives_a_restart(batch: tuple[Batch, Server, str]) -> None:
    api, _, conn_id = batch
    async with WatcherHarness() as first:
        watch = await first.start(watcher(conn_id))
        await quiet()
        api.state = "ready"
        await watch.wait_for_events(1)
        await quiet()
    async with WatcherHarness(stores=first.stores) as second:
        watch = await second.start(watcher(conn_id))
        await quiet(0.5)
        assert watch.payloads == []  # still ready: it fired before the restart
        api.state = "running"
    async with WatcherHarness(stores=second.stores) as third:  # went back while it ran; ready while down
        watch = await third.start(watcher(conn_id))
        await quiet()
        api.state = "ready"
        await watch.wait_for_events(1)


async def test_backfill_fires_when_ready_at_the_first_poll(batch: tuple[Batch, Server, str]) -> None:
    api, _, conn_id = batch
    api.state = "ready"
    async with WatcherHarness() as triggerer:
        watch = await triggerer.start(watcher(conn_id, backfill=True))
        await watch.wait_for_events(1)
        await quiet()
        assert len(watch.events) == 1


async def test_a_hundred_watchers_of_one_endpoint_cost_one_request_per_round(
    serve: Callable[..., Server], connection: Callable[..., str]
) -> None:
    ready: set[int] = set()
    server = serve(lambda seen: reply(200, {"batches": {f"b{i}": "ready" for i in ready}}))
    conn_id = connection("batch_many", host=server.url)
    watchers = [
        HttpBatchReadyEventTrigger(http_conn_id=conn_id, endpoint="v1/batches", poll_interval=0.1,
                                   success=[{"path": f"batches.b{i}", "equals": "ready"}])
        for i in range(100)
    ]  # fmt: skip
    assert len({w.shared_stream_key() for w in watchers}) == 1
    async with WatcherHarness() as triggerer:
        watches = [await triggerer.start(w, assets=(f"asset-{i}",)) for i, w in enumerate(watchers)]
        await quiet(0.6)
        ready.update(range(0, 100, 2))
        for watch in watches[::2]:
            await watch.wait_for_events(1)
        await quiet()
        started, requests = server.requests[0].at, len(server.requests)
        elapsed = server.requests[-1].at - started
    assert all(len(w.events) == (1 if i % 2 == 0 else 0) for i, w in enumerate(watches))
    assert requests <= elapsed / 0.1 + 2  # one request a round for all hundred (alone: 100 a round)
