"""Fixtures for the Kafka wait: the shared broker, per-test topics, a producer, socket counting,
a task state store and task contexts for retries, and private brokers for the tests that restart
one, require authentication, hold thousands of topics or sit behind an outage proxy."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import subprocess
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

from airflow_deferrable_kit import leases
from airflow_deferrable_kit._kafka import catchup as _kafka_catchup
from airflow_deferrable_kit._kafka import reader as _kafka_reader
from airflow_deferrable_kit._kafka import settings as kafka_settings
from airflow_deferrable_kit._kafka.fanout import TopicReader
from airflow_deferrable_kit._kafka.reader import ConnectionReader
from airflow_deferrable_kit.testing import run_trigger
from airflow_deferrable_kit.triggers.kafka import KafkaMessageTrigger
from scripts import services
from tests.integration.kafka.proxy import OutageProxy
from tests.integration.kafka.tls_terminator import TlsTerminator

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


async def create_topics(bootstrap: str, names: Sequence[str], partitions: int = 1, batch: int = 500) -> list[str]:
    """Create many topics through one admin client, ``batch`` per request (500 take ~0.2 s)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        for start in range(0, len(names), batch):
            chunk = names[start : start + batch]
            await admin.create_topics([NewTopic(n, num_partitions=partitions, replication_factor=1) for n in chunk])
    finally:
        await admin.close()
    return list(names)


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


def make(topic: str | list[str], conn: str, **kwargs: Any) -> KafkaMessageTrigger:
    kwargs.setdefault("poll_interval", 0.1)
    return KafkaMessageTrigger(topics=[topic] if isinstance(topic, str) else topic, kafka_conn_id=conn, **kwargs)


def key_is(value: str, state: str = "success") -> dict[str, Any]:
    return {"state": state, "matcher": "key", "comparator": "equals", "expected": value}


def path_is(path: str, value: Any, state: str = "success", comparator: str = "equals") -> dict[str, Any]:
    return {"state": state, "matcher": "path", "argument": path, "comparator": comparator, "expected": value}


async def produce_elsewhere(bootstrap: str, topic: str, *messages: Message) -> list[tuple[int, int]]:
    """Produce from another thread and loop, so the producer's own work is not measured as ours."""
    return await asyncio.to_thread(asyncio.run, produce(bootstrap, topic, *messages))


async def produce_to_each(bootstrap: str, messages: Sequence[tuple[str, Message]]) -> list[tuple[int, int]]:
    """One message per (topic, message), through one producer in another thread and loop."""

    async def send_all() -> list[tuple[int, int]]:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
        await producer.start()
        try:
            futures = [
                await producer.send(topic, value=_encode(m), key=m.key.encode() if isinstance(m.key, str) else m.key)
                for topic, m in messages
            ]
            return [((meta := await future).partition, meta.offset) for future in futures]
        finally:
            await producer.stop()

    return await asyncio.to_thread(asyncio.run, send_all())


async def waiting(trigger: KafkaMessageTrigger, topic: str) -> asyncio.Future[Any]:
    """Run ``trigger`` to its event in the background; return once it waits on ``topic``'s reader."""
    task = asyncio.ensure_future(run_trigger(trigger, timeout=20))
    await eventually(lambda: trigger._subscription is not None and topic in trigger._subscription.waiter.attached)
    return task


async def recreate_topic(bootstrap: str, name: str, partitions: int) -> None:
    """Grow a topic's partition set: tansu 0.6 has no CreatePartitions, so delete and recreate it;
    the reader sees the new partitions appear, as after a real partition add."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([name])
    finally:
        await admin.close()
    await create_topic(bootstrap, name, partitions=partitions)


def count_consumers(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every consumer the shared readers start from now on (fetch, lookups, catch-up)."""
    started: list[Any] = []
    for module in (_kafka_reader, _kafka_catchup):
        original = module.start_consumer

        async def counting(options: Any, *, _original: Any = original, **kwargs: Any) -> Any:
            consumer = await _original(options, **kwargs)
            started.append(consumer)
            return consumer

        monkeypatch.setattr(module, "start_consumer", counting)
    return started


def connection_for(conn: str) -> ConnectionReader:
    """The shared reader of every wait on ``conn`` in this process."""
    entry = leases._registry()[("kafka-connection", conn)]
    connection = entry.creating.result()
    assert isinstance(connection, ConnectionReader)
    return connection


def reader_for(conn: str, topic: str) -> TopicReader:
    """The hand-out of ``topic`` on ``conn``'s shared reader."""
    return connection_for(conn).topics[topic]


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
    monkeypatch.setattr(kafka_settings, "PARTITION_REFRESH_SECONDS", 0.2)


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


#: Unrelated topics on the crowded broker: a cluster where asking for every topic is expensive.
CROWD = 2000


@pytest.fixture(scope="module")
def crowded_broker() -> Iterator[PrivateBroker]:
    """A broker of this module's own that already holds ``CROWD`` unrelated topics."""
    broker = private_broker()
    broker.start()
    try:
        asyncio.run(create_topics(broker.bootstrap_servers, [f"crowd-{i}" for i in range(CROWD)]))
        yield broker
    finally:
        broker.kill()


@dataclass
class ProxiedBroker:
    """A broker reachable only through an :class:`~tests.integration.kafka.proxy.OutageProxy` or a
    :class:`~tests.integration.kafka.tls_terminator.TlsTerminator` (it advertises the proxy's address, so
    clients never bypass it)."""

    process: subprocess.Popen[bytes]
    proxy: OutageProxy | TlsTerminator

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.proxy.port}"


@pytest.fixture
def proxied_broker() -> Iterator[ProxiedBroker]:
    yield from proxied(OutageProxy(services.free_port()))


def proxied(proxy: OutageProxy | TlsTerminator) -> Iterator[ProxiedBroker]:
    """A private broker behind ``proxy`` (not started yet), advertising the proxy's address."""
    port = proxy.target_port
    proxy.start()
    process = subprocess.Popen(
        [
            str(services.tansu_binary()),
            "broker",
            "--listener-url",
            f"tcp://127.0.0.1:{port}",
            "--advertised-listener-url",
            f"tcp://127.0.0.1:{proxy.port}",
            "--storage-engine",
            "memory://tansu/",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        services.wait_for_port(port, timeout=30, proc=process, what="tansu broker")
        yield ProxiedBroker(process, proxy)
    finally:
        proxy.close()
        services.stop_process(process)


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
