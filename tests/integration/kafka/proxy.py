"""A TCP proxy in front of a broker that can play an outage and counts connection attempts.

It runs in a thread of its own, with its own event loop, so the process under test sees a real
network peer. Up, it forwards every connection to the broker. Down, it drops every live
connection and then accepts and at once closes each new one (a broker whose port answers but
whose Kafka does not), counting them: every accept while down is one connection attempt by a
client. Bounded: it only ever talks to 127.0.0.1 and stops with :meth:`close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

from scripts import services


class OutageProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = services.free_port()
        self.accepts: list[float] = []  # monotonic times of connections accepted while down
        self.down = False
        self._loop = asyncio.new_event_loop()
        self._live: set[asyncio.StreamWriter] = set()
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="outage-proxy")

    def start(self) -> OutageProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(10)
        return self

    async def _serve(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            self.accepts.append(time.monotonic())
            writer.close()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._live.update((writer, upstream_writer))
        await asyncio.gather(self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._live.discard(writer)
            writer.close()

    def go_down(self) -> None:
        """From now on the broker is unreachable: live connections drop, new ones are closed."""

        def cut() -> None:
            self.down = True
            for writer in list(self._live):
                writer.transport.abort()
            self._live.clear()

        self._loop.call_soon_threadsafe(cut)

    def come_back(self) -> None:
        self._loop.call_soon_threadsafe(setattr, self, "down", False)

    def attempts_between(self, start: float, end: float) -> int:
        return sum(start <= t < end for t in self.accepts)

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for writer in list(self._live):
                writer.transport.abort()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
