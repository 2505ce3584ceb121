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
* a failed answer is never reused: every wait that shared it gets the error (and handles it with
  its own backoff), and the next poll asks again;
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
from collections.abc import Callable, Coroutine, Hashable
from typing import Any, Final

#: A poll may use an answer whose request started at most this fraction of the wait's poll
#: interval before the poll did (and at most :data:`REUSE_MAX` seconds before).
REUSE_FRACTION: Final = 0.1
#: The longest time, in seconds, an answer's request may have started before a poll that uses it.
REUSE_MAX: Final = 1.0


def reuse_window(poll_interval: float) -> float:
    """How old (from its start) a shared answer may be and still answer a wait's poll."""
    return min(REUSE_MAX, REUSE_FRACTION * poll_interval)


@dataclasses.dataclass
class _Shared:
    """One request whose answer several waits share."""

    started: float  # loop time at which its request was about to be sent
    task: asyncio.Task[Any]
    waiters: int = 0
    expiry: asyncio.TimerHandle | None = None

    def failed(self) -> bool:
        return self.task.done() and (self.task.cancelled() or self.task.exception() is not None)

    def answered(self, seen: int | None) -> bool:
        """Whether this is the answer a caller already got (``seen``, its ``id()``)."""
        return seen is not None and self.task.done() and not self.failed() and id(self.task.result()) == seen


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
    ) -> Any:
        """The answer of ``fetch()``, shared with every caller asking the same ``what``.

        An answer whose request started at most ``max_age`` seconds ago, finished or still in
        flight, is reused; past that (or after a failure) ``fetch()`` runs again, in its own task
        so that one caller's cancellation does not fail the others. A good answer is dropped
        ``keep`` seconds after its start; a failed one at once, after every caller got its error.
        ``seen`` is the ``id()`` of the answer this caller got last, which it is not given again
        (while an answer is held its id names it alone; a stale id only costs a fresh request).
        """
        loop = asyncio.get_running_loop()
        entry = self._shared.get(what)
        if entry is None or not self.reusable(what, max_age=max_age, seen=seen):
            entry = _Shared(started=loop.time(), task=loop.create_task(fetch()))
            self._shared[what] = entry
            entry.task.add_done_callback(functools.partial(self._settled, what, entry, keep))
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
        return not (
            entry is None
            or asyncio.get_running_loop().time() - entry.started > max_age
            or entry.failed()
            or entry.answered(seen)
        )

    def in_flight(self, what: Hashable) -> tuple[float, asyncio.Task[Any]] | None:
        """When the request held for ``what`` started (loop time) and its task, if one is held."""
        entry = self._shared.get(what)
        return None if entry is None else (entry.started, entry.task)

    def _settled(self, what: Hashable, entry: _Shared, keep: float, task: asyncio.Task[Any]) -> None:
        if task.cancelled() or task.exception() is not None:  # retrieving the error marks it seen
            self._forget(what, entry)
            return
        entry.expiry = asyncio.get_running_loop().call_at(entry.started + keep, self._forget, what, entry)

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


__all__ = ["REUSE_FRACTION", "REUSE_MAX", "SharedAnswers", "reuse_window"]
