"""When one listing of a prefix answers many exact-key polls more cheaply than one HEAD each.

Waits on exact keys (no wildcard) of one connection are grouped by bucket and **prefix**, where
a prefix is one of the key's folders: first its own folder, the key up to and including its
last ``/`` (``run-42/part-7.csv`` -> ``run-42/``; a key without a ``/`` is in the bucket's
root, ``""``), then the folders enclosing it, up to :data:`MAX_ENCLOSING_FOLDERS` of them
(``runs/r1/7/data.csv`` -> ``runs/r1/7/``, ``runs/r1/``, ``runs/``; :func:`prefixes_of`). Folders,
not the longest text the waiting keys share, because they do not move as waits come and go (a
moving prefix would split the waits over several listings), and because they are the boundary
IAM policies usually grant ``s3:ListBucket`` on (``s3:prefix`` conditions). The bucket's root
is only ever the group of keys that live in it: keys that share no folder share no listing.

The rule (:meth:`KeyGroups.route`): a poll walks the key's prefixes from the deepest, counting
itself in each, and is answered from a shared listing of the first whose rule says list
(:meth:`KeyGroup.lists`): the polls expected in one listing's window
(:func:`airflow_deferrable_kit._s3.poller.listing_reuse_window`) outnumber the prefix's listing
pages by :data:`POLLS_PER_LISTING_PAGE`. Polls are expected from the keys counted in the prefix
recently, each at its own poll interval. A page of 1,000 objects costs about 8 HEADs of CPU to
read and S3 prices a LIST like 12.5 HEADs, so at 16 polls per page a listing is cheaper on both
counts. Since the window is at most a tenth of a poll interval, each waiting key adds at most
0.1 expected poll: it takes at least 160 keys for a one-page listing. So 1,000 keys each in its
own folder under ``runs/r1/`` are answered by listings of ``runs/r1/``; 200 keys of one folder
by listings of that folder, and their polls are not counted in the folders enclosing it (a
listing there would be paid for by the other keys alone). A prefix is weighed with at least
the pages a listing of a folder inside it took (it holds those objects too), and a prefix on
HEAD (the bound, below) ends the walk: every folder enclosing it is at least as large.

A key is answered from listings only once a HEAD of it answered (:meth:`KeyGroup.may_list`):
its first poll is a HEAD, so a key the credentials may not read (an ``s3:GetObject`` deny on it
or its prefix, which S3 answers 403 whether the object exists or not) ends its wait with HEAD's
403 at once, as without the group, instead of waiting on "not in the listing" until it times out.

The bound: a listing of an exact-key prefix stops after :data:`MAX_LISTING_PAGES` pages and then
answers no key (a key past its last page is not known to be absent). A prefix that holds more
objects, or whose listing S3 refuses (``s3:ListBucket`` denied where ``s3:GetObject`` is
allowed) or fails for any other non-transient reason, is polled with HEADs for
:data:`HEAD_ONLY_SECONDS`, then tried again.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Final

#: Expected polls one listing must answer per page it takes, for the listing to be used.
POLLS_PER_LISTING_PAGE: Final = 16
#: The most pages (of up to 1,000 objects) an exact-key prefix is listed with; past it, HEAD.
MAX_LISTING_PAGES: Final = 10
#: Seconds a prefix that listed too large, or whose listing was refused, is polled with HEADs.
HEAD_ONLY_SECONDS: Final = 600.0
#: Folders enclosing a key's own folder that may group it (the nearest ones; never the root).
MAX_ENCLOSING_FOLDERS: Final = 3
#: A key not polled for this many of its poll intervals no longer counts (its wait ended).
_STALE_INTERVALS: Final = 2.0
#: Seconds between two looks for key groups whose waits all ended (so they are dropped).
GROUP_SWEEP_SECONDS: Final = 60.0


def folder_of(key: str) -> str:
    """The key up to and including its last ``/``: the first prefix its poll is counted in."""
    return key[: key.rfind("/") + 1]


@functools.lru_cache(maxsize=65536)
def prefixes_of(key: str) -> tuple[str, ...]:
    """The prefixes that may group ``key``, deepest first: its folder, then the folders enclosing it.

    At most :data:`MAX_ENCLOSING_FOLDERS` enclosing folders, and never the bucket's root unless
    the key lives in it (``"top.csv"`` -> ``("",)``; ``"a/b/c.csv"`` -> ``("a/b/", "a/")``).
    """
    folder = folder_of(key)
    prefixes = [folder]
    while len(prefixes) <= MAX_ENCLOSING_FOLDERS:
        cut = folder.rfind("/", 0, len(folder) - 1)
        if cut < 0:
            break
        folder = folder[: cut + 1]
        prefixes.append(folder)
    return tuple(prefixes)


@dataclasses.dataclass(slots=True)
class KeyGroup:
    """The exact keys counted in one bucket prefix, and how their polls are answered.

    Keys alone in their folder (``own-7/data.csv``) each have a group of their own that never
    lists, so a group is kept small: slots, and one dict for everything known per key.
    """

    prefix: str
    #: key -> (its poll interval, loop time of its last poll, whether a HEAD of it answered: 404
    #: or an object, so the credentials may read it and a listing may answer it)
    polled: dict[str, tuple[float, float, bool]] = dataclasses.field(default_factory=dict)
    rate: float = 0.0  # expected polls per second: the sum of 1 / interval over ``polled``
    pages: int = 1  # pages of the last complete listing (one until there is one)
    swept_at: float = -math.inf
    last_poll: float = -math.inf
    longest_interval: float = 0.0
    head_only_until: float = -math.inf
    head_only_reason: str = ""

    def note_poll(self, key: str, interval: float, now: float) -> None:
        """Count a poll of ``key``; forget keys whose waits stopped polling (at most once an interval)."""
        interval = max(interval, 1e-3)
        previous = self.polled.get(key)
        if previous is None:
            self.rate += 1.0 / interval
        elif previous[0] != interval:
            self.rate += 1.0 / interval - 1.0 / previous[0]
        self.polled[key] = (interval, now, previous is not None and previous[2])
        self.last_poll = now
        self.longest_interval = max(self.longest_interval, interval)
        if now - self.swept_at >= interval:
            self.swept_at = now
            for stale in [k for k, (every, last, _) in self.polled.items() if now - last > _STALE_INTERVALS * every]:
                self.rate -= 1.0 / self.polled.pop(stale)[0]
            if not self.polled:
                self.rate = 0.0

    def idle(self, now: float) -> bool:
        """No key was counted here for two of the longest poll intervals: its waits ended (or list elsewhere)."""
        return now - self.last_poll > _STALE_INTERVALS * self.longest_interval

    def expected_polls(self, window: float) -> float:
        """Polls of this prefix's keys expected within ``window`` seconds."""
        return self.rate * window

    def on_head(self, now: float) -> bool:
        """Whether the prefix is polled with HEADs for now (:meth:`head_only`)."""
        return now < self.head_only_until

    def lists(self, window: float, now: float, *, at_least_pages: int = 1) -> bool:
        """Whether a poll now is answered from a listing shared for ``window`` seconds.

        ``at_least_pages``: pages a listing of a folder inside this prefix took (this one holds them too).
        """
        if self.on_head(now):
            return False
        pages = max(self.pages, at_least_pages)
        return self.expected_polls(window) >= POLLS_PER_LISTING_PAGE * pages - 1e-9  # float sums

    def may_list(self, key: str) -> bool:
        """Whether a listing may answer ``key``: a HEAD of it answered (see the module docstring)."""
        entry = self.polled.get(key)
        return entry is not None and entry[2]

    def headed(self, key: str) -> None:
        """A HEAD of ``key`` answered (a key no longer counted here is counted again at its next poll)."""
        entry = self.polled.get(key)
        if entry is not None and not entry[2]:
            self.polled[key] = (entry[0], entry[1], True)

    def listed(self, pages: int) -> None:
        """A complete listing took ``pages`` pages: the next decisions weigh that many."""
        self.pages = max(1, pages)

    def head_only(self, now: float, reason: str) -> bool:
        """Poll this prefix with HEADs for :data:`HEAD_ONLY_SECONDS`; ``True`` if it was listing until now."""
        started = now >= self.head_only_until
        if started:
            self.head_only_until = now + HEAD_ONLY_SECONDS
            self.head_only_reason = reason
        return started


@dataclasses.dataclass
class Route:
    """How one poll of an exact key is answered: from ``listing``'s listing, else with a HEAD."""

    #: the group whose listing answers the poll; ``None``: HEAD
    listing: KeyGroup | None
    #: the groups the poll was counted in (a HEAD that answers makes the key listable in each)
    counted: list[KeyGroup]

    def headed(self, key: str) -> None:
        """A HEAD of ``key`` answered: the listings of the groups it is counted in may answer it."""
        for group in self.counted:
            group.headed(key)


class KeyGroups:
    """The key groups of one connection, by ``(bucket, prefix)``: keys of two buckets never share."""

    def __init__(self) -> None:
        self.groups: dict[tuple[str, str], KeyGroup] = {}
        self._swept_at = -math.inf

    def route(self, bucket: str, key: str, interval: float, now: float, window: float) -> Route:
        """Count a poll of ``key`` and say which listing answers it (the rule of the module docstring)."""
        if now - self._swept_at >= GROUP_SWEEP_SECONDS:
            self._swept_at = now
            for idle in [where for where, group in self.groups.items() if group.idle(now)]:
                del self.groups[idle]
        counted: list[KeyGroup] = []
        pages = 1
        for prefix in prefixes_of(key):
            group = self.groups.get((bucket, prefix))
            if group is None:
                group = self.groups[bucket, prefix] = KeyGroup(prefix)
            group.note_poll(key, interval, now)
            counted.append(group)
            if group.lists(window, now, at_least_pages=pages):
                return Route(group if group.may_list(key) else None, counted)
            if group.on_head(now):  # too large or refused: so is every folder enclosing it
                break
            pages = max(pages, group.pages)
        return Route(None, counted)
