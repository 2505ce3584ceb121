"""The harness itself: each real service starts on a free 127.0.0.1 port and answers."""

from __future__ import annotations

import asyncio

import asyncpg
from aiobotocore.session import get_session
from aiokafka.admin import AIOKafkaAdminClient

from scripts import services


def test_postgres_answers_sql(postgres_server: services.Postgres) -> None:
    async def query() -> int:
        conn = await asyncpg.connect(postgres_server.dsn)
        try:
            return int(await conn.fetchval("select 40 + 2"))
        finally:
            await conn.close()

    assert postgres_server.dsn.startswith("postgresql://postgres@127.0.0.1:")
    assert asyncio.run(query()) == 42


def test_s3_server_round_trips_an_object(s3_server: services.S3Server) -> None:
    async def put_and_get() -> bytes:
        session = get_session()
        async with session.create_client(
            "s3",
            endpoint_url=s3_server.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
        ) as client:
            await client.create_bucket(Bucket="harness-check")
            await client.put_object(Bucket="harness-check", Key="k", Body=b"hello")
            response = await client.get_object(Bucket="harness-check", Key="k")
            async with response["Body"] as body:
                return bytes(await body.read())

    assert asyncio.run(put_and_get()) == b"hello"


def test_kafka_broker_lists_created_topic(kafka_broker: services.Kafka) -> None:
    from aiokafka.admin import NewTopic

    async def create_and_list() -> list[str]:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap_servers)
        await admin.start()
        try:
            await admin.create_topics([NewTopic("harness-check", num_partitions=1, replication_factor=1)])
            return list(await admin.list_topics())
        finally:
            await admin.close()

    assert "harness-check" in asyncio.run(create_and_list())


def test_missing_postgres_binaries_fail_with_a_clear_message(monkeypatch) -> None:
    import pytest

    monkeypatch.setattr(services.shutil, "which", lambda name: None)
    monkeypatch.setattr(services.Path, "glob", lambda self, pattern: iter(()))
    with pytest.raises(services.ServiceUnavailable, match="initdb, pg_ctl"):
        services.postgres_bindir()
