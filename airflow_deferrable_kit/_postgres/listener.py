"""The shared LISTEN engine of the Postgres wait: one connection per (connection id, channel).

Every waiter with a ``notify_channel`` subscribes to the :class:`ChannelListener` of its
(connection id, channel), leased through the trigger's shared clients, so a thousand waiters on
one channel hold one ``LISTEN`` connection, not a thousand. It is best effort: it reconnects
with backoff on its own, and polling carries the wait whenever it is down.

asyncpg is imported inside functions only, so this module imports without the ``postgres`` extra.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from airflow_deferrable_kit._backoff import full_jitter
from airflow_deferrable_kit._postgres.client import connect, load_options
from airflow_deferrable_kit._redact import redact
from airflow_deferrable_kit.errors import describe_exception

if TYPE_CHECKING:
    import asyncpg

log = logging.getLogger(__name__)

#: Reconnect backoff of a LISTEN connection: full jitter, capped.
LISTEN_RETRY_BASE = 0.5
LISTEN_RETRY_CAP = 30.0


class ChannelListener:
    """One ``LISTEN`` connection shared by every waiter on a (connection id, channel).

    Waiters subscribe an :class:`asyncio.Event`; a notification sets them all. Every successful
    (re)connection also wakes everybody, because a notification sent while nobody was listening
    is lost and the waiters should look once instead of sleeping a full poll interval.
    """

    def __init__(self, conn_id: str, channel: str) -> None:
        self.conn_id = conn_id
        self.channel = channel
        self.notifications = 0
        self.connects = 0
        self._waiters: set[asyncio.Event] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"listen:{self.channel}")

    def subscribe(self, event: asyncio.Event) -> None:
        self._waiters.add(event)

    def unsubscribe(self, event: asyncio.Event) -> None:
        self._waiters.discard(event)

    def wake_all(self) -> None:
        for event in self._waiters:
            event.set()

    def _on_notify(self, connection: Any, pid: int, channel: str, payload: str) -> None:
        self.notifications += 1
        self.wake_all()

    async def _run(self) -> None:

        failures = 0
        while True:
            conn: asyncpg.Connection | None = None
            lost = asyncio.Event()
            try:
                options = await load_options(self.conn_id)
                conn = await connect(self.conn_id, options)
                conn.add_termination_listener(lambda _conn, lost=lost: lost.set())
                await conn.add_listener(self.channel, self._on_notify)
                failures = 0
                self.connects += 1
                log.info("Listening on Postgres channel %r (%s)", self.channel, self.conn_id)
                self.wake_all()
                await lost.wait()
                log.warning("Lost the LISTEN connection for channel %r; polling continues meanwhile", self.channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                log.warning(
                    "Cannot LISTEN on channel %r (%s): %s; polling continues meanwhile",
                    self.channel,
                    self.conn_id,
                    redact(describe_exception(exc)),
                )
            finally:
                if conn is not None:
                    conn.terminate()
            await asyncio.sleep(full_jitter(failures, base=LISTEN_RETRY_BASE, cap=LISTEN_RETRY_CAP))

    async def close(self) -> None:
        self._waiters.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


async def start_listener(conn_id: str, channel: str) -> ChannelListener:
    """Start listening in the background; never waits for the server (polling covers the gap)."""
    listener = ChannelListener(conn_id, channel)
    listener.start()
    return listener


async def close_listener(listener: ChannelListener) -> None:
    await listener.close()
