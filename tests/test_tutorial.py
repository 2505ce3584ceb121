"""The "write your own wait" tutorial, run as written: its first code block is the wait."""

from __future__ import annotations

import asyncio
import re
import socket
import sys
import types
from pathlib import Path

import pytest

from airflow_deferrable_kit.testing import assert_defers, make_context, run_trigger_payload, watch_blocking

PAGE = Path(__file__).resolve().parent.parent / "docs" / "writing-your-own-wait.md"


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
