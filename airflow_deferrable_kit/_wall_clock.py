"""One alarm per event loop for every wait on a wall-clock moment.

Ten thousand ``DateTimeTrigger`` waits that each slept in chunks of ``poll_interval`` woke the
loop 10,000 times per interval (a task step, a timer and a clock read each, through the
triggerer's greenback portal) only to learn that the moment had not come. Here a wait costs a
heap entry and a future until its moment: one timer per loop watches the earliest moment and
re-reads the wall clock at least every :data:`RECHECK_SECONDS`, so a clock step (NTP, a resumed
VM) is noticed within a second for every wait at once, and a step backwards never fires early.
Waits due together are handed to ``wake`` in one list (the polling trigger's pacer, which wakes
them a batch per loop iteration so no iteration runs long).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Callable

#: Longest time between two reads of the wall clock while a wait is pending.
RECHECK_SECONDS = 1.0
#: Cancelled entries tolerated in the heap before it is rebuilt without them.
COMPACT_AFTER = 256


class WallClockAlarm:
    """Wake futures when the wall clock reaches their moment (POSIX seconds)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        wake: Callable[[list[asyncio.Future[None]]], None],
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._loop = loop
        self._wake = wake
        self._wall = wall
        self._heap: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._cancelled = 0

    def __len__(self) -> int:
        """Entries held (cancelled ones included until the heap is compacted or they come due)."""
        return len(self._heap)

    async def until(self, moment: float) -> None:
        """Return once ``time.time() >= moment`` has been seen (never earlier)."""
        ticket: asyncio.Future[None] = self._loop.create_future()
        heapq.heappush(self._heap, (moment, next(self._order), ticket))
        self._arm()
        try:
            await ticket
        except asyncio.CancelledError:
            if not ticket.done() or ticket.cancelled():
                self._forget_one()
            raise

    def _forget_one(self) -> None:
        self._cancelled += 1
        if self._cancelled >= COMPACT_AFTER and self._cancelled * 2 >= len(self._heap):
            self._heap = [entry for entry in self._heap if not entry[2].done()]
            heapq.heapify(self._heap)
            self._cancelled = 0

    def _arm(self) -> None:
        """Have one timer at the earliest moment, or at the next re-read of the clock if sooner."""
        if not self._heap:
            return
        ahead = self._heap[0][0] - self._wall()
        at = self._loop.time() + max(0.0, min(ahead, RECHECK_SECONDS))
        if self._timer is not None:
            if self._timer_at <= at:
                return
            self._timer.cancel()
        self._timer_at = at
        self._timer = self._loop.call_at(at, self._ring)

    def _ring(self) -> None:
        self._timer, self._timer_at = None, math.inf
        now = self._wall()
        due: list[asyncio.Future[None]] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            ticket = heapq.heappop(heap)[2]
            if ticket.done():
                self._cancelled = max(0, self._cancelled - 1)
            else:
                due.append(ticket)
        if due:
            self._wake(due)
        self._arm()


__all__ = ["RECHECK_SECONDS", "WallClockAlarm"]
