"""The door to aiohttp for the HTTP waits: connection -> options, one shared session, errors.

* :func:`load_options` reads an Airflow ``http`` connection inside the triggerer and turns it
  into frozen :class:`HttpOptions`: base URL, headers (extras and ``Authorization``), proxy and
  TLS. The trigger kwargs carry only the connection id, never a credential.
* :func:`open_session` builds the one pooled keep-alive ``ClientSession`` every HTTP trigger of a
  process leases under :data:`SESSION_KEY` (``options.lease_key``, see
  :mod:`airflow_deferrable_kit.leases`); a connection's credentials are applied per request, so
  waits on unrelated connections share it.
* :meth:`HttpOptions.at` and :func:`keeps_credentials` keep a connection's credentials to its own
  origin, for a URL a server hands out and for a redirect
  (:mod:`airflow_deferrable_kit._http.responses` sends the requests).
* :func:`classify_aiohttp_error` is the one place aiohttp's exceptions become our transient or
  fatal errors; :func:`is_transient_status` says which HTTP statuses are worth retrying and
  :func:`status_error_type` what kind of error an error status is.

aiohttp's public API is all this module uses (no private attribute is touched). ``aiohttp`` (and
``yarl``, which ships with it) is imported lazily, and the first time off the event loop, so this
module imports without the ``http`` extra.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import importlib
import ssl
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from airflow_deferrable_kit._redact import is_sensitive_key, redact_url
from airflow_deferrable_kit._redact import register as register_secret
from airflow_deferrable_kit._tls import TlsFiles, build_ssl_context
from airflow_deferrable_kit.connections import get_connection, get_extra
from airflow_deferrable_kit.errors import ErrorType, FatalError, TransientError, WaitError

if TYPE_CHECKING:
    import aiohttp
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
#: Headers dropped, besides every connection header that carries a credential, when a redirect
#: leaves the origin (requests drops ``Authorization`` and ``Cookie``; the kit drops the
#: connection's key headers too, such as ``X-Api-Key``).
ORIGIN_ONLY_HEADERS: Final = frozenset({"authorization", "cookie", "proxy-authorization"})
DEFAULT_PORTS: Final = {"http": 80, "https": 443}


# ------------------------------------------------------------------------- shared session
def loaded_module(name: str) -> Any:
    """``sys.modules[name]`` once its import has finished, else ``None``.

    While one thread runs a module's import, ``sys.modules`` already holds the half-made module:
    another waiter reading it from there would find names missing (``aiohttp.TCPConnector``).
    """
    module = sys.modules.get(name)
    if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None
    return module


async def _import_aiohttp() -> Any:
    """Import aiohttp in a worker thread: its import reads CA files and must not stall the loop.

    Many waits ask at once; each one that finds the import unfinished asks importlib too, on a
    thread, where it waits for the import under way to finish rather than take the half-made module.
    """
    module = loaded_module("aiohttp")
    if module is None:
        module = await asyncio.to_thread(importlib.import_module, "aiohttp")
    return module


async def open_session(options: HttpOptions) -> aiohttp.ClientSession:
    """The process-wide session: pooled keep-alive connections, no cookies, no environment.

    One session serves every connection (``options.lease_key`` is the same for all): what
    ``options`` say is applied per request. No cookie jar because the session is shared by
    triggers of unrelated connections; no ``trust_env`` because that reads ``~/.netrc`` from disk
    on requests.
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
class HttpOptions:
    """Everything a request needs from the connection, resolved once per trigger in the triggerer.

    The headers (credentials among them) and the proxy URL (which may carry some) stay out of
    ``repr``.
    """

    base: URL
    headers: Mapping[str, str] = dataclasses.field(repr=False)
    ssl: bool | ssl.SSLContext
    proxy: str | None = dataclasses.field(default=None, repr=False)

    def __hash__(self) -> int:
        return hash((self.base, tuple(sorted(self.headers.items())), self.ssl, self.proxy))

    @property
    def lease_key(self) -> tuple[str]:
        """The shared session's key: the same for every connection (see :func:`open_session`)."""
        return SESSION_KEY

    def url(self, endpoint: str, query: Mapping[str, Any] | None) -> URL:
        from yarl import URL

        base = str(self.base)
        if endpoint:
            base = base.rstrip("/") + "/" + endpoint.lstrip("/")
        url = URL(base)
        if query:
            url = url.extend_query(_query_items(query))
        return url

    def at(self, link: str, query: Mapping[str, Any] | None = None) -> tuple[HttpOptions, URL]:
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
        headers = {name: value for name, value in self.headers.items() if not origin_only(name)}
        return dataclasses.replace(self, headers=headers), url

    def with_headers(self, headers: Mapping[str, str]) -> HttpOptions:
        """This target sending ``headers`` too (a request's own, such as an idempotency key)."""
        return dataclasses.replace(self, headers={**self.headers, **headers})


async def load_options(conn_id: str) -> HttpOptions:
    """Read the connection asynchronously and turn it into :class:`HttpOptions`."""
    await _import_aiohttp()  # and yarl with it, off the loop
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
    return HttpOptions(base=base, headers=headers, ssl=await _ssl_for(verify), proxy=proxy_for(extra, base.scheme))


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


def origin_only(name: str) -> bool:
    """Whether header ``name`` is sent only to the connection's own origin (a credential)."""
    return name.lower() in ORIGIN_ONLY_HEADERS or is_sensitive_key(name)


# ---------------------------------------------------------------------------------- errors
def is_transient_status(status: int) -> bool:
    """Whether an error status is worth retrying: 408, 429 and every 5xx; any other is fatal."""
    return status in TRANSIENT_STATUSES or 500 <= status <= 599


def status_error_type(status: int) -> ErrorType:
    """The vocabulary's name for an error status (the status itself is in the payload)."""
    if status == 401 or status == 407:
        return ErrorType.AUTHENTICATION
    if status == 403:
        return ErrorType.AUTHORIZATION
    if status in (404, 410):
        return ErrorType.NOT_FOUND
    if status == 429:
        return ErrorType.THROTTLED
    if is_transient_status(status):
        return ErrorType.NETWORK if status == 408 else ErrorType.UNAVAILABLE
    return ErrorType.BAD_REQUEST


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
    aiohttp = loaded_module("aiohttp")
    if aiohttp is None:  # not imported yet, so no exception can be one of its own
        return None
    text = redact_url(str(exc))
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return FatalError(f"TLS certificate rejected: {text}", error_type=ErrorType.TLS)
    if isinstance(exc, aiohttp.InvalidURL):
        return FatalError(f"invalid URL: {text}", error_type=ErrorType.BAD_CONNECTION)
    if isinstance(exc, aiohttp.ClientError):
        return TransientError(f"{type(exc).__name__}: {text}", error_type=ErrorType.NETWORK)
    return None
