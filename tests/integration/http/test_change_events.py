"""HttpBatchReadyEventTrigger(fire_on_change=...) against a real aiohttp server: one event per
new value at a path of a ready answer (a release id), its last value in the asset state store
across restarts, and the ``event_id`` of a repeat equal to the first copy's.

The server answers a script of values, one per request; the watchers count events and the
server counts requests, nothing is timed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from airflow_deferrable_kit.testing_events import WatcherHarness
from airflow_deferrable_kit.triggers.http_events import HttpBatchReadyEventTrigger, change_event_id, fingerprint

from .conftest import Seen, Server, reply

FAST = 0.05


class Releases:
    """The latest release, one answer per request from a script (the last one repeats)."""

    def __init__(self, *script: Any) -> None:
        self.script = list(script)
        self.served = 0

    def handle(self, seen: Seen) -> Any:
        step = self.script[min(seen.index, len(self.script) - 1)]
        self.served += 1
        if isinstance(step, int):
            return reply(step, {"error": "busy"}, headers={"Retry-After": "0"})
        if step is None:
            return reply(200, {"name": "no id yet"})
        return reply(200, {"id": step, "name": f"release {step}", "state": "published"})


@pytest.fixture
def releases(
    serve: Callable[..., Server], connection: Callable[..., str]
) -> Callable[..., tuple[Releases, Server, str]]:
    def start(*script: Any) -> tuple[Releases, Server, str]:
        api = Releases(*script)
        server = serve(api.handle)
        return api, server, connection("releases", host=server.url)

    return start


def watcher(conn_id: str, **kwargs: Any) -> HttpBatchReadyEventTrigger:
    return HttpBatchReadyEventTrigger(
        http_conn_id=conn_id,
        endpoint="repos/acme/app/releases/latest",
        poll_interval=FAST,
        fire_on_change="id",
        **kwargs,
    )


async def requests_served(server: Server, count: int, timeout: float = 30.0) -> None:
    end = asyncio.get_running_loop().time() + timeout
    while len(server.requests) < count:
        assert asyncio.get_running_loop().time() < end, f"{len(server.requests)} of {count} requests served"
        await asyncio.sleep(0.01)


async def saved(triggerer: WatcherHarness, mark: str, timeout: float = 30.0) -> None:
    store = triggerer.stores.get("asset")
    end = asyncio.get_running_loop().time() + timeout
    while not any((v.get("state") or {}).get("value") == mark for v in store.values.values()):
        assert asyncio.get_running_loop().time() < end, f"watermark {mark} never saved: {store.values}"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize(("backfill", "fired"), [(True, ["a", "b", "c"]), (False, ["b", "c"])])
async def test_a_a_b_b_c_fires_once_per_new_value_and_not_again_after_a_restart(
    releases: Callable[..., tuple[Releases, Server, str]], backfill: bool, fired: list[str]
) -> None:
    api, server, conn_id = releases("a", "a", "b", "b", "c")
    async with WatcherHarness() as first:
        watch = await first.start(watcher(conn_id, backfill=backfill, select=["name"]))
        await watch.wait_for_events(len(fired))
        await requests_served(server, 10)  # "c" answered five times more
        await saved(first, '"c"')
        assert [p["changed"] for p in watch.payloads] == [{"path": "id", "value": v} for v in fired]
        assert [p["fields"] for p in watch.payloads] == [{"name": f"release {v}"} for v in fired]
        ids = [p["event_id"] for p in watch.payloads]
        assert len(set(ids)) == len(ids)
        assert ids[-1].startswith('id="c"@after:')
        assert (ids[0] == 'id="a"@start') is backfill
    async with WatcherHarness(stores=first.stores) as second:  # a restart from the saved watermark
        watch = await second.start(watcher(conn_id, backfill=backfill, select=["name"]))
        served = len(server.requests)
        await requests_served(server, served + 10)
        assert watch.payloads == []  # "c" fired before the restart
        api.script.append("d")  # a new release while it runs
        api.script[:-1] = ["d"] * (len(api.script) - 1)
        [event] = await watch.wait_for_events(1)
        assert event["changed"] == {"path": "id", "value": "d"}


async def test_answers_that_are_not_ready_or_lack_the_path_change_nothing(
    releases: Callable[..., tuple[Releases, Server, str]],
) -> None:
    # 503 and a body without "id" cannot tell; "a" again after them is no new value; a failure
    # condition (not ready) in between neither.
    _api, server, conn_id = releases("a", 503, None, "a", "x", "a", "b")
    trigger = watcher(
        conn_id,
        success=[{"path": "state", "equals": "published"}],
        failure=[{"path": "id", "equals": "x"}],
        max_backoff=0.2,
    )
    async with WatcherHarness() as triggerer:
        watch = await triggerer.start(trigger)
        [event] = await watch.wait_for_events(1)
        await requests_served(server, 12)
        assert len(watch.events) == 1
    assert event["changed"]["value"] == "b" and event["event_id"].startswith('id="b"@after:')


async def test_a_repeat_after_a_crash_carries_the_first_copys_event_id(
    releases: Callable[..., tuple[Releases, Server, str]],
) -> None:
    _, _server, conn_id = releases("a", "b")
    async with WatcherHarness(auto_store=False) as first:  # fired, never stored: the watermark stays at "a"
        watch = await first.start(watcher(conn_id))
        [lost] = await watch.wait_for_events(1)
    async with WatcherHarness(stores=first.stores) as second:
        watch = await second.start(watcher(conn_id))
        [again] = await watch.wait_for_events(1)
    assert again["event_id"] == lost["event_id"] and again["changed"] == lost["changed"]


def test_the_parameter_is_checked_at_parse_and_left_out_of_the_kwargs_when_unset() -> None:
    with pytest.raises(ValueError, match="fire_on_change"):
        HttpBatchReadyEventTrigger(http_conn_id="api", fire_on_change="items[*].id")
    with pytest.raises(ValueError, match="fire_on_change"):
        HttpBatchReadyEventTrigger(http_conn_id="api", fire_on_change="")
    plain = HttpBatchReadyEventTrigger(http_conn_id="api", endpoint="v1/latest")
    assert "fire_on_change" not in plain.serialize()[1]  # watchers deployed before keep hash and watermark
    changing = HttpBatchReadyEventTrigger(http_conn_id="api", endpoint="v1/latest", fire_on_change="batch.id")
    _classpath, kwargs = changing.serialize()
    assert kwargs["fire_on_change"] == "batch.id"
    assert HttpBatchReadyEventTrigger(**json.loads(json.dumps(kwargs))) == changing
    assert changing.watermark_key() != plain.watermark_key()  # another kind of watermark, another key
    assert changing.shared_stream_key() == plain.shared_stream_key()  # one request for both


def test_long_values_are_kept_by_digest_and_ids_name_the_state_left() -> None:
    assert fingerprint("r-17") == '"r-17"'
    assert fingerprint({"b": 1, "a": 2}) == '{"a":2,"b":1}'
    assert fingerprint("x" * 500).startswith("sha256:")
    assert change_event_id("id", '"b"', None) == 'id="b"@start'
    assert change_event_id("id", '"b"', {"value": '"a"', "since": "t1"}) == 'id="b"@after:t1'
