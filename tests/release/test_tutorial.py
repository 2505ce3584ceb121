"""The "write your own wait" tutorial, run as written: its first code block is the wait."""

from __future__ import annotations

import asyncio
import re
import socket
import sys
import types

import pytest

from airflow_deferrable_kit.testing import assert_defers, make_context, run_trigger_payload, watch_blocking
from tests import REPO

PAGE = REPO / "docs" / "writing-your-own-wait.md"


@pytest.fixture(scope="module")
def tutorial() -> types.ModuleType:
    code = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)[0]
    assert len([line for line in code.splitlines() if line.strip()]) <= 30  # "in under 30 lines"
    module = types.ModuleType("adk_tutorial_wait")
    sys.modules[module.__name__] = module
    exec(compile(code, str(PAGE), "exec"), module.__dict__)
    return module


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_the_tutorial_trigger_waits_until_the_port_opens(tutorial: types.ModuleType) -> None:
    port = free_port()
    trigger = tutorial.PortOpenTrigger(host="127.0.0.1", port=port, poll_interval=0.05)

    async def open_later() -> asyncio.Server:
        await asyncio.sleep(0.3)
        return await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", port)

    opener = asyncio.ensure_future(open_later())
    with watch_blocking(0.05) as blocked:
        payload = await run_trigger_payload(trigger, timeout=30)
    server = await opener
    server.close()
    assert payload == {"status": "success", "host": "127.0.0.1", "port": port}
    assert blocked == []


def test_the_tutorial_sensor_validates_defers_and_round_trips(tutorial: types.ModuleType) -> None:
    with pytest.raises(ValueError, match="port must be between 1 and 65535"):
        tutorial.PortOpenSensor(task_id="bad", host="h", port=0)
    sensor = tutorial.PortOpenSensor(task_id="t", host="127.0.0.1", port=free_port(), deferrable=True)
    trigger = assert_defers(sensor, tutorial.PortOpenTrigger, context=make_context(sensor))
    classpath, kwargs = trigger.serialize()
    assert classpath == "adk_tutorial_wait.PortOpenTrigger"
    assert tutorial.PortOpenTrigger(**kwargs) == trigger


# ------------------------------------------------------------------------- the event form
@pytest.fixture(scope="module")
def tutorial_events(tutorial: types.ModuleType) -> dict[str, object]:
    """The page's second code block (the event form), run as written beside the first."""
    code = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)[1]
    namespace = dict(tutorial.__dict__)
    exec(compile(code, str(PAGE), "exec"), namespace)
    return namespace


def test_the_tutorial_wait_becomes_an_asset_watcher_without_another_class(
    tutorial: types.ModuleType, tutorial_events: dict[str, object]
) -> None:
    from airflow.sdk import Asset

    from airflow_deferrable_kit.triggers.events import ConditionEventTrigger

    asset = tutorial_events["db_up"]
    assert isinstance(asset, Asset)
    [watcher] = asset.watchers
    trigger = watcher.trigger
    assert isinstance(trigger, ConditionEventTrigger)
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_deferrable_kit.triggers.events.ConditionEventTrigger"
    assert kwargs["wait_classpath"] == "adk_tutorial_wait.PortOpenTrigger"
    assert kwargs["wait_params"] == {"host": "db.internal", "port": 5432}
    assert ConditionEventTrigger(**kwargs) == trigger
    with pytest.raises(ValueError, match="port must be between 1 and 65535"):  # the wait's validation
        tutorial.PortOpenTrigger(host="h", port=0, poll_interval=1).as_event_trigger()
    with pytest.raises(ValueError, match="port must be between 1 and 65535"):
        ConditionEventTrigger(**{**kwargs, "wait_params": {"host": "h", "port": 0}})


async def test_the_event_form_fires_each_time_the_port_opens_and_survives_a_restart(
    tutorial: types.ModuleType,
) -> None:
    from airflow_deferrable_kit.testing_events import WatcherHarness

    port = free_port()

    def watcher() -> object:
        return tutorial.PortOpenTrigger(host="127.0.0.1", port=port, poll_interval=0.05).as_event_trigger()

    async def serve() -> asyncio.Server:
        return await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", port)

    async with WatcherHarness() as triggerer:
        watch = await triggerer.start(watcher())
        await asyncio.sleep(0.3)
        assert watch.payloads == []  # closed
        server = await serve()
        [event] = await watch.wait_for_events(1)
        assert {"host": "127.0.0.1", "port": port}.items() <= event.items()
        await asyncio.sleep(0.3)
        assert len(watch.events) == 1  # still open: no second event
        server.close()
        await server.wait_closed()
        await asyncio.sleep(0.3)
        server = await serve()
        await watch.wait_for_events(2)  # opened again
        await asyncio.sleep(0.3)
    async with WatcherHarness(stores=triggerer.stores) as restarted:
        watch = await restarted.start(watcher())
        await asyncio.sleep(0.5)
        assert watch.payloads == []  # the restart remembers it is open: nothing fires again
    server.close()
    await server.wait_closed()
