"""State that belongs to one event loop: shared clients, pacers, semaphores, in-flight lookups.

Async clients, futures and semaphores are bound to the loop that made them, and a process may
run more than one loop over its life (the triggerer runs one; tests and the poke path run many).
:class:`PerLoop` keeps one value per running loop and forgets it when the loop is collected, so
no module has to write its own ``WeakKeyDictionary`` of loops.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerLoop(Generic[T]):
    """A lazily built value per running event loop: ``registry = PerLoop(dict)``; ``registry.get()``."""

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._values: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = weakref.WeakKeyDictionary()

    def get(self) -> T:
        """The value for the running loop, built on first use (must be called inside a loop)."""
        loop = asyncio.get_running_loop()
        value = self._values.get(loop)
        if value is None:
            value = self._values[loop] = self._factory()
        return value


__all__ = ["PerLoop"]
