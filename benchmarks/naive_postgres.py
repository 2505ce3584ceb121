"""The naive deferrable Postgres wait: the anchor the kit's Postgres wait is measured against.

No official deferrable SQL or Postgres trigger exists, so the benchmark compares with the
pattern a team writes from Airflow's "Writing deferrable operators" guide: a ``BaseTrigger``
that opens its own asyncpg connection in ``run()``, runs ``SELECT ... WHERE batch_id = $1`` (a
text key, as marker tables have) every poll and sleeps ``poll_interval`` in between. One wait,
one connection, one statement per poll.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

#: Statements every naive trigger of this process has sent (one per poll, by construction).
STATEMENTS = [0]


class NaivePostgresMarkerTrigger(BaseTrigger):
    """Wait for ``SELECT * FROM <table> WHERE batch_id = $1`` to return a row, on a connection of its own."""

    def __init__(self, postgres_conn_id: str, table: str, batch_id: str, poll_interval: float = 30.0) -> None:
        super().__init__()
        self.postgres_conn_id = postgres_conn_id
        self.table = table
        self.batch_id = batch_id
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "postgres_conn_id": self.postgres_conn_id,
                "table": self.table,
                "batch_id": self.batch_id,
                "poll_interval": self.poll_interval,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        import asyncpg
        from airflow.sdk import BaseHook

        conn = await BaseHook.aget_connection(self.postgres_conn_id)
        connection = await asyncpg.connect(
            host=conn.host, port=conn.port, user=conn.login, password=conn.password, database=conn.schema
        )
        try:
            while True:
                STATEMENTS[0] += 1
                row = await connection.fetchrow(f"SELECT * FROM {self.table} WHERE batch_id = $1", self.batch_id)
                if row is not None:
                    yield TriggerEvent({"status": "success", "row": dict(row)})
                    return
                await asyncio.sleep(self.poll_interval)
        finally:
            await connection.close()
