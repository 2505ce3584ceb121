"""Response checks for the official ``HttpEventTrigger`` in the HTTP event-watcher benchmark.

The official trigger takes its condition as the dotted path of an async function of the
response (no arguments can be passed), and re-imports its module (``importlib.reload``) at every
poll: this module is kept tiny so the reload costs what a user's own small module would.
``ready`` checks ``{"state": "ready"}``; ``item_00042`` checks item ``i00042`` of an
``{"items": {...}}`` document (one function per watched item, made on first use).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any


async def ready(response: Any) -> bool:
    return bool(response.json().get("state") == "ready")


def __getattr__(name: str) -> Callable[[Any], Awaitable[bool]]:
    if not name.startswith("item_"):
        raise AttributeError(name)
    key = f"i{name.removeprefix('item_')}"

    async def item_ready(response: Any) -> bool:
        return bool(response.json()["items"].get(key) == "ready")

    return item_ready
