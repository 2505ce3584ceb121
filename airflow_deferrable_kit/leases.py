"""Reference-counted clients shared by every trigger in one event loop.

The triggerer runs all triggers in one asyncio loop, so 10,000 waits on the same S3 connection
should hold one client, not 10,000. A trigger *leases* a client by key; the first lease builds it
(once, even when a thousand triggers ask at the same moment), the last release closes it.
Registries are per event loop because async clients are bound to the loop that made them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Hashable
from dataclasses import dataclass
from typing import Any

from airflow_deferrable_kit import _metrics
from airflow_deferrable_kit._per_loop import PerLoop

Factory = Callable[[], Coroutine[Any, Any, Any]]
Closer = Callable[[Any], Coroutine[Any, Any, None]]


@dataclass
class _Entry:
    creating: asyncio.Task[Any]
    close: Closer
    refs: int = 0


_registries: PerLoop[dict[Hashable, _Entry]] = PerLoop(dict)


def _registry() -> dict[Hashable, _Entry]:
    return _registries.get()


def _forget_failed(registry: dict[Hashable, _Entry], key: Hashable, entry: _Entry) -> None:
    def done(task: asyncio.Task[Any]) -> None:
        if (task.cancelled() or task.exception() is not None) and registry.get(key) is entry:
            del registry[key]
            _metrics.client_closed(key)

    entry.creating.add_done_callback(done)


def _close_when_built(entry: _Entry) -> None:
    """Close a client nobody holds any more, once (and if) its creation succeeds."""

    def done(task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is None:
            closing: asyncio.Task[None] = asyncio.get_running_loop().create_task(entry.close(task.result()))
            _background.add(closing)
            closing.add_done_callback(_background.discard)

    entry.creating.add_done_callback(done)


_background: set[asyncio.Task[None]] = set()


async def acquire(key: Hashable, factory: Factory, close: Closer) -> Any:
    """Return the shared client for ``key``, building it with ``factory`` if nobody holds one.

    Creation runs in its own task so that cancelling the trigger that happened to ask first
    does not fail every other trigger waiting for the same client.
    """
    registry = _registry()
    entry = registry.get(key)
    if entry is None:
        entry = _Entry(creating=asyncio.get_running_loop().create_task(factory()), close=close)
        registry[key] = entry
        _metrics.client_opened(key)
        _forget_failed(registry, key, entry)
    entry.refs += 1
    _metrics.leases_changed(key, 1)
    try:
        return await asyncio.shield(entry.creating)
    except BaseException:
        entry.refs -= 1
        _metrics.leases_changed(key, -1)
        if entry.refs == 0 and registry.get(key) is entry:
            del registry[key]
            _metrics.client_closed(key)
            _close_when_built(entry)
        raise


async def release(key: Hashable) -> None:
    """Drop one lease on ``key``; the last one closes the client."""
    registry = _registry()
    entry = registry.get(key)
    if entry is None:
        return
    entry.refs -= 1
    _metrics.leases_changed(key, -1)
    if entry.refs > 0:
        return
    del registry[key]
    _metrics.client_closed(key)
    task = entry.creating
    if task.done() and not task.cancelled() and task.exception() is None:
        await entry.close(task.result())
    else:
        _close_when_built(entry)


def held_keys() -> dict[Hashable, int]:
    """Keys with live leases in the running loop and their counts (for tests and diagnostics)."""
    return {key: entry.refs for key, entry in _registry().items()}


class Leases:
    """The leases one trigger holds, so its cleanup releases exactly those.

    Nearly every trigger holds one lease for its life (its connection's client), and 10,000 of
    them may wait in one triggerer: the first lease is kept as a pair and a dict is made only for
    a second one (~170 bytes less per waiting trigger than a dict each).
    """

    __slots__ = ("_first", "_more")

    def __init__(self) -> None:
        self._first: tuple[Hashable, Any] | None = None
        self._more: dict[Hashable, Any] | None = None

    async def get(self, key: Hashable, factory: Factory, close: Closer) -> Any:
        first = self._first
        if first is not None and first[0] == key:
            return first[1]
        if self._more is not None and key in self._more:
            return self._more[key]
        client = await acquire(key, factory, close)
        if self._first is None:
            self._first = (key, client)
        else:
            if self._more is None:
                self._more = {}
            self._more[key] = client
        return client

    async def release_all(self) -> None:
        keys = [self._first[0]] if self._first is not None else []
        keys += list(self._more or ())
        self._first, self._more = None, None
        for key in keys:
            await release(key)

    def __len__(self) -> int:
        return (self._first is not None) + len(self._more or ())
