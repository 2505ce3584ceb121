"""The one backoff formula: capped exponential with full jitter, and a floor against hot loops.

Every retry in the package (a trigger's transient error, a shared reader's failed fetch, a
listener's reconnect) sleeps ``full_jitter(...)`` seconds, so "no hot loop, no thundering herd"
is decided in one place (after the AWS architecture blog's "full jitter").
"""

from __future__ import annotations

import random

#: Shortest sleep before a retry, so an error storm can never become a hot loop.
MIN_RETRY_DELAY = 0.1


def full_jitter(failures: int, *, base: float, cap: float, retry_after: float | None = None) -> float:
    """Seconds to wait after ``failures`` consecutive failures: uniform in [0, min(cap, base * 2^n)].

    Never below ``min(MIN_RETRY_DELAY, base)``; a server's ``retry_after`` is honoured as a floor.
    """
    ceiling = min(float(cap), float(base) * 2.0 ** min(max(failures, 0), 30))
    delay = max(random.uniform(0.0, ceiling), min(MIN_RETRY_DELAY, float(base)))
    if retry_after is not None:
        delay = max(delay, float(retry_after))
    return delay


__all__ = ["MIN_RETRY_DELAY", "full_jitter"]
