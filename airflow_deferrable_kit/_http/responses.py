"""One HTTP request and its response: sent on the shared session, read capped, shared when identical.

* :func:`send` makes one request with a connection's :class:`~airflow_deferrable_kit._http.client.HttpOptions`
  and returns a :class:`Response`, read up to a byte cap and released back to the pool before
  anything is evaluated; redirects are followed by requests' rules, the connection's credentials
  kept to its own origin.
* :func:`send_shared` lets identical requests (:func:`request_identity`) sent within a short
  window share one response.
* :func:`parse_retry_after` and :func:`next_link` read the headers a wait acts on.

aiohttp's public API is all this module uses, imported lazily like :mod:`airflow_deferrable_kit._http.client`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import email.utils
import functools
import json
import re
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from airflow_deferrable_kit._http.client import (
    DEFAULT_PORTS,
    HttpOptions,
    is_transient_status,
    keeps_credentials,
    origin_only,
)
from airflow_deferrable_kit._per_loop import PerLoop
from airflow_deferrable_kit._redact import redact_url
from airflow_deferrable_kit._shared_polls import SharedAnswers
from airflow_deferrable_kit.errors import ErrorType, FatalError
from airflow_deferrable_kit.payload import truncate_text

if TYPE_CHECKING:
    import aiohttp
    from aiohttp import CookieJar
    from yarl import URL

#: A Retry-After above this is read as this, so a misbehaving server cannot park a wait for days.
MAX_RETRY_AFTER: Final = 3600.0
#: Bodies above this are parsed as JSON in a worker thread instead of on the event loop.
THREAD_PARSE_BYTES: Final = 256 * 1024
#: Redirects followed per request: requests' ``Session.max_redirects``, which the official
#: ``HttpSensor`` follows with.
MAX_REDIRECTS: Final = 30
REDIRECT_STATUSES: Final = frozenset({301, 302, 303, 307, 308})


#: What :meth:`Response.document` returns instead of a JSON value, and why.
NOT_JSON: Final = object()
TOO_LARGE: Final = object()


@dataclasses.dataclass
class Response:
    """One HTTP response, read (capped) and released back to the pool."""

    status: int
    reason: str
    headers: Mapping[str, str]
    body: bytes
    truncated: bool
    charset: str | None
    #: Where the answer came from, and how many redirects led there (0: the URL asked).
    url: URL | None = None
    redirects: int = 0

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @functools.cached_property
    def decoded(self) -> str:
        """The body as text (charset from the response, else UTF-8; undecodable bytes replaced)."""
        try:
            return self.body.decode(self.charset or "utf-8", errors="replace")
        except LookupError:
            return self.body.decode("utf-8", errors="replace")

    def excerpt(self, limit: int) -> str:
        text = truncate_text(self.decoded, limit)
        if self.truncated:
            text += " [body larger than max_body_bytes; not read to the end]"
        return text

    async def document(self) -> Any:
        """The body as JSON, or a sentinel saying why not (parsed off the loop when large)."""
        if self.truncated:
            return TOO_LARGE
        if not self.body.strip():
            return NOT_JSON
        try:
            if len(self.body) > THREAD_PARSE_BYTES:
                return await asyncio.to_thread(json.loads, self.body)
            return json.loads(self.body)
        except (ValueError, UnicodeDecodeError):
            return NOT_JSON


async def read_capped(resp: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """Read at most ``limit`` bytes of the body; say whether there was more."""
    buf = bytearray()
    while len(buf) <= limit:
        chunk = await resp.content.read(limit + 1 - len(buf))
        if not chunk:
            break
        buf += chunk
    truncated = len(buf) > limit
    return bytes(buf[:limit]), truncated


async def send(
    session: aiohttp.ClientSession,
    target: HttpOptions,
    method: str,
    url: URL,
    *,
    json_body: Any,
    timeout: float,
    max_body_bytes: int,
    data: str | bytes | None = None,
) -> Response:
    """One request with the connection's headers, TLS and proxy, following redirects as
    ``requests`` does for the official ``HttpSensor``.

    The body is ``json_body`` as JSON, or ``data`` as it is (text or bytes), or none.

    Up to :data:`MAX_REDIRECTS` hops, each with requests' rules (``Session.resolve_redirects``):
    the method of :func:`redirected_method` (302 and 303 make every method but HEAD a GET, 301
    makes a POST a GET), the body dropped on every redirect but 307 and 308, and the cookies
    the hops set sent on the hops after them (a jar of this request's own, never the session's:
    a login gateway that sets its session cookie on a redirect is passed, and no cookie outlives
    the request or reaches another wait). A redirect to a URL of another scheme (``ftp:``,
    ``file:``) is a fatal :func:`non_http_redirect`. A hop that leaves the origin (another host,
    port or scheme; http -> https on the same host keeps it) drops the connection's
    credentials: ``Authorization``, its cookies and every credential header of the connection,
    so they never reach a host the connection does not name (the jar's cookies follow their own
    domain rules). ``timeout`` covers the whole request, every hop and the wait for a pooled socket.
    """
    aiohttp = sys.modules["aiohttp"]  # imported off the loop by open_session, which made `session`
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    headers = dict(target.headers)
    body = json_body
    raw = data
    jar: CookieJar | None = None  # made at the first cookie a redirect sets
    for hop in range(MAX_REDIRECTS + 1):
        # No body: no Content-Type either (aiohttp would add application/octet-stream to a bare
        # POST, PUT or PATCH; requests adds none).
        options: dict[str, Any] = {"skip_auto_headers": ("Content-Type",)}
        if body is not None:
            options = {"json": body}
        elif raw is not None:
            options = {"data": raw}
        async with session.request(
            method,
            url,
            headers=headers if jar is None else with_cookies(headers, jar.filter_cookies(url)),
            ssl=target.ssl,
            proxy=target.proxy,
            timeout=aiohttp.ClientTimeout(total=max(deadline - loop.time(), 0.001)),
            allow_redirects=False,
            **options,
        ) as resp:
            location = resp.headers.get("Location")
            if resp.status not in REDIRECT_STATUSES or not location or hop == MAX_REDIRECTS:
                content, truncated = await read_capped(resp, max_body_bytes)
                return Response(
                    status=resp.status,
                    reason=resp.reason or "",
                    headers=resp.headers.copy(),
                    body=content,
                    truncated=truncated,
                    charset=resp.charset,
                    url=url,
                    redirects=hop,
                )
            status = resp.status
            if resp.cookies:
                if jar is None:
                    jar = aiohttp.CookieJar(unsafe=True)  # unsafe: IP hosts too, as requests takes them
                jar.update_cookies(resp.cookies, resp.url)
        following = url.join(type(url)(location))
        if following.scheme not in DEFAULT_PORTS:
            raise non_http_redirect(method, url, status, following)
        if not keeps_credentials(url, following):
            headers = {name: value for name, value in headers.items() if not origin_only(name)}
        method = redirected_method(status, method)
        if status not in (307, 308):
            body = raw = None
        url = following
    raise AssertionError("not reached: the last hop returns its response")  # pragma: no cover


def redirected_method(status: int, method: str) -> str:
    """The method of the hop after a ``status`` redirect: ``requests``' ``Session.rebuild_method``."""
    if status in (302, 303) and method != "HEAD":
        return "GET"  # 303 by the RFC; 302 as browsers (and requests) do
    if status == 301 and method == "POST":
        return "GET"
    return method


def with_cookies(headers: Mapping[str, str], cookies: Mapping[str, Any]) -> Mapping[str, str]:
    """``headers`` whose ``Cookie`` also carries ``cookies`` (a jar's, for this URL).

    The connection's own cookies stay, but one the jar holds too takes the jar's value: the
    server set it since.
    """
    if not cookies:
        return headers
    name = next((key for key in headers if key.lower() == "cookie"), "Cookie")
    kept = [
        pair.strip()
        for pair in headers.get(name, "").split(";")
        if pair.strip() and pair.partition("=")[0].strip() not in cookies
    ]
    pairs = [f"{morsel.key}={morsel.coded_value}" for morsel in cookies.values()]
    return {**headers, name: "; ".join(kept + pairs)}


def non_http_redirect(method: str, url: URL, status: int, location: URL) -> FatalError:
    """The error for a redirect to a URL HTTP cannot follow (``ftp:``, ``file:``, ``javascript:``).

    Fatal at once, as ``requests`` raises ``InvalidSchema`` at once: asking again gets the same
    answer, and a retry until the deadline would end as a timeout, which ``soft_fail`` skips.
    Both URLs are the server's to choose, so their secret-looking query values are masked.
    """
    where = redact_url(str(location.with_user(None)) if location.host else str(location))
    asked = redact_url(str(url.with_user(None)))
    return FatalError(
        f"{method} {asked} was redirected ({status}) to {where!r}, a URL of scheme {location.scheme!r}: "
        "only http and https redirects are followed",
        error_type=ErrorType.PROTOCOL,
        details={"status_code": status, "method": method, "location": where},
    )


#: Responses identical requests share, one registry per event loop (see :func:`send_shared`).
_shared_responses: PerLoop[SharedAnswers] = PerLoop(SharedAnswers)


def request_identity(
    session: aiohttp.ClientSession,
    target: HttpOptions,
    method: str,
    url: URL,
    *,
    json_body: Any,
    timeout: float,
    max_body_bytes: int,
) -> tuple[Any, ...]:
    """Everything that shapes a response: requests equal in all of it may share one.

    The URL (scheme, host, port, path, query), the method, every header sent (the connection's
    extras and its ``Authorization``, so waits with different credentials never share), the
    body as sent, TLS verification, the proxy, and how the response is read (the timeout and
    the byte cap). It lives in memory only, never in a payload or a log line.
    """
    body = None if json_body is None else json.dumps(json_body)  # the bytes aiohttp sends
    return (
        id(session),
        method,
        str(url),
        tuple(sorted(target.headers.items())),
        body,
        target.ssl,  # True, False or a context (cached per CA bundle, so equal settings share one)
        target.proxy,
        timeout,
        max_body_bytes,
    )


async def send_shared(
    session: aiohttp.ClientSession,
    target: HttpOptions,
    method: str,
    url: URL,
    *,
    json_body: Any,
    timeout: float,
    max_body_bytes: int,
    max_age: float,
    seen: int | None = None,
) -> Response:
    """:func:`send`, or the response of an identical request started at most ``max_age`` s ago.

    N waits polling one URL with the same connection cost about one request per window, not N
    (rules in :mod:`airflow_deferrable_kit._shared_polls`). The :class:`Response` is shared
    read-only: each wait evaluates its own conditions on it. A failed request (an exception, or
    a 408, 429 or 5xx response) is shared too, with one backoff: every wait that shared it, and
    every poll of the same request until its hold ends, gets that error or response to classify
    and back off from on its own, so a throttled or failing server is asked less often than a
    healthy one (:func:`~airflow_deferrable_kit._shared_polls.failure_hold`, ``Retry-After``
    honoured). Cancelling one wait does not cancel the request the others wait for. ``seen``, the ``id()`` of
    the response the caller got last, is never handed to it again (the caller keeps no reference).
    """
    what = request_identity(
        session, target, method, url, json_body=json_body, timeout=timeout, max_body_bytes=max_body_bytes
    )

    def fetch() -> Any:
        return send(session, target, method, url, json_body=json_body, timeout=timeout, max_body_bytes=max_body_bytes)

    shared = _shared_responses.get()
    response: Response = await shared.share(
        what, fetch, max_age=max_age, seen=seen, is_failure=_is_failure, retry_after=_retry_after_of
    )
    return response


def _is_failure(response: Response) -> bool:
    """A response worth retrying (408, 429, 5xx) is shared like a failed request: for one hold."""
    return is_transient_status(response.status)


def _retry_after_of(failure: Any) -> float | None:
    if isinstance(failure, Response):
        return parse_retry_after(failure.headers.get("Retry-After"), now=time.time())
    return None


def shared_responses() -> SharedAnswers:
    """The running loop's shared responses (for tests and diagnostics)."""
    return _shared_responses.get()


def parse_retry_after(value: str | None, *, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP-date), capped."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.timezone.utc)
        seconds = when.timestamp() - now
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def next_link(value: str | None) -> str | None:
    """The ``rel="next"`` target of a ``Link`` header (RFC 8288), or ``None``.

    ``<https://api/x?page=2>; rel="next", <...>; rel="last"``: the first link whose ``rel``
    names ``next`` among its space-separated relations.
    """
    if not value:
        return None
    for part in _LINK.finditer(value):
        params = part.group("params") or ""
        for match in _LINK_REL.finditer(params):
            if "next" in match.group("rel").strip('"').lower().split():
                return part.group("target").strip()
    return None


_LINK: Final = re.compile(r"<(?P<target>[^>]*)>(?P<params>(?:\s*;\s*[^;,<]+(?:=(?:\"[^\"]*\"|[^;,]*))?)*)")
_LINK_REL: Final = re.compile(r"rel\s*=\s*(?P<rel>\"[^\"]*\"|[^;,\s]+)", re.IGNORECASE)
