"""Helpers to test triggers and deferrable sensors, ours and your own.

* :func:`run_trigger` runs a trigger to its first event the way the triggerer does, checks it
  stops after that one event, and always runs ``cleanup()``.
* :class:`FakeClock` lets a test run hours of polling and backoff in milliseconds.
* :func:`assert_defers` checks that a sensor defers with a given trigger class and method.
* :func:`make_context` builds the minimal context a sensor's ``execute`` needs.
* :func:`watch_blocking` reports every callback that held the event loop too long.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import gc
import logging
import time
from collections.abc import Iterator
from typing import Any, TypeVar

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_deferrable_kit.triggers.base import Clock

T = TypeVar("T", bound=BaseTrigger)


async def run_trigger(trigger: BaseTrigger, *, timeout: float = 30.0) -> TriggerEvent:
    """Run ``trigger`` to its first event within ``timeout`` seconds and return that event.

    Fails if the trigger yields nothing, or yields a second event instead of stopping.
    ``cleanup()`` runs afterwards whatever happened, as the triggerer guarantees.
    """
    events = trigger.run()
    try:
        try:
            event = await asyncio.wait_for(events.__anext__(), timeout)
        except StopAsyncIteration:
            raise AssertionError(f"{trigger!r} finished without firing an event") from None
        except asyncio.TimeoutError:
            raise AssertionError(f"{trigger!r} fired no event within {timeout}s") from None
        try:
            extra = await asyncio.wait_for(events.__anext__(), timeout)
        except StopAsyncIteration:
            return event
        raise AssertionError(f"{trigger!r} fired a second event {extra!r}; a wait fires exactly one")
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
        await trigger.cleanup()


async def run_trigger_payload(trigger: BaseTrigger, *, timeout: float = 30.0) -> Any:
    """Like :func:`run_trigger`, returning the event's payload."""
    return (await run_trigger(trigger, timeout=timeout)).payload


class FakeClock(Clock):
    """A clock whose ``sleep`` advances time at once and records how long each sleep was."""

    def __init__(self, start: float | None = None) -> None:
        self.now = time.time() if start is None else start
        self.sleeps: list[float] = []

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)

    def advance(self, seconds: float) -> None:
        """Step the wall clock, as NTP or a resumed VM would."""
        self.now += seconds


def assert_defers(
    sensor: Any,
    trigger_class: type[T],
    *,
    method_name: str = "execute_complete",
    context: Any = None,
    render: bool = True,
) -> T:
    """Run ``sensor.execute`` and assert it defers with ``trigger_class`` to ``method_name``.

    As the worker does, the sensor's templated fields are rendered with ``context`` first
    (``{{ ds }}``, ``{{ run_id }}``, ...); pass ``render=False`` for a sensor rendered already.
    Returns the trigger, so the test can check its kwargs or run it with :func:`run_trigger`.
    """
    from airflow.sdk.exceptions import TaskDeferred

    context = context if context is not None else make_context(sensor)
    if render:
        sensor.render_template_fields(context)
    try:
        result = sensor.execute(context)
    except TaskDeferred as deferred:
        trigger = deferred.trigger
        if not isinstance(trigger, trigger_class):
            raise AssertionError(
                f"{sensor.task_id} deferred with {type(trigger).__name__}, not {trigger_class.__name__}"
            ) from None
        if deferred.method_name != method_name:
            raise AssertionError(
                f"{sensor.task_id} will resume in {deferred.method_name!r}, not {method_name!r}"
            ) from None
        return trigger
    raise AssertionError(f"{sensor.task_id} did not defer; execute returned {result!r}")


class _TaskInstance:
    """Just enough of a task instance for sensors in poke and reschedule mode."""

    def __init__(self, first_reschedule_date: dt.datetime | None = None) -> None:
        self.first_reschedule_date = first_reschedule_date
        self.try_number = 1

    def get_first_reschedule_date(self, context: Any) -> dt.datetime | None:
        return self.first_reschedule_date


def make_context(task: Any = None, **overrides: Any) -> dict[str, Any]:
    """A minimal task context: ``ti``, ``task``, ``logical_date`` and ``ds``, plus ``overrides``."""
    now = dt.datetime.now(dt.timezone.utc)
    context: dict[str, Any] = {
        "ti": _TaskInstance(),
        "task": task,
        "logical_date": now,
        "ds": now.date().isoformat(),
        "run_id": "test_run",
    }
    context.update(overrides)
    return context


class _Collect(logging.Handler):
    def __init__(self, sink: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if " took " in message:
            self.sink.append(message)


@contextlib.contextmanager
def watch_blocking(threshold: float = 0.05) -> Iterator[list[str]]:
    """Collect asyncio's slow-callback reports (anything holding the loop over ``threshold`` s).

    Use inside a running loop; assert the yielded list is empty afterwards::

        with watch_blocking(0.05) as blocked:
            await run_trigger(trigger)
        assert blocked == []
    """
    loop = asyncio.get_running_loop()
    # A full garbage collection of a big test process can take longer than the threshold; it is
    # not the trigger's doing, so park the existing objects outside the collector meanwhile.
    gc.collect()
    gc.freeze()
    reports: list[str] = []
    handler = _Collect(reports)
    asyncio_log = logging.getLogger("asyncio")
    previous = (loop.get_debug(), loop.slow_callback_duration, asyncio_log.level)
    loop.set_debug(True)
    loop.slow_callback_duration = threshold
    asyncio_log.addHandler(handler)
    asyncio_log.setLevel(logging.WARNING)
    try:
        yield reports
    finally:
        gc.unfreeze()
        asyncio_log.removeHandler(handler)
        loop.set_debug(previous[0])
        loop.slow_callback_duration = previous[1]
        asyncio_log.setLevel(previous[2])
