"""asyncpg plumbing for the Postgres wait, shared by every Postgres trigger in a triggerer.

* :func:`connect_options` turns an Airflow ``postgres`` connection into asyncpg arguments, inside
  the triggerer, so no DSN or password ever travels in trigger kwargs.
* :func:`open_pool` builds the one bounded pool a connection id gets per process: a thousand
  waiting triggers share ``pool_max_size`` server connections (4 by default), and a waiter
  holds one only for the length of its query.
* :class:`ChannelListener` keeps one ``LISTEN`` connection per (connection id, channel) and wakes
  every subscribed waiter on a notification. It is best effort: it reconnects with backoff on
  its own, and polling carries the wait whenever it is down.

asyncpg is imported inside functions only, so this module imports without the ``postgres`` extra.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import shlex
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_deferrable_kit.connections import get_connection, get_extra
from airflow_deferrable_kit.payload import FatalError

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
#: Reconnect backoff of a LISTEN connection: full jitter, capped.
LISTEN_RETRY_BASE = 0.5
LISTEN_RETRY_CAP = 30.0


@dataclass(frozen=True)
class ConnectOptions:
    """asyncpg connect arguments (they hold the password: never log or serialize them)."""

    kwargs: dict[str, Any]
    pool_max_size: int
    where: str

    def __repr__(self) -> str:
        return f"ConnectOptions({self.where}, pool_max_size={self.pool_max_size})"


def _bad(conn_id: str, message: str) -> FatalError:
    return FatalError(f"postgres_conn_id={conn_id!r}: {message}", error_type="bad_connection_config")


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


def options_from_connection(conn_id: str, conn: Connection, extra: dict[str, Any]) -> ConnectOptions:
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
    return ConnectOptions(kwargs=kwargs, pool_max_size=pool_max_size, where=where)


async def connect_options(conn_id: str) -> ConnectOptions:
    """Resolve ``conn_id`` through Airflow's async connection API and map it for asyncpg."""
    conn = await get_connection(conn_id, argument="postgres_conn_id")
    return options_from_connection(conn_id, conn, await get_extra(conn))


async def _init_connection(conn: asyncpg.Connection) -> None:
    """Decode json/jsonb into Python values, so acceptor paths can look inside JSON columns."""
    for name in ("json", "jsonb"):
        await conn.set_type_codec(name, encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def open_pool(conn_id: str) -> asyncpg.Pool:
    """The bounded pool for ``conn_id``. Opens no connection until the first query asks for one."""
    await asyncio.to_thread(__import__, "asyncpg")  # the first import takes ~0.1 s: not on the loop
    import asyncpg

    options = await connect_options(conn_id)
    log.info("Opening a Postgres pool for %s (%s, at most %d connections)", conn_id, options, options.pool_max_size)
    pool: asyncpg.Pool = await asyncpg.create_pool(
        min_size=0,
        max_size=options.pool_max_size,
        init=_init_connection,
        **options.kwargs,
    )
    return pool


async def close_pool(pool: asyncpg.Pool) -> None:
    """Close gracefully, but never let a hung server keep the triggerer's cleanup waiting."""
    try:
        await asyncio.wait_for(pool.close(), timeout=10.0)
    except Exception:
        pool.terminate()


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
        import asyncpg

        failures = 0
        while True:
            conn: asyncpg.Connection | None = None
            lost = asyncio.Event()
            try:
                options = await connect_options(self.conn_id)
                conn = await asyncpg.connect(**options.kwargs)
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
                    "Cannot LISTEN on channel %r (%s): %s: %s; polling continues meanwhile",
                    self.channel,
                    self.conn_id,
                    type(exc).__name__,
                    exc,
                )
            finally:
                if conn is not None:
                    conn.terminate()
            ceiling = min(LISTEN_RETRY_CAP, LISTEN_RETRY_BASE * 2.0 ** min(failures, 10))
            await asyncio.sleep(random.uniform(LISTEN_RETRY_BASE / 2, max(ceiling, LISTEN_RETRY_BASE)))

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
