"""Answers that waits asking the very same question share: one request answers every identical poll.

A thousand waits on one endpoint (one status URL polled by a hundred DAGs, a mass deferral, a
triggerer restart) would otherwise each send the same request. :class:`SharedAnswers` lets a
poll use the answer of an identical request that started at most a short window before it
(:func:`reuse_window`), still in flight or just finished, instead of sending its own. Each wait
then judges that answer by its own conditions, so sharing changes what is sent, never what a
wait decides.

:func:`reuse_window` is also the window of the S3 poller's shared listings
(``airflow_deferrable_kit._s3.poller``, which shares through :class:`SharedAnswers` too) and of
the Postgres waits' batched statements (``airflow_deferrable_kit._postgres.batches``). The rules:

* the window is a tenth of the wait's poll interval, at most one second, so a wait sees a change
  at most one poll interval plus that window after it happened;
* a failure is shared like an answer, with one backoff: every wait that shared the request gets
  its error, and so does every poll of the same question until the failure's hold ends
  (:func:`failure_hold`: the window of the poll that asked, doubling with each failure in a row
  up to :data:`HOLD_DOUBLINGS` times, and a server's ``Retry-After`` up to that cap); the
  first poll after the hold asks again. A throttled or failing upstream so sees at most one
  request per hold, fewer than when it is healthy (one per window), never one per waiting poll;
  each wait still backs off on its own from the error it got;
* the request runs in its own task, so cancelling one wait never cancels it for the others; it
  is cancelled only when every wait that wanted it was;
* a good answer is kept only while its window can still use it (at most :data:`REUSE_MAX`
  seconds after it started), so memory stays at a few answers per distinct request;
* a caller never gets the same answer twice (``seen``): a wait whose next poll comes sooner than
  the window (a short first phase, a test's fake clock) asks again instead of re-reading the
  answer it already judged.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
from collections.abc import Callable, Coroutine, Hashable
from typing import Any, Final

#: A poll may use an answer whose request started at most this fraction of the wait's poll
#: interval before the poll did (and at most :data:`REUSE_MAX` seconds before).
REUSE_FRACTION: Final = 0.1
#: The longest time, in seconds, an answer's request may have started before a poll that uses it.
REUSE_MAX: Final = 1.0
#: A failure's hold doubles with each failure in a row of the same request, at most this many
#: times (to 8 windows: under a wait's own backoff after its first error, a poll interval, so
#: the hold adds no latency past one poll once the upstream recovers).
HOLD_DOUBLINGS: Final = 3


def reuse_window(poll_interval: float) -> float:
    """How old (from its start) a shared answer may be and still answer a wait's poll."""
    return min(REUSE_MAX, REUSE_FRACTION * poll_interval)


def failure_hold(window: float, failures: int, retry_after: float | None = None) -> float:
    """Seconds a failed request's error answers the polls of its question, from when it failed.

    ``window`` seconds (the reuse window of the poll that sent it: a failing upstream is never
    asked more often than a healthy one) doubled for each earlier failure in a row, at most
    :data:`HOLD_DOUBLINGS` times, and at least a server's ``retry_after`` up to that cap: each
    wait honours a longer ``Retry-After`` in its own backoff, and a hold past the cap would delay
    a wait by more than one poll once the upstream recovers.
    """
    cap = window * 2.0**HOLD_DOUBLINGS
    hold = window * 2.0 ** min(max(failures - 1, 0), HOLD_DOUBLINGS)
    return max(hold, min(retry_after or 0.0, cap))


def _retry_after(failure: Any) -> float | None:
    value = getattr(failure, "retry_after", None)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclasses.dataclass
class _Shared:
    """One request whose answer (or error) several waits share."""

    started: float  # loop time at which its request was about to be sent
    task: asyncio.Task[Any]
    window: float  # the reuse window of the poll that sent it: the base of a failure's hold
    streak: int = 0  # failures in a row of this question before this request
    waiters: int = 0
    expiry: asyncio.TimerHandle | None = None
    held_until: float = -math.inf  # loop time until which its failure answers every poll
    is_failure: Callable[[Any], bool] | None = None  # an answer that is a failure too (an HTTP 503)

    def failure(self) -> Any:
        """The error, or the answer that is a failure, of a finished request; ``None`` otherwise."""
        if not self.task.done() or self.task.cancelled():
            return None
        error = self.task.exception()
        if error is not None:
            return error
        answer = self.task.result()
        return answer if self.is_failure is not None and self.is_failure(answer) else None

    def failed(self) -> bool:
        return self.failure() is not None

    def given(self, seen: int | None) -> bool:
        """Whether this is the answer a caller already got (``seen``, its ``id()``)."""
        return (
            seen is not None
            and self.task.done()
            and not self.task.cancelled()
            and self.task.exception() is None
            and id(self.task.result()) == seen
        )

    def usable(self, now: float, max_age: float, seen: int | None) -> bool:
        """Whether a poll at ``now`` that accepts answers ``max_age`` s old is answered by this."""
        if not self.task.done():
            return now - self.started <= max_age
        if self.task.cancelled():
            return False
        if self.failed():  # held; a hold not yet set: it failed in this very turn
            return now < self.held_until or self.held_until == -math.inf
        return now - self.started <= max_age and not self.given(seen)


class SharedAnswers:
    """Answers of requests in flight or just finished, by what was asked (one registry per loop)."""

    def __init__(self) -> None:
        self._shared: dict[Hashable, _Shared] = {}

    def __len__(self) -> int:
        """Answers held right now (in flight or within their window): for tests and diagnostics."""
        return len(self._shared)

    async def share(
        self,
        what: Hashable,
        fetch: Callable[[], Coroutine[Any, Any, Any]],
        *,
        max_age: float,
        keep: float = REUSE_MAX,
        seen: int | None = None,
        retry_after: Callable[[Any], float | None] | None = None,
        is_failure: Callable[[Any], bool] | None = None,
    ) -> Any:
        """The answer of ``fetch()``, shared with every caller asking the same ``what``.

        An answer whose request started at most ``max_age`` seconds ago, finished or still in
        flight, is reused; past that ``fetch()`` runs again, in its own task so that one caller's
        cancellation does not fail the others. A good answer is dropped ``keep`` seconds after
        its start. A failure (the exception ``fetch()`` raised) answers every caller until its
        hold ends (:func:`failure_hold`, the exception's ``retry_after`` honoured); a request
        cancelled because every caller was is dropped at once.
        ``is_failure`` says which answers are failures too (an HTTP 503 is a response, but a
        throttled one), held like an error. ``retry_after`` reads a server's ``Retry-After`` from
        an error or such an answer (default: its ``retry_after`` attribute, as
        :class:`~airflow_deferrable_kit.errors.TransientError` has).
        ``seen`` is the ``id()`` of the answer this caller got last, which it is not given again
        (a failing one it already got: it waits for that answer's hold to end)
        (while an answer is held its id names it alone; a stale id only costs a fresh request).
        """
        loop = asyncio.get_running_loop()
        now = loop.time()
        entry = self._shared.get(what)
        if entry is not None and entry.given(seen) and entry.failed() and now < entry.held_until:
            # This caller judged that failing answer already: it waits out the hold, then shares
            # the next request (a backoff shorter than the hold must not send one of its own).
            await asyncio.sleep(entry.held_until - now)
            now = loop.time()
            entry = self._shared.get(what)
        if entry is None or not entry.usable(now, max_age, seen):
            streak = entry.streak + 1 if entry is not None and entry.failed() else 0
            entry = _Shared(
                started=now,
                task=loop.create_task(fetch()),
                window=min(max_age, REUSE_MAX),
                streak=streak,
                is_failure=is_failure,
            )
            self._shared[what] = entry
            entry.task.add_done_callback(functools.partial(self._settled, what, entry, keep, retry_after))
        entry.waiters += 1
        try:
            return await asyncio.shield(entry.task)
        finally:
            entry.waiters -= 1
            if not entry.waiters and not entry.task.done():
                entry.task.cancel()  # every caller that wanted it was cancelled

    def reusable(self, what: Hashable, *, max_age: float, seen: int | None = None) -> bool:
        """Whether :meth:`share` of ``what`` would use the answer it holds (no new request) now."""
        entry = self._shared.get(what)
        return entry is not None and entry.usable(asyncio.get_running_loop().time(), max_age, seen)

    def in_flight(self, what: Hashable) -> tuple[float, asyncio.Task[Any]] | None:
        """When the request held for ``what`` started (loop time) and its task, if one is held."""
        entry = self._shared.get(what)
        return None if entry is None else (entry.started, entry.task)

    def _settled(
        self,
        what: Hashable,
        entry: _Shared,
        keep: float,
        retry_after: Callable[[Any], float | None] | None,
        task: asyncio.Task[Any],
    ) -> None:
        loop = asyncio.get_running_loop()
        if task.cancelled():
            self._forget(what, entry)
            return
        task.exception()  # retrieving the error marks it seen
        failure = entry.failure()
        if failure is None:
            entry.expiry = loop.call_at(entry.started + keep, self._forget, what, entry)
            return
        hold = failure_hold(entry.window, entry.streak + 1, (retry_after or _retry_after)(failure))
        entry.held_until = loop.time() + hold
        # Kept one more hold after it ends, so that a failure soon after counts as one more in a row.
        entry.expiry = loop.call_at(entry.held_until + hold, self._forget, what, entry)

    def _forget(self, what: Hashable, entry: _Shared) -> None:
        if self._shared.get(what) is entry:
            del self._shared[what]

    def close(self) -> None:
        """Stop the requests nobody waits for any more and drop every answer."""
        for entry in self._shared.values():
            entry.task.cancel()
            if entry.expiry is not None:
                entry.expiry.cancel()
        self._shared.clear()


__all__ = ["HOLD_DOUBLINGS", "REUSE_FRACTION", "REUSE_MAX", "SharedAnswers", "failure_hold", "reuse_window"]
