"""Fixtures for the Kafka wait: the shared broker, per-test topics, a producer, socket counting,
a task state store and task contexts for retries, and private brokers for the tests that restart
one or require authentication."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import OffsetAndMetadata

from airflow_deferrable_kit import _kafka_reader
from scripts import services

_names = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}-{next(_names)}"


@dataclass
class Message:
    """What a test produces: value may be a JSON value, raw bytes, or None (a tombstone).

    ``timestamp_ms`` stamps the record as its producer says (Kafka ``CreateTime``), as Kafka
    Streams, Connect or a producer with a slow clock do; by default the producer's clock.
    """

    value: Any = None
    key: str | bytes | None = None
    headers: Sequence[tuple[str, bytes]] = ()
    partition: int | None = None
    raw: bool = False
    timestamp_ms: int | None = None


def hours_ago(hours: float) -> int:
    """Epoch milliseconds ``hours`` before now: a timestamp from a producer whose clock is behind."""
    return int((time.time() - hours * 3600) * 1000)


def _encode(message: Message) -> bytes | None:
    if message.raw or isinstance(message.value, (bytes, type(None))):
        return message.value  # type: ignore[no-any-return]
    return json.dumps(message.value).encode()


async def produce(bootstrap: str, topic: str, *messages: Message) -> list[tuple[int, int]]:
    """Send messages in order; returns (partition, offset) of each."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        futures = []
        for message in messages:
            key = message.key.encode() if isinstance(message.key, str) else message.key
            futures.append(
                await producer.send(
                    topic,
                    value=_encode(message),
                    key=key,
                    headers=list(message.headers),
                    partition=message.partition,
                    timestamp_ms=message.timestamp_ms,
                )
            )
        return [((meta := await future).partition, meta.offset) for future in futures]
    finally:
        await producer.stop()


async def create_topic(bootstrap: str, name: str, partitions: int = 3) -> str:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    finally:
        await admin.close()
    return name


async def commit(bootstrap: str, group: str, topic: str, offsets: Mapping[int, int]) -> None:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = {TopicPartition(topic, p): OffsetAndMetadata(o, "") for p, o in offsets.items()}
        consumer.assign(list(tps))
        await consumer.commit(tps)
    finally:
        await consumer.stop()


async def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        offsets = await admin.list_consumer_group_offsets(group, partitions=tps)
        return {tp.partition: offsets[tp].offset for tp in tps}
    finally:
        await admin.close()


async def eventually(condition: Callable[[], Any], timeout: float = 10.0) -> None:
    """Wait for a state the test can observe (not a timing assertion: fails only if never reached)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition never became true")
        await asyncio.sleep(0.02)


def broker_sockets(port: int) -> int:
    """Established TCP connections from this process to ``port`` (read from /proc, no timing)."""
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as handle:
            next(handle)
            for line in handle:
                fields = line.split()
                remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                if fields[3] == "01" and remote_port == port and fields[9] in inodes:
                    count += 1
    return count


class TaskStateStore:
    """Airflow's task state store as a task sees it (``context["task_state_store"]``), in memory.

    Values go through JSON, as they do through the Execution API; one instance stands for the
    rows of one task instance, shared by all its tries.
    """

    def __init__(self) -> None:
        self.rows: dict[str, str] = {}
        self.retention: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return json.loads(self.rows[key]) if key in self.rows else default

    def set(self, key: str, value: Any, *, retention: Any = None) -> None:
        if value is None:
            raise ValueError("Cannot set value as None")
        self.rows[key] = json.dumps(value)
        self.retention[key] = retention

    def delete(self, key: str) -> None:
        self.rows.pop(key, None)


def task_context(task: Any, store: TaskStateStore | None, *, try_number: int = 1, **overrides: Any) -> dict[str, Any]:
    """The context of one try of ``task`` whose task instance keeps its state in ``store``."""
    from airflow_deferrable_kit.testing import make_context

    context = make_context(task, **overrides)
    context["ti"].try_number = try_number
    if store is not None:
        context["task_state_store"] = store
    return context


def set_connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, bootstrap: str, **extra: Any) -> str:
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}",
        json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": bootstrap, **extra}}),
    )
    return conn_id


@pytest.fixture
def bootstrap(kafka_broker: services.Kafka) -> str:
    return kafka_broker.bootstrap_servers


@pytest.fixture
def kafka_conn(monkeypatch: pytest.MonkeyPatch, bootstrap: str) -> str:
    return set_connection(monkeypatch, "kafka_test", bootstrap)


@pytest.fixture
def topic(bootstrap: str) -> str:
    return asyncio.run(create_topic(bootstrap, unique("wait")))


@pytest.fixture
def fast_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Readers look for new partitions / topics every 0.2 s instead of every 30 s."""
    monkeypatch.setattr(_kafka_reader, "PARTITION_REFRESH_SECONDS", 0.2)


@pytest.fixture
def frozen_gc() -> Iterator[None]:
    """Move the interpreter's objects out of the collector's reach for a loop-blocking test: a full
    collection of Airflow's ~160k objects takes ~0.45 s here and would be reported as a block."""
    import gc

    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


# ----------------------------------------------------------------------- private brokers
#: A tansu broker of a test's own, so it can kill and restart it without disturbing others.
PrivateBroker = services.Kafka


def private_broker(**options: Any) -> services.Kafka:
    return services.Kafka(port=services.free_port(), binary=services.tansu_binary(), **options)


@pytest.fixture
def durable_broker(s3_server: services.S3Server) -> Iterator[PrivateBroker]:
    """A broker whose log survives a restart: tansu's S3 storage on the session's moto server."""
    import boto3

    bucket = unique("tansu")
    boto3.client(
        "s3",
        endpoint_url=s3_server.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    ).create_bucket(Bucket=bucket)
    env = dict(
        os.environ,
        AWS_ENDPOINT=s3_server.endpoint_url,
        AWS_ALLOW_HTTP="true",
        AWS_ACCESS_KEY_ID="test",
        AWS_SECRET_ACCESS_KEY="test",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_REGION="us-east-1",
    )
    broker = private_broker(storage=f"s3://{bucket}/", env=env)
    broker.start()
    try:
        yield broker
    finally:
        broker.kill()


@pytest.fixture
def authenticating_broker() -> Iterator[PrivateBroker]:
    """A broker that requires SASL authentication (and knows no users)."""
    broker = private_broker(extra_args=("--authentication",))
    broker.start()
    try:
        yield broker
    finally:
        broker.kill()
