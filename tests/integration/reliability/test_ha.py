"""HA: two copies of one trigger (as two triggerers would run it) both fire the same payload and
leave no trace in the system they watch.

Side effects checked per kind: S3 — the bucket's listing (keys and ETags) is unchanged; HTTP —
the API saw only GET requests; Postgres — no transaction id was assigned anywhere in the cluster
(``pg_snapshot_xmax`` does not move: nothing was written) and the table is unchanged; Kafka — no
consumer group was created (so nothing was committed); DateTime — nothing to touch.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import botocore.session
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from airflow_deferrable_kit.testing import run_trigger

from .conftest import BUCKET, KINDS, TABLE, Waits, World


def observer(kind: str, world: World) -> Callable[[], Awaitable[Any]]:
    """A read-only view of everything the wait could have changed."""

    async def s3() -> Any:
        client = botocore.session.get_session().create_client(
            "s3",
            endpoint_url=world.s3.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id="admin",
            aws_secret_access_key="admin",
        )
        listing = await asyncio.to_thread(client.list_objects_v2, Bucket=BUCKET)
        return sorted((o["Key"], o["ETag"], o["Size"]) for o in listing.get("Contents", []))

    async def http() -> Any:
        return sorted({seen.method for seen in world.http.requests} - {"GET"})

    async def postgres() -> Any:
        conn = await asyncpg.connect(world.postgres.dsn)
        try:
            # The next transaction id to be assigned: it moves only if some session wrote.
            xmax = await conn.fetchval("SELECT pg_snapshot_xmax(pg_current_snapshot())::text")
            rows = await conn.fetch(f"SELECT * FROM {TABLE} ORDER BY batch_id")
            return xmax, [dict(r) for r in rows]
        finally:
            await conn.close()

    async def kafka() -> Any:
        admin = AIOKafkaAdminClient(bootstrap_servers=world.kafka.bootstrap_servers)
        await admin.start()
        try:
            return sorted(map(str, await admin.list_consumer_groups()))
        finally:
            await admin.close()

    async def datetime() -> Any:
        return None

    return {"s3": s3, "http": http, "postgres": postgres, "kafka": kafka, "datetime": datetime}[kind]


@pytest.mark.parametrize("kind", KINDS)
async def test_two_copies_fire_the_same_payload_with_no_side_effect(kind: str, waits: Waits, world: World) -> None:
    look = observer(kind, world)
    _, kwargs = waits.trigger(kind, ready=True).serialize()
    cls = type(waits.trigger(kind, ready=True))
    first, second = cls(**kwargs), cls(**kwargs)
    assert first == second
    before = await look()

    a, b = await asyncio.gather(run_trigger(first, timeout=60), run_trigger(second, timeout=60))

    assert a.payload["status"] == "success", a.payload
    assert json.dumps(a.payload, sort_keys=True, default=str) == json.dumps(b.payload, sort_keys=True, default=str)
    assert await look() == before
