"""Real aiohttp servers on 127.0.0.1 for the HTTP wait, each in its own thread and event loop.

A server runs outside the test's loop so it neither hides nor causes loop blocking in the
trigger under test, and so sync tests (the sensor's poke path uses ``asyncio.run``) can use it
too. Each server records every request it receives (arrival time on the monotonic clock,
method, path, query, headers, body, client port) so tests count requests and connections
instead of timing anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ipaddress
import itertools
import json
import ssl
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from scripts.services import free_port


@dataclass
class Seen:
    """One request as the server received it."""

    index: int
    at: float
    method: str
    path: str
    target: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    client_port: int


Handler = Callable[[Seen], "web.StreamResponse | Awaitable[web.StreamResponse]"]


def reply(status: int = 200, body: Any = None, *, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON response (``body`` a JSON value), or a raw one when ``body`` is bytes or str."""
    if isinstance(body, (bytes, str)):
        return web.Response(status=status, body=body if isinstance(body, bytes) else body.encode(), headers=headers)
    if body is None:
        return web.Response(status=status, headers=headers)
    return web.Response(status=status, text=json.dumps(body), content_type="application/json", headers=headers)


def script(*steps: Callable[[], web.StreamResponse]) -> Handler:
    """A handler playing the given responses in order, repeating the last one."""

    def handle(seen: Seen) -> web.StreamResponse:
        return steps[min(seen.index, len(steps) - 1)]()

    return handle


@dataclass
class Server:
    handler: Handler
    port: int = 0
    ssl_context: ssl.SSLContext | None = None
    requests: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._lock = threading.Lock()

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_context else "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def client_ports(self) -> set[int]:
        """Distinct client ports seen: one per TCP connection the client opened."""
        return {seen.client_port for seen in self.requests}

    def gaps(self) -> list[float]:
        times = [seen.at for seen in self.requests]
        return [b - a for a, b in itertools.pairwise(times)]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        peer = request.transport.get_extra_info("peername") if request.transport else None
        with self._lock:
            seen = Seen(
                index=len(self.requests),
                at=time.monotonic(),
                method=request.method,
                path=request.path,
                target=request.raw_path,
                query={key: request.query.getall(key) for key in request.query},
                headers=dict(request.headers),
                body=body,
                client_port=int(peer[1]) if peer else -1,
            )
            self.requests.append(seen)
        result = self.handler(seen)
        if isinstance(result, Awaitable):
            result = await result
        return result

    async def _start(self) -> None:
        app = web.Application(client_max_size=1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=self.ssl_context)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def start(self) -> Server:
        ready = threading.Event()
        loop = asyncio.new_event_loop()
        self._loop = loop

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self._start())
            ready.set()
            loop.run_forever()

        self._thread = threading.Thread(target=serve, name=f"http-test-server-{self.port}", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("test HTTP server did not start")
        return self

    def stop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        loop.close()


@pytest.fixture
def serve() -> Iterator[Callable[..., Server]]:
    """Start servers: ``serve(handler, port=0, ssl_context=None)``; all are stopped afterwards."""
    started: list[Server] = []

    def start(handler: Handler, *, port: int = 0, ssl_context: ssl.SSLContext | None = None) -> Server:
        server = Server(handler, port=port, ssl_context=ssl_context).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def connection(monkeypatch: pytest.MonkeyPatch) -> Callable[..., str]:
    """Define an Airflow connection from the environment: ``connection(conn_id, host=..., ...)``."""

    def define(conn_id: str, **fields: Any) -> str:
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "http", **fields}))
        return conn_id

    return define


@pytest.fixture
def unused_port() -> int:
    return free_port()


# ------------------------------------------------------------------ blocking-call audit
#: Audit events that mean a synchronous disk, DNS, sleep, process or import call.
BLOCKING_EVENTS = frozenset(
    {
        "open",
        "os.listdir",
        "os.scandir",
        "glob.glob",
        "socket.getaddrinfo",
        "socket.gethostbyname",
        "time.sleep",
        "subprocess.Popen",
        "os.system",
        "import",
    }
)
_audit: dict[str, Any] = {"thread": None, "events": None}
_DEBUG_MACHINERY = tuple(
    str(Path(module.__file__).resolve()) for module in (__import__("linecache"), __import__("traceback"))
)


def _audit_hook(event: str, args: tuple[Any, ...]) -> None:
    if _audit["events"] is None or event not in BLOCKING_EVENTS or threading.get_ident() != _audit["thread"]:
        return
    frame = sys._getframe(1)
    stack: list[str] = []
    while frame is not None:
        stack.append(f"{frame.f_code.co_filename}:{frame.f_lineno}")
        frame = frame.f_back
    if any(where.startswith(_DEBUG_MACHINERY) for where in stack):
        return  # asyncio debug mode (watch_blocking) reads source lines for its own reports
    if any("airflow_deferrable_kit" in where for where in stack):
        _audit["events"].append((event, repr(args)[:200], [w for w in stack if "airflow_deferrable_kit" in w][:6]))


@pytest.fixture
def blocking_calls() -> Iterator[Callable[[], Any]]:
    """Record synchronous blocking calls made on this thread (the loop's) from package code.

    Deterministic where a slow-callback threshold is not: it sees a 1 ms ``open()`` on the loop
    as surely as a 1 s one. Use as ``with blocking_calls() as calls: ...; assert calls == []``.
    """
    if not _audit.get("installed"):
        sys.addaudithook(_audit_hook)  # audit hooks cannot be removed: it stays idle when unused
        _audit["installed"] = True

    @contextlib.contextmanager
    def record() -> Iterator[list[Any]]:
        events: list[Any] = []
        _audit.update(thread=threading.get_ident(), events=events)
        try:
            yield events
        finally:
            _audit.update(thread=None, events=None)

    yield record


@dataclass
class Tls:
    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        return context


@pytest.fixture(scope="session")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    """A self-signed certificate for 127.0.0.1 (also usable as its own CA bundle)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder = tmp_path_factory.mktemp("tls")
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return Tls(cert=cert_path, key=key_path)
