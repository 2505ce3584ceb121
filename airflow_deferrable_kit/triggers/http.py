"""Wait until an HTTP endpoint says a batch is ready, over one shared aiohttp session.

Readiness is data: acceptors on the status code and on JSON paths of the body (see
:mod:`airflow_deferrable_kit.conditions`), optionally an importable predicate. Credentials come
from the Airflow connection inside the triggerer and are applied per request, so the kwargs
hold none and one pooled keep-alive session serves every trigger in the process.

``aiohttp`` (and ``yarl``, which ships with it) is imported lazily so this module imports
without the ``http`` extra; the session factory imports it off the event loop.
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
import ssl
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final

from airflow_deferrable_kit.conditions import (
    MISSING,
    Acceptor,
    Decision,
    decide,
    load_acceptors,
    lookup,
    parse_path,
    run_predicate,
    validate_predicate_path,
)
from airflow_deferrable_kit.connections import get_connection, get_extra
from airflow_deferrable_kit.payload import (
    ConditionFailed,
    FatalError,
    TransientError,
    WaitError,
    truncate_text,
)
from airflow_deferrable_kit.triggers.base import Found, PollingTrigger

if TYPE_CHECKING:
    import aiohttp
    from airflow.sdk import Connection
    from yarl import URL

#: Matchers an HTTP acceptor may use, and whether each takes an argument.
MATCHERS: Final[Mapping[str, bool]] = {"status": False, "path": True}
METHODS: Final = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")
#: Statuses that are worth retrying (besides every 5xx) when no acceptor decided.
TRANSIENT_STATUSES: Final = frozenset({408, 429})

DEFAULT_NOT_YET_CODES: Final = (404,)
DEFAULT_REQUEST_TIMEOUT: Final = 30.0
DEFAULT_MAX_BODY_BYTES: Final = 1024 * 1024
DEFAULT_EXCERPT_CHARS: Final = 1000
#: Upper bound for ``excerpt_chars`` so a payload always fits in MAX_PAYLOAD_BYTES.
MAX_EXCERPT_CHARS: Final = 16_000
#: A selected or observed value longer than this (as JSON) is cut to a marked string.
MAX_VALUE_CHARS: Final = 1000
#: A Retry-After above this is read as this, so a misbehaving server cannot park a wait for days.
MAX_RETRY_AFTER: Final = 3600.0
#: Bodies above this are parsed as JSON in a worker thread instead of on the event loop.
THREAD_PARSE_BYTES: Final = 256 * 1024

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
_ssl_contexts: dict[str, ssl.SSLContext] = {}


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
        context = _ssl_contexts.get(verify)
        if context is None:
            try:
                context = await asyncio.to_thread(ssl.create_default_context, cafile=verify)
            except (OSError, ssl.SSLError) as exc:
                raise FatalError(
                    f"connection extra 'verify' names CA bundle {verify!r}, which cannot be loaded: {exc}",
                    error_type="connection_config",
                ) from exc
            _ssl_contexts[verify] = context
        return context
    raise FatalError(
        f"connection extra 'verify' must be true, false or a CA bundle path, got {verify!r}",
        error_type="connection_config",
    )


def _header_value(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise FatalError(
        f"connection extra {name!r} is sent as a header and must be a string or number, got {type(value).__name__}",
        error_type="connection_config",
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
                error_type="connection_config",
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
            error_type="connection_config",
        )
    token = extra.get("bearer_token")
    if token is not None and (not isinstance(token, str) or not token):
        raise FatalError("connection extra 'bearer_token' must be a non-empty string", error_type="connection_config")
    authorization: str | None = None
    if auth_type == "bearer" or (auth_type == "auto" and token):
        token = token or password
        if not token:
            raise FatalError(
                "auth_type 'bearer' needs a token: set extra 'bearer_token' or the connection password",
                error_type="connection_config",
            )
        authorization = f"Bearer {token}"
    elif auth_type in ("basic", "auto") and (login or (auth_type == "basic" and password)):
        pair = f"{login or ''}:{password or ''}".encode()
        authorization = "Basic " + base64.b64encode(pair).decode("ascii")
    if authorization is not None:
        for name in [n for n in headers if n.lower() == "authorization"]:
            del headers[name]
        headers["Authorization"] = authorization
    return headers


def base_url(conn: Connection) -> URL:
    """The connection's base URL, without credentials.

    ``host`` may carry the scheme (``https://api.example.com/v1``); otherwise ``schema`` is the
    scheme (default ``http``). ``port`` is added when the host has none.
    """
    from yarl import URL

    host = (conn.host or "").strip()
    if not host:
        raise FatalError("the HTTP connection has no host", error_type="connection_config")
    if "://" not in host:
        scheme = (conn.schema or "http").strip() or "http"
        host = f"{scheme}://{host}"
    try:
        url = URL(host)
    except ValueError as exc:
        raise FatalError(f"the HTTP connection host is not a valid URL: {exc}", error_type="connection_config") from exc
    if url.scheme not in ("http", "https") or not url.host:
        raise FatalError(
            f"the HTTP connection must give an http(s) host, got scheme {url.scheme!r}",
            error_type="connection_config",
        )
    if conn.port and url.explicit_port is None:
        url = url.with_port(int(conn.port))
    return url.with_user(None)


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


async def resolve_target(conn_id: str) -> Target:
    """Read the connection asynchronously and turn it into a :class:`Target`."""
    from yarl import URL

    conn = await get_connection(conn_id, argument="http_conn_id")
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


def proxy_for(extra: Mapping[str, Any], scheme: str) -> str | None:
    """The proxy URL from extra ``proxy`` (one URL) or ``proxies`` (``{"http": ..., "https": ...}``)."""
    proxy = extra.get("proxy")
    proxies = extra.get("proxies")
    if proxy is None and proxies:
        if not isinstance(proxies, Mapping):
            raise FatalError(
                "connection extra 'proxies' must be an object such as {'https': 'http://proxy:3128'}",
                error_type="connection_config",
            )
        proxy = proxies.get(scheme)
    if proxy in (None, ""):
        return None
    if not isinstance(proxy, str) or not proxy.startswith(("http://", "https://")):
        raise FatalError("the connection's proxy must be an http:// or https:// URL", error_type="connection_config")
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


# ----------------------------------------------------------------------------- responses
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


class _Unreadable(Exception):
    """A path acceptor needed the body as JSON and it is not (or it was too large to read)."""


_NOT_JSON: Final = object()
_TOO_LARGE: Final = object()


@dataclasses.dataclass
class Response:
    """One HTTP response, read (capped) and released back to the pool."""

    status: int
    reason: str
    headers: Mapping[str, str]
    body: bytes
    truncated: bool
    charset: str | None

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
            return _TOO_LARGE
        if not self.body.strip():
            return _NOT_JSON
        try:
            if len(self.body) > THREAD_PARSE_BYTES:
                return await asyncio.to_thread(json.loads, self.body)
            return json.loads(self.body)
        except (ValueError, UnicodeDecodeError):
            return _NOT_JSON


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


def _cap_value(value: Any) -> Any:
    """Keep a JSON value if small, else a marked cut of its JSON text (payloads stay bounded)."""
    if value is MISSING:
        return None
    text = json.dumps(value, separators=(",", ":"), default=str)
    if len(text) <= MAX_VALUE_CHARS:
        return value
    return truncate_text(text, MAX_VALUE_CHARS)


# ------------------------------------------------------------------------------ trigger
class HttpBatchReadyTrigger(PollingTrigger):
    """Poll ``endpoint`` on ``http_conn_id`` until the response says the batch is ready.

    :param http_conn_id: Airflow connection with the base URL, credentials and extra headers.
    :param endpoint: path relative to the connection's base URL (may carry a query string).
    :param method: HTTP method (GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS).
    :param query: query parameters; a list value repeats the parameter.
    :param json_body: JSON request body (``None`` sends no body).
    :param acceptors: canonical acceptors (matchers ``status`` and ``path``), tried in order.
    :param predicate: dotted path of a sync or async callable deciding on 2xx responses that no
        acceptor decided; it returns ``True``/``"success"``, ``"failure"`` or falsy/``"retry"``.
    :param not_yet_codes: statuses meaning "not yet" when no acceptor decided.
    :param select: JSON paths copied into the success payload's ``fields``.
    :param request_timeout: seconds for one request, including waiting for a pooled socket.
    :param max_body_bytes: most of a body read; a larger one cannot be evaluated as JSON.
    :param excerpt_chars: length of the body excerpt in payloads and error messages.
    """

    http_conn_id: str = "http_default"
    endpoint: str = ""
    method: str = "GET"
    query: dict[str, Any] | None = None
    json_body: Any = None
    acceptors: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    predicate: str | None = None
    not_yet_codes: list[int] = dataclasses.field(default_factory=lambda: list(DEFAULT_NOT_YET_CODES))
    select: list[str] = dataclasses.field(default_factory=list)
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    excerpt_chars: int = DEFAULT_EXCERPT_CHARS
    poll_interval: float = 60.0

    extra: ClassVar[str | None] = "http"
    extra_modules: ClassVar[tuple[str, ...]] = ("aiohttp",)

    # -------------------------------------------------------------------- validation
    def validate(self) -> None:
        if not isinstance(self.http_conn_id, str) or not self.http_conn_id:
            raise ValueError(f"http_conn_id must be a non-empty string, got {self.http_conn_id!r}")
        if not isinstance(self.endpoint, str):
            raise ValueError(f"endpoint must be a string, got {type(self.endpoint).__name__}")
        if "://" in self.endpoint:
            raise ValueError(
                f"endpoint must be a path relative to the connection's base URL, got {self.endpoint!r} "
                "(put the scheme and host in the connection, so credentials only go where it points)"
            )
        if not isinstance(self.method, str) or self.method.upper() not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")
        self._validate_query()
        self._acceptors: list[Acceptor] = load_acceptors(self._require_list("acceptors"), matchers=MATCHERS)
        for i, acceptor in enumerate(self._acceptors):
            if acceptor.matcher == "status" and acceptor.comparator != "exists":
                values = acceptor.expected if acceptor.comparator == "in" else [acceptor.expected]
                if not all(_is_status(v) for v in values):
                    raise ValueError(
                        f"acceptors[{i}]: a status acceptor expects HTTP status integers (100-599), "
                        f"got {acceptor.expected!r}"
                    )
        if self.predicate is not None:
            validate_predicate_path(self.predicate, argument="predicate")
        codes = self._require_list("not_yet_codes")
        if not all(_is_status(code) for code in codes):
            raise ValueError(f"not_yet_codes must be a list of HTTP status integers (100-599), got {codes!r}")
        self._select_paths = {path: parse_path(path, argument="select") for path in self._require_list("select")}
        for name in ("request_timeout",):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if isinstance(self.max_body_bytes, bool) or not isinstance(self.max_body_bytes, int) or self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be a positive integer, got {self.max_body_bytes!r}")
        chars = self.excerpt_chars
        if isinstance(chars, bool) or not isinstance(chars, int) or not 0 <= chars <= MAX_EXCERPT_CHARS:
            raise ValueError(f"excerpt_chars must be an integer from 0 to {MAX_EXCERPT_CHARS}, got {chars!r}")
        if self._acceptors and self.predicate is None and not any(a.state == "success" for a in self._acceptors):
            raise ValueError(
                "acceptors say only when to fail or keep waiting; add a success condition "
                "(e.g. success=[{'status': 200}] or [{'path': 'state', 'equals': 'ready'}]) or a predicate, "
                "so a response nobody described is never mistaken for 'ready'"
            )
        self._target: Target | None = None
        self._hold_off: float | None = None
        self._last: str | None = None

    def _require_list(self, name: str) -> list[Any]:
        value = getattr(self, name)
        if not isinstance(value, list):
            raise ValueError(f"{name} must be a list, got {type(value).__name__}")
        return value

    def _validate_query(self) -> None:
        if self.query is None:
            return
        if not isinstance(self.query, dict):
            raise ValueError(f"query must be a dict of parameter names to values, got {type(self.query).__name__}")
        for name, value in self.query.items():
            for item in value if isinstance(value, list) else [value]:
                if item is not None and not isinstance(item, (str, int, float, bool)):
                    raise ValueError(
                        f"query[{name!r}] must be a string, number, boolean or a list of them, got {item!r}"
                    )

    def describe(self) -> str:
        """What is polled, and what the last poll saw (so a timeout message says why it waited)."""
        text = f"{self.method.upper()} {self.endpoint or '/'} on connection {self.http_conn_id!r}"
        return f"{text} ({self._last})" if self._last else text

    # ------------------------------------------------------------------------ polling
    async def check(self) -> Found | None:
        # The session first: its factory imports aiohttp (and yarl) off the loop.
        session = await self.lease(SESSION_KEY, open_session, close_session)
        if self._target is None:
            self._target = await resolve_target(self.http_conn_id)
        aiohttp = sys.modules["aiohttp"]
        method = self.method.upper()
        url = self._target.url(self.endpoint, self.query)
        options: dict[str, Any] = {}
        if self.json_body is not None:
            options["json"] = self.json_body
        async with session.request(
            method,
            url,
            headers=self._target.headers,
            ssl=self._target.ssl,
            proxy=self._target.proxy,
            timeout=aiohttp.ClientTimeout(total=float(self.request_timeout)),
            allow_redirects=False,
            **options,
        ) as resp:
            body, truncated = await read_capped(resp, int(self.max_body_bytes))
            response = Response(
                status=resp.status,
                reason=resp.reason or "",
                headers=resp.headers.copy(),
                body=body,
                truncated=truncated,
                charset=resp.charset,
            )
        return await self.evaluate(response, safe_url=str(url.with_user(None)), method=method)

    async def evaluate(self, response: Response, *, safe_url: str, method: str) -> Found | None:
        """Decide on one response: ready, not yet, or raise a transient / fatal / failed error."""
        status = response.status
        context: dict[str, Any] = {"status_code": status, "method": method, "url": safe_url}
        # The body is only evaluated on a 2xx that is not a "not yet" code: an error page or an
        # empty 202 must never satisfy (or break) a path acceptor such as {"exists": false}.
        evaluate_body = response.ok and status not in self.not_yet_codes
        needs_document = evaluate_body and (
            self._select_paths or self.predicate or any(a.matcher == "path" for a in self._acceptors)
        )
        document = await response.document() if needs_document else _NOT_JSON

        def value_of(acceptor: Acceptor) -> Any:
            if acceptor.matcher == "status":
                return status
            if document is _NOT_JSON or document is _TOO_LARGE:
                raise _Unreadable
            return lookup(document, acceptor.argument or "")

        applicable = self._acceptors if evaluate_body else [a for a in self._acceptors if a.matcher == "status"]
        try:
            decision, observed = decide(applicable, value_of)
        except _Unreadable:
            raise self._unreadable(response, document, context) from None
        context["observed"] = {label: _cap_value(value) for label, value in observed.items()}

        state: str | None = None
        decided: dict[str, Any] | None = None
        if decision is not None:
            state, decided = decision.state, self._decision_dict(decision)
        elif status in self.not_yet_codes:
            state = "retry"
        elif response.ok:
            if self.predicate is not None:
                state = await self._run_predicate(response, document)
                decided = {"state": state, "matcher": "predicate", "argument": self.predicate}
            elif not self._acceptors:
                state = "success"
                decided = {"state": "success", "matcher": "default", "comparator": "2xx", "actual": status}
            else:
                state = "retry"

        if state == "success":
            self._last = None
            data = {**context, "decision": decided}
            if self._select_paths:
                usable = document is not _NOT_JSON and document is not _TOO_LARGE
                data["fields"] = {
                    path: _cap_value(lookup(document, parts)) if usable else None
                    for path, parts in self._select_paths.items()
                }
            data["body_excerpt"] = response.excerpt(int(self.excerpt_chars))
            return Found(data)
        if state == "failure":
            assert decided is not None
            raise ConditionFailed(
                f"{method} {safe_url} reported failure: {self._describe_decision(decided)}; "
                f"body: {response.excerpt(min(int(self.excerpt_chars), 300))}",
                details={**context, "decision": decided, "body_excerpt": response.excerpt(int(self.excerpt_chars))},
            )
        if state == "retry":
            self._hold_off = parse_retry_after(response.headers.get("Retry-After"), now=self.clock.time())
            seen = ", ".join(f"{label}={value!r}" for label, value in context["observed"].items())
            self._last = truncate_text(f"last response: {status}" + (f", {seen}" if seen else ""), 300)
            return None
        raise self._status_error(response, context)

    def _decision_dict(self, decision: Decision) -> dict[str, Any]:
        out = decision.as_dict()
        out["actual"] = _cap_value(out.get("actual"))
        return out

    @staticmethod
    def _describe_decision(decided: Mapping[str, Any]) -> str:
        if decided.get("matcher") == "predicate":
            return f"predicate {decided.get('argument')} returned failure"
        where = decided["matcher"] + (f" {decided['argument']}" if "argument" in decided else "")
        expected = decided.get("expected", True)
        return f"{where} {decided.get('comparator')} {expected!r} (saw {decided.get('actual')!r})"

    def _status_error(self, response: Response, context: dict[str, Any]) -> WaitError:
        status = response.status
        excerpt = response.excerpt(int(self.excerpt_chars))
        message = (
            f"{context['method']} {context['url']} returned {status} {response.reason}".rstrip()
            + f": {response.excerpt(min(int(self.excerpt_chars), 300))}"
        )
        details = {**context, "body_excerpt": excerpt}
        self._last = f"last response: {status} {response.reason}".rstrip()
        if status in TRANSIENT_STATUSES or 500 <= status <= 599:
            retry_after = parse_retry_after(response.headers.get("Retry-After"), now=self.clock.time())
            return TransientError(message, retry_after=retry_after, error_type=f"http_{status}", details=details)
        if 300 <= status <= 399:
            location = response.headers.get("Location")
            message += (
                f" (redirect to {location!r} not followed, so connection headers never leave its origin; "
                "point the connection at the final URL)"
            )
        return FatalError(message, error_type=f"http_{status}", details=details)

    def _unreadable(self, response: Response, document: Any, context: dict[str, Any]) -> FatalError:
        excerpt = response.excerpt(int(self.excerpt_chars))
        if document is _TOO_LARGE:
            reason = f"the body is larger than max_body_bytes={self.max_body_bytes}"
            error_type = "body_too_large"
        else:
            reason = "the body is not JSON"
            error_type = "invalid_json"
        content_type = response.headers.get("Content-Type", "no content type")
        return FatalError(
            f"{context['method']} {context['url']} returned {response.status} ({content_type}) but {reason}, "
            f"so the path acceptors cannot be evaluated: {response.excerpt(min(int(self.excerpt_chars), 300))}",
            error_type=error_type,
            details={**context, "body_excerpt": excerpt},
        )

    async def _run_predicate(self, response: Response, document: Any) -> str:
        assert self.predicate is not None
        subject = {
            "status_code": response.status,
            "headers": dict(response.headers),
            "text": response.decoded,
            "json": None if document is _NOT_JSON or document is _TOO_LARGE else document,
        }
        try:
            return await run_predicate(self.predicate, subject)
        except WaitError:
            raise
        except Exception as exc:
            raise FatalError(
                f"predicate {self.predicate!r} failed: {type(exc).__name__}: {exc}", error_type="predicate_error"
            ) from exc

    def next_poll_delay(self) -> float:
        """The poll interval, or longer if a "not yet" response asked for it with Retry-After."""
        hold_off, self._hold_off = self._hold_off, None
        return max(float(self.poll_interval), hold_off or 0.0)

    def classify_error(self, exc: Exception) -> WaitError:
        if isinstance(exc, WaitError):
            return exc
        aiohttp = sys.modules.get("aiohttp")
        if aiohttp is not None:
            if isinstance(exc, aiohttp.ClientConnectorCertificateError):
                return FatalError(f"TLS certificate rejected: {exc}", error_type="tls_certificate")
            if isinstance(exc, aiohttp.InvalidURL):
                return FatalError(f"invalid URL: {exc}", error_type="invalid_url")
            if isinstance(exc, aiohttp.ClientError):
                error: WaitError = TransientError(f"{type(exc).__name__}: {exc}", error_type="network")
                self._last = truncate_text(f"last error: {error.message}", 300)
                return error
        error = super().classify_error(exc)
        if isinstance(error, TransientError):
            self._last = truncate_text(f"last error: {error.message}", 300)
        return error


def _is_status(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599


__all__ = [
    "MATCHERS",
    "HttpBatchReadyTrigger",
    "parse_retry_after",
]
