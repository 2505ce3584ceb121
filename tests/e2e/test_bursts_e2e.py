"""Every event starts (or joins) a DAG run: bursts on a real Airflow 3.3.2, one triggerer and two.

Airflow queues one run per asset and DAG at a time and gives it the events stored up to the
moment the first of them queued it; an event stored while that run is queued but not yet
created joins no run until another event comes. The kit fires what one look found as one event
and spaces a watcher's events by ``min_event_interval``, so every event is consumed by one run
within seconds, with no further event needed.

For each event trigger kind (S3, Postgres, Kafka: items; HTTP and ``as_event_trigger()``: edges)
and each burst size, the test makes the burst happen at once (edges: one transition every
other poll, the fastest a watcher that looks every poll can see them, each state held until
the watcher's saved watermark shows it was seen) and counts the events
fired, the events consumed, the runs created, and the seconds from the last item to the
creation of the run that consumed it. First with one triggerer, then with two holding the
watchers between them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scripts import services
from scripts.airflow_local import ROUTINE_LINES, LocalAirflow
from tests.e2e.event_deployment import EventDeployment
from tests.e2e.metadata import (
    items_of,
    query,
    running_triggerers,
    set_batch,
    wait_for,
    watcher_holders,
    watermarks,
)

pytestmark = pytest.mark.e2e

DAGS = Path(__file__).parent / "burst_dags"
ITEM_KINDS = ("adk_burst_s3", "adk_burst_pg", "adk_burst_kafka")
EDGE_KINDS = ("adk_burst_http", "adk_burst_condition")
KINDS = ITEM_KINDS + EDGE_KINDS
#: Burst sizes of the item watchers: objects, rows, messages made at once.
ITEM_SIZES = (1, 2, 3, 10, 1000)
#: Transitions of the edge watchers. One look sees at most one, so a burst of them lasts a
#: poll each; a thousand would take a thousand looks and say nothing the ten do not.
EDGE_SIZES = (1, 2, 3, 10)
#: With two triggerers: a single item, a burst that one look finds, one that takes several
#: looks (the sizes in between were shown with one triggerer; what two add is the split).
ITEM_SIZES_TWO = (1, 10, 1000)
EDGE_SIZES_TWO = (1, 3)
#: Seconds a state is held, so that a watcher looking every second sees each transition.
EDGE_HOLD = 2.5
#: The documented bound (docs/events.md): poll_interval (1) + min_event_interval (5) + the
#: scheduler's loop, with a margin for a busy 2-core machine.
BOUND = 30.0


@dataclasses.dataclass
class Bursts:
    airflow: LocalAirflow
    dsn: str
    postgres: services.Postgres
    s3: Any
    bootstrap: str
    api_url: str
    bucket: str
    table: str
    topic: str
    batch: str
    flag: Path

    def query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        return query(self.dsn, sql, *args)

    def events(self, asset: str) -> list[tuple[int, list[dict[str, Any]]]]:
        """``(asset event id, items)`` of every event of ``asset``, oldest first."""
        rows = self.query(
            "SELECT e.id, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id WHERE a.name = %s ORDER BY e.id",
            asset,
        )
        out = []
        for event_id, extra in rows:
            document = extra if isinstance(extra, dict) else json.loads(extra)
            out.append((int(event_id), items_of(document.get("payload") or {})))
        return out

    def consumers(self, asset: str) -> dict[int, list[tuple[int, float]]]:
        """For each consumed event of ``asset``: the runs of its consumer that hold it, with when each was created."""
        rows = self.query(
            "SELECT l.event_id, r.id, extract(epoch FROM r.queued_at) FROM dagrun_asset_event l "
            "JOIN dag_run r ON r.id = l.dag_run_id WHERE r.dag_id = %s",
            f"{asset}_consumer",
        )
        runs: dict[int, list[tuple[int, float]]] = {}
        for event_id, run_id, queued in rows:
            runs.setdefault(int(event_id), []).append((int(run_id), float(queued)))
        return runs

    def run_count(self, asset: str) -> int:
        return int(self.query("SELECT count(*) FROM dag_run WHERE dag_id = %s", f"{asset}_consumer")[0][0])

    def holders(self) -> Counter[int | None]:
        return watcher_holders(self.dsn)

    def trigger_rows(self) -> list[tuple[Any, ...]]:
        """Every trigger row, with its holder and the watcher it serves (``None``: none any more)."""
        return self.query(
            "SELECT t.id, t.triggerer_id, w.name FROM trigger t LEFT JOIN asset_watcher w ON w.trigger_id = t.id "
            "ORDER BY t.id"
        )

    # ---------------------------------------------------------------- making things happen
    def make(self, asset: str, tag: str, size: int) -> float:
        """Make a burst of ``size`` happen on ``asset``'s upstream; when its last item was made."""
        if asset == "adk_burst_s3":
            keys = [f"burst/{tag}-{i:04d}.csv" for i in range(size)]
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda key: self.s3.put_object(Bucket=self.bucket, Key=key, Body=b"1\n"), keys))
        elif asset == "adk_burst_pg":
            self.postgres.psql(
                f"INSERT INTO {self.table} (dataset) SELECT '{tag}-' || lpad(i::text, 4, '0') "
                f"FROM generate_series(0, {size - 1}) i"
            )
        elif asset == "adk_burst_kafka":
            asyncio.run(self._produce(tag, size))
        else:
            made = time.time()
            for _ in range(size):
                made = self._hold_edge(asset, True)
                self._hold_edge(asset, False)
            return made  # the last transition to ready
        return time.time()

    def _hold_edge(self, asset: str, ready: bool) -> float:
        """Make ``asset``'s condition ``ready`` and hold it until its watcher has seen it; when it was made.

        Each state is held at least :data:`EDGE_HOLD` (two looks), and then until the watcher's
        saved watermark says it: a look delayed by a busy loop (the item watchers' bursts run on
        the same triggerer at the same time) would otherwise miss a state, which is what an edge
        watcher is documented to do, not what this test is about.
        """
        self._edge(asset, ready)
        made = time.time()
        time.sleep(EDGE_HOLD)
        wait_for(
            f"{asset}'s watcher seeing its condition {'true' if ready else 'false'}",
            lambda: (watermarks(self.dsn, asset).get(asset) or {}).get("ready") is ready,
            timeout=60,
        )
        return made

    def _edge(self, asset: str, ready: bool) -> None:
        if asset == "adk_burst_http":
            set_batch(self.api_url, self.batch, "ready" if ready else "pending")
        elif ready:
            self.flag.touch()
        else:
            self.flag.unlink(missing_ok=True)

    async def _produce(self, tag: str, size: int) -> None:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=5)
        await producer.start()
        try:
            sent = [await producer.send(self.topic, json.dumps({"id": f"{tag}-{i:04d}"}).encode()) for i in range(size)]
            await producer.flush()
            await asyncio.gather(*sent)
        finally:
            await producer.stop()

    def tagged(self, asset: str, tag: str) -> list[tuple[int, dict[str, Any]]]:
        """``(asset event id, item)`` of the items of the burst ``tag`` (edges: every item after it started)."""
        found = []
        for event_id, items in self.events(asset):
            for item in items:
                if asset == "adk_burst_s3":
                    mine = str(item.get("key", "")).startswith(f"burst/{tag}-")
                elif asset == "adk_burst_pg":
                    mine = str((item.get("row") or {}).get("dataset", "")).startswith(f"{tag}-")
                elif asset == "adk_burst_kafka":
                    mine = str((item.get("value") or {}).get("id", "")).startswith(f"{tag}-")
                else:
                    mine = True
                if mine:
                    found.append((event_id, item))
        return found


@dataclasses.dataclass
class Outcome:
    asset: str
    size: int
    items: int
    fired: int
    consumed: int
    runs: int
    seconds: float

    def line(self) -> str:
        return (
            f"{self.asset:<20} {self.size:>5} items: {self.items:>5} fired in {self.fired:>3} events, "
            f"{self.consumed:>3} consumed by {self.runs:>3} runs, last item -> its run {self.seconds:5.1f}s"
        )


def burst(world: Bursts, asset: str, size: int, triggerers: int) -> Outcome:
    """One burst on ``asset``: made, fired, every event consumed by one run; what it took."""
    tag = f"t{triggerers}-n{size}-{uuid.uuid4().hex[:6]}"
    edges_before = {event_id for event_id, _ in world.events(asset)} if asset in EDGE_KINDS else set()
    last = world.make(asset, tag, size)

    def mine() -> list[tuple[int, dict[str, Any]]]:
        return [(e, item) for e, item in world.tagged(asset, tag) if e not in edges_before]

    def complete() -> list[tuple[int, dict[str, Any]]] | None:
        found = mine()
        return found if len(found) >= size else None

    fired = wait_for(f"{size} items of {asset}", complete, timeout=120)
    ids = {event_id for event_id, _ in fired}

    def all_consumed() -> dict[int, list[tuple[int, float]]] | None:
        runs = world.consumers(asset)
        return runs if ids <= set(runs) else None

    try:
        wait_for(f"a run for every event of {asset}'s burst of {size}", all_consumed, timeout=BOUND + 30)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: events {sorted(ids)}, consumed {sorted(world.consumers(asset))}") from exc
    time.sleep(2)  # nothing more fires for this burst
    fired = mine()
    # every item once: none lost, none twice
    assert len(fired) == size, (asset, size, [e for e, _ in fired], world.trigger_rows())
    if asset in ITEM_KINDS:
        assert len({json.dumps(item, sort_keys=True) for _, item in fired}) == size
    consumed = world.consumers(asset)
    assert all(len(consumed[event_id]) == 1 for event_id in ids), consumed  # one run each, never two
    created = max(queued for event_id in ids for _, queued in consumed[event_id])
    return Outcome(
        asset,
        size,
        len(fired),
        len(ids),
        len(ids & set(consumed)),
        len({run for event_id in ids for run, _ in consumed[event_id]}),
        created - last,
    )


def sizes_of(asset: str, triggerers: int) -> tuple[int, ...]:
    if asset in ITEM_KINDS:
        return ITEM_SIZES if triggerers == 1 else ITEM_SIZES_TWO
    return EDGE_SIZES if triggerers == 1 else EDGE_SIZES_TWO


def all_bursts(world: Bursts, triggerers: int) -> list[Outcome]:
    """Every kind's bursts, the kinds side by side (one thread each), the sizes one after another."""
    outcomes: list[Outcome] = []
    errors: list[BaseException] = []

    def kind(asset: str) -> None:
        try:
            for size in sizes_of(asset, triggerers):
                outcomes.append(burst(world, asset, size, triggerers))
        except BaseException as exc:  # reported below, with the others' outcomes
            errors.append(exc)

    threads = [threading.Thread(target=kind, args=(asset,), daemon=True) for asset in KINDS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=900)
    print(f"\n{triggerers} triggerer(s):")
    for outcome in sorted(outcomes, key=lambda o: (o.asset, o.size)):
        print("  " + outcome.line())
    if errors:
        print(f"trigger rows (id, triggerer job, watcher): {world.trigger_rows()}")
        for name in ("triggerer", "triggerer-2"):
            print(f"--- {name} log, without the lines every healthy loop writes ---\n{notable(world, name)}")
        for error in errors[1:]:
            print(f"also: {error}")
        raise errors[0]
    return outcomes


def notable(world: Bursts, component: str) -> str:
    """The last lines of a triggerer's log a failure is explained by: all but the routine ones
    (the test's own report adds every component's warnings and errors, tests/e2e/conftest.py)."""
    lines = [
        line
        for line in world.airflow.log_tail(component, 400_000).splitlines()
        if not any(r in line for r in ROUTINE_LINES)
    ]
    return "\n".join(lines[-80:])


@pytest.fixture(scope="module")
def bursts(event_airflow: EventDeployment) -> Iterator[Bursts]:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    deployment = event_airflow
    names = deployment.names
    table, bucket, topic = names.table("bursts"), names.bucket("bursts"), names.topic("bursts")

    async def create_topic() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=deployment.kafka.bootstrap_servers)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])
        finally:
            await admin.close()

    asyncio.run(create_topic())
    deployment.postgres.psql(f"CREATE TABLE {table} (id serial PRIMARY KEY, dataset text NOT NULL)")
    client = deployment.s3_client()
    client.create_bucket(Bucket=bucket)
    set_batch(deployment.api_url, names.batch("bursts"), "pending")
    world = Bursts(
        deployment.airflow, deployment.dsn, deployment.postgres, client, deployment.kafka.bootstrap_servers,
        deployment.api_url, bucket, table, topic, names.batch("bursts"), deployment.flag,
    )  # fmt: skip
    # A triggerer stopped by the test ends its job at once; the threshold only keeps a busy
    # machine's late heartbeat from handing watchers over in the middle of a burst.
    deployment.restart_triggerers(1, AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD="120")
    files = sorted(DAGS.glob("*.py"))  # the DAGs and the user's own wait module they import
    deployment.install(*files)
    try:
        for asset in KINDS:
            world.airflow.wait_for_dag(f"{asset}_consumer")
        # Each watcher's first look is its starting point, saved once taken.
        wait_for(
            "every watcher's starting point",
            lambda: (
                len(
                    world.query(
                        "SELECT DISTINCT s.asset_id FROM asset_state_store s JOIN asset a ON a.id = s.asset_id "
                        "WHERE a.name = ANY(%s)",
                        list(KINDS),
                    )
                )
                >= len(KINDS)
            ),
            timeout=180,
        )
        yield world
    finally:
        deployment.uninstall(files, [f"{asset}_consumer" for asset in KINDS], KINDS)


def looking(world: Bursts) -> None:
    """Return once every edge watcher is looking again after its adoption.

    An edge watcher sees states, not the moments between them: a condition that became true and
    false again between two looks fires nothing. After an adoption the watcher's first look
    comes only after it read its watermark back, which on a freshly started triggerer waits for
    Airflow to build the in-process API its first request goes through (about 10 s on a busy
    2-core machine). A burst's transition, held 2.5 s, can fall entirely in that gap. So each
    edge's condition is held true until its watcher fires for it, then made false again for
    long enough to be seen; the item watchers need no such proof (their watermark finds what
    was made before they looked).
    """

    def prime(asset: str) -> None:
        before = {event_id for event_id, _ in world.events(asset)}
        world._edge(asset, True)
        try:
            fired = wait_for(
                f"{asset}'s adopted watcher firing for a condition held true",
                lambda: {event_id for event_id, _ in world.events(asset)} - before,
                timeout=120,
            )
        finally:
            world._edge(asset, False)
        # its run is created before the bursts begin, so no burst event waits behind it
        wait_for(f"a run for {asset}'s priming event", lambda: fired <= set(world.consumers(asset)), timeout=BOUND + 30)

    with concurrent.futures.ThreadPoolExecutor(len(EDGE_KINDS)) as pool:
        list(pool.map(prime, EDGE_KINDS))
    time.sleep(EDGE_HOLD)  # the watchers, looking every second, see the conditions false again


def check(outcomes: list[Outcome], triggerers: int) -> None:
    expected = {(asset, size) for asset in KINDS for size in sizes_of(asset, triggerers)}
    assert {(o.asset, o.size) for o in outcomes} == expected
    for outcome in outcomes:
        assert outcome.items == outcome.size, outcome.line()
        assert outcome.consumed == outcome.fired, outcome.line()  # every event in a run
        assert outcome.seconds <= BOUND, outcome.line()
        if outcome.asset in ITEM_KINDS and outcome.size <= 10:
            # Made at once: one look finds them, one event carries them (two if a look fell
            # in the middle of making them).
            assert outcome.fired <= 2, outcome.line()
        if outcome.asset in EDGE_KINDS:
            assert outcome.fired == outcome.size, outcome.line()  # one event per transition


def test_every_event_of_a_burst_is_consumed_within_seconds_with_one_triggerer(bursts: Bursts) -> None:
    check(all_bursts(bursts, triggerers=1), triggerers=1)


def test_every_event_of_a_burst_is_consumed_within_seconds_with_two_triggerers(bursts: Bursts) -> None:
    world = bursts
    [first] = running_triggerers(world.dsn)
    # A second triggerer, then the first stopped and started again: the watchers it held are
    # adopted by the second one until it is full (capacity 3), the rest by the first again.
    world.airflow.extra_env = {**world.airflow.extra_env, "AIRFLOW__TRIGGERER__CAPACITY": "3"}
    world.airflow.start_component("triggerer", name="triggerer-2")
    second = wait_for("a second triggerer job", lambda: [j for j in running_triggerers(world.dsn) if j != first])[0]
    world.airflow.extra_env = {**world.airflow.extra_env, "AIRFLOW__TRIGGERER__CAPACITY": "1000"}
    world.airflow.stop_component("triggerer")
    wait_for("the second triggerer holding three watchers", lambda: world.holders().get(second) == 3, timeout=120)
    world.airflow.start_component("triggerer")

    def shared() -> bool:
        holders, running = world.holders(), set(running_triggerers(world.dsn))
        return set(holders) <= running and len(holders) == 2

    wait_for("both triggerers holding watchers", shared, timeout=120)
    # The metadata DB names a watcher's new holder before the old one stopped running it (at
    # its next state sync): wait until every trigger row (a watcher's, or one that serves none
    # any more and is still run by its holder until Airflow deletes it) stayed put for a while.
    steady = world.trigger_rows()
    end, give_up = time.monotonic() + 8, time.monotonic() + 120
    while time.monotonic() < end:
        time.sleep(0.5)
        if world.trigger_rows() != steady:
            steady, end = world.trigger_rows(), time.monotonic() + 8
        assert time.monotonic() < give_up, f"trigger rows never settled: {steady}"
    assert all(watcher is not None for _, _, watcher in steady), f"triggers that serve no watcher: {steady}"
    assert shared(), f"the watchers moved to one triggerer: {steady}"
    print(f"\nwatchers per triggerer job: {dict(world.holders())}")
    looking(world)
    check(all_bursts(world, triggerers=2), triggerers=2)
