"""The one object per connection every S3 wait polls through, and the answers it shares.

Waits whose patterns have the same literal prefix use one ``ListObjectsV2`` of it, started at
most a short window (:func:`listing_reuse_window`, the rule of every shared poll in
:mod:`airflow_deferrable_kit._shared_polls`) before their poll, and a bucket's existence
is checked once for all the waits on it. A failed answer is shared too, for one backoff (the
hold of :func:`airflow_deferrable_kit._shared_polls.failure_hold`): a throttled or failing bucket
is asked less often than a healthy one, never once per waiting poll. Waits on exact keys
of one folder, or of sibling folders under one prefix, share listings the same way when that is
cheaper than one HEAD each (:meth:`S3Poller.find_object`; the rule and its bound are in
:mod:`airflow_deferrable_kit._s3.key_groups`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final

from airflow_deferrable_kit._s3.client import S3Options, classify_s3_error, new_client, retry_after_of
from airflow_deferrable_kit._s3.key_groups import MAX_LISTING_PAGES, KeyGroup, KeyGroups
from airflow_deferrable_kit._s3.signed import DirectRequests
from airflow_deferrable_kit._shared_polls import REUSE_MAX as LISTING_REUSE_MAX
from airflow_deferrable_kit._shared_polls import SharedAnswers
from airflow_deferrable_kit._shared_polls import reuse_window as listing_reuse_window
from airflow_deferrable_kit.errors import TransientError

log = logging.getLogger(__name__)

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
    pages: int = 1
    #: ``False`` when the listing stopped at its page bound: keys past it are not in it.
    complete: bool = True
    _by_tail: dict[int, dict[str, list[int]]] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    _members: set[str] = dataclasses.field(default_factory=set, repr=False, compare=False)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` was listed (a set of the keys is built on the first question)."""
        if not self._members and self.keys:
            self._members.update(self.keys)
        return key in self._members

    def covers(self, key: str) -> bool:
        """Whether the listing says if ``key`` exists: it is complete, or ``key`` sorts before its end.

        S3 lists keys in UTF-8 byte order, which is the order of Python's ``str`` comparison.
        """
        return self.complete or (bool(self.keys) and key <= self.keys[-1])

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


class S3Poller:
    """What every S3 wait of one connection polls through: one per connection per process.

    It shares what many waits would otherwise each ask for: a listing of a prefix that started
    moments ago answers every wait on that prefix (:meth:`list_prefix`), and a bucket's
    existence, once confirmed, answers every wait on that bucket (:meth:`head_bucket`). HEADs and
    listing pages take the direct path of :class:`DirectRequests`, and answer or fail as
    botocore would.
    """

    def __init__(self, client: Any, *, where: str = "") -> None:
        self.client = client
        self.where = where  # the connection, for errors raised before S3 answered
        self._requests = DirectRequests(client)
        self._answers = SharedAnswers()
        self._groups = KeyGroups()

    # ---------------------------------------------------------------------------- HEAD
    async def head_object(self, bucket: str, key: str) -> dict[str, Any] | None:
        """``ContentLength``, ``ETag`` and ``LastModified`` of an object; ``None`` when S3 answers 404."""
        return await self._requests.head_object(bucket, key)

    async def find_object(self, bucket: str, key: str, *, poll_interval: float) -> dict[str, Any] | None:
        """What :meth:`head_object` says of ``key``, from a shared listing of a prefix where cheaper.

        The poll is counted in the key's groups (its folder, then the folders enclosing it); when
        the rule picks one (:meth:`KeyGroups.route`), a bounded listing of that prefix that started
        at most :func:`listing_reuse_window` before this poll answers "not yet" for a key it does
        not hold. A key it does hold is then HEADed, so what a found key reports (payload fields,
        ``min_size``, and errors such as a 403 on ``s3:GetObject``) is exactly what HEAD says; a
        key's first poll is a HEAD too (:meth:`KeyGroup.may_list`), so a key the credentials may
        not read fails its own wait at once and no other.
        A listing that stopped at its page bound, or failed with anything but a transient error,
        puts the prefix on HEAD (:meth:`KeyGroup.head_only`); a transient one (throttling, 5xx,
        network) is raised as the :class:`TransientError` :func:`classify_s3_error` makes of it,
        to every poll that shares the listing and, for one hold, every poll after them
        (:mod:`airflow_deferrable_kit._shared_polls`).
        """
        now = asyncio.get_running_loop().time()
        window = listing_reuse_window(poll_interval)
        route = self._groups.route(bucket, key, poll_interval, now, window)
        if route.listing is not None:
            listing = await self._prefix_listing(bucket, route.listing, window)
            # Only a listing that reached past the key says it is absent (one stopped at its bound is None).
            if listing is not None and listing.covers(key) and key not in listing:
                return None
        found = await self._requests.head_object(bucket, key)
        route.headed(key)  # HEAD answered (404, or an object min_size may still refuse): readable
        return found

    async def _prefix_listing(self, bucket: str, group: KeyGroup, window: float) -> Listing | None:
        """A shared listing of ``group``'s prefix bounded at :data:`MAX_LISTING_PAGES`; ``None``: use HEAD.

        One listing of a prefix is in flight at a time. A poll that finds one in flight that
        started more than ``window`` ago (too early to answer it) waits for it to end and then
        shares the listing that starts next, which began after the poll did: however slow the
        listings, a prefix costs one at a time, never one per window of their duration.
        """
        what = ("exact-keys", bucket, group.prefix)
        loop = asyncio.get_running_loop()
        while True:
            running = self._answers.in_flight(what)
            if running is None:
                break
            started, listing_task = running
            if listing_task.done() or loop.time() - started <= window:
                break
            await asyncio.wait([listing_task])
            if not group.lists(window, loop.time()):  # that listing put the prefix on HEAD
                return None
        listing: Listing | None = await self._share(
            what, window, LISTING_REUSE_MAX, lambda: self._list_prefix_of(bucket, group)
        )
        return listing

    async def _list_prefix_of(self, bucket: str, group: KeyGroup) -> Listing | None:
        """List ``group``'s prefix once; on the bound or a refusal, put the group on HEAD and say ``None``.

        Decided here, in the shared request, so that no poll starts another listing between
        the answer and the waits that shared it hearing of it.
        """
        what = f"LIST s3://{bucket}/{group.prefix}"
        try:
            listing = await self._list(bucket, group.prefix, max_pages=MAX_LISTING_PAGES)
        except Exception as exc:
            error = classify_s3_error(exc, what=what, where=self.where)
            if error is None:
                raise
            if isinstance(error, TransientError):
                raise error from exc
            reason = f"its listing failed ({error.message})"
        else:
            if listing.complete:
                group.listed(listing.pages)
                return listing
            reason = f"it holds more than {MAX_LISTING_PAGES} pages of objects"
        if group.head_only(asyncio.get_running_loop().time(), reason):
            log.info("%s: the waits on its keys poll them with HEAD for a while: %s", what, reason)
        return None

    async def head_bucket(self, bucket: str) -> Any:
        """botocore's own ``head_bucket``; a success answers every wait for :data:`BUCKET_CHECK_REUSE` s.

        Waits ask once, on their first 404, so a thousand waits deferred together on one bucket
        would otherwise send a thousand of these at the same moment.
        """
        return await self._share(
            ("bucket", bucket), BUCKET_CHECK_REUSE, BUCKET_CHECK_REUSE, lambda: self.client.head_bucket(Bucket=bucket)
        )

    # ------------------------------------------------------------------------- listings
    async def list_prefix(
        self, bucket: str, prefix: str, *, poll_interval: float, max_pages: int | None = None, seen: int | None = None
    ) -> Listing:
        """Every object under ``prefix`` for a wait polling every ``poll_interval`` seconds.

        The listing is shared within :func:`listing_reuse_window` of the poll interval, the
        window :meth:`find_object` shares its listings by: the one rule of every S3 wait (see
        :meth:`list_prefix_within` for the sharing, ``max_pages`` and ``seen``).
        """
        return await self.list_prefix_within(
            bucket, prefix, max_age=listing_reuse_window(poll_interval), max_pages=max_pages, seen=seen
        )

    async def list_prefix_within(
        self, bucket: str, prefix: str, *, max_age: float, max_pages: int | None = None, seen: int | None = None
    ) -> Listing:
        """Every object under ``prefix``, from a listing that started at most ``max_age`` s ago.

        A listing of the same ``(bucket, prefix)`` that is in flight or finished, and started
        within ``max_age`` seconds, is shared instead of sending another: N waits on one prefix
        cost about one listing per window, not N. A failed listing answers with its error every
        wait that shared it and every poll of the prefix until its hold ends (a window, doubling
        with each failure in a row, a ``Retry-After`` up to that cap); the first poll after it
        lists again.

        With ``max_pages`` the listing stops after that many pages (it is then not ``complete``),
        so a wait that must hold a whole prefix in memory never reads an unbounded one. Such a
        wait still shares an unbounded listing of the prefix another wait started within the
        window (it holds every page; the caller compares ``pages`` with its bound), and bounded
        listings with the same bound are shared among themselves. ``seen`` is the ``id()`` of the
        listing this caller judged last, which it is not given again (a poll sooner than the
        window, e.g. under a test's fake clock, lists anew rather than re-reading it).
        """
        what: tuple[str, ...] = ("list", bucket, prefix)
        if max_pages is not None and not self._answers.reusable(what, max_age=max_age, seen=seen):
            what = ("list", bucket, prefix, str(max_pages))
        else:
            max_pages = None
        listing: Listing = await self._share(
            what, max_age, LISTING_REUSE_MAX, lambda: self._list(bucket, prefix, max_pages=max_pages), seen=seen
        )
        return listing

    async def _list(self, bucket: str, prefix: str, *, max_pages: int | None = None) -> Listing:
        """Page through ``ListObjectsV2`` of ``prefix`` (no delimiter: keys at any depth).

        With ``max_pages``, stop after that many pages: the listing is then not ``complete``.
        """
        keys: list[str] = []
        details: list[tuple[int | None, str | None, Any]] = []
        token: str | None = None
        pages = 0
        while True:
            token = await self._requests.list_page(bucket, prefix, token, keys, details)
            pages += 1
            if token is None or (max_pages is not None and pages >= max_pages):
                return Listing(tuple(keys), tuple(details), pages=pages, complete=token is None)

    # ---------------------------------------------------------------------------- sharing
    async def _share(
        self,
        what: tuple[str, ...],
        max_age: float,
        keep: float,
        fetch: Callable[[], Coroutine[Any, Any, Any]],
        *,
        seen: int | None = None,
    ) -> Any:
        """The answer of ``fetch()``, shared with every caller of the same ``what``
        (:class:`~airflow_deferrable_kit._shared_polls.SharedAnswers`: reused while it started at
        most ``max_age`` s ago, dropped ``keep`` s after its start; a failure answers every caller
        for its hold, a server's ``Retry-After`` honoured up to its cap)."""
        return await self._answers.share(what, fetch, max_age=max_age, keep=keep, seen=seen, retry_after=retry_after_of)

    async def close(self) -> None:
        """Stop shared requests nobody waits for any more and close the client's pool."""
        self._answers.close()
        await self.client.close()


async def open_poller(options: S3Options) -> S3Poller:
    """The shared poller of one connection: its client built off the loop (the first lease calls this).

    A trigger leases it as ``lease(options.lease_key, lambda: open_poller(options), close_poller)``.
    """
    return S3Poller(await new_client(options), where=options.describe())


async def close_poller(poller: S3Poller) -> None:
    """Close a poller (the last lease calls this)."""
    await poller.close()
