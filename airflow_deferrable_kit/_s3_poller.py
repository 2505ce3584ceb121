"""The one object per connection every S3 wait polls through, and the answers it shares.

Waits whose patterns have the same literal prefix use one ``ListObjectsV2`` of it, started at
most a short window (:func:`listing_reuse_window`) before their poll, and a bucket's existence
is checked once for all the waits on it. A failed answer is never reused.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final

from airflow_deferrable_kit._s3_requests import DirectRequests
from airflow_deferrable_kit._share_window import LISTING_REUSE_FRACTION as LISTING_REUSE_FRACTION
from airflow_deferrable_kit._share_window import LISTING_REUSE_MAX
from airflow_deferrable_kit._share_window import listing_reuse_window as listing_reuse_window

#: Seconds a bucket's existence, once confirmed, answers for every wait of the connection.
BUCKET_CHECK_REUSE: Final = 60.0


@dataclasses.dataclass(frozen=True)
class Listing:
    """Every object under one prefix, as one paginated ``ListObjectsV2`` saw it, in key order.

    Many waits match their own pattern against one listing. A pattern's literal tail (the text
    after its last wildcard) picks the candidate keys through an index built once per tail
    length, so a thousand waits on one prefix do not each scan every key.
    """

    keys: tuple[str, ...]
    #: ``(size, etag, last_modified)`` of each key; ``last_modified`` may still be S3's text.
    details: tuple[tuple[int | None, str | None, Any], ...]
    _by_tail: dict[int, dict[str, list[int]]] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def candidates(self, tail: str) -> Sequence[int]:
        """Indexes, in key order, of the keys that end with ``tail`` (every key for ``""``)."""
        if not tail:
            return range(len(self.keys))
        size = len(tail)
        index = self._by_tail.get(size)
        if index is None:
            index = self._by_tail[size] = {}
            for position, key in enumerate(self.keys):
                index.setdefault(key[-size:], []).append(position)
        return index.get(tail, ())

    def detail(self, index: int) -> tuple[int | None, str | None, Any]:
        """``(size, etag, last_modified)`` of one key, the time parsed as botocore parses it.

        Parsing a timestamp costs more than the rest of a listed object together, so it is done
        only for the objects a wait reports.
        """
        from botocore.utils import parse_timestamp

        size, etag, modified = self.details[index]
        return size, etag, parse_timestamp(modified) if isinstance(modified, str) else modified


@dataclasses.dataclass
class _Shared:
    """One request (or paginated listing) whose answer several waits share."""

    started: float  # loop time at which its first request was about to be sent
    task: asyncio.Task[Any]
    waiters: int = 0
    expiry: asyncio.TimerHandle | None = None

    def failed(self) -> bool:
        return self.task.done() and (self.task.cancelled() or self.task.exception() is not None)


class S3Poller:
    """What every S3 wait of one connection polls through: one per connection per process.

    It shares what many waits would otherwise each ask for: a listing of a prefix that started
    moments ago answers every wait on that prefix (:meth:`list_prefix`), and a bucket's
    existence, once confirmed, answers every wait on that bucket (:meth:`head_bucket`). HEADs and
    listing pages take the direct path of :class:`DirectRequests`, and answer or fail as
    botocore would.
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self._requests = DirectRequests(client)
        self._shared: dict[tuple[str, ...], _Shared] = {}

    # ---------------------------------------------------------------------------- HEAD
    async def head_object(self, bucket: str, key: str) -> dict[str, Any] | None:
        """``ContentLength``, ``ETag`` and ``LastModified`` of an object; ``None`` when S3 answers 404."""
        return await self._requests.head_object(bucket, key)

    async def head_bucket(self, bucket: str) -> Any:
        """botocore's own ``head_bucket``; a success answers every wait for :data:`BUCKET_CHECK_REUSE` s.

        Waits ask once, on their first 404, so a thousand waits deferred together on one bucket
        would otherwise send a thousand of these at the same moment.
        """
        return await self._share(
            ("bucket", bucket), BUCKET_CHECK_REUSE, BUCKET_CHECK_REUSE, lambda: self.client.head_bucket(Bucket=bucket)
        )

    # ------------------------------------------------------------------------- listings
    async def list_prefix(self, bucket: str, prefix: str, *, max_age: float) -> Listing:
        """Every object under ``prefix``, from a listing that started at most ``max_age`` s ago.

        A listing of the same ``(bucket, prefix)`` that is in flight or finished, and started
        within ``max_age`` seconds, is shared instead of sending another: N waits on one prefix
        cost about one listing per window, not N. A failed listing is never reused: the waits
        that shared it all get its error, and the next poll lists again.
        """
        listing: Listing = await self._share(
            ("list", bucket, prefix), max_age, LISTING_REUSE_MAX, lambda: self._list(bucket, prefix)
        )
        return listing

    async def _list(self, bucket: str, prefix: str) -> Listing:
        """Page through ``ListObjectsV2`` of ``prefix`` (no delimiter: keys at any depth)."""
        keys: list[str] = []
        details: list[tuple[int | None, str | None, Any]] = []
        token: str | None = None
        while True:
            token = await self._requests.list_page(bucket, prefix, token, keys, details)
            if token is None:
                return Listing(tuple(keys), tuple(details))

    # ---------------------------------------------------------------------------- sharing
    async def _share(
        self, what: tuple[str, ...], max_age: float, keep: float, fetch: Callable[[], Coroutine[Any, Any, Any]]
    ) -> Any:
        """The answer of ``fetch()``, shared with every caller of the same ``what``.

        An answer whose request started at most ``max_age`` seconds ago, finished or still in
        flight, is reused; past that (or after a failure) ``fetch()`` runs again, in its own task
        so that one caller's cancellation does not fail the others. A good answer is dropped
        ``keep`` seconds after its start; a failed one at once, after every caller got its error.
        """
        loop = asyncio.get_running_loop()
        entry = self._shared.get(what)
        if entry is None or loop.time() - entry.started > max_age or entry.failed():
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

    def _settled(self, what: tuple[str, ...], entry: _Shared, keep: float, task: asyncio.Task[Any]) -> None:
        if task.cancelled() or task.exception() is not None:  # retrieving the error marks it seen
            self._forget(what, entry)
            return
        entry.expiry = asyncio.get_running_loop().call_at(entry.started + keep, self._forget, what, entry)

    def _forget(self, what: tuple[str, ...], entry: _Shared) -> None:
        if self._shared.get(what) is entry:
            del self._shared[what]

    async def close(self) -> None:
        """Stop shared requests nobody waits for any more and close the client's pool."""
        for entry in self._shared.values():
            entry.task.cancel()
            if entry.expiry is not None:
                entry.expiry.cancel()
        self._shared.clear()
        await self.client.close()


async def close_poller(poller: S3Poller) -> None:
    """Close a poller (the last lease calls this)."""
    await poller.close()
