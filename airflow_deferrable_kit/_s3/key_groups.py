"""When one listing of a folder answers many exact-key polls more cheaply than one HEAD each.

Waits on exact keys (no wildcard) of one connection are grouped by bucket and **folder**: the
key up to and including its last ``/`` (``run-42/part-7.csv`` -> ``run-42/``; a key without a
``/`` is in the bucket's root, ``""``). A folder, not the longest prefix the waiting keys share,
because it does not move as waits come and go (a moving prefix would split the waits over
several listings), and because it is the boundary IAM policies usually grant ``s3:ListBucket``
on (``s3:prefix`` conditions).

The rule (:meth:`KeyGroup.lists`): a poll of a key in a folder is answered from a shared
listing of that folder when the polls expected in one listing's window
(:func:`airflow_deferrable_kit._s3.poller.listing_reuse_window`) outnumber the folder's listing
pages by :data:`POLLS_PER_LISTING_PAGE`. Polls are expected from the keys of the folder polled
recently, each at its own poll interval. A page of 1,000 objects costs about 8 HEADs of CPU to
read and S3 prices a LIST like 12.5 HEADs, so at 16 polls per page a listing is cheaper on both
counts. Since the window is at most a tenth of a poll interval, each waiting key adds at most
0.1 expected poll: it takes at least 160 keys in one folder for a one-page listing.

A key is answered from listings only once a HEAD of it answered (:meth:`KeyGroup.may_list`):
its first poll is a HEAD, so a key the credentials may not read (an ``s3:GetObject`` deny on it
or its prefix, which S3 answers 403 whether the object exists or not) ends its wait with HEAD's
403 at once, as without the group, instead of waiting on "not in the listing" until it times out.

The bound: a listing of an exact-key folder stops after :data:`MAX_LISTING_PAGES` pages. A
folder that holds more objects, or whose listing S3 refuses (``s3:ListBucket`` denied where
``s3:GetObject`` is allowed) or fails for any other non-transient reason, is polled with HEADs
for :data:`HEAD_ONLY_SECONDS`, then tried again.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Final

#: Expected polls one listing must answer per page it takes, for the listing to be used.
POLLS_PER_LISTING_PAGE: Final = 16
#: The most pages (of up to 1,000 objects) an exact-key folder is listed with; past it, HEAD.
MAX_LISTING_PAGES: Final = 10
#: Seconds a folder that listed too large, or whose listing was refused, is polled with HEADs.
HEAD_ONLY_SECONDS: Final = 600.0
#: A key not polled for this many of its poll intervals no longer counts (its wait ended).
_STALE_INTERVALS: Final = 2.0
#: Seconds between two looks for folder groups whose waits all ended (so they are dropped).
GROUP_SWEEP_SECONDS: Final = 60.0


def folder_of(key: str) -> str:
    """The key up to and including its last ``/``: the prefix its group lists."""
    return key[: key.rfind("/") + 1]


@dataclasses.dataclass
class KeyGroup:
    """The exact keys of one bucket folder being waited for, and how their polls are answered."""

    folder: str
    #: key -> (its poll interval, loop time of its last poll)
    polled: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    #: keys a HEAD answered (404, or an object): the credentials may read them, so a listing may answer them
    headed: set[str] = dataclasses.field(default_factory=set)
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
        self.polled[key] = (interval, now)
        self.last_poll = now
        self.longest_interval = max(self.longest_interval, interval)
        if now - self.swept_at >= interval:
            self.swept_at = now
            for stale in [k for k, (every, last) in self.polled.items() if now - last > _STALE_INTERVALS * every]:
                self.rate -= 1.0 / self.polled.pop(stale)[0]
                self.headed.discard(stale)
            if not self.polled:
                self.rate = 0.0

    def idle(self, now: float) -> bool:
        """No key of the folder was polled for two of the longest poll intervals: its waits ended."""
        return now - self.last_poll > _STALE_INTERVALS * self.longest_interval

    def expected_polls(self, window: float) -> float:
        """Polls of this folder's keys expected within ``window`` seconds."""
        return self.rate * window

    def lists(self, window: float, now: float) -> bool:
        """Whether a poll now is answered from a listing shared for ``window`` seconds."""
        if now < self.head_only_until:
            return False
        return self.expected_polls(window) >= POLLS_PER_LISTING_PAGE * self.pages - 1e-9  # float sums

    def may_list(self, key: str) -> bool:
        """Whether a listing may answer ``key``: a HEAD of it answered (see the module docstring)."""
        return key in self.headed

    def listed(self, pages: int) -> None:
        """A complete listing took ``pages`` pages: the next decisions weigh that many."""
        self.pages = max(1, pages)

    def head_only(self, now: float, reason: str) -> bool:
        """Poll this folder with HEADs for :data:`HEAD_ONLY_SECONDS`; ``True`` if it was listing until now."""
        started = now >= self.head_only_until
        if started:
            self.head_only_until = now + HEAD_ONLY_SECONDS
            self.head_only_reason = reason
        return started
