"""Airflow's own ``TriggerRunner`` builds every kit trigger, and survives every one it cannot build.

``TriggerRunner.create_triggers()`` (Airflow 3.3.2) lets nothing but a ``TypeError`` out of a
trigger's constructor: anything else kills the runner, and with it every wait and watcher of the
triggerer. These tests hand the runner the very workloads the supervisor hands it (``RunTrigger``,
kwargs as the Execution API stores them) and check that a trigger it cannot build ends alone
(a wait with one clear error event, a watcher retrying) while the others run on.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib
import importlib.util
import json
import pathlib
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest

from airflow_deferrable_kit import extras
from airflow_deferrable_kit.triggers import events as event_triggers
from airflow_deferrable_kit.triggers.base import PollingTrigger
from tests.unit.triggers.test_every_trigger import EVENT_EXAMPLES, EXAMPLES, registered_triggers

# The workloads are shaped as Airflow 3.3's TriggerRunner takes them (their shape changed in 3.3).
pytestmark = pytest.mark.airflow_3_3

CLASSPATHS = {cls.__name__: f"{cls.__module__}.{cls.__qualname__}" for cls in registered_triggers()}
WAITS = sorted(EXAMPLES)
WATCHERS = sorted(EVENT_EXAMPLES)
#: The optional client each wait needs, as ``require_extra`` names it.
EXTRA_MODULES = {"aiobotocore": "s3", "aiohttp": "http", "asyncpg": "postgres", "aiokafka": "kafka"}

PAST = "2020-01-01T00:00:00+00:00"


def workload(trigger_id: int, classpath: str, kwargs: dict[str, Any]) -> Any:
    from airflow.executors.workloads import RunTrigger

    return RunTrigger(id=trigger_id, classpath=classpath, encrypted_kwargs=json.dumps(kwargs))


@pytest.fixture
async def runner() -> AsyncIterator[Any]:
    from airflow.jobs.triggerer_job_runner import TriggerRunner

    runner = TriggerRunner()
    yield runner
    tasks = [entry["task"] for entry in runner.triggers.values()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await runner._shared_streams.stop_all()


@pytest.fixture
def reasons(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every reason a trigger gave for not being built, with the watchers' retries made quick."""
    monkeypatch.setattr(event_triggers, "UNBUILT_RETRY_BASE", 0.01)
    monkeypatch.setattr(event_triggers, "UNBUILT_RETRY_CAP", 0.05)
    seen: list[str] = []
    not_built = PollingTrigger._not_built

    def spy(self: PollingTrigger, exc: Exception, kwargs: dict[str, Any]) -> None:
        not_built(self, exc, kwargs)
        assert self._unbuilt is not None
        seen.append(self._unbuilt.message)

    monkeypatch.setattr(PollingTrigger, "_not_built", spy)
    return seen


async def build(runner: Any, workloads: list[Any]) -> None:
    """What the runner does with new trigger rows; raising here is the runner dying."""
    runner.to_create.extend(workloads)
    await runner.create_triggers()


async def finished(runner: Any, ids: list[int], timeout: float = 30) -> dict[int, Any]:
    """The one event each of ``ids`` fired, once their tasks are done."""
    await asyncio.wait_for(asyncio.gather(*(runner.triggers[i]["task"] for i in ids)), timeout)
    out: dict[int, Any] = {}
    for entry in runner.events:
        assert entry.trigger_id not in out, f"trigger {entry.trigger_id} fired twice"
        out[entry.trigger_id] = entry.event.payload
    return out


def wait_class(name: str) -> type[PollingTrigger]:
    module, _, attribute = CLASSPATHS[name].rpartition(".")
    cls: type[PollingTrigger] = getattr(importlib.import_module(module), attribute)
    return cls


def healthy_alarm(trigger_id: int) -> Any:
    return workload(trigger_id, CLASSPATHS["DateTimeTrigger"], {"target_time": PAST, "poll_interval": 1.0})


async def test_the_runner_builds_every_trigger_class_from_its_stored_kwargs(runner: Any) -> None:
    names = WAITS + WATCHERS
    examples = {**EXAMPLES, **EVENT_EXAMPLES}
    await build(runner, [workload(i, CLASSPATHS[name], examples[name]) for i, name in enumerate(names, 1)])
    assert list(runner.failed_triggers) == []
    assert sorted(runner.triggers) == list(range(1, len(names) + 1))
    # Built and running; one may already have ended with its event (a connection this process
    # missed long ago is believed at once), but none crashed.
    tasks = {entry["name"]: entry["task"] for entry in runner.triggers.values()}
    await asyncio.sleep(0.2)
    crashed = {name: task.exception() for name, task in tasks.items() if task.done() and task.exception()}
    assert crashed == {}


@pytest.mark.parametrize("name", WAITS)
async def test_a_wait_with_an_invalid_argument_ends_alone_with_one_clear_error(runner: Any, name: str) -> None:
    bad = {**EXAMPLES[name], "poll_interval": -1}
    await build(runner, [healthy_alarm(1), workload(2, CLASSPATHS[name], bad), healthy_alarm(3)])
    assert list(runner.failed_triggers) == []
    payloads = await finished(runner, [1, 2, 3])
    assert payloads[1]["status"] == payloads[3]["status"] == "success"
    assert payloads[2]["status"] == "error" and payloads[2]["error_type"] == "bad_configuration"
    assert "poll_interval" in payloads[2]["message"] and name in payloads[2]["message"], payloads[2]


@pytest.mark.parametrize("module", sorted(EXTRA_MODULES))
async def test_a_triggerer_without_an_extra_ends_those_waits_with_the_pip_command(
    runner: Any, module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(extras.importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a))
    needing = [
        name
        for name in WAITS
        if module in getattr(sys.modules[CLASSPATHS[name].rpartition(".")[0]], name).extra_modules
    ]
    assert needing, module
    loads = [healthy_alarm(1)] + [workload(i, CLASSPATHS[name], EXAMPLES[name]) for i, name in enumerate(needing, 2)]
    await build(runner, loads)
    assert list(runner.failed_triggers) == []
    payloads = await finished(runner, [w.id for w in loads])
    assert payloads[1]["status"] == "success"
    for i in range(2, len(loads) + 1):
        assert payloads[i]["status"] == "error", payloads[i]
        assert f'pip install "airflow-deferrable-kit[{EXTRA_MODULES[module]}]"' in payloads[i]["message"]


@pytest.mark.parametrize("name", WATCHERS)
async def test_a_watcher_that_cannot_be_built_keeps_trying_and_the_runner_goes_on(
    runner: Any, name: str, reasons: list[str]
) -> None:
    bad = {**EVENT_EXAMPLES[name], "backfill": "yes"}
    await build(runner, [healthy_alarm(1), workload(2, CLASSPATHS[name], bad)])
    assert list(runner.failed_triggers) == []
    payloads = await finished(runner, [1])
    assert payloads[1]["status"] == "success"
    await asyncio.sleep(0.3)
    assert not runner.triggers[2]["task"].done()  # still trying, with backoff; nothing fired
    assert [e for e in runner.events if e.trigger_id == 2] == []
    assert all(name in reason and "backfill" in reason for reason in reasons), reasons
    assert 3 <= len(reasons) < 100, len(reasons)  # built once by the runner, then retried, paced


WAIT_MODULE = """
from airflow_deferrable_kit.payload import Found
from airflow_deferrable_kit.triggers.base import PollingTrigger


class AlwaysThere(PollingTrigger):
    name: str = "x"

    async def check(self):
        return Found({"name": self.name})
"""


async def test_a_watcher_whose_wait_module_is_deployed_later_starts_firing(
    runner: Any, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The triggerer host lacks the module of an ``as_event_trigger()`` watcher's wait (code
    shipped only to the DAG processor); once it is deployed, the watcher builds and fires."""
    monkeypatch.setattr(event_triggers, "UNBUILT_RETRY_BASE", 0.05)
    monkeypatch.setattr(event_triggers, "UNBUILT_RETRY_CAP", 0.1)
    module = f"adk_late_wait_{id(tmp_path)}"
    kwargs = {"wait_classpath": f"{module}.AlwaysThere", "wait_params": {"name": "late"}, "backfill": True}
    await build(runner, [workload(1, CLASSPATHS["ConditionEventTrigger"], kwargs), healthy_alarm(2)])
    assert list(runner.failed_triggers) == []
    assert (await finished(runner, [2]))[2]["status"] == "success"
    assert not runner.triggers[1]["task"].done()
    (tmp_path / f"{module}.py").write_text(WAIT_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    for _ in range(200):
        fired = [e.event.payload for e in runner.events if e.trigger_id == 1]
        if fired:
            break
        await asyncio.sleep(0.05)
    assert fired and fired[0]["name"] == "late", fired
    # Built late, it still runs in a shared stream in ack mode: each event is bound to the batch
    # it came from, so its watermark is saved only once the event is stored (not when fired).
    entries = [e for e in runner.events if e.trigger_id == 1]
    assert entries and all(e.persist_seq is not None for e in entries), entries
    assert any("unbuilt" in map(str, key) for key in runner._shared_streams._groups)


@pytest.mark.parametrize("module", sorted(EXTRA_MODULES))
async def test_a_watcher_of_a_wait_whose_extra_is_missing_keeps_trying_with_the_pip_command(
    runner: Any, module: str, reasons: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``wait.as_event_trigger()`` on a triggerer without the wait's extra: the watcher is not
    built either, says so with the pip command, and tries again with backoff (it used to be
    built around a broken wait, die at its first look and be re-created at every sync)."""
    [name, *_] = [n for n in WAITS if module in wait_class(n).extra_modules and not n.endswith("EventTrigger")]
    watcher_form = wait_class(name)(**EXAMPLES[name]).as_event_trigger()  # HTTP's has a class of its own
    classpath, kwargs = watcher_form.serialize()
    real = importlib.util.find_spec
    monkeypatch.setattr(extras.importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a))
    await build(runner, [healthy_alarm(1), workload(2, classpath, kwargs)])
    assert list(runner.failed_triggers) == []
    assert (await finished(runner, [1]))[1]["status"] == "success"
    await asyncio.sleep(0.3)
    assert not runner.triggers[2]["task"].done()  # still trying, with backoff; nothing fired
    assert [e for e in runner.events if e.trigger_id == 2] == []
    pip = f'pip install "airflow-deferrable-kit[{EXTRA_MODULES[module]}]"'
    watcher = [r for r in reasons if r.startswith(f"{type(watcher_form).__name__} could not be built")]
    assert watcher and all(pip in reason for reason in watcher), reasons
    assert 3 <= len(watcher) < 100, len(watcher)


def test_outside_the_runner_the_constructor_still_refuses_bad_input_at_parse() -> None:
    for name in WAITS:
        cls: type[PollingTrigger] = getattr(importlib.import_module(CLASSPATHS[name].rpartition(".")[0]), name)
        with pytest.raises(ValueError, match="poll_interval"):
            cls(**{**EXAMPLES[name], "poll_interval": -1})


def test_a_deadline_in_the_past_is_not_an_error_in_the_runner() -> None:
    """Guard for the tests above: the healthy alarm really is due."""
    assert dt.datetime.fromisoformat(PAST) < dt.datetime.now(dt.timezone.utc)
