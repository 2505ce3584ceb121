"""The ported official HttpEventTrigger against a real aiohttp server: its response_check_path
callable runs unchanged on a requests.Response and the watcher fires when it turns true."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow_deferrable_kit.testing_events import WatcherHarness
from airflow_deferrable_kit.triggers.official_events import HttpEventTrigger

from .conftest import Seen, Server, reply
from .test_change_events import requests_served


async def test_the_official_response_check_path_runs_on_a_requests_response(
    serve: Callable[..., Server], connection: Callable[..., str]
) -> None:
    state = {"value": "draft"}

    def handle(seen: Seen) -> Any:
        return reply(200, {"id": 7, "state": state["value"]})

    server = serve(handle)
    conn_id = connection("github_releases", host=server.url)
    trigger = HttpEventTrigger(
        endpoint="repos/apache/airflow/releases/latest",
        method="GET",
        http_conn_id=conn_id,
        response_check_path="tests.integration.http.predicates.official_release_check",
        data={"per_page": 1},
        poll_interval=0.05,
    )
    async with WatcherHarness() as triggerer:
        watch = await triggerer.start(trigger)
        await requests_served(server, 3)  # judged "draft": the starting point, nothing fires
        assert watch.payloads == []
        state["value"] = "published"
        [event] = await watch.wait_for_events(1)
    assert event["decision"]["state"] == "success" and event["event_id"].startswith("ready-after@")
    assert server.requests[-1].query == {"per_page": ["1"]}
