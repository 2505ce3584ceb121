"""Every kind of wait, built from its sensor, against the real services, with secrets in its connection.

``waits.build(kind, ready=...)`` returns a sensor whose condition already holds (``ready=True``,
so its trigger fires a success event) or never will (``ready=False``, so its trigger keeps
waiting). Each connection carries a recognisable secret, ``s3cr3t-<kind>`` (see ``SECRETS``),
so tests can prove it never reaches trigger kwargs or event payloads.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import botocore.session
import pytest

from airflow_deferrable_kit.sensors.base import DeferrableSensor
from airflow_deferrable_kit.sensors.http import HttpBatchReadySensor
from airflow_deferrable_kit.sensors.kafka import KafkaMessageSensor
from airflow_deferrable_kit.sensors.postgres import PostgresBatchMarkerSensor
from airflow_deferrable_kit.sensors.s3 import S3KeySensor
from airflow_deferrable_kit.sensors.temporal import DateTimeSensor
from airflow_deferrable_kit.testing import assert_defers, make_context
from airflow_deferrable_kit.triggers.base import PollingTrigger
from scripts import services
from tests.integration.http.conftest import Server
from tests.integration.kafka.conftest import Message, create_topic, produce
from tests.integration.reliability import http_api

KINDS = ("s3", "http", "postgres", "kafka", "datetime")
SECRETS = {kind: f"s3cr3t-{kind}" for kind in KINDS}
BUCKET = "adk-reliability"
TABLE = "reliability.batch_markers"


@dataclass
class World:
    """The shared services, prepared once: a bucket, an HTTP API, a marker table, a topic."""

    postgres: services.Postgres
    s3: services.S3Server
    kafka: services.Kafka
    http: Server
    topic: str

    def connections(self) -> dict[str, dict[str, Any]]:
        return {
            "s3": {
                "conn_type": "aws",
                "login": "AKIARELIABILITY",
                "password": SECRETS["s3"],
                "extra": {"region_name": "us-east-1", "endpoint_url": self.s3.endpoint_url},
            },
            "http": {
                "conn_type": "http",
                "host": "127.0.0.1",
                "port": self.http.port,
                "schema": "http",
                "password": SECRETS["http"],
                "extra": {"auth_type": "bearer"},
            },
            "postgres": {
                "conn_type": "postgres",
                "host": "127.0.0.1",
                "port": self.postgres.port,
                "login": "postgres",
                "password": SECRETS["postgres"],  # the test cluster trusts local users; never sent
                "schema": "postgres",
            },
            "kafka": {
                "conn_type": "kafka",
                "login": "reliability",
                "password": SECRETS["kafka"],
                "extra": {"bootstrap.servers": self.kafka.bootstrap_servers},
            },
        }


@pytest.fixture(scope="session")
def world(
    postgres_server: services.Postgres, s3_server: services.S3Server, kafka_broker: services.Kafka
) -> Iterator[World]:
    s3 = botocore.session.get_session().create_client(
        "s3",
        endpoint_url=s3_server.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="admin",
        aws_secret_access_key="admin",
    )
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="ready/_SUCCESS", Body=b"ok")
    postgres_server.psql(
        "create schema if not exists reliability; create table if not exists reliability.batch_markers "
        "(batch_id text not null, status text not null, row_count int);"
        "insert into reliability.batch_markers values ('ready', 'done', 7)"
    )
    topic = f"reliability-{uuid.uuid4().hex[:8]}"
    bootstrap = kafka_broker.bootstrap_servers
    asyncio.run(create_topic(bootstrap, topic, partitions=1))
    asyncio.run(produce(bootstrap, topic, Message(key="ready", value={"rows": 7})))
    http = Server(http_api.handler).start()
    try:
        yield World(postgres=postgres_server, s3=s3_server, kafka=kafka_broker, http=http, topic=topic)
    finally:
        http.stop()


class Waits:
    """Builds sensors of each kind (and their triggers, through the sensor's own deferral)."""

    def __init__(self, world: World, monkeypatch: pytest.MonkeyPatch) -> None:
        self.world = world
        for kind, conn in world.connections().items():
            monkeypatch.setenv(f"AIRFLOW_CONN_REL_{kind.upper()}", json.dumps(conn))

    def sensor(self, kind: str, *, ready: bool, task_id: str | None = None) -> DeferrableSensor:
        common: dict[str, Any] = {
            "task_id": task_id or f"wait_{kind}",
            "deferrable": True,
            "check_before_defer": False,
            "poke_interval": 60,
            "timeout": 3600,
        }
        batch = "ready" if ready else f"pending-{uuid.uuid4().hex[:8]}"
        if kind == "s3":
            return S3KeySensor(bucket_key=f"s3://{BUCKET}/{batch}/_SUCCESS", aws_conn_id="rel_s3", **common)
        if kind == "http":
            return HttpBatchReadySensor(
                http_conn_id="rel_http",
                endpoint=f"v1/batches/{batch}",
                success=[{"path": "state", "equals": "ready"}],
                failure=[{"path": "state", "equals": "failed"}],
                **common,
            )
        if kind == "postgres":
            return PostgresBatchMarkerSensor(
                postgres_conn_id="rel_postgres",
                table=TABLE,
                match={"batch_id": batch},
                status_column="status",
                ready_values=["done"],
                **common,
            )
        if kind == "kafka":
            return KafkaMessageSensor(
                kafka_conn_id="rel_kafka",
                topics=self.world.topic,
                success=[{"key": batch}],
                start_from="earliest",
                **common,
            )
        if kind == "datetime":
            now = dt.datetime.now(dt.timezone.utc)
            target = now - dt.timedelta(seconds=1) if ready else now + dt.timedelta(days=1)
            return DateTimeSensor(target_time=target.isoformat(), **common)
        raise ValueError(kind)

    def trigger(self, kind: str, *, ready: bool) -> PollingTrigger:
        """The trigger the sensor defers with, exactly as a worker would hand it to the triggerer."""
        sensor = self.sensor(kind, ready=ready)
        return assert_defers(sensor, sensor.trigger_class, context=make_context(sensor))


@pytest.fixture
def waits(world: World, monkeypatch: pytest.MonkeyPatch) -> Waits:
    return Waits(world, monkeypatch)


def socket_count() -> int:
    """Open sockets of this process, from /proc/self/fd."""
    from pathlib import Path

    count = 0
    for fd in Path("/proc/self/fd").iterdir():
        try:
            if fd.readlink().as_posix().startswith("socket:"):
                count += 1
        except OSError:
            continue
    return count
