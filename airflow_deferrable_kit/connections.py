"""Resolve Airflow connections inside the triggerer without blocking its event loop.

Triggers carry only a ``conn_id``; credentials are looked up where the trigger runs, through
Airflow's async connection API, so no secret is ever stored in trigger kwargs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_deferrable_kit.payload import FatalError

if TYPE_CHECKING:
    from airflow.sdk import Connection


async def get_connection(conn_id: str, *, argument: str = "conn_id") -> Connection:
    """Return the Airflow connection ``conn_id``; an unknown id is a fatal, clearly named error."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        return await BaseHook.aget_connection(conn_id)
    except AirflowNotFoundException as exc:
        raise FatalError(
            f"{argument}={conn_id!r}: no Airflow connection with this id is defined "
            "(create it in the UI, an AIRFLOW_CONN_* variable or a secrets backend)",
            error_type="connection_not_found",
        ) from exc


async def get_extra(conn: Connection) -> dict[str, Any]:
    """The connection's extra as a dict, read without the blocking secret-masking path."""
    aextra = getattr(conn, "aextra_dejson", None)
    if aextra is not None:
        return dict(await aextra())
    return dict(conn.extra_dejson)
