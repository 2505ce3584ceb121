"""A tiny HTTP proxy in front of the S3 API server that injects faults and counts what it sees.

Real servers cannot be told to throttle on demand, so the proxy answers the next N requests
itself (e.g. 503 SlowDown) and forwards everything else to moto untouched (the Host header is
kept, so SigV4 signatures still verify). It records every request and the client connections,
which is how the tests count polls, retries and sockets instead of timing anything.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from yarl import URL

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade", "content-length"}
)


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    status: int
    injected: bool
    query: str = ""
    raw_path: str = ""  # as sent: percent-encoding intact, query string included
    headers: dict[str, str] = field(default_factory=dict, compare=False)  # lower-case names
    at: float = field(default_factory=time.monotonic, compare=False)  # when the proxy received it


@dataclass
class Rule:
    """A standing fault: every request ``match`` accepts is answered with this S3 error."""

    match: Callable[[web.Request], bool]
    status: int
    code: str
    message: str
    headers: dict[str, str]


def is_listing(request: web.Request) -> bool:
    """Whether a request is a ``ListObjectsV2``."""
    return request.method == "GET" and request.query.get("list-type") == "2"


class FaultProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.seen: list[Seen] = []
        self.peers: set[tuple[str, int]] = set()
        self._faults: list[tuple[int, str, str, dict[str, str]]] = []
        self._listing_faults: list[tuple[int, str, str, dict[str, str]]] = []
        self._rules: list[Rule] = []
        self._gate: asyncio.Event | None = None
        self._held_by: list[tuple[Callable[[web.Request], bool], asyncio.Event]] = []
        self.held = 0
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def open_connections(self) -> int:
        """Client connections the proxy currently holds open (keep-alive included)."""
        assert self._runner is not None and self._runner.server is not None
        return len(self._runner.server.connections)

    def fail_next(
        self,
        count: int,
        status: int = 503,
        code: str = "SlowDown",
        message: str = "Reduce your request rate.",
        retry_after: float | None = None,
        *,
        listings_only: bool = False,
    ) -> None:
        """Answer the next ``count`` requests (or only ``ListObjectsV2`` ones) with an S3 error."""
        headers = {} if retry_after is None else {"Retry-After": str(retry_after)}
        (self._listing_faults if listings_only else self._faults).extend([(status, code, message, headers)] * count)

    def refuse(
        self,
        match: Callable[[web.Request], bool],
        status: int = 403,
        code: str = "AccessDenied",
        message: str = "Access Denied",
        retry_after: float | None = None,
    ) -> Callable[[], None]:
        """Answer every request ``match`` accepts with an S3 error until the returned function is called."""
        rule = Rule(match, status, code, message, {} if retry_after is None else {"Retry-After": str(retry_after)})
        self._rules.append(rule)
        return lambda: self._rules.remove(rule)

    def hold_requests(self) -> asyncio.Event:
        """Keep every request from now on waiting (counted in ``held``) until the event is set."""
        self._gate = asyncio.Event()
        return self._gate

    def hold_matching(self, match: Callable[[web.Request], bool]) -> asyncio.Event:
        """Keep only the requests ``match`` accepts waiting (counted in ``held``) until the event is set.

        A request that hangs on the server while every other request is answered: what a
        stalled object, a slow storage node or a black-holed path does to one wait among many.
        """
        gate = asyncio.Event()
        self._held_by.append((match, gate))
        return gate

    def count(self, method: str | None = None, *, injected: bool | None = None) -> int:
        return sum(
            1
            for s in self.seen
            if (method is None or s.method == method) and (injected is None or s.injected == injected)
        )

    def listings(self) -> list[Seen]:
        """The ``ListObjectsV2`` requests seen so far."""
        return [s for s in self.seen if s.method == "GET" and "list-type=2" in s.query]

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None and server.sockets
        self.port = int(server.sockets[0].getsockname()[1])
        self._session = aiohttp.ClientSession(auto_decompress=False)

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if peer:
            self.peers.add((peer[0], peer[1]))
        body = await request.read()
        if self._gate is not None and not self._gate.is_set():
            self.held += 1
            await self._gate.wait()
        for match, gate in self._held_by:
            if not gate.is_set() and match(request):
                self.held += 1
                await gate.wait()
        arrived = time.monotonic()
        listing = is_listing(request)
        faults = self._listing_faults if listing and self._listing_faults else self._faults
        rule = next((rule for rule in self._rules if rule.match(request)), None)
        if rule is not None or faults:
            if rule is not None:
                status, code, message, headers = rule.status, rule.code, rule.message, rule.headers
            else:
                status, code, message, headers = faults.pop(0)
            self.seen.append(
                Seen(
                    request.method,
                    request.path,
                    status,
                    True,
                    request.query_string,
                    request.raw_path,
                    _headers(request),
                    arrived,
                )
            )
            xml = (
                '<?xml version="1.0" encoding="UTF-8"?>\n'
                f"<Error><Code>{code}</Code><Message>{message}</Message><RequestId>fault</RequestId></Error>"
            )
            return web.Response(
                status=status,
                text=None if request.method == "HEAD" else xml,
                content_type="application/xml",
                headers=headers,
            )
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        async with self._session.request(
            request.method,
            URL(self.upstream + request.raw_path, encoded=True),
            headers=headers,
            data=body or None,
            allow_redirects=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        ) as upstream:
            payload = await upstream.read()
            out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
            length = upstream.headers.get("Content-Length")
        self.seen.append(
            Seen(
                request.method,
                request.path,
                upstream.status,
                False,
                request.query_string,
                request.raw_path,
                _headers(request),
                arrived,
            )
        )
        response = web.Response(
            status=upstream.status, headers=out_headers, body=None if request.method == "HEAD" else payload
        )
        if request.method == "HEAD" and length is not None:
            response.headers["Content-Length"] = length
        return response


def _headers(request: web.Request) -> dict[str, str]:
    return {name.lower(): value for name, value in request.headers.items()}


async def settle(predicate: Callable[[], bool], *, attempts: int = 500) -> None:
    """Yield to the loop until ``predicate()`` holds (a generous bound, not a timing assertion)."""
    for _ in range(attempts):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition did not hold")
