"""Importable predicates for the HTTP wait's tests (a predicate is named by a dotted path)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

#: Names of the threads sync predicates ran in (to prove they never run on the event loop's thread).
SYNC_THREADS: list[str] = []


def even_count_ready(response: dict[str, Any]) -> bool:
    """Sync: ready once the body's ``count`` is a positive even number."""
    SYNC_THREADS.append(threading.current_thread().name)
    count = (response["json"] or {}).get("count", 0)
    return count > 0 and count % 2 == 0


async def header_says(response: dict[str, Any]) -> str:
    """Async: the server's ``X-Batch`` header decides."""
    await asyncio.sleep(0)
    return {"done": "success", "broken": "failure"}.get(response["headers"].get("X-Batch", ""), "retry")


def explodes(response: dict[str, Any]) -> bool:
    raise RuntimeError("predicate bug")


#: Types of what ``ready_by_response`` was given, to prove it got a ``requests.Response``.
RESPONSE_TYPES: list[str] = []
#: Sizes of the bodies ``ready_by_response`` was given, to prove it got them whole.
BODY_SIZES: list[int] = []


def ready_by_response(response: Any) -> bool:
    """An official-style ``response_check``: judges a ``requests.Response``."""
    RESPONSE_TYPES.append(f"{type(response).__module__}.{type(response).__name__}")
    BODY_SIZES.append(len(response.content))
    return bool(response.json().get("state") == "ready" and response.status_code == 200)


async def official_release_check(response: Any) -> bool:
    """An official ``HttpEventTrigger`` ``response_check_path`` callable: async, given a ``requests.Response``."""
    return response.status_code == 200 and response.json().get("state") == "published"
