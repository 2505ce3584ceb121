"""Cancelling Postgres waits while the server hangs finishes at once and leaves nothing behind.

A server that stops answering mid-query (a frozen VM, a network partition) is simulated by a
TCP proxy in front of the real server that stops forwarding bytes on demand.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from airflow_deferrable_kit import leases
from airflow_deferrable_kit.testing import run_trigger
from airflow_deferrable_kit.triggers.postgres import PostgresBatchMarkerTrigger
from scripts import services

from .helpers import define_connection


class FreezingProxy:
    """Forwards TCP to the server until :meth:`freeze`; then holds every byte, both ways."""

    def __init__(self, port: int) -> None:
        self.upstream_port = port
        self.frozen = asyncio.Event()
        self.open = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    def freeze(self) -> None:
        self.frozen.set()

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        pumps = [
            asyncio.ensure_future(self._pump(reader, up_writer)),
            asyncio.ensure_future(self._pump(up_reader, writer)),
        ]
        self._tasks.update(pumps)
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            for w in (writer, up_writer):
                w.close()
            self.open -= 1

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        while data := await source.read(65536):
            if self.frozen.is_set():
                continue  # swallowed: a hung peer never answers, but a closed socket is still noticed
            sink.write(data)
            await sink.drain()


class _Via:
    """The server as a connection sees it: through the proxy's port."""

    def __init__(self, port: int) -> None:
        self.port = port


@pytest.fixture
async def proxy(postgres_server: services.Postgres) -> AsyncIterator[FreezingProxy]:
    frozen = FreezingProxy(postgres_server.port)
    frozen.port = await frozen.start()
    yield frozen
    await frozen.stop()


async def test_cancelling_200_waits_on_a_hung_server_finishes_within_a_second(
    monkeypatch: pytest.MonkeyPatch, proxy: FreezingProxy
) -> None:
    conn_id = define_connection(monkeypatch, _Via(proxy.port))  # type: ignore[arg-type]
    triggers = [
        PostgresBatchMarkerTrigger(
            postgres_conn_id=conn_id,
            sql="SELECT 1 WHERE $1::int < 0",
            parameters=[i],
            poll_interval=0.05,
            statement_timeout=30.0,
        )
        for i in range(200)
    ]
    tasks = [asyncio.ensure_future(run_trigger(t, timeout=120)) for t in triggers]
    for _ in range(400):  # every wait polled at least once through the proxy
        await asyncio.sleep(0.01)
        if proxy.open and all(t._bound is not None for t in triggers):
            break
    assert all(t._bound is not None for t in triggers)
    proxy.freeze()
    await asyncio.sleep(0.3)  # the next polls are now stuck in flight on the hung server
    started = time.monotonic()
    for task in tasks:
        task.cancel()
    done, pending = await asyncio.wait(tasks, timeout=5.0)
    took = time.monotonic() - started
    assert not pending, f"{len(pending)} waits still unfinished 5 s after cancel (statement_timeout is 30 s)"
    assert took < 2.0, f"cancel took {took:.1f}s"  # a hang detector, far from the 30 s it took before
    assert leases.held_keys() == {}
    for _ in range(100):  # every socket to the hung server dropped (terminated, not gracefully closed)
        if proxy.open == 0:
            break
        await asyncio.sleep(0.02)
    assert proxy.open == 0
    for task in done:
        with contextlib.suppress(asyncio.CancelledError):
            task.result()
