"""asyncpg behind the Postgres wait: connection -> client, and asyncpg's errors -> ours.

* :func:`load_options` turns an Airflow ``postgres`` connection into asyncpg arguments, inside
  the triggerer, so no DSN or password ever travels in trigger kwargs.
* :func:`open_pool` builds the one bounded pool a connection id gets per process: a thousand
  waiting triggers share ``pool_max_size`` server connections (4 by default), and a waiter
  holds one only for the length of its query.
* :func:`pooled` lends one pooled connection for one query, with the statement timeout and a
  release that a hung server cannot hold up: every query of the Postgres waits goes through it.
* :func:`classify_postgres_error` is the one place asyncpg's exceptions become transient or
  fatal errors.

The Postgres wait uses no private asyncpg API. What it does rely on beyond asyncpg's documented
surface, the text of a few errors asyncpg gives no class of their own, is said where it is used.
The LISTEN engine is in :mod:`airflow_deferrable_kit._postgres.listener`.

asyncpg is imported inside functions only, so this module imports without the ``postgres`` extra.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import shlex
import ssl
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_deferrable_kit._tls import read_refusal
from airflow_deferrable_kit.connections import get_connection, get_extra
from airflow_deferrable_kit.errors import ErrorType, FatalError, TransientError, WaitError

if TYPE_CHECKING:
    import asyncpg
    from airflow.sdk import Connection

log = logging.getLogger(__name__)

#: Server connections one pool (one Airflow connection id, one triggerer process) may open.
DEFAULT_POOL_MAX_SIZE = 4
MAX_POOL_MAX_SIZE = 100
#: ``application_name`` our sessions carry unless the connection names its own.
APPLICATION_NAME = "airflow-deferrable-kit"
DEFAULT_CONNECT_TIMEOUT = 10.0
SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
#: libpq SSL file parameters asyncpg reads from a DSN query string (never a secret-bearing DSN).
SSL_FILE_KEYS = ("sslrootcert", "sslcert", "sslkey", "sslcrl")


def pool_key(conn_id: str) -> tuple[str, str]:
    """The lease key of a connection id's pool, shared by every Postgres wait of the process."""
    return ("postgres-pool", conn_id)


@dataclass(frozen=True)
class PostgresOptions:
    """asyncpg connect arguments of one connection (they hold the password: never log or serialize them)."""

    conn_id: str
    kwargs: dict[str, Any]
    pool_max_size: int
    where: str
    #: The client certificate, key and key password the connection presents, if any.
    client_certificate: tuple[str, str | None, str | None] | None = None

    def __repr__(self) -> str:
        return f"PostgresOptions({self.where}, pool_max_size={self.pool_max_size})"

    def __hash__(self) -> int:
        return hash((self.conn_id, self.where, self.pool_max_size))

    @property
    def lease_key(self) -> tuple[str, str]:
        """The shared pool's key: one pool per connection id (see :func:`open_pool`)."""
        return pool_key(self.conn_id)


def _bad(conn_id: str, message: str) -> FatalError:
    return FatalError(f"postgres_conn_id={conn_id!r}: {message}", error_type=ErrorType.BAD_CONNECTION)


def parse_options(options: str, *, conn_id: str) -> dict[str, str]:
    """Read libpq's ``options`` string (``-c key=value`` / ``--key=value``) as server settings."""
    try:
        tokens = shlex.split(options)
    except ValueError as exc:
        raise _bad(conn_id, f"extra 'options' cannot be parsed: {exc}") from exc
    settings: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == "-c" and i + 1 < len(tokens):
            setting, i = tokens[i + 1], i + 2
        elif (token.startswith("-c") and len(token) > 2) or (token.startswith("--") and "=" in token):
            setting, i = token[2:], i + 1
        else:
            raise _bad(conn_id, f"extra 'options' supports only '-c name=value' settings, got {token!r}")
        name, sep, value = setting.partition("=")
        if not sep or not name:
            raise _bad(conn_id, f"extra 'options' setting {setting!r} is not name=value")
        settings[name.replace("-", "_")] = value
    return settings


def _positive_int(conn_id: str, extra: dict[str, Any], key: str, default: int, *, upper: int) -> int:
    raw = extra.get(key, default)
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise _bad(conn_id, f"extra {key!r} must be an integer, got {raw!r}") from None
    if not 1 <= value <= upper:
        raise _bad(conn_id, f"extra {key!r} must be between 1 and {upper}, got {value}")
    return value


def options_from_connection(conn_id: str, conn: Connection, extra: dict[str, Any]) -> PostgresOptions:
    """Map an Airflow postgres connection to asyncpg arguments.

    host, port, login, password and schema (the database) as usual; extras ``sslmode``,
    ``sslrootcert``/``sslcert``/``sslkey``/``sslcrl``, ``sslpassword``, ``options`` (``-c``
    settings), ``application_name``, ``connect_timeout``, ``statement_cache_size`` and this
    package's ``pool_max_size``. Sessions are read-only by default (a wait has no side effects).
    """
    if extra.get("iam"):
        raise _bad(conn_id, "IAM authentication is not supported by the Postgres batch-marker wait")
    kwargs: dict[str, Any] = {}
    if conn.host:
        kwargs["host"] = conn.host
    if conn.port:
        kwargs["port"] = int(conn.port)
    if conn.login:
        kwargs["user"] = conn.login
    if conn.password:
        kwargs["password"] = conn.password
    database = extra.get("database") or conn.schema
    if database:
        kwargs["database"] = database
    sslmode = extra.get("sslmode")
    if sslmode is not None:
        if sslmode not in SSL_MODES:
            raise _bad(conn_id, f"extra 'sslmode' must be one of {', '.join(SSL_MODES)}, got {sslmode!r}")
        kwargs["ssl"] = sslmode
    files = {key: str(extra[key]) for key in SSL_FILE_KEYS if extra.get(key)}
    if files:
        kwargs["dsn"] = "postgresql://?" + urllib.parse.urlencode(files)
    if extra.get("sslpassword"):
        kwargs.setdefault("dsn", "postgresql://")
        kwargs["dsn"] += ("&" if "?" in kwargs["dsn"] else "?") + urllib.parse.urlencode(
            {"sslpassword": str(extra["sslpassword"])}
        )
    settings = {"application_name": APPLICATION_NAME, "default_transaction_read_only": "on"}
    if extra.get("options"):
        settings.update(parse_options(str(extra["options"]), conn_id=conn_id))
    if extra.get("application_name"):
        settings["application_name"] = str(extra["application_name"])
    kwargs["server_settings"] = settings
    timeout = extra.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT)
    try:
        kwargs["timeout"] = float(timeout)
    except (TypeError, ValueError):
        raise _bad(conn_id, f"extra 'connect_timeout' must be a number of seconds, got {timeout!r}") from None
    if "statement_cache_size" in extra:
        cache = extra["statement_cache_size"]
        if isinstance(cache, bool) or not isinstance(cache, (int, str)) or not str(cache).isdigit():
            raise _bad(conn_id, f"extra 'statement_cache_size' must be an integer >= 0, got {cache!r}")
        kwargs["statement_cache_size"] = int(cache)
    pool_max_size = _positive_int(conn_id, extra, "pool_max_size", DEFAULT_POOL_MAX_SIZE, upper=MAX_POOL_MAX_SIZE)
    where = f"{conn.host or 'localhost'}:{conn.port or 5432}/{database or conn.login or ''}"
    certificate = None
    if files.get("sslcert"):
        certificate = (files["sslcert"], files.get("sslkey"), str(extra.get("sslpassword") or "") or None)
    return PostgresOptions(
        conn_id=conn_id, kwargs=kwargs, pool_max_size=pool_max_size, where=where, client_certificate=certificate
    )


async def load_options(conn_id: str) -> PostgresOptions:
    """Resolve ``conn_id`` through Airflow's async connection API and map it for asyncpg."""
    conn = await get_connection(conn_id, argument="postgres_conn_id", conn_types=("postgres", "postgresql"))
    return options_from_connection(conn_id, conn, await get_extra(conn))


async def _init_connection(conn: asyncpg.Connection) -> None:
    """Decode json/jsonb into Python values, so acceptor paths can look inside JSON columns."""
    for name in ("json", "jsonb"):
        await conn.set_type_codec(name, encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def connect(conn_id: str, options: PostgresOptions, *args: Any, **kwargs: Any) -> asyncpg.Connection:
    """Open one server connection; a server that refuses who we are is named with the connection.

    Every connection of the Postgres waits (pooled or listening) opens here. A refusal no retry
    can change (wrong password, certificate, role, database, TLS) becomes one fatal error that
    names ``postgres_conn_id`` and the server; anything else is raised as asyncpg raised it, for
    :func:`classify_postgres_error`.
    """
    import asyncpg

    try:
        # The pool passes its own arguments (our options among them); the listener passes none.
        return await asyncpg.connect(*args, **(kwargs if args or kwargs else options.kwargs))
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        refusal = classify_postgres_error(exc)
        if not isinstance(refusal, FatalError):
            dropped = isinstance(exc, asyncpg.ConnectionDoesNotExistError)
            refusal = await _certificate_refusal(options) if dropped and options.client_certificate else None
            if refusal is None:
                raise
        raise FatalError(
            f"postgres_conn_id={conn_id!r} ({options.where}): {refusal.message}",
            error_type=refusal.error_type,
            details=refusal.details,
        ) from exc


async def _certificate_refusal(options: PostgresOptions) -> FatalError | None:
    """The server's refusal of our client certificate, when a connection presenting one was
    dropped in the middle of its start-up (see :func:`~airflow_deferrable_kit._tls.read_refusal`)."""
    assert options.client_certificate is not None
    certfile, keyfile, password = options.client_certificate
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the server's identity is asyncpg's to check, not the probe's
    try:
        await asyncio.to_thread(context.load_cert_chain, certfile, keyfile, password)
    except (OSError, ssl.SSLError):
        return None
    host, port = str(options.kwargs.get("host") or "localhost"), int(options.kwargs.get("port") or 5432)
    alert = await read_refusal(host, port, context, preamble=_SSL_REQUEST, expect=b"S")
    if alert is None:
        return None
    return FatalError(
        f"the server rejected the TLS client certificate (sslcert={certfile!r}): {alert}",
        error_type=ErrorType.TLS,
        details={"condition": "client_certificate_rejected"},
    )


#: PostgreSQL's SSLRequest (length 8, code 80877103), answered ``S`` by a server that speaks TLS.
_SSL_REQUEST = b"\x00\x00\x00\x08\x04\xd2\x16\x2f"


async def open_pool(options: PostgresOptions) -> asyncpg.Pool:
    """The bounded pool of one connection. Opens no connection until the first query asks for one.

    A trigger leases it as ``lease(options.lease_key, lambda: open_pool(options), close_pool)``.
    """
    await asyncio.to_thread(__import__, "asyncpg")  # the first import is slow: not on the loop
    import asyncpg

    conn_id = options.conn_id
    log.info("Opening a Postgres pool for %s (%s, at most %d connections)", conn_id, options, options.pool_max_size)
    pool: asyncpg.Pool = await asyncpg.create_pool(
        connect=functools.partial(connect, conn_id, options),
        min_size=0,
        max_size=options.pool_max_size,
        init=_init_connection,
        **options.kwargs,
    )
    return pool


#: Seconds a pool nobody uses any more gets to say goodbye before its sockets are dropped.
CLOSE_GRACE = 0.5


async def close_pool(pool: asyncpg.Pool) -> None:
    """Close gracefully, but never let a hung server keep the triggerer's cleanup waiting.

    The last wait on a pool releases it, often while being cancelled: a frozen server must not
    hold that cancel (or a triggerer shutdown) for the statement timeout, so a close that does
    not finish within :data:`CLOSE_GRACE` drops the sockets at once.
    """
    try:
        await asyncio.wait_for(pool.close(), timeout=CLOSE_GRACE)
    except (Exception, asyncio.CancelledError):
        pool.terminate()


@contextlib.asynccontextmanager
async def pooled(pool: asyncpg.Pool, timeout: float) -> AsyncIterator[Any]:
    """One pooled connection for one query, held only for it.

    Waiting for the connection and a query still running after ``timeout`` seconds (asyncpg's
    ``timeout=``) are transient errors. A query cancelled in flight (the wait was cancelled, its
    deadline passed, the triggerer is stopping) gives its connection back by
    :func:`release_cancelled`, so a hung server cannot hold up the cancel.
    """
    try:
        connection = await pool.acquire(timeout=timeout)
    except asyncio.TimeoutError as exc:
        raise TransientError(
            f"no Postgres connection within statement_timeout={timeout}s "
            "(every pooled connection busy, or the server not answering)",
            error_type=ErrorType.UNAVAILABLE,
        ) from exc
    cancelled = False
    try:
        try:
            yield connection
        except asyncio.TimeoutError as exc:
            raise query_timed_out(timeout) from exc
    except asyncio.CancelledError:
        cancelled = True
        await release_cancelled(pool, connection)
        raise
    finally:
        if not cancelled:
            await pool.release(connection)


def query_timed_out(timeout: float) -> TransientError:
    """The error of a query still running after the statement timeout (asyncpg cancelled it)."""
    return TransientError(
        f"the query ran longer than statement_timeout={timeout}s and was cancelled", error_type=ErrorType.UNAVAILABLE
    )


def is_lost(connection: Any) -> bool:
    """Whether a pooled connection can run no more queries: the server or the network closed it.

    asyncpg gives a connection that was closed under it back to its pool at once, while the
    borrower still holds it: every later call on it raises ``InterfaceError: ... connection has
    been released back to the pool``, which is neither the outage it is nor a bug of the wait.
    """
    import asyncpg

    try:
        return bool(connection.is_closed())
    except asyncpg.InterfaceError:
        return True


def connection_lost() -> TransientError:
    """The error of a query that was not sent: its pooled connection was closed before its turn."""
    return TransientError(
        "the Postgres connection was closed before the query could be sent (the server closed it, "
        "or the network dropped it)",
        error_type=ErrorType.NETWORK,
    )


async def release_cancelled(pool: asyncpg.Pool, connection: Any) -> None:
    """Give back a connection whose query was cancelled, without letting a hung server hold us.

    asyncpg asks the server to cancel the query and a graceful release waits for that (so the
    server stops working on it); a hung server would hold it for the statement timeout, so the
    release gets ``CLOSE_GRACE`` seconds, then the socket is dropped (the pool opens a fresh one
    when needed).
    """
    release = asyncio.ensure_future(pool.release(connection))
    done, _ = await asyncio.wait({release}, timeout=CLOSE_GRACE)
    if not done or release.exception() is not None:
        connection.terminate()
        await asyncio.gather(release, return_exceptions=True)


# ---------------------------------------------------------------------- errors -> ours
#: SQLSTATE classes and codes (PostgreSQL's appendix A) that a later poll may well not meet,
#: with the condition's name (kept in the error's details) and the vocabulary's type.
_NETWORK, _UNAVAILABLE = ErrorType.NETWORK, ErrorType.UNAVAILABLE
_TRANSIENT_CLASSES: dict[str, tuple[str, ErrorType]] = {
    "08": ("connection_exception", _NETWORK),
    "40": ("transaction_rollback", _UNAVAILABLE),
    "53": ("insufficient_resources", _UNAVAILABLE),
    "57": ("server_unavailable", _UNAVAILABLE),
    "58": ("system_error", _UNAVAILABLE),
}
_TRANSIENT_STATES: dict[str, tuple[str, ErrorType]] = {
    "40001": ("serialization_failure", _UNAVAILABLE),
    "40P01": ("deadlock", _UNAVAILABLE),
    "53300": ("too_many_connections", _UNAVAILABLE),
    "57014": ("query_canceled", _UNAVAILABLE),
    "57P01": ("server_restarting", _UNAVAILABLE),
    "57P02": ("server_restarting", _UNAVAILABLE),
    "57P03": ("server_restarting", _UNAVAILABLE),
    "55P03": ("lock_not_available", _UNAVAILABLE),
    "55006": ("object_in_use", _UNAVAILABLE),
    "25P03": ("idle_in_transaction_timeout", _UNAVAILABLE),
}
#: SQLSTATEs that no retry will change: the query, the schema or the credentials are wrong.
_FATAL_STATES: dict[str, tuple[str, ErrorType]] = {
    "42601": ("syntax_error", ErrorType.BAD_REQUEST),
    "42P01": ("undefined_table", ErrorType.NOT_FOUND),
    "42703": ("undefined_column", ErrorType.BAD_REQUEST),
    "42883": ("undefined_function", ErrorType.BAD_REQUEST),
    "42501": ("permission_denied", ErrorType.AUTHORIZATION),
    "28P01": ("authentication_failed", ErrorType.AUTHENTICATION),
    "28000": ("authentication_failed", ErrorType.AUTHENTICATION),
    "3D000": ("unknown_database", ErrorType.NOT_FOUND),
    "3F000": ("unknown_schema", ErrorType.NOT_FOUND),
    "25006": ("read_only", ErrorType.BAD_REQUEST),
}
_FATAL_CLASSES: dict[str, tuple[str, ErrorType]] = {
    "42": ("sql_error", ErrorType.BAD_REQUEST),
    "22": ("data_error", ErrorType.BAD_REQUEST),
    "28": ("authentication_failed", ErrorType.AUTHENTICATION),
}
_OTHER_SERVER_ERROR = ("postgres_error", ErrorType.BAD_REQUEST)


def classify_postgres_error(exc: BaseException) -> WaitError | None:
    """Transient or fatal for asyncpg's errors; ``None`` if ``exc`` is not one of them.

    The server's errors are classified by SQLSTATE and asyncpg's own by class, except a few that
    asyncpg gives no class of their own: those are told apart by their text, as asyncpg 0.32.0
    words it (``pool.py``, ``connection.py``, ``connect_utils.py`` and ``protocol/*.pyx``). An
    asyncpg that rewords one moves it to the next rule below; the tests that restart a real
    server and refuse its TLS show such a change.
    """
    import asyncpg

    if isinstance(exc, asyncpg.PostgresError):
        state = str(getattr(exc, "sqlstate", "") or "")
        message = f"{type(exc).__name__} (SQLSTATE {state}): {exc}"
        if isinstance(exc, asyncpg.exceptions.InvalidCachedStatementError):
            return TransientError(message, error_type=_UNAVAILABLE, details={"sqlstate": state})
        transient = _TRANSIENT_STATES.get(state) or _TRANSIENT_CLASSES.get(state[:2])
        if transient is not None:
            condition, error_type = transient
            return TransientError(message, error_type=error_type, details={"sqlstate": state, "condition": condition})
        if state == "25006":
            message += " (waits run in read-only sessions: the query must not write)"
        if "invalid input for query argument" in str(exc):  # asyncpg's text when its codec refuses a value
            return FatalError(
                f"a bound value does not fit its placeholder: {exc}", error_type=ErrorType.BAD_CONFIGURATION
            )
        condition, error_type = _FATAL_STATES.get(state) or _FATAL_CLASSES.get(state[:2], _OTHER_SERVER_ERROR)
        return FatalError(message, error_type=error_type, details={"sqlstate": state, "condition": condition})
    if isinstance(exc, asyncpg.ClientConfigurationError):
        return FatalError(f"bad connection settings: {exc}", error_type=ErrorType.BAD_CONNECTION)
    if isinstance(exc, asyncpg.InterfaceError):
        text = str(exc)
        # asyncpg's texts for a connection (or pool) that is gone or being torn down.
        if "closed" in text or "pool is closing" in text or "another operation is in progress" in text:
            return TransientError(f"{type(exc).__name__}: {text}", error_type=_NETWORK)
        return FatalError(f"{type(exc).__name__}: {text}", error_type=ErrorType.INTERNAL)
    if isinstance(exc, asyncpg.exceptions.OutdatedSchemaCacheError):
        return TransientError(f"{type(exc).__name__}: {exc}", error_type=_UNAVAILABLE)
    if isinstance(exc, asyncpg.exceptions.ProtocolError):
        return FatalError(f"{type(exc).__name__}: {exc}", error_type=ErrorType.PROTOCOL)
    if isinstance(exc, asyncpg.exceptions.InternalClientError):
        # E.g. "cannot switch to state 12; another operation (2) is in progress": the server
        # sent an unsolicited error (shutdown) and the connection is being torn down.
        return TransientError(f"{type(exc).__name__}: {exc}", error_type=_NETWORK)
    if isinstance(exc, ssl.SSLCertVerificationError) or (
        # asyncpg's text when TLS is required and the server will not speak it.
        isinstance(exc, ConnectionError) and "rejected SSL upgrade" in str(exc)
    ):
        return FatalError(f"TLS setup failed: {exc}", error_type=ErrorType.TLS)
    return None
