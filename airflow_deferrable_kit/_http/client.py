"""The aiohttp side of the HTTP wait: connection -> request settings, one shared session, responses, errors.

* :func:`load_options` reads an Airflow ``http`` connection inside the triggerer and turns it
  into a :class:`Target`: base URL, headers (extras and ``Authorization``), proxy and TLS. The
  trigger kwargs carry only the connection id, never a credential.
* :func:`open_session` builds the one pooled keep-alive ``ClientSession`` every HTTP trigger of a
  process leases under :data:`SESSION_KEY` (see :mod:`airflow_deferrable_kit.clients`); a
  connection's credentials are applied per request, so waits on unrelated connections share it.
* :func:`send` makes one request and returns a :class:`Response`, read up to a byte cap and
  released back to the pool before anything is evaluated; :func:`send_shared` lets identical
  requests (:func:`request_identity`) sent within a short window share one response.
* :func:`classify_aiohttp_error` is the one place aiohttp's exceptions become our transient or
  fatal errors; :func:`is_transient_status` says which HTTP statuses are worth retrying.

aiohttp's public API is all this module uses (no private attribute is touched). ``aiohttp`` (and
``yarl``, which ships with it) is imported lazily, and the first time off the event loop, so this
module imports without the ``http`` extra.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime as dt
import email.utils
import functools
import importlib
import json
import re
import ssl
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from airflow_deferrable_kit._per_loop import PerLoop
from airflow_deferrable_kit._redact import is_sensitive_key, redact_url
from airflow_deferrable_kit._redact import register as register_secret
from airflow_deferrable_kit._shared_polls import SharedAnswers
from airflow_deferrable_kit._tls import TlsFiles, build_ssl_context
from airflow_deferrable_kit.connections import get_connection, get_extra
from airflow_deferrable_kit.errors import ErrorType, FatalError, TransientError, WaitError
from airflow_deferrable_kit.payload import truncate_text

if TYPE_CHECKING:
    import aiohttp
    from aiohttp import CookieJar
    from airflow.sdk import Connection
    from yarl import URL

#: The one session every HTTP trigger in a triggerer process shares (leased, reference counted).
SESSION_KEY: Final = ("aiohttp-session",)
#: Sockets the shared session may open in total and towards one host: N waits never mean N sockets.
SESSION_LIMIT: Final = 100
SESSION_LIMIT_PER_HOST: Final = 20
#: Seconds an idle keep-alive connection stays in the pool.
KEEPALIVE_TIMEOUT: Final = 30.0
USER_AGENT: Final = "airflow-deferrable-kit"

#: Connection extra keys that configure the request; every other key is sent as a header.
OPTION_KEYS: Final = frozenset({"bearer_token", "auth_type", "verify", "verify_ssl", "headers", "proxy", "proxies"})
#: Keys the official HttpHook reads as requests options: ignored here rather than sent as headers.
IGNORED_KEYS: Final = frozenset(
    {"timeout", "allow_redirects", "stream", "cert", "max_redirects", "trust_env", "auth_kwargs"}
)
AUTH_TYPES: Final = {
    "": "auto",
    "auto": "auto",
    "basic": "basic",
    "bearer": "bearer",
    "none": "none",
    "requests.auth.HTTPBasicAuth": "basic",
    "aiohttp.BasicAuth": "basic",
}

#: Statuses that are worth retrying (besides every 5xx) when no acceptor decided.
TRANSIENT_STATUSES: Final = frozenset({408, 429})
#: A Retry-After above this is read as this, so a misbehaving server cannot park a wait for days.
MAX_RETRY_AFTER: Final = 3600.0
#: Bodies above this are parsed as JSON in a worker thread instead of on the event loop.
THREAD_PARSE_BYTES: Final = 256 * 1024
#: Redirects followed per request: requests' ``Session.max_redirects``, which the official
#: ``HttpSensor`` follows with.
MAX_REDIRECTS: Final = 30
REDIRECT_STATUSES: Final = frozenset({301, 302, 303, 307, 308})
#: Headers dropped, besides every connection header that carries a credential, when a redirect
#: leaves the origin (requests drops ``Authorization`` and ``Cookie``; the kit drops the
#: connection's key headers too, such as ``X-Api-Key``).
ORIGIN_ONLY_HEADERS: Final = frozenset({"authorization", "cookie", "proxy-authorization"})
DEFAULT_PORTS: Final = {"http": 80, "https": 443}


# ------------------------------------------------------------------------- shared session
async def _import_aiohttp() -> Any:
    """Import aiohttp in a worker thread: its import reads CA files and must not stall the loop."""
    module = sys.modules.get("aiohttp")
    if module is None:
        module = await asyncio.to_thread(importlib.import_module, "aiohttp")
    return module


async def open_session() -> aiohttp.ClientSession:
    """The process-wide session: pooled keep-alive connections, no cookies, no environment.

    No cookie jar because the session is shared by triggers of unrelated connections; no
    ``trust_env`` because that reads ``~/.netrc`` from disk on requests.
    """
    aiohttp = await _import_aiohttp()
    connector = aiohttp.TCPConnector(
        limit=SESSION_LIMIT,
        limit_per_host=SESSION_LIMIT_PER_HOST,
        keepalive_timeout=KEEPALIVE_TIMEOUT,
        ttl_dns_cache=300,
    )
    return aiohttp.ClientSession(
        connector=connector,
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
        raise_for_status=False,
        headers={"User-Agent": USER_AGENT},
    )


async def close_session(session: aiohttp.ClientSession) -> None:
    await session.close()


# ------------------------------------------------------------------------- the target
async def _ssl_for(verify: Any) -> bool | ssl.SSLContext:
    """``verify`` from the connection extra: true/false, or a CA bundle path (loaded off the loop)."""
    if verify is None or verify is True:
        return True
    if verify is False:
        return False
    if isinstance(verify, str):
        lowered = verify.strip().lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        return await build_ssl_context(TlsFiles(cafile=verify), where=f"connection extra 'verify' ({verify!r})")
    raise FatalError(
        f"connection extra 'verify' must be true, false or a CA bundle path, got {verify!r}",
        error_type=ErrorType.BAD_CONNECTION,
    )


def _header_value(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise FatalError(
        f"connection extra {name!r} is sent as a header and must be a string or number, got {type(value).__name__}",
        error_type=ErrorType.BAD_CONNECTION,
    )


def connection_headers(extra: Mapping[str, Any], *, login: str | None, password: str | None) -> dict[str, str]:
    """Headers a connection asks for: its extra headers and its ``Authorization``.

    Rule: every extra key other than the option keys is a header, and an extra ``headers``
    object contributes its entries too. Credentials from the connection (a bearer token, or
    login/password as basic auth) replace any ``Authorization`` given in the extras.
    """
    headers: dict[str, str] = {}
    nested = extra.get("headers")
    if nested is not None:
        if not isinstance(nested, Mapping):
            raise FatalError(
                f"connection extra 'headers' must be an object of header names to values, got {nested!r}",
                error_type=ErrorType.BAD_CONNECTION,
            )
        for name, value in nested.items():
            headers[str(name)] = _header_value(f"headers.{name}", value)
    for name, value in extra.items():
        if name in OPTION_KEYS or name in IGNORED_KEYS:
            continue
        headers[name] = _header_value(name, value)

    raw_type = extra.get("auth_type") or ""
    auth_type = AUTH_TYPES.get(str(raw_type))
    if auth_type is None:
        raise FatalError(
            f"connection extra 'auth_type' {raw_type!r} is not supported; use basic, bearer or none",
            error_type=ErrorType.BAD_CONNECTION,
        )
    token = extra.get("bearer_token")
    if token is not None and (not isinstance(token, str) or not token):
        raise FatalError(
            "connection extra 'bearer_token' must be a non-empty string", error_type=ErrorType.BAD_CONNECTION
        )
    authorization: str | None = None
    if auth_type == "bearer" or (auth_type == "auto" and token):
        token = token or password
        if not token:
            raise FatalError(
                "auth_type 'bearer' needs a token: set extra 'bearer_token' or the connection password",
                error_type=ErrorType.BAD_CONNECTION,
            )
        authorization = f"Bearer {token}"
    elif auth_type in ("basic", "auto") and (login or (auth_type == "basic" and password)):
        pair = f"{login or ''}:{password or ''}".encode()
        authorization = "Basic " + base64.b64encode(pair).decode("ascii")
    if authorization is not None:
        for name in [n for n in headers if n.lower() == "authorization"]:
            del headers[name]
        headers["Authorization"] = authorization
    # A credential header's value must never come back in an echo: masked from now on. Ordinary
    # headers (Accept, X-Team) are not secrets and are left alone, or every payload would suffer.
    for name, value in headers.items():
        if is_sensitive_key(name):
            register_secret(value)
            register_secret(value.partition(" ")[2])  # "Bearer <token>", "Basic <base64>"
    register_secret(token)
    return headers


def base_url(conn: Connection) -> URL:
    """The connection's base URL, without credentials.

    ``host`` may carry the scheme (``https://api.example.com/v1``); otherwise ``schema`` is the
    scheme (default ``http``). ``port`` is added when the host has none.
    """
    from yarl import URL

    host = (conn.host or "").strip()
    if not host:
        raise FatalError("the HTTP connection has no host", error_type=ErrorType.BAD_CONNECTION)
    if "://" not in host:
        scheme = (conn.schema or "http").strip() or "http"
        host = f"{scheme}://{host}"
    try:
        url = URL(host)
    except ValueError as exc:
        raise FatalError(
            f"the HTTP connection host is not a valid URL: {exc}", error_type=ErrorType.BAD_CONNECTION
        ) from exc
    if url.scheme not in ("http", "https") or not url.host:
        raise FatalError(
            f"the HTTP connection must give an http(s) host, got scheme {url.scheme!r}",
            error_type=ErrorType.BAD_CONNECTION,
        )
    if conn.port and url.explicit_port is None:
        url = url.with_port(int(conn.port))
    return url.with_user(None)


def proxy_for(extra: Mapping[str, Any], scheme: str) -> str | None:
    """The proxy URL from extra ``proxy`` (one URL) or ``proxies`` (``{"http": ..., "https": ...}``)."""
    proxy = extra.get("proxy")
    proxies = extra.get("proxies")
    if proxy is None and proxies:
        if not isinstance(proxies, Mapping):
            raise FatalError(
                "connection extra 'proxies' must be an object such as {'https': 'http://proxy:3128'}",
                error_type=ErrorType.BAD_CONNECTION,
            )
        proxy = proxies.get(scheme)
    if proxy in (None, ""):
        return None
    if not isinstance(proxy, str) or not proxy.startswith(("http://", "https://")):
        raise FatalError(
            "the connection's proxy must be an http:// or https:// URL", error_type=ErrorType.BAD_CONNECTION
        )
    return proxy


def _query_items(query: Mapping[str, Any]) -> list[tuple[str, str | int | float]]:
    items: list[tuple[str, str | int | float]] = []
    for name, value in query.items():
        for item in value if isinstance(value, list) else [value]:
            if item is None:
                continue
            if isinstance(item, bool):
                items.append((name, "true" if item else "false"))
            else:
                items.append((name, item))
    return items


@dataclasses.dataclass(frozen=True)
class Target:
    """Everything a request needs from the connection, resolved once per trigger in the triggerer."""

    base: URL
    headers: Mapping[str, str]
    ssl: bool | ssl.SSLContext
    proxy: str | None = None

    def url(self, endpoint: str, query: Mapping[str, Any] | None) -> URL:
        from yarl import URL

        base = str(self.base)
        if endpoint:
            base = base.rstrip("/") + "/" + endpoint.lstrip("/")
        url = URL(base)
        if query:
            url = url.extend_query(_query_items(query))
        return url

    def at(self, link: str, query: Mapping[str, Any] | None = None) -> tuple[Target, URL]:
        """The target and URL for ``link``: a path under the base URL, or an absolute URL a
        server handed out (a job's ``Location``, a result's next page).

        An absolute URL at another origin than the connection's is asked without the
        connection's credentials (``Authorization``, cookies, key headers), by the rule redirects
        follow (:func:`keeps_credentials`), so a server cannot send them elsewhere by naming a URL.
        """
        from yarl import URL

        if "://" not in link:
            return self, self.url(link, query)
        url = URL(link)
        if url.scheme not in DEFAULT_PORTS or not url.host:
            raise FatalError(
                f"the server named {redact_url(link)!r} as a URL to ask, which is not an http(s) URL",
                error_type=ErrorType.PROTOCOL,
            )
        url = url.with_user(None)
        if query:
            url = url.extend_query(_query_items(query))
        if keeps_credentials(self.base, url):
            return self, url
        headers = {name: value for name, value in self.headers.items() if not _origin_only(name)}
        return dataclasses.replace(self, headers=headers), url

    def with_headers(self, headers: Mapping[str, str]) -> Target:
        """This target sending ``headers`` too (a request's own, such as an idempotency key)."""
        return dataclasses.replace(self, headers={**self.headers, **headers})


async def load_options(conn_id: str) -> Target:
    """Read the connection asynchronously and turn it into a :class:`Target`."""
    from yarl import URL

    conn = await get_connection(conn_id, argument="http_conn_id", conn_types=("http", "https"))
    extra = await get_extra(conn)
    base = base_url(conn)
    login, password = conn.login, conn.password
    if not login and conn.host and "://" in conn.host:
        # Credentials written into the host (https://user:pass@host) act as basic auth.
        in_host = URL(conn.host.strip())
        if in_host.user:
            login, password = in_host.user, in_host.password if in_host.password is not None else password
    headers = connection_headers(extra, login=login, password=password)
    verify = extra.get("verify", extra.get("verify_ssl"))
    return Target(base=base, headers=headers, ssl=await _ssl_for(verify), proxy=proxy_for(extra, base.scheme))


# ------------------------------------------------------------------- requests and responses
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
    target: Target,
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
            headers = {name: value for name, value in headers.items() if not _origin_only(name)}
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


def keeps_credentials(old: URL, new: URL) -> bool:
    """Whether a redirect from ``old`` to ``new`` stays at the origin the connection names
    (``requests``' ``should_strip_auth``, inverted)."""
    if old.host != new.host:
        return False
    old_port = old.explicit_port or DEFAULT_PORTS.get(old.scheme)
    new_port = new.explicit_port or DEFAULT_PORTS.get(new.scheme)
    if old.scheme == "http" and new.scheme == "https" and old_port == 80 and new_port == 443:
        return True  # the upgrade to TLS on the standard ports
    return old.scheme == new.scheme and old_port == new_port


def _origin_only(name: str) -> bool:
    return name.lower() in ORIGIN_ONLY_HEADERS or is_sensitive_key(name)


#: Responses identical requests share, one registry per event loop (see :func:`send_shared`).
_shared_responses: PerLoop[SharedAnswers] = PerLoop(SharedAnswers)


def request_identity(
    session: aiohttp.ClientSession,
    target: Target,
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
    target: Target,
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


# ---------------------------------------------------------------------------------- errors
def is_transient_status(status: int) -> bool:
    """Whether an error status is worth retrying: 408, 429 and every 5xx; any other is fatal."""
    return status in TRANSIENT_STATUSES or 500 <= status <= 599


def classify_aiohttp_error(exc: BaseException) -> WaitError | None:
    """Our error for an aiohttp exception, or ``None`` when ``exc`` is not one.

    A rejected certificate and an invalid URL are fatal: asking again cannot fix them. Every
    other ``aiohttp.ClientError`` (refused or reset connections, DNS failures, TLS handshakes
    cut short, broken payloads, aiohttp's own connect and read timeouts) is transient. Socket,
    ``ssl`` and timeout errors that reach us unwrapped (``OSError``, ``TimeoutError``, e.g. the
    request's total timeout) are left to :meth:`PollingTrigger.classify_error`, which calls
    them transient network errors the same way for every wait.

    Some of aiohttp's messages quote the URL asked (a connect timeout, a malformed response),
    which after a redirect is one the server chose: its secret-looking query values are masked
    (:func:`~airflow_deferrable_kit._redact.redact_url`).
    """
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is None:  # never imported, so no exception can be one of its own
        return None
    text = redact_url(str(exc))
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return FatalError(f"TLS certificate rejected: {text}", error_type=ErrorType.TLS)
    if isinstance(exc, aiohttp.InvalidURL):
        return FatalError(f"invalid URL: {text}", error_type=ErrorType.BAD_CONNECTION)
    if isinstance(exc, aiohttp.ClientError):
        return TransientError(f"{type(exc).__name__}: {text}", error_type=ErrorType.NETWORK)
    return None
