"""Resolve Airflow connections inside the triggerer without blocking its event loop.

Triggers carry only a ``conn_id``; credentials are looked up where the trigger runs, through
Airflow's async connection API, so no secret is ever stored in trigger kwargs.

"Not found" is not final at once: inside the triggerer, Airflow's execution-API secrets backend
answers ``None`` when it cannot reach its supervisor (a triggerer restart, an API blip), which
looks exactly like a missing connection. A miss is therefore retried as a transient error for
:data:`NOT_FOUND_GRACE` seconds from the first miss of that ``conn_id`` in this process; a
connection that really does not exist ends the wait with one clear error when the window closes.

Two things keep the lookup off the loop's critical path: Airflow's lookup machinery is imported
once in a worker thread (its first import would otherwise stall the loop), and concurrent
lookups of one ``conn_id`` are merged, so a thousand triggers starting together make one lookup
(some secrets backends run on Airflow's single shared sync thread).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from airflow_deferrable_kit._per_loop import PerLoop
from airflow_deferrable_kit._redact import register_connection
from airflow_deferrable_kit.errors import ErrorType, FatalError, TransientError

if TYPE_CHECKING:
    from airflow.sdk import Connection

_in_flight: PerLoop[dict[str, asyncio.Future[Any]]] = PerLoop(dict)
_imported = False
#: Seconds a "connection not found" is retried before it is believed (see the module docstring).
NOT_FOUND_GRACE = 30.0
#: When each conn_id was first found missing, until a lookup of it succeeds.
_first_miss: dict[str, float] = {}


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


def _not_found(conn_id: str, argument: str) -> TransientError | FatalError:
    """Transient within the grace window of the first miss, fatal once it has closed."""
    now = _now()
    first = _first_miss.setdefault(conn_id, now)
    if now - first < NOT_FOUND_GRACE:
        return TransientError(
            f"{argument}={conn_id!r}: Airflow found no connection with this id; asking again for up to "
            f"{NOT_FOUND_GRACE:g}s in case Airflow could not be asked (a triggerer restart answers the same way)",
            error_type=ErrorType.UNAVAILABLE,
        )
    return FatalError(
        f"{argument}={conn_id!r}: no Airflow connection with this id is defined "
        f"(still missing {now - first:.0f}s after the first lookup; create it in the UI, an AIRFLOW_CONN_* "
        "variable or a secrets backend)",
        error_type=ErrorType.CONNECTION_NOT_FOUND,
    )


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
