"""Resolve Airflow connections inside the triggerer without blocking its event loop.

Triggers carry only a ``conn_id``; credentials are looked up where the trigger runs, through
Airflow's async connection API, so no secret is ever stored in trigger kwargs.

"Not found" is not final at once: inside the triggerer, Airflow's execution-API secrets backend
answers ``None`` when it cannot reach its supervisor (a triggerer restart, an API blip), which
looks exactly like a missing connection. A miss is therefore retried as a transient error for
:data:`NOT_FOUND_GRACE` seconds from the first miss of that ``conn_id`` in this process; a
connection that really does not exist ends the wait with one clear error when the window closes.

The window is the triggerer's alone. A worker looks a connection up through its own task
supervisor, as Airflow's own sensors do, and they fail at the first poke on an unknown
``conn_id``; so the sensor's looks in the worker run inside :func:`misses_are_final` and a miss
there is believed at once. (The window could not help there anyway: every reschedule-mode poke is
a fresh process that would start it again, so a typo would wait until the sensor's timeout.)

Two things keep the lookup off the loop's critical path: Airflow's lookup machinery is imported
once in a worker thread (its first import would otherwise stall the loop), and concurrent
lookups of one ``conn_id`` are merged, so a thousand triggers starting together make one lookup
(some secrets backends run on Airflow's single shared sync thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from airflow_deferrable_kit._per_loop import PerLoop
from airflow_deferrable_kit._redact import register_connection
from airflow_deferrable_kit.errors import ErrorType, FatalError, TransientError, WaitError

if TYPE_CHECKING:
    from airflow.sdk import Connection

_in_flight: PerLoop[dict[str, asyncio.Future[Any]]] = PerLoop(dict)
_imported = False
#: Seconds a "connection not found" is retried before it is believed (see the module docstring).
NOT_FOUND_GRACE = 30.0
#: When each conn_id was first found missing, until a lookup of it succeeds.
_first_miss: dict[str, float] = {}
#: Set while the worker looks (see the module docstring): a miss is final at once.
_misses_final: contextvars.ContextVar[bool] = contextvars.ContextVar("misses_final", default=False)


@contextlib.contextmanager
def misses_are_final() -> Iterator[None]:
    """Within this block (and tasks started in it), an unknown ``conn_id`` is a fatal error at once."""
    token = _misses_final.set(True)
    try:
        yield
    finally:
        _misses_final.reset(token)


def _import_lookup_machinery() -> None:
    """Import (and load the secrets backends of) Airflow's lookup path, in a worker thread."""
    import airflow.sdk.definitions.connection
    import airflow.sdk.execution_time.cache
    import airflow.sdk.execution_time.context  # noqa: F401
    import asgiref.sync  # noqa: F401
    from airflow.sdk import BaseHook  # noqa: F401
    from airflow.sdk.execution_time.supervisor import ensure_secrets_backend_loaded

    ensure_secrets_backend_loaded()


async def get_connection(
    conn_id: str, *, argument: str = "conn_id", conn_types: tuple[str, ...] | None = None
) -> Connection:
    """Return the Airflow connection ``conn_id``; an unknown id is a fatal, clearly named error.

    With ``conn_types``, a connection of another type (a Postgres connection given to an HTTP
    wait) is a fatal ``bad_connection`` naming both, instead of an outage retried until the
    deadline. A connection with no type, or the type ``generic``, is accepted as any.
    """
    global _imported
    if not _imported:
        await asyncio.to_thread(_import_lookup_machinery)
        _imported = True
    pending = _in_flight.get()
    lookup = pending.get(conn_id)
    if lookup is None:
        lookup = pending[conn_id] = asyncio.ensure_future(_lookup(conn_id))
        lookup.add_done_callback(lambda _: pending.pop(conn_id, None))
    try:
        conn: Connection = await asyncio.shield(lookup)
    except LookupError as exc:
        raise _not_found(conn_id, argument) from exc
    _first_miss.pop(conn_id, None)
    conn_type = (getattr(conn, "conn_type", None) or "").lower()
    if conn_types is not None and conn_type not in (*conn_types, "", "generic"):
        raise FatalError(
            f"{argument}={conn_id!r} is a connection of type {conn_type!r}; this wait needs one of type "
            + " or ".join(repr(name) for name in conn_types),
            error_type=ErrorType.BAD_CONNECTION,
        )
    return conn


def _now() -> float:
    return time.monotonic()


class ConnectionMissing(TransientError):
    """ "Not found" within the grace window: retried, but never allowed to end as a timeout.

    :meth:`believed` is the error the wait ends with once the miss is believed.
    """

    def __init__(self, message: str, *, conn_id: str, argument: str, grace_left: float) -> None:
        super().__init__(message, error_type=ErrorType.UNAVAILABLE)
        self.conn_id = conn_id
        self.argument = argument
        #: Seconds until the grace window closes, when the error was raised.
        self.grace_left = grace_left

    def believed(self) -> FatalError:
        return _missing(self.conn_id, self.argument, "")


def _missing(conn_id: str, argument: str, since: str) -> FatalError:
    return FatalError(
        f"{argument}={conn_id!r}: no Airflow connection with this id is defined{since} "
        "(create it in the UI, an AIRFLOW_CONN_* variable or a secrets backend)",
        error_type=ErrorType.CONNECTION_NOT_FOUND,
    )


def _not_found(conn_id: str, argument: str) -> TransientError | FatalError:
    """Transient within the grace window of the first miss, fatal once it has closed (or in a worker)."""
    if _misses_final.get():
        return _missing(conn_id, argument, "")
    now = _now()
    first = _first_miss.setdefault(conn_id, now)
    if now - first < NOT_FOUND_GRACE:
        return ConnectionMissing(
            f"{argument}={conn_id!r}: Airflow found no connection with this id; asking again for up to "
            f"{NOT_FOUND_GRACE:g}s in case Airflow could not be asked (a triggerer restart answers the same way)",
            conn_id=conn_id,
            argument=argument,
            grace_left=first + NOT_FOUND_GRACE - now,
        )
    return _missing(conn_id, argument, f" (still missing {now - first:.0f}s after the first lookup)")


def believed_before_deadline(error: WaitError, *, seconds_left: float | None, longest_retry: float) -> WaitError:
    """``error``, or the connection error itself if a miss's grace could outlast the wait.

    The grace exists to ride out a blip, never to turn a typo into a timeout (a skip with
    ``soft_fail``): when the window would not close, and one more lookup be made (a retry sleeps
    at most ``longest_retry``), before the deadline, the miss is believed now. A wait with no
    deadline (an event trigger) keeps the whole window.
    """
    if not isinstance(error, ConnectionMissing) or seconds_left is None:
        return error
    if seconds_left <= error.grace_left + longest_retry:
        return error.believed()
    return error


async def _lookup(conn_id: str) -> Connection:
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = await BaseHook.aget_connection(conn_id)
    except AirflowNotFoundException as exc:
        raise LookupError(conn_id) from exc
    # Its secrets are known from now on, so no payload, message or log line of ours can carry them
    # (the extra's are registered when a client reads it, through get_extra, read once).
    register_connection(conn)
    return conn


async def get_extra(conn: Connection) -> dict[str, Any]:
    """The connection's extra as a dict, read without the blocking secret-masking path."""
    aextra = getattr(conn, "aextra_dejson", None)
    extra = dict(await aextra()) if aextra is not None else dict(conn.extra_dejson)
    register_connection(conn, extra)
    return extra
