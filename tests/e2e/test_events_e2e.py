"""Event-driven scheduling on a real Airflow: DAGs scheduled on assets whose watchers are the
kit's S3, Postgres and HTTP event triggers, with no sensor task.

* N new objects and N new rows make N asset events each, every one consumed by one DAG run
  of the consumer (several events in one run when they arrive together); the HTTP watcher
  fires once per transition to ready.
* The triggerer is killed (SIGKILL) while objects and rows keep arriving, and another one
  takes the watchers over: nothing is missed, and an event fires twice only if it was stored
  in the moment before the kill, before its watermark could be saved (the documented window).

Runs on the event deployment (tests/e2e/event_deployment.py: a PostgreSQL metadata DB), the
Kafka tests on the HA deployment of the same shape, with a short triggerer health threshold so a
killed triggerer's watchers are adopted within seconds.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from scripts import services
from scripts.airflow_local import LocalAirflow
from scripts.demo import API_TOKEN
from tests.e2e.event_deployment import EventDeployment
from tests.e2e.metadata import (
    events_in_runs,
    items_of,
    query,
    set_batch,
    wait_for,
    watermarks,
)

pytestmark = pytest.mark.e2e

DAGS = Path(__file__).parent / "event_dags"
S3_ASSET, PG_ASSET, HTTP_ASSET = "adk_e2e_s3_files", "adk_e2e_pg_rows", "adk_e2e_http_ready"
#: An event may fire twice if the triggerer dies within this many seconds after it was stored
#: (before the triggerer's next state sync confirmed it and its watermark was saved).
DUPLICATE_WINDOW = 6.0
T = TypeVar("T")


@dataclasses.dataclass
class World:
    airflow: LocalAirflow
    dsn: str  # the metadata DB
    postgres: services.Postgres
    s3: services.S3Server
    api_url: str
    bucket: str
    table: str
    batch: str

    def s3_client(self) -> Any:
        import botocore.session

        return botocore.session.get_session().create_client(
            "s3",
            endpoint_url=self.s3.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id="e2e",
            aws_secret_access_key="e2e",
        )

    def insert_row(self, dataset: str, status: str = "done") -> None:
        self.postgres.psql(f"INSERT INTO {self.table} (dataset, status) VALUES ('{dataset}', '{status}')")

    def set_batch(self, state: str) -> None:
        set_batch(self.api_url, self.batch, state)

    def query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        return query(self.dsn, sql, *args)

    def asset_events(self, asset: str) -> list[tuple[int, dict[str, Any], float]]:
        """``(id, item, stored at)`` of every item the events of ``asset`` carry, oldest first.

        An S3, Postgres or Kafka event carries the items one look found; an edge event is one item.
        """
        rows = self.query(
            "SELECT e.id, e.extra, extract(epoch FROM e.timestamp) FROM asset_event e "
            "JOIN asset a ON a.id = e.asset_id WHERE a.name = %s ORDER BY e.id",
            asset,
        )
        events = []
        for event_id, extra, stored in rows:
            document = extra if isinstance(extra, dict) else json.loads(extra)
            for item in items_of(document.get("payload") or {}):
                events.append((int(event_id), item, float(stored)))
        return events

    def events_in_runs(self, dag_id: str) -> Counter[int]:
        """How many consumer DAG runs each asset event triggered."""
        return events_in_runs(self.dsn, dag_id)

    def watermarks(self) -> dict[str, Any]:
        """Each asset's saved watermark (the state inside the kit's envelope)."""
        return watermarks(self.dsn)


@pytest.fixture(scope="module")
def world(event_airflow: EventDeployment) -> Iterator[World]:
    deployment = event_airflow
    names = deployment.names
    table, bucket, batch = names.table("events"), names.bucket("events"), names.batch("events")
    deployment.postgres.psql(
        f"CREATE TABLE {table} (id serial PRIMARY KEY, dataset text NOT NULL, status text NOT NULL DEFAULT 'done')"
    )
    world = World(
        deployment.airflow, deployment.dsn, deployment.postgres, deployment.s3, deployment.api_url, bucket, table, batch
    )
    world.s3_client().create_bucket(Bucket=bucket)
    # A killed triggerer's watchers are adopted within seconds.
    deployment.restart_triggerers(1, AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD="6")
    deployment.install(DAGS / "e2e_events.py")
    assets = (S3_ASSET, PG_ASSET, HTTP_ASSET)
    try:
        for asset in assets:
            world.airflow.wait_for_dag(f"{asset}_consumer")
        # Each watcher's first look is its starting point, saved once it is taken.
        wait_for("every watcher's starting point", lambda: set(assets) <= set(world.watermarks()), timeout=180)
        yield world
    finally:
        deployment.uninstall([DAGS / "e2e_events.py"], [f"{asset}_consumer" for asset in assets], assets)


def consumed_all(world: World, dag_id: str, ids: set[int]) -> Callable[[], Counter[int] | None]:
    """A probe: the runs each event is in, once every one of ``ids`` is in a run of ``dag_id``."""

    def probe() -> Counter[int] | None:
        runs = world.events_in_runs(dag_id)
        return runs if ids <= set(runs) else None

    return probe


def by_key(events: list[tuple[int, dict[str, Any], float]], field: str, prefix: str) -> dict[str, list[float]]:
    """Times each matching item's events were stored, by the item (an S3 key, a row's dataset)."""
    seen: dict[str, list[float]] = {}
    for _, payload, stored in events:
        value = payload.get(field) if field == "key" else (payload.get("row") or {}).get("dataset")
        if isinstance(value, str) and value.startswith(prefix):
            seen.setdefault(value, []).append(stored)
    return seen


def test_each_new_object_row_and_transition_is_one_asset_event_in_a_dag_run(world: World) -> None:
    client = world.s3_client()
    keys = [f"drop/first-{i}.csv" for i in range(4)]
    for key in keys:
        client.put_object(Bucket=world.bucket, Key=key, Body=b"1,2,3\n")
    client.put_object(Bucket=world.bucket, Key="drop/first-ignored.txt", Body=b"x")
    for i in range(4):
        world.insert_row(f"first-{i}")
    world.insert_row("first-running", status="running")  # not accepted by the watcher's condition
    world.set_batch("ready")

    def complete(asset: str, field: str, prefix: str) -> Callable[[], dict[str, list[float]] | None]:
        def probe() -> dict[str, list[float]] | None:
            found = by_key(world.asset_events(asset), field, prefix)
            return found if len(found) >= 4 else None

        return probe

    s3 = wait_for("four S3 events", complete(S3_ASSET, "key", "drop/first-"))
    wait_for("four Postgres events", complete(PG_ASSET, "row", "first-"))
    http = wait_for("the HTTP event", lambda: world.asset_events(HTTP_ASSET))
    time.sleep(4)  # several more polls: nothing more fires

    assert by_key(world.asset_events(S3_ASSET), "key", "drop/first-") == s3
    assert sorted(s3) == keys and all(len(times) == 1 for times in s3.values())
    pg = by_key(world.asset_events(PG_ASSET), "row", "first-")
    assert sorted(pg) == [f"first-{i}" for i in range(4)] and all(len(times) == 1 for times in pg.values())
    assert len(world.asset_events(HTTP_ASSET)) == len(http) == 1  # ready, and still ready: one event
    [(_, payload, _)] = http
    assert payload["status_code"] == 200 and payload["decision"]["expected"] == "ready"
    assert API_TOKEN not in json.dumps(world.asset_events(HTTP_ASSET))

    # Every asset event is consumed by exactly one consumer run, with no further event needed:
    # what one look found is one event, and a watcher's events are min_event_interval apart.
    burst = {asset: {event_id for event_id, _, _ in world.asset_events(asset)} for asset in (S3_ASSET, PG_ASSET)}
    burst[HTTP_ASSET] = {event_id for event_id, _, _ in http}
    for asset, ids in burst.items():
        dag_id = f"{asset}_consumer"
        consumed = wait_for(f"{dag_id} runs for every event", consumed_all(world, dag_id, ids), timeout=60)
        assert all(consumed[event_id] == 1 for event_id in ids), consumed  # one run each, never two
        runs = world.airflow.api("GET", f"/api/v2/dags/{dag_id}/dagRuns")["dag_runs"]
        assert runs and all(run["run_type"] == "asset_triggered" for run in runs)

    # A second transition: not ready, then ready again.
    world.set_batch("pending")
    time.sleep(3)
    world.set_batch("ready")
    wait_for("the second HTTP event", lambda: len(world.asset_events(HTTP_ASSET)) == 2)


def test_a_killed_triggerer_misses_nothing_and_repeats_only_what_it_had_no_time_to_record(world: World) -> None:
    client = world.s3_client()
    wait_for("the HTTP watcher's ready state saved", lambda: (world.watermarks()[HTTP_ASSET] or {}).get("ready"))
    http_before = len(world.asset_events(HTTP_ASSET))
    made: list[str] = []
    count = 16

    def keep_arriving() -> None:
        for i in range(count):
            client.put_object(Bucket=world.bucket, Key=f"drop/kill-{i:02d}.csv", Body=b"1\n")
            world.insert_row(f"kill-{i:02d}")
            made.append(f"{i:02d}")
            time.sleep(0.7)

    arriving = threading.Thread(target=keep_arriving, daemon=True)
    arriving.start()
    wait_for("the stream flowing", lambda: len(by_key(world.asset_events(S3_ASSET), "key", "drop/kill-")) >= 3)
    victim = world.airflow.processes["triggerer"]
    killed_at = time.time()
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(timeout=30)
    print(f"\nkilled the triggerer after {len(made)} of {count} objects and rows")
    time.sleep(2)
    world.airflow.start_component("triggerer", name="triggerer-2")
    arriving.join(timeout=60)
    assert len(made) == count

    def all_arrived() -> bool:
        s3 = by_key(world.asset_events(S3_ASSET), "key", "drop/kill-")
        pg = by_key(world.asset_events(PG_ASSET), "row", "kill-")
        return len(s3) == count and len(pg) == count

    wait_for("an event for every object and row", all_arrived, timeout=180)
    time.sleep(4)  # a late duplicate would show by now

    for asset, field, prefix in ((S3_ASSET, "key", "drop/kill-"), (PG_ASSET, "row", "kill-")):
        stored = by_key(world.asset_events(asset), field, prefix)
        assert len(stored) == count  # nothing missed
        repeated = {item: times for item, times in stored.items() if len(times) > 1}
        offsets = sorted(round(min(times) - killed_at, 1) for times in repeated.values())
        print(f"{asset}: {count} items, {len(repeated)} fired twice (first stored {offsets} s from the kill)")
        for item, times in repeated.items():
            first = min(times)
            assert len(times) == 2, (item, times)
            # Only an event stored in the moment before the kill, whose watermark was not saved yet.
            assert killed_at - DUPLICATE_WINDOW <= first <= killed_at, (item, first - killed_at)
    # The HTTP watcher was ready before the kill and stayed ready: its last state was kept, so
    # the new triggerer fired nothing for it.
    assert len(world.asset_events(HTTP_ASSET)) == http_before
    assert world.airflow.processes["triggerer-2"].poll() is None


def test_every_copy_of_an_event_carries_the_event_id_of_the_first(world: World) -> None:
    """What a consumer deduplicates on: the repeats after the kill above carry the first copy's ``event_id``."""
    for asset, field in ((S3_ASSET, "key"), (PG_ASSET, "row")):
        ids: dict[str, set[str]] = {}
        for _, payload, _ in world.asset_events(asset):
            item = payload.get("key") if field == "key" else (payload.get("row") or {}).get("dataset")
            ids.setdefault(str(item), set()).add(payload["event_id"])
        assert ids and all(len(event_ids) == 1 for event_ids in ids.values()), ids
    http = [payload["event_id"] for _, payload, _ in world.asset_events(HTTP_ASSET)]
    assert http and len(set(http)) == len(http)  # each transition its own event_id


# ------------------------------------------------------------------------------ Kafka
KAFKA_ASSET = "adk_e2e_kafka_orders"


@dataclasses.dataclass
class KafkaWorld:
    """The event deployment seen from the Kafka watcher's side: its topic and its events."""

    airflow: LocalAirflow
    dsn: str  # the metadata DB
    bootstrap: str
    topic: str

    query = World.query
    asset_events = World.asset_events
    events_in_runs = World.events_in_runs
    watermarks = World.watermarks

    def produce(self, *values: dict[str, Any], partition: int | None = None) -> list[tuple[int, int]]:
        """Send ``values`` as JSON, in order; their (partition, offset)."""
        import asyncio

        from aiokafka import AIOKafkaProducer

        async def send() -> list[tuple[int, int]]:
            producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap)
            await producer.start()
            try:
                sent = [
                    await producer.send_and_wait(self.topic, json.dumps(v).encode(), partition=partition)
                    for v in values
                ]
                return [(meta.partition, meta.offset) for meta in sent]
            finally:
                await producer.stop()

        return asyncio.run(send())

    def fired(self, prefix: str) -> dict[str, list[float]]:
        """Times each message's events were stored, by the message's ``id`` field."""
        seen: dict[str, list[float]] = {}
        for _, payload, stored in self.asset_events(KAFKA_ASSET):
            value = payload.get("value") or {}
            if isinstance(value, dict) and str(value.get("id", "")).startswith(prefix):
                seen.setdefault(value["id"], []).append(stored)
        return seen


@pytest.fixture(scope="module")
def kafka_world(ha_deployment: EventDeployment) -> Iterator[KafkaWorld]:
    # On the HA deployment (the same shape), so that its minutes run beside the event
    # deployment's instead of after them; it comes first there (file order) and leaves one
    # triggerer as it found it.
    import asyncio

    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    deployment = ha_deployment
    topic = deployment.names.topic("kafka")

    async def create_topic() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=deployment.kafka.bootstrap_servers)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])
        finally:
            await admin.close()

    asyncio.run(create_topic())
    world = KafkaWorld(deployment.airflow, deployment.dsn, deployment.kafka.bootstrap_servers, topic)
    deployment.restart_triggerers(1, AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD="6")
    deployment.install(DAGS / "e2e_kafka_events.py")
    try:
        world.airflow.wait_for_dag(f"{KAFKA_ASSET}_consumer")
        # The watcher's first look (the log end of each partition) is its starting point.
        wait_for("the Kafka watcher's starting point", lambda: KAFKA_ASSET in world.watermarks(), timeout=180)
        yield world
    finally:
        deployment.uninstall([DAGS / "e2e_kafka_events.py"], [f"{KAFKA_ASSET}_consumer"], [KAFKA_ASSET])


def test_each_matching_kafka_message_is_one_asset_event_and_one_dag_run(kafka_world: KafkaWorld) -> None:
    world = kafka_world
    made = []
    for i in range(4):  # spaced out, so each event starts a run of its own
        made += world.produce({"kind": "order", "id": f"run-{i}"}, partition=i % 3)
        world.produce({"kind": "refund", "id": f"ignored-{i}"}, partition=i % 3)  # not matched
        time.sleep(5)
    fired = wait_for("four Kafka events", lambda: (f := world.fired("run-")) and len(f) == 4 and f)
    time.sleep(4)  # several more looks: nothing more fires
    assert world.fired("run-") == fired and all(len(times) == 1 for times in fired.values())
    assert not world.fired("ignored-")
    events = world.asset_events(KAFKA_ASSET)
    coordinates = sorted(
        (p["partition"], p["offset"]) for _, p, _ in events if str(p["value"]["id"]).startswith("run-")
    )
    assert coordinates == sorted(made)
    assert all(p["event_id"] == f"{p['topic']}[{p['partition']}]@{p['offset']}" for _, p, _ in events)
    ids = {event_id for event_id, p, _ in events if str(p["value"]["id"]).startswith("run-")}
    dag_id = f"{KAFKA_ASSET}_consumer"
    consumed = wait_for(f"{dag_id} runs for every event", consumed_all(world, dag_id, ids))  # type: ignore[arg-type]
    assert all(consumed[event_id] == 1 for event_id in ids), consumed  # one run each, never two
    runs = world.airflow.api("GET", f"/api/v2/dags/{dag_id}/dagRuns")["dag_runs"]
    assert len(runs) == 4 and all(run["run_type"] == "asset_triggered" for run in runs)
    offsets = world.watermarks()[KAFKA_ASSET]["offsets"][world.topic]
    for partition, offset in made:
        assert offsets[str(partition)] > offset  # saved past every message that fired


def test_a_killed_triggerer_misses_no_kafka_message_and_repeats_only_what_it_had_no_time_to_record(
    kafka_world: KafkaWorld,
) -> None:
    world = kafka_world
    count = 16
    made: list[str] = []

    def keep_arriving() -> None:
        for i in range(count):
            world.produce({"kind": "order", "id": f"kill-{i:02d}"}, partition=i % 3)
            made.append(f"kill-{i:02d}")
            time.sleep(0.7)

    arriving = threading.Thread(target=keep_arriving, daemon=True)
    arriving.start()
    wait_for("the stream flowing", lambda: len(world.fired("kill-")) >= 3)
    victim = world.airflow.processes["triggerer"]
    killed_at = time.time()
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(timeout=30)
    print(f"\nkilled the triggerer after {len(made)} of {count} messages")
    time.sleep(2)
    world.airflow.start_component("triggerer", name="triggerer-2")
    arriving.join(timeout=60)
    assert len(made) == count
    wait_for("an event for every message", lambda: len(world.fired("kill-")) == count, timeout=180)
    time.sleep(4)  # a late duplicate would show by now

    stored = world.fired("kill-")
    assert sorted(stored) == made  # nothing missed
    repeated = {item: times for item, times in stored.items() if len(times) > 1}
    offsets = sorted(round(min(times) - killed_at, 1) for times in repeated.values())
    print(f"{KAFKA_ASSET}: {count} messages, {len(repeated)} fired twice (first stored {offsets} s from the kill)")
    for item, times in repeated.items():
        assert len(times) == 2, (item, times)
        # Only an event stored in the moment before the kill, whose watermark was not saved yet.
        assert killed_at - DUPLICATE_WINDOW <= min(times) <= killed_at, (item, min(times) - killed_at)
    assert world.airflow.processes["triggerer-2"].poll() is None
