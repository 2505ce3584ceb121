"""Measuring one try: how long a worker slot was held, and how long the try waited in all.

Where worker-held time comes from (Airflow 3.3.2, ``api_fastapi/execution_api/routes/
task_instances.py``): every state change a worker reports through the Execution API adds a row
to the ``log`` table, server-timestamped: ``running`` when a worker process starts the try
(first start, each reschedule poke, each resume after a deferral) and ``deferred``,
``up_for_reschedule``, ``success``, ``failed``, ... when it lets go. Each ``running`` →
next-state pair is one interval a worker slot was held. ``task_instance.start_date`` (the
worker's own clock when it asked to run) refines the start of the interval it opened.
``task_reschedule`` rows cannot be used for this: 3.3.2 stamps their ``start_date`` at the end of
the poke, so their duration is 0. When the ``log`` rows of a try are gone (``airflow db clean``),
the try is estimated from ``task_instance`` and ``task_reschedule`` alone and counted as such.

Pure functions of the rows read: nothing here touches a database.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

#: The ``log`` event a worker writes when it starts (or resumes) a try.
WORKER_START = "running"
#: ``log`` events that end a worker's hold on a try: a hand-off (deferred, rescheduled, parked
#: for input), an end state, or the scheduler giving up on a silent worker.
WORKER_STOP = (
    "deferred",
    "up_for_reschedule",
    "awaiting_input",
    "success",
    "failed",
    "skipped",
    "up_for_retry",
    "upstream_failed",
    "removed",
    "restarting",
    "heartbeat timeout",
)


#: Operators that are waits too: they start remote work in one request and then only wait for
#: it (the kit's HTTP job operator), so time they hold beyond one check is idle as a sensor's is.
WAITING_OPERATORS = frozenset({"HttpJobOperator"})


def is_sensor(*names: str | None) -> bool:
    """Whether an operator waits for something (so time held beyond one check is idle)."""
    return any(name and ("sensor" in name.lower() or name in WAITING_OPERATORS) for name in names)


# ------------------------------------------------------------------ measuring one try
@dataclass(frozen=True)
class Event:
    """A state change of one try, as the ``log`` table recorded it (server clock)."""

    name: str
    at: dt.datetime


@dataclass(frozen=True)
class Try:
    """One try of a task instance: a ``task_instance`` row (the current try) or a
    ``task_instance_history`` row (an earlier one)."""

    dag_id: str
    task_id: str
    run_id: str
    map_index: int
    try_number: int
    state: str | None
    operator: str | None
    custom_operator_name: str | None
    start: dt.datetime | None
    end: dt.datetime | None
    queued: dt.datetime | None = None
    reschedules: int = 0
    first_reschedule_end: dt.datetime | None = None

    @property
    def operator_name(self) -> str:
        """What the UI shows: the custom name (``@task.sensor``, ...) or the class name."""
        return self.custom_operator_name or self.operator or "?"

    @property
    def sensor(self) -> bool:
        return is_sensor(self.operator, self.custom_operator_name)


@dataclass(frozen=True)
class Usage:
    """How one try used worker slots. Seconds; ``estimated`` when the ``log`` rows were missing.

    ``resumed`` is the worker-held time after the try first deferred: the runs that resumed it on
    a worker, which ``end_from_trigger=True`` would not need.
    """

    mode: str
    wall: float
    worker: float
    segments: int
    shortest: float
    estimated: bool = False
    resumed: float = 0.0

    def idle(self, *, sensor: bool, check_seconds: float) -> float:
        """Worker-held seconds beyond one check: what a sensor held while only waiting.

        One check is the try's shortest worker interval, at most ``check_seconds`` (a poke-mode
        sensor has a single interval spanning the whole wait). Non-sensors are working: 0.
        """
        if not sensor or self.mode == "first_look":  # the one look took all of it
            return 0.0
        return max(0.0, self.worker - min(self.shortest, check_seconds))


def _seconds(start: dt.datetime, end: dt.datetime) -> float:
    return (end - start).total_seconds()


def worker_intervals(events: Sequence[Event], end: dt.datetime | None) -> list[tuple[dt.datetime, dt.datetime]]:
    """Pair each ``running`` event with the next event that ended the worker's hold.

    A second ``running`` without a stop in between closes the first (its worker was replaced);
    an interval still open at the end closes at the try's ``end_date``.
    """
    intervals: list[tuple[dt.datetime, dt.datetime]] = []
    opened: dt.datetime | None = None
    for event in events:
        if event.name == WORKER_START:
            if opened is not None:
                intervals.append((opened, event.at))
            opened = event.at
        elif opened is not None:
            intervals.append((opened, event.at))
            opened = None
    if opened is not None and end is not None and end > opened:
        intervals.append((opened, end))
    return intervals


#: How far a worker's clock may be behind the scheduler's before a try looks started by the
#: scheduler: more than this between ``start_date`` and ``queued_dttm`` is a real deferral.
CLOCK_SKEW_ALLOWANCE = dt.timedelta(seconds=1)


def _started_in_triggerer(attempt: Try, intervals: Sequence[tuple[dt.datetime, dt.datetime]]) -> bool:
    """The scheduler deferred the try itself (``start_from_trigger``): no worker ran before it.

    The scheduler sets ``start_date`` when it defers such a try and writes no ``log`` row; a
    worker only appears once the try is queued again to resume, after ``start_date``.
    """
    if attempt.start is None or attempt.queued is None or not intervals:
        return False
    return attempt.queued - attempt.start > CLOCK_SKEW_ALLOWANCE and attempt.queued <= intervals[0][0]


def _use_worker_start(
    intervals: list[tuple[dt.datetime, dt.datetime]], start: dt.datetime | None
) -> list[tuple[dt.datetime, dt.datetime]]:
    """Start the interval ``start_date`` belongs to at ``start_date`` (the worker's clock).

    The worker sends ``start_date`` when it asks to run; the ``running`` row is written when the
    server has handled that request, which can be seconds later on a busy API server while the
    worker already holds its slot. ``start_date`` is kept across a deferral and reset by each
    reschedule poke, so it belongs to the first interval of a deferred try and to the last of a
    rescheduled one: the one whose ``running`` event follows it with no interval ending between.
    """
    if start is None:
        return intervals
    previous_end: dt.datetime | None = None
    for index, (opened, closed) in enumerate(intervals):
        if (previous_end is None or start >= previous_end) and start <= opened:
            return [*intervals[:index], (start, closed), *intervals[index + 1 :]]
        previous_end = closed
    return intervals


def measure(attempt: Try, events: Sequence[Event]) -> Usage | None:
    """Wall and worker-held seconds of one try; ``None`` if it never ran on a worker.

    ``events`` are the try's ``log`` rows in order. Without them the try is estimated (see the
    module docstring and docs/audit.md for the approximations).
    """
    sensor = attempt.sensor
    names = {event.name for event in events}
    intervals = worker_intervals(events, attempt.end)
    from_triggerer = _started_in_triggerer(attempt, intervals)
    if not from_triggerer:  # there start_date is the scheduler's deferral, not a worker's start
        intervals = _use_worker_start(intervals, attempt.start)
    if intervals:
        if "deferred" in names or from_triggerer:
            mode = "deferred"
        elif "up_for_reschedule" in names:
            mode = "reschedule"
        else:
            mode = "poke" if sensor else "worker"
        lengths = [max(0.0, _seconds(opened, closed)) for opened, closed in intervals]
        worker = sum(lengths)
        last = attempt.end if attempt.end is not None and attempt.end > intervals[-1][1] else intervals[-1][1]
        first = attempt.start if from_triggerer and attempt.start is not None else intervals[0][0]
        wall = max(_seconds(first, last), worker)
        resumed = 0.0
        if from_triggerer:  # every worker run resumed it
            resumed = worker
        elif mode == "deferred":  # every run but the one that first deferred
            resumed = sum(lengths[1:])
        return Usage(mode, wall, worker, len(intervals), min(lengths), resumed=resumed)
    if not events and attempt.queued is None and not attempt.reschedules and attempt.start and attempt.end:
        # Never queued to an executor, yet started and ended: the triggerer ran the whole try
        # (start_from_trigger with end_from_trigger) and no worker was ever held.
        span = _seconds(attempt.start, attempt.end)
        return Usage("deferred", span, 0.0, 0, 0.0) if span > 0 else None
    return _estimate(attempt)


def first_look(usage: Usage) -> Usage:
    """``usage`` as a first look if it held one worker run and ended there; else unchanged.

    For a try of a task whose other tries deferred: the sensor is deferrable, and a deferrable
    sensor looks once on the worker before deferring (this kit's ``check_before_defer``, the
    official sensors' first ``poke``), so a condition already true ends the try there. Without
    such evidence the metadata DB cannot tell that from poke mode (see ``docs/audit.md``).
    """
    if usage.mode == "poke" and usage.segments == 1 and not usage.estimated:
        return Usage("first_look", usage.wall, usage.worker, 1, usage.shortest)
    return usage


def _estimate(attempt: Try) -> Usage | None:
    """Worker-held time from ``task_instance`` alone, for tries whose ``log`` rows are gone."""
    if attempt.start is None or attempt.end is None:
        return None
    span = max(0.0, _seconds(attempt.start, attempt.end))
    if attempt.reschedules > 0:
        # start_date/duration describe the last poke only; assume every poke took as long.
        first_start = attempt.start
        if attempt.first_reschedule_end is not None:
            first_start = min(first_start, attempt.first_reschedule_end - dt.timedelta(seconds=span))
        pokes = attempt.reschedules + 1
        worker = span * pokes
        wall = max(_seconds(first_start, attempt.end), worker)
        return Usage("reschedule", wall, worker, pokes, span, estimated=True)
    if span <= 0:
        return None
    if attempt.queued is not None and attempt.queued > attempt.start:
        # Queued again after it started: resumed after a deferral. start_date kept the first
        # start, so the span includes the wait; assume the run before deferring took as long
        # as the resumed run (which includes its wait in the queue).
        resumed = max(0.0, _seconds(attempt.queued, attempt.end))
        worker = min(span, 2 * resumed)
        return Usage("deferred", span, worker, 2, worker / 2, estimated=True, resumed=worker / 2)
    return Usage("poke" if attempt.sensor else "worker", span, span, 1, span, estimated=True)
