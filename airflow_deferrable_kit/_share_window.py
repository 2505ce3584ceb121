"""How far apart two waits' polls may be and still share one look at the server.

Waits of one kind that ask the same server the same kind of question share one request: S3
waits on one prefix share a listing that started moments before their poll, Postgres waits on
one table share one batched query gathered for a moment before it is sent. Both use this one
window, so "found within one poll interval" becomes "within one poll interval plus this
window", and the window stays a small fraction of the interval.
"""

from __future__ import annotations

from typing import Final

#: A poll may share a look that started (or is sent) at most this fraction of the wait's poll
#: interval away from the poll (and at most :data:`LISTING_REUSE_MAX` seconds away).
LISTING_REUSE_FRACTION: Final = 0.1
#: The longest time, in seconds, between a poll and the shared look that answers it.
LISTING_REUSE_MAX: Final = 1.0


def listing_reuse_window(poll_interval: float) -> float:
    """How far (in seconds) a shared look may be from a wait's own poll and still answer it.

    An object present when a listing starts is in it, so a wait that uses a listing started at
    most this long before its own poll sees an object at most one poll interval plus this window
    after the object appeared. A batched query sent at most this long after a wait's poll
    is due gives the same bound.
    """
    return min(LISTING_REUSE_MAX, LISTING_REUSE_FRACTION * poll_interval)
