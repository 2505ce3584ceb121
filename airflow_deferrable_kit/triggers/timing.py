"""When a wait wakes and when it ends: the pacer, the shared alarms, the clock and the deadline guard.

Every wait of a triggerer process sleeps and wakes through one :class:`Pacer` per event loop:
sleeps ending together share a timer, and waits woken together run a batch per loop iteration,
so a mass wake-up never holds the loop. :func:`paced_alarm` is the interruptible form of the same
sleep. :class:`Clock` is the wall clock and the sleep a trigger uses (swapped by tests), and a
deadline is an absolute UTC time (:func:`deadline_after`, :func:`parse_deadline`).
:class:`DeadlineGuard` abandons a check that runs past its wait's deadline, with one timer for
the wait's life. :class:`~airflow_deferrable_kit.triggers.base.PollingTrigger` uses all of it.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import math
import time
from collections import deque
from collections.abc import Coroutine
from typing import Any, Final, Protocol

from airflow_deferrable_kit._moments import in_utc
from airflow_deferrable_kit._per_loop import PerLoop

#: CPU seconds one loop iteration may spend on waits woken together before the rest wait a turn.
TURN_BUDGET = 0.02
#: Waits woken per loop iteration: where the pace starts and its bounds while it adapts.
WAKES_PER_TURN_START, WAKES_PER_TURN_MIN, WAKES_PER_TURN_MAX = 16, 4, 4096
#: Sleeps ending within the same slot of this many seconds share one timer (never ending early).
WAKE_RESOLUTION = 0.005

#: A sleep shares its timer with sleeps ending in the same slot, at most this share of its length
#: wide (a slot is WAKE_RESOLUTION times a power of two): 30 s polls share 60 ms slots, so 10,000
#: spread waits hold ~500 timers, not ~6,000; a short sleep keeps the 5 ms resolution.
SLOT_SHARE = 1 / 500


def _slot(end: float, seconds: float) -> int:
    """The slot (in WAKE_RESOLUTION units) a sleep of ``seconds`` ending at ``end`` wakes in; never early."""
    factor = 1 << max(0, int(seconds * SLOT_SHARE / WAKE_RESOLUTION).bit_length() - 1)
    return math.ceil(end / (WAKE_RESOLUTION * factor)) * factor


class Pacer:
    """Wake sleeping waits a batch per loop iteration, oldest first, so no iteration runs long.

    Ten thousand waits that wake at the same instant (one target time, a mass deferral, a
    triggerer restart) would otherwise all run in one loop iteration, and every other trigger's
    callback would wait seconds behind them. Sleeps ending in the same ``WAKE_RESOLUTION`` slot
    share one timer; when it fires its sleepers join a queue that each iteration drains a batch
    of. The batch grows while an iteration stays well under ``TURN_BUDGET`` and halves when it
    goes over, so cheap wake-ups (a clock read) go fast and costly ones (a signed request) stay
    spread out. Waits that wake at different moments pass straight through.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._slots: dict[int, list[asyncio.Future[None]]] = {}
        self._due: deque[asyncio.Future[None]] = deque()
        self._per_turn = WAKES_PER_TURN_START
        self._woken = 0
        self._turn = 0
        self._turn_started = time.thread_time()
        self._turn_scheduled = False
        #: Tasks woken in the current turn (emptied every turn: nothing is kept per wait).
        self._woken_this_turn: set[asyncio.Task[Any] | None] = set()

    async def sleep(self, seconds: float) -> None:
        """Sleep at least ``seconds`` (``0``: just take a turn), then wait for this wait's turn."""
        if seconds <= 0:
            if self._woken_this_turn and asyncio.current_task() in self._woken_this_turn:
                return  # woken from a sleep in this very turn: already counted
            if not self._due and self._woken < self._per_turn:
                self._woken += 1
                self._schedule_turn()
                return
            ticket = self._loop.create_future()
            self._due.append(ticket)
            self._schedule_turn()
        else:
            ticket = self.alarm(seconds)
        await ticket  # a cancelled ticket is skipped when its turn comes
        self._woken_this_turn.add(asyncio.current_task())

    def alarm(self, seconds: float) -> asyncio.Future[None]:
        """A future resolved at a paced turn at least ``seconds`` from now, on a shared timer.

        For a sleep that something else may end first: resolve (or cancel) the future early and
        its turn is skipped when the slot comes; the slot's timer is shared, never cancelled.
        """
        slot = _slot(self._loop.time() + seconds, seconds)
        ticket = self._loop.create_future()
        sleepers = self._slots.get(slot)
        if sleepers is None:
            sleepers = self._slots[slot] = []
            self._loop.call_at(slot * WAKE_RESOLUTION, self._slot_due, slot)
        sleepers.append(ticket)
        return ticket

    def _slot_due(self, slot: int) -> None:
        self.wake(self._slots.pop(slot))

    def wake(self, tickets: list[asyncio.Future[None]]) -> None:
        """Queue futures that are due now (sleepers of a shared timer) for their paced turns."""
        self._due.extend(tickets)
        self._schedule_turn()

    def _schedule_turn(self) -> None:
        if not self._turn_scheduled:
            self._turn_scheduled = True
            self._loop.call_soon(self._next_turn)

    def _next_turn(self) -> None:
        now = time.thread_time()  # CPU of the loop's thread: being descheduled is not the batch's cost
        if self._woken >= self._per_turn:  # the last batch was full: adapt to what it cost
            took = now - self._turn_started
            if took > TURN_BUDGET:
                self._per_turn = max(self._per_turn // 2, WAKES_PER_TURN_MIN)
            elif took < TURN_BUDGET / 2:
                self._per_turn = min(self._per_turn * 2, WAKES_PER_TURN_MAX)
        self._turn += 1
        self._turn_started = now
        self._turn_scheduled = False
        self._woken = 0
        self._woken_this_turn.clear()
        while self._due and self._woken < self._per_turn:
            ticket = self._due.popleft()
            if not ticket.done():
                ticket.set_result(None)
                self._woken += 1
        if self._woken or self._due:
            self._schedule_turn()


_pacers: PerLoop[Pacer] = PerLoop(lambda: Pacer(asyncio.get_running_loop()))


def pacer() -> Pacer:
    return _pacers.get()


def paced_alarm(seconds: float) -> asyncio.Future[None]:
    """A future resolved at least ``seconds`` from now, in a paced turn, sharing its timer.

    What an interruptible sleep of a wait needs (resolve the future early to end it): ten
    thousand waits sleeping a poll interval hold a few hundred shared timers between them, not
    one timer (and a copied context) each, and wake a batch per loop iteration.
    """
    return pacer().alarm(seconds)


class Clock:
    """Wall-clock time and sleeping, swappable so tests can run hours of waiting in milliseconds."""

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await pacer().sleep(seconds)


SYSTEM_CLOCK = Clock()


def deadline_after(seconds: float, *, clock: Clock = SYSTEM_CLOCK) -> str:
    """The absolute UTC deadline ``seconds`` from now, in the ISO form triggers carry."""
    return dt.datetime.fromtimestamp(clock.time() + seconds, tz=dt.timezone.utc).isoformat()


def parse_deadline(value: str, *, argument: str = "deadline") -> float:
    """Parse an ISO 8601 deadline with an explicit offset into a POSIX timestamp."""
    try:
        moment = dt.datetime.fromisoformat(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{argument} must be an ISO 8601 datetime string, got {value!r}") from exc
    if moment.tzinfo is None:
        raise ValueError(f"{argument} must carry a UTC offset (e.g. '+00:00'), got naive {value!r}")
    in_utc(moment, argument=argument, given=value)
    return moment.timestamp()


# ------------------------------------------------------------------------ the deadline
class Deadlined(Protocol):
    """What the guard asks of a wait: the seconds left to its deadline (``None``: no deadline)."""

    def seconds_left(self) -> float | None: ...


#: What a check abandoned at the deadline returns instead of its outcome.
DEADLINE_PASSED: Final = object()

#: The context the deadline timers run in: the callback reads no context variable, and a timer
#: would otherwise keep a copy of its wait's context for as long as the wait lasts.
_TIMER_CONTEXT: Final = contextvars.Context()

#: How far the loop's clock may run from the wall clock before a wait's deadline timer is set
#: again (a clock step, a suspended VM, a test's clock). Deadlines are in wall-clock time.
DEADLINE_DRIFT_SECONDS: Final = 1.0


class DeadlineGuard:
    """The deadline of one wait's checks: one timer for the wait's life, not one per check.

    ``asyncio.timeout`` around every check costs a timer handle and a copied context per poll,
    and the cancelled handle of a deadline days away stays in the loop's heap until the heap is
    rebuilt, so a waiting wait kept several timers alive (docs/benchmarks.md). The guard sets one
    timer at the deadline and sets it again only when the loop's clock and the wall clock
    disagree by more than :data:`DEADLINE_DRIFT_SECONDS`. When it fires during a check it cancels
    the wait's task there, as ``asyncio.timeout`` would, and the check is abandoned; outside a
    check it does nothing (the sleep between polls already ends at the deadline). It never fires
    early: a timer that comes due before the wall clock's deadline is set again for what is left.
    """

    __slots__ = ("_cancelled", "_handle", "_task", "_trigger")

    def __init__(self, trigger: Deadlined) -> None:
        self._trigger = trigger
        self._handle: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[Any] | None = None  # set while a check runs
        self._cancelled = False  # the guard cancelled the running check

    def enter(self, left: float) -> int:
        """A check starts with ``left`` seconds to the deadline; returns the task's cancel count."""
        loop = asyncio.get_running_loop()
        when = loop.time() + left
        handle = self._handle
        if handle is None or handle.cancelled() or abs(handle.when() - when) > DEADLINE_DRIFT_SECONDS:
            if handle is not None:
                handle.cancel()
            self._handle = loop.call_at(when, self._due, context=_TIMER_CONTEXT)
        task = asyncio.current_task()
        assert task is not None
        self._task, self._cancelled = task, False
        return task.cancelling()

    def leave(self, cancelling: int) -> bool:
        """The check ended; True if it ended because the guard cancelled it (and nothing else did)."""
        task, self._task = self._task, None
        if not self._cancelled or task is None:
            return False
        self._cancelled = False
        return task.uncancel() <= cancelling

    def _due(self) -> None:
        left = self._trigger.seconds_left()
        if left is not None and left > 0:  # the loop's clock ran ahead of the wall clock
            self._handle = asyncio.get_running_loop().call_later(left, self._due, context=_TIMER_CONTEXT)
            return
        self._handle = None  # spent: the next check (if any) sets a new one
        if self._task is not None and not self._cancelled:
            self._cancelled = True
            self._task.cancel()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


async def check_in_task(check: Coroutine[Any, Any, Any], left: float) -> Any:
    """Python 3.10's way to abandon a check at the deadline: run it as a task and wait for it."""
    task = asyncio.ensure_future(check)
    try:
        done, _ = await asyncio.wait({task}, timeout=left)
    except asyncio.CancelledError:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)  # unwound before run() releases clients
        raise
    if not done:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return DEADLINE_PASSED
    return task.result()


__all__ = [
    "SYSTEM_CLOCK",
    "Clock",
    "DeadlineGuard",
    "Pacer",
    "deadline_after",
    "paced_alarm",
    "pacer",
    "parse_deadline",
]
