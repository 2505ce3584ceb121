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
import resource
import threading
import time
import traceback
from collections.abc import Callable, Iterator
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
    """Just enough of a task instance for sensors in poke and reschedule mode, and for what keys
    itself by the task instance (an operator's idempotency key): the task's own ids."""

    def __init__(self, first_reschedule_date: dt.datetime | None = None, task: Any = None) -> None:
        self.first_reschedule_date = first_reschedule_date
        self.try_number = 1
        self.task_id = str(getattr(task, "task_id", "") or "")
        self.dag_id = str(getattr(task, "dag_id", "") or "")
        self.run_id = "test_run"
        self.map_index = -1

    def get_first_reschedule_date(self, context: Any) -> dt.datetime | None:
        return self.first_reschedule_date


def make_context(task: Any = None, **overrides: Any) -> dict[str, Any]:
    """A minimal task context: ``ti``, ``task``, ``logical_date`` and ``ds``, plus ``overrides``."""
    now = dt.datetime.now(dt.timezone.utc)
    context: dict[str, Any] = {
        "ti": _TaskInstance(task=task),
        "task": task,
        "logical_date": now,
        "ds": now.date().isoformat(),
        "run_id": "test_run",
    }
    context.update(overrides)
    return context


class BlockingReports(list[str]):
    """The callbacks that held the loop (one line each), and beside them those that only *seemed*
    to: :attr:`preempted` lists callbacks that took long on the wall clock while their thread
    neither used the CPU for that long nor waited for anything (no voluntary context switch),
    only lost the CPU to other processes or, on a virtual machine, to other guests: a busy
    machine, not the code."""

    def __init__(self) -> None:
        super().__init__()
        self.preempted: list[str] = []


def _switches() -> tuple[int, int]:
    """This thread's voluntary and involuntary context switches so far (Linux), else zeros."""
    usage = resource.getrusage(getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF))
    return usage.ru_nvcsw, usage.ru_nivcsw


def _describe_handle(handle: asyncio.Handle) -> str:
    """The task a callback steps, else the callback (as asyncio's own slow-callback report says)."""
    owner = getattr(getattr(handle, "_callback", None), "__self__", None)
    return repr(owner) if isinstance(owner, asyncio.Task) else repr(handle)


class _Watch:
    """Times every callback the watched thread runs: wall clock, CPU, context switches."""

    def __init__(self, threshold: float, reports: BlockingReports) -> None:
        self.threshold = threshold
        self.reports = reports
        self.thread = threading.get_ident()
        self.exact = hasattr(resource, "RUSAGE_THREAD")  # per-thread switches: preemption is told apart
        #: Seconds the watched thread spent building debug-mode source tracebacks (see
        #: :meth:`timed_tracebacks`): the instrument's cost, not the code's.
        self.instrument = 0.0

    def timed_tracebacks(self, extract: Callable[..., Any]) -> Callable[..., Any]:
        """``StackSummary._extract_from_extended_frame_gen``, timed on the watched thread.

        asyncio's debug mode records where every future was created (``traceback.extract_stack``,
        reading source lines and stat-ing files): about 0.5 ms per future, which a callback that
        creates hundreds of futures (aiokafka assigning 600 partitions) would otherwise be blamed
        for, although without debug mode it costs nothing.
        """

        def timed(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != self.thread:
                return extract(*args, **kwargs)
            started = time.thread_time()
            try:
                return extract(*args, **kwargs)
            finally:
                self.instrument += time.thread_time() - started

        return timed

    def run(self, handle: asyncio.Handle, original: Callable[[asyncio.Handle], None]) -> None:
        if threading.get_ident() != self.thread:
            original(handle)
            return
        # The counters are read outside the wall-clock window, so every switch inside it counts.
        (voluntary, involuntary), cpu = _switches(), time.thread_time()
        instrument = self.instrument
        wall = time.perf_counter()
        try:
            original(handle)
        finally:
            instrument = self.instrument - instrument
            wall = time.perf_counter() - wall - instrument
            if wall >= self.threshold:
                cpu = time.thread_time() - cpu - instrument
                now_voluntary, now_involuntary = _switches()
                voluntary, involuntary = now_voluntary - voluntary, now_involuntary - involuntary
                line = (
                    f"Executing {_describe_handle(handle)} took {wall:.3f} seconds (CPU {cpu:.3f} s, "
                    f"{voluntary} voluntary / {involuntary} involuntary context switches)"
                )
                # Neither busy nor waiting for anything: the CPU went to other processes (involuntary
                # switches) or, on a virtual machine, to other guests (no switch the guest can see).
                preempted = self.exact and cpu < self.threshold and voluntary == 0
                (self.reports.preempted if preempted else self.reports).append(line)


@contextlib.contextmanager
def watch_blocking(threshold: float = 0.05) -> Iterator[BlockingReports]:
    """Report every callback that holds the event loop over ``threshold`` seconds.

    Use inside a running loop; assert the yielded list is empty afterwards::

        with watch_blocking(0.05) as blocked:
            await run_trigger(trigger)
        assert blocked == []

    A callback is reported when it ran that long on the wall clock and either used that much CPU
    or waited for something (a blocking call, a lock, the GIL held by another thread: a voluntary
    context switch). One that only lost the CPU to other processes on a busy machine (or to other
    guests of a virtual machine) is listed under ``blocked.preempted`` instead (Linux, where
    per-thread counters exist; elsewhere every long callback is reported). asyncio's debug mode
    is on meanwhile, for its other checks; the time it spends recording where each future was
    created is not counted against the callback (it costs nothing without debug mode).
    """
    loop = asyncio.get_running_loop()
    # A full garbage collection of a big test process can take longer than the threshold; it is
    # not the trigger's doing, so park the existing objects outside the collector meanwhile.
    gc.collect()
    gc.freeze()
    reports = BlockingReports()
    watch = _Watch(threshold, reports)
    original = asyncio.Handle._run
    extract = traceback.StackSummary.__dict__["_extract_from_extended_frame_gen"]
    setattr(  # noqa: B010 - a private classmethod of the stdlib, patched for the watch's length
        traceback.StackSummary,
        "_extract_from_extended_frame_gen",
        classmethod(watch.timed_tracebacks(extract.__func__)),
    )
    previous = (loop.get_debug(), loop.slow_callback_duration)
    loop.set_debug(True)
    loop.slow_callback_duration = float("inf")  # the watch reports, with more to say
    asyncio.Handle._run = lambda handle: watch.run(handle, original)  # type: ignore[method-assign,assignment]
    try:
        yield reports
    finally:
        asyncio.Handle._run = original  # type: ignore[method-assign]
        setattr(traceback.StackSummary, "_extract_from_extended_frame_gen", extract)  # noqa: B010
        gc.unfreeze()
        loop.set_debug(previous[0])
        loop.slow_callback_duration = previous[1]
