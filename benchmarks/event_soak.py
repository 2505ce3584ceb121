"""Event watchers under sustained flow on a real Airflow, the triggerer killed every few minutes.

One S3, one Postgres, one Kafka and one HTTP watcher (benchmarks/dags/event_soak.py) run on a
real Airflow 3.3 with a PostgreSQL metadata DB. For ``--minutes``, a new object, row and message
are made ``--rate`` times a second, and the HTTP batch turns ready every ``--edge-every``
seconds (ready for half of it, pending for the other half: by default longer than a triggerer's
adoption takes, so that every transition is there to be seen by whichever triggerer holds the
watcher; an edge watcher samples a state, and a state undone before anyone looks leaves nothing
to find, for the official ``HttpEventTrigger`` as for the kit's); every ``--kill-every`` seconds
the triggerer is killed (SIGKILL) and another one started at once, which adopts the watchers
once the dead one's heartbeat is older than Airflow's health threshold (30 s, its default).
Then the flow stops and the backlog drains.

What is counted, per kind, from the metadata DB: items made, items delivered (distinct
``event_id``), missing, duplicates (deliveries past the first) and how many of them came within
two minutes after a kill; event latency (an item's asset event stored minus the item made) p50
and p99; watermark lag (sampled every 5 s: seconds since the watcher's watermark was last saved
while the flow runs) p50 and p99.

    python -m benchmarks.event_soak --minutes 30 --kill-every 300 --out benchmarks/event_soak.jsonl

Run it alone on a quiet machine (benchmarks/RESULTS.md, "Method").
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psycopg2

from benchmarks.quiet import quiet_cell
from scripts import services
from tests.e2e.event_deployment import EventDeployment, event_deployment
from tests.e2e.metadata import items_of, query, set_batch, wait_for

DAG = Path(__file__).parent / "dags" / "event_soak.py"
ASSETS = {"s3": "adk_soak_s3", "postgres": "adk_soak_pg", "kafka": "adk_soak_kafka", "http": "adk_soak_http"}
#: Duplicates this long after a kill are "around the kill".
AROUND_KILL = 120.0


def percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


class Flow:
    """Makes the items (and the HTTP transitions) and remembers when each was made."""

    def __init__(self, deployment: EventDeployment, rate: float, edge_every: float) -> None:
        names = deployment.names
        self.deployment = deployment
        self.bucket, self.table = names.bucket("events"), names.table("events")
        self.topic, self.batch = names.topic("kafka"), names.batch("events")
        self.rate, self.edge_every = rate, edge_every
        self.made: dict[str, dict[str, float]] = {kind: {} for kind in ASSETS}
        self.stop = threading.Event()
        self.errors: list[str] = []

    def setup(self) -> None:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic

        self.deployment.s3_client().create_bucket(Bucket=self.bucket)
        self.deployment.postgres.psql(
            f"CREATE TABLE {self.table} (id serial PRIMARY KEY, dataset text NOT NULL, made double precision)"
        )

        async def create_topic() -> None:
            admin = AIOKafkaAdminClient(bootstrap_servers=self.deployment.kafka.bootstrap_servers)
            await admin.start()
            try:
                await admin.create_topics([NewTopic(self.topic, num_partitions=3, replication_factor=1)])
            finally:
                await admin.close()

        asyncio.run(create_topic())
        set_batch(self.deployment.api_url, self.batch, "pending")

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        from aiokafka import AIOKafkaProducer

        s3 = self.deployment.s3_client()
        pg = psycopg2.connect(f"postgresql://postgres@127.0.0.1:{self.deployment.postgres.port}/postgres")
        pg.autocommit = True
        producer = AIOKafkaProducer(bootstrap_servers=self.deployment.kafka.bootstrap_servers)
        await producer.start()
        seq, next_edge, ready = 0, time.time() + self.edge_every, False
        try:
            while not self.stop.is_set():
                started = time.time()
                made = time.time()
                try:
                    key = f"drop/{seq:07d}.csv"
                    s3.put_object(Bucket=self.bucket, Key=key, Body=b"1\n")
                    self.made["s3"][f"s3://{self.bucket}/{key}"] = made
                    with pg.cursor() as cursor:
                        cursor.execute(
                            f"INSERT INTO {self.table} (dataset, made) VALUES (%s, %s) RETURNING id", (str(seq), made)
                        )
                        row_id = cursor.fetchone()[0]
                    self.made["postgres"][f"{self.table}@[{row_id}]"] = made
                    sent = await producer.send_and_wait(self.topic, json.dumps({"seq": seq, "made": made}).encode())
                    self.made["kafka"][f"{self.topic}[{sent.partition}]@{sent.offset}"] = made
                    if time.time() >= next_edge:
                        ready = not ready
                        set_batch(self.deployment.api_url, self.batch, "ready" if ready else "pending")
                        if ready:
                            self.made["http"][f"ready@{time.time()}"] = time.time()
                        next_edge = time.time() + self.edge_every / 2
                except Exception as exc:  # counted and reported, never silently
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                seq += 1
                await asyncio.sleep(max(0.0, 1 / self.rate - (time.time() - started)))
        finally:
            await producer.stop()
            pg.close()


def watermark_ages(dsn: str) -> dict[str, float]:
    rows = query(
        dsn,
        "SELECT a.name, extract(epoch FROM now() - s.updated_at) FROM asset_state_store s "
        "JOIN asset a ON a.id = s.asset_id WHERE a.name = ANY(%s) AND s.key LIKE 'airflow_deferrable_kit/%%'",
        list(ASSETS.values()),
    )
    return {str(name): float(age) for name, age in rows}


def deliveries(dsn: str, asset: str) -> list[tuple[float, dict[str, Any]]]:
    """``(stored at, item)`` of every item of every asset event of ``asset``."""
    rows = query(
        dsn,
        "SELECT extract(epoch FROM e.timestamp), e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
        "WHERE a.name = %s ORDER BY e.id",
        asset,
    )
    out = []
    for stored, extra in rows:
        extra = extra if isinstance(extra, dict) else json.loads(extra)
        out.extend((float(stored), item) for item in items_of(extra.get("payload") or {}))
    return out


def summarise(kind: str, flow: Flow, dsn: str, kills: list[float], lags: list[float]) -> dict[str, Any]:
    got = deliveries(dsn, ASSETS[kind])
    if kind == "http":  # one event per transition to ready: matched to the transition before it
        readies = sorted(flow.made["http"].values())
        latencies = []
        seen_per: list[set[str]] = [set() for _ in readies]  # the events fired in each ready period
        for stored, item in got:
            before = [i for i, t in enumerate(readies) if t <= stored]
            if before:
                latencies.append(stored - readies[before[-1]])
                seen_per[before[-1]].add(str(item.get("event_id")))
        # the same event stored twice, or one transition fired as two events
        duplicates = len(got) - len({item.get("event_id") for _, item in got})
        duplicates += sum(max(0, len(events) - 1) for events in seen_per)
        return {
            "kind": kind, "made": len(readies), "delivered": sum(1 for events in seen_per if events),
            "missing": sum(1 for events in seen_per if not events),
            "duplicates": duplicates, "duplicates_near_kill": None,
            "latency_p50_s": percentile(latencies, 0.5), "latency_p99_s": percentile(latencies, 0.99),
            "watermark_lag_p50_s": percentile(lags, 0.5), "watermark_lag_p99_s": percentile(lags, 0.99),
        }  # fmt: skip
    made = flow.made[kind]
    first: dict[str, float] = {}
    duplicates = near_kill = 0
    for stored, item in got:
        event_id = str(item.get("event_id"))
        if event_id.startswith("s3://"):
            event_id = event_id.split("#", 1)[0]
        if event_id in first:
            duplicates += 1
            near_kill += any(0 <= stored - kill <= AROUND_KILL for kill in kills)
        else:
            first[event_id] = stored
    latencies = [first[event_id] - made[event_id] for event_id in made if event_id in first]
    return {
        "kind": kind, "made": len(made), "delivered": len(set(made) & set(first)),
        "missing": len(set(made) - set(first)), "duplicates": duplicates, "duplicates_near_kill": near_kill,
        "latency_p50_s": percentile(latencies, 0.5), "latency_p99_s": percentile(latencies, 0.99),
        "watermark_lag_p50_s": percentile(lags, 0.5), "watermark_lag_p99_s": percentile(lags, 0.99),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--kill-every", type=float, default=300.0)
    parser.add_argument("--rate", type=float, default=2.0, help="items of each kind made per second")
    parser.add_argument(
        "--edge-every",
        type=float,
        default=100.0,
        help="seconds per HTTP ready/pending cycle (each half outlasts an adoption)",
    )
    parser.add_argument("--drain", type=float, default=300.0, help="seconds to wait for the backlog after the flow")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--allow-busy", action="store_true", help="run on a busy machine (the result says so)")
    args = parser.parse_args()
    started = time.time()
    with (
        quiet_cell(allow_busy=args.allow_busy) as machine,
        services.postgres() as pg,
        services.s3_server() as s3,
        services.kafka() as kafka,
        event_deployment(pg, s3, kafka) as deployment,
    ):
        flow = Flow(deployment, args.rate, args.edge_every)
        flow.setup()
        deployment.restart_triggerers(1, AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD="30")
        deployment.install(DAG)
        for asset in ASSETS.values():
            deployment.airflow.wait_for_dag(f"{asset}_consumer")
        wait_for("every watcher's starting point", lambda: len(watermark_ages(deployment.dsn)) == 4, timeout=300)
        print(f"set up in {time.time() - started:.0f}s; flowing for {args.minutes} min", flush=True)
        thread = threading.Thread(target=flow.run, daemon=True)
        thread.start()
        lags: dict[str, list[float]] = {asset: [] for asset in ASSETS.values()}
        kills: list[float] = []
        end = time.time() + 60 * args.minutes
        next_kill, generation = time.time() + args.kill_every, 1
        while time.time() < end:
            time.sleep(5)
            for asset, age in watermark_ages(deployment.dsn).items():
                lags[asset].append(age)
            if time.time() >= next_kill and time.time() < end - 30:
                name = "triggerer" if generation == 1 else f"triggerer-{generation}"
                process = deployment.airflow.processes.pop(name)
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
                kills.append(time.time())
                generation += 1
                deployment.airflow.start_component("triggerer", name=f"triggerer-{generation}")
                print(f"{dt.datetime.now():%H:%M:%S} killed {name}, started triggerer-{generation}", flush=True)
                next_kill = time.time() + args.kill_every
        flow.stop.set()
        thread.join(timeout=60)
        flow_end = time.time()

        def drained() -> bool:
            return all(
                summarise(kind, flow, deployment.dsn, kills, [])["missing"] == 0 for kind in ASSETS if kind != "http"
            )

        try:
            wait_for("the backlog drained", drained, timeout=args.drain, step=5)
        except AssertionError as exc:
            print(exc, flush=True)
        drain_s = time.time() - flow_end
        results = [summarise(kind, flow, deployment.dsn, kills, lags[ASSETS[kind]]) for kind in ASSETS]
    record = {
        "benchmark": "event_soak", "at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "minutes": args.minutes, "kill_every_s": args.kill_every, "rate_per_s": args.rate, "kills": len(kills),
        "drain_s": round(drain_s, 1), "flow_errors": flow.errors[:5], "flow_error_count": len(flow.errors),
        "cpus": os.cpu_count(), **machine, "results": results,
    }  # fmt: skip
    print(json.dumps(record, indent=1))
    for row in results:
        print(
            " | ".join(
                f"{key}={value:.2f}" if isinstance(value, float) else f"{key}={value}" for key, value in row.items()
            )
        )
    if args.out is not None:
        with args.out.open("a") as out:
            out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
