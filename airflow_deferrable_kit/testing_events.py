"""Run event triggers in a test the way Airflow 3.3's triggerer runs ``AssetWatcher`` triggers.

:class:`WatcherHarness` drives triggers through Airflow's own ``SharedStreamManager`` (shared
streams in ack mode, as the triggerer does), gives each an in-memory asset state store, and
stores each event the way the triggerer's supervisor does: at once by default, or only when
the test says so (:meth:`WatcherHarness.store_events`), so a test can stop the "triggerer"
between an event being fired and being stored, then start again from the same state stores::

    async with WatcherHarness() as triggerer:
        watch = await triggerer.start(MyEventTrigger(...))
        ... make something happen ...
        await watch.wait_for_events(1)  # or wait_for_items(n): what the events carry
    # a restart: the same stores, a new trigger
    async with WatcherHarness(stores=triggerer.stores) as again:
        watch = await again.start(MyEventTrigger(...))
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
from collections.abc import Iterable
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from airflow_deferrable_kit._asset_state import MemoryStateStore


@dataclasses.dataclass
class Watch:
    """One running watcher: its trigger, the events it fired, its assets' state stores."""

    trigger_id: int
    trigger: BaseEventTrigger
    stores: dict[str, MemoryStateStore]
    events: list[TriggerEvent] = dataclasses.field(default_factory=list)
    task: asyncio.Task[None] | None = None

    @property
    def payloads(self) -> list[Any]:
        return [event.payload for event in self.events]

    @property
    def items(self) -> list[Any]:
        """What the events carry, one entry per item: an event of items (S3 objects, Postgres rows,
        Kafka messages: ``{"items": [...], "count": n}``) gives each of its items, any other its payload."""
        found: list[Any] = []
        for payload in self.payloads:
            if isinstance(payload, dict) and isinstance(payload.get("items"), list):
                found.extend(payload["items"])
            else:
                found.append(payload)
        return found

    async def wait_for_items(self, count: int, *, timeout: float = 30.0) -> list[Any]:
        """Wait until the events fired carry ``count`` items (see :attr:`items`); the items."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while len(self.items) < count:
            if self.task is not None and self.task.done():
                self.task.result()
                raise AssertionError(f"the trigger ended after {len(self.items)} of {count} items")
            if loop.time() > end:
                raise AssertionError(f"{len(self.items)} of {count} items within {timeout}s: {self.payloads}")
            await asyncio.sleep(0.01)
        return self.items

    async def wait_for_events(self, count: int, *, timeout: float = 30.0) -> list[Any]:
        """Wait until ``count`` events were fired (and fail if the trigger died); their payloads."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while len(self.events) < count:
            if self.task is not None and self.task.done():
                self.task.result()
                raise AssertionError(f"the trigger ended after {len(self.events)} of {count} events")
            if loop.time() > end:
                raise AssertionError(f"{len(self.events)} of {count} events within {timeout}s: {self.payloads}")
            await asyncio.sleep(0.01)
        return self.payloads


class _Stores:
    """One asset state store per asset name, kept across harnesses (a "restart" reuses them)."""

    def __init__(self) -> None:
        self.by_asset: dict[str, MemoryStateStore] = {}

    def get(self, asset: str) -> MemoryStateStore:
        return self.by_asset.setdefault(asset, MemoryStateStore())


class _Accessors:
    """What the triggerer injects as ``asset_state_store``: one accessor per watched asset."""

    def __init__(self, stores: dict[str, MemoryStateStore]) -> None:
        self._by_name = dict(stores)
        self._by_uri: dict[str, MemoryStateStore] = {}


class WatcherHarness:
    """A triggerer for tests: shared streams in ack mode, state stores per asset, event storage.

    :param stores: the state stores of an earlier harness (``harness.stores``), to restart.
    :param auto_store: store every event as soon as it is fired (the supervisor confirming it);
        ``False`` leaves them unstored until :meth:`store_events`.
    :param ack_timeout: Airflow's ``[triggerer] shared_stream_ack_timeout``.
    """

    def __init__(self, *, stores: _Stores | None = None, auto_store: bool = True, ack_timeout: float = 300.0) -> None:
        from airflow.triggers.shared_stream import SharedStreamManager

        self.stores = stores if stores is not None else _Stores()
        self.auto_store = auto_store
        self.manager = SharedStreamManager(ack_timeout=ack_timeout)
        self.watches: list[Watch] = []
        self._ids = itertools.count(1)
        self._unstored: list[int] = []

    async def __aenter__(self) -> WatcherHarness:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self, trigger: BaseEventTrigger, *, assets: Iterable[str] = ("asset",)) -> Watch:
        """Start ``trigger`` as the watcher of ``assets`` (names), as the triggerer would."""
        stores = {name: self.stores.get(name) for name in assets}
        trigger.asset_state_store = _Accessors(stores)  # type: ignore[assignment]
        watch = Watch(trigger_id=next(self._ids), trigger=trigger, stores=stores)
        watch.task = asyncio.get_running_loop().create_task(self._run(watch))
        self.watches.append(watch)
        await asyncio.sleep(0)
        return watch

    async def _run(self, watch: Watch) -> None:
        """``TriggerRunner.run_trigger`` for an event trigger, minus the logging and tracing."""
        trigger = watch.trigger
        key = trigger.shared_stream_key()
        try:
            if key is not None:
                stream = self.manager.subscribe(trigger_id=watch.trigger_id, trigger=trigger, key=key)
                events = trigger.filter_shared_stream(stream)
            else:
                events = trigger.run()
            async for event in events:
                watch.events.append(event)
                seq = self.manager.bind_pending_event(trigger_id=watch.trigger_id, key=key) if key else None
                if seq is not None:
                    if self.auto_store:
                        self.manager.confirm_persisted([seq])
                    else:
                        self._unstored.append(seq)
        finally:
            if key is not None:
                await self.manager.unsubscribe(watch.trigger_id, key)
            with contextlib.suppress(Exception):
                await trigger.cleanup()

    def store_events(self) -> int:
        """Store every event fired so far and not stored yet (what the supervisor does each loop)."""
        seqs, self._unstored = self._unstored, []
        self.manager.confirm_persisted(seqs)
        return len(seqs)

    async def stop(self) -> None:
        """Stop every watcher, as a triggerer shutting down (or killed) does: unstored events are lost."""
        for watch in self.watches:
            if watch.task is not None:
                watch.task.cancel()
        await asyncio.gather(*(w.task for w in self.watches if w.task is not None), return_exceptions=True)
        await self.manager.stop_all()
        self.watches = []


__all__ = ["Watch", "WatcherHarness"]
