"""Resolve Airflow connections inside the triggerer without blocking its event loop.

Triggers carry only a ``conn_id``; credentials are looked up where the trigger runs, through
Airflow's async connection API, so no secret is ever stored in trigger kwargs.

Two things keep the lookup off the loop's critical path: Airflow's lookup machinery is imported
once in a worker thread (its first import would otherwise stall the loop), and concurrent
lookups of one ``conn_id`` are merged, so a thousand triggers starting together make one lookup
(some secrets backends run on Airflow's single shared sync thread).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from airflow_deferrable_kit._per_loop import PerLoop
from airflow_deferrable_kit.errors import FatalError

if TYPE_CHECKING:
    from airflow.sdk import Connection

_in_flight: PerLoop[dict[str, asyncio.Future[Any]]] = PerLoop(dict)
_imported = False


def _import_lookup_machinery() -> None:
    """Import (and load the secrets backends of) Airflow's lookup path, in a worker thread."""
    import airflow.sdk.definitions.connection
    import airflow.sdk.execution_time.cache
    import airflow.sdk.execution_time.context  # noqa: F401
    import asgiref.sync  # noqa: F401
    from airflow.sdk import BaseHook  # noqa: F401
    from airflow.sdk.execution_time.supervisor import ensure_secrets_backend_loaded

    ensure_secrets_backend_loaded()


async def get_connection(conn_id: str, *, argument: str = "conn_id") -> Connection:
    """Return the Airflow connection ``conn_id``; an unknown id is a fatal, clearly named error."""
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
        raise FatalError(
            f"{argument}={conn_id!r}: no Airflow connection with this id is defined "
            "(create it in the UI, an AIRFLOW_CONN_* variable or a secrets backend)",
            error_type="connection_not_found",
        ) from exc
    return conn


async def _lookup(conn_id: str) -> Connection:
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        return await BaseHook.aget_connection(conn_id)
    except AirflowNotFoundException as exc:
        raise LookupError(conn_id) from exc


async def get_extra(conn: Connection) -> dict[str, Any]:
    """The connection's extra as a dict, read without the blocking secret-masking path."""
    aextra = getattr(conn, "aextra_dejson", None)
    if aextra is not None:
        return dict(await aextra())
    return dict(conn.extra_dejson)
