"""`make demo`: the showcase DAG on a real Airflow, against real local services.

Starts PostgreSQL, an S3 API server, a Kafka-protocol broker and the batch API on 127.0.0.1,
then a real Airflow (api-server, scheduler, triggerer, dag-processor; SQLite + LocalExecutor).
Runs ``deferrable_kit_showcase``; once its five sensors have deferred, makes each awaited
condition true after a delay, and prints per task when it deferred and resumed, the seconds it
held a worker against the seconds it waited, and its payload. Exit 0 if every task succeeded;
otherwise 1 with the failing task's log excerpt. Everything it started is stopped, also on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scripts import services  # noqa: E402
from scripts.airflow_local import LocalAirflow, WatchedRun, local_airflow  # noqa: E402

DAG_ID = "deferrable_kit_showcase"
BUCKET = "adk-demo"
TOPIC = "batch-events"
API_TOKEN = "demo-token"  # a local demo credential, only ever in the connection
SETTLE_SECONDS = 5.0
TASKS = ("wait_s3_object", "wait_http_batch_ready", "wait_postgres_marker", "wait_kafka_message", "wait_moment")


@dataclass
class Showcase:
    """The local services, the Airflow that waits on them, and how to make each wait come true."""

    airflow: LocalAirflow
    postgres: services.Postgres
    s3: services.S3Server
    kafka: services.Kafka
    batch_api_url: str
    batch: str = "demo"
    made_true: dict[str, float] = field(default_factory=dict)

    # Each action makes one awaited condition true, the way an upstream system would.
    def put_s3_object(self) -> str:
        import botocore.session

        client = botocore.session.get_session().create_client(
            "s3",
            endpoint_url=self.s3.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id="demo",
            aws_secret_access_key="demo",
        )
        key = f"exports/{self.batch}/_SUCCESS"
        client.put_object(Bucket=BUCKET, Key=key, Body=b"42 files\n")
        return f"put s3://{BUCKET}/{key}"

    def mark_http_batch_ready(self) -> str:
        import urllib.request

        body = json.dumps({"state": "ready", "rows": 1234}).encode()
        request = urllib.request.Request(
            f"{self.batch_api_url}/v1/batches/{self.batch}",
            data=body,
            method="PUT",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_TOKEN}"},
        )
        with urllib.request.urlopen(request, timeout=10):
            pass
        return f"PUT /v1/batches/{self.batch} state=ready"

    def insert_marker_row(self) -> str:
        self.postgres.psql(
            f"insert into etl.batch_markers (batch_id, status, row_count) values ('{self.batch}', 'done', 1234)"
        )
        return "insert into etl.batch_markers ... status='done'"

    def produce_kafka_message(self) -> str:
        from aiokafka import AIOKafkaProducer

        async def produce() -> None:
            producer = AIOKafkaProducer(bootstrap_servers=self.kafka.bootstrap_servers)
            await producer.start()
            try:
                value = json.dumps({"batch": self.batch, "rows": 1234}).encode()
                await producer.send_and_wait(TOPIC, value=value, key=f"batch-{self.batch}".encode())
            finally:
                await producer.stop()

        asyncio.run(produce())
        return f"produced key=batch-{self.batch} to {TOPIC}"

    def actions(self) -> list[tuple[str, Callable[[], str]]]:
        return [
            ("wait_s3_object", self.put_s3_object),
            ("wait_http_batch_ready", self.mark_http_batch_ready),
            ("wait_postgres_marker", self.insert_marker_row),
            ("wait_kafka_message", self.produce_kafka_message),
        ]


def connections_env(
    pg: services.Postgres, s3: services.S3Server, kafka: services.Kafka, api_url: str
) -> dict[str, str]:
    host, port = api_url.removeprefix("http://").split(":")
    conns = {
        "S3_DEMO": {
            "conn_type": "aws",
            "login": "demo",
            "password": "demo",
            "extra": {"region_name": "us-east-1", "endpoint_url": s3.endpoint_url},
        },
        "BATCH_API": {
            "conn_type": "http",
            "host": host,
            "port": int(port),
            "schema": "http",
            "password": API_TOKEN,
            "extra": {"auth_type": "bearer"},
        },
        "WAREHOUSE": {
            "conn_type": "postgres",
            "host": "127.0.0.1",
            "port": pg.port,
            "login": "postgres",
            "schema": "postgres",
        },
        "KAFKA_DEFAULT": {"conn_type": "kafka", "extra": {"bootstrap.servers": kafka.bootstrap_servers}},
    }
    return {f"AIRFLOW_CONN_{name}": json.dumps(conn) for name, conn in conns.items()}


def prepare(pg: services.Postgres, s3: services.S3Server, kafka: services.Kafka) -> None:
    """Create what the upstream systems would already have: the table, the bucket, the topic."""
    import botocore.session
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    pg.psql(
        "create schema if not exists etl; create table if not exists etl.batch_markers ("
        "batch_id text not null, status text not null, row_count int, created_at timestamptz default now())"
    )
    botocore.session.get_session().create_client(
        "s3",
        endpoint_url=s3.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="demo",
        aws_secret_access_key="demo",
    ).create_bucket(Bucket=BUCKET)

    async def create_topic() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(TOPIC, num_partitions=1, replication_factor=1)])
        finally:
            await admin.close()

    asyncio.run(create_topic())


@contextlib.contextmanager
def batch_api() -> Iterator[str]:
    port = services.free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "scripts" / "batch_api.py"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--token",
            API_TOKEN,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        services.wait_for_port(port, timeout=30, proc=proc, what="batch API")
        yield f"http://127.0.0.1:{port}"
    finally:
        services.stop_process(proc)


@contextlib.contextmanager
def showcase(
    extra_dags: Sequence[Path] = (),
    *,
    postgres: services.Postgres | None = None,
    s3: services.S3Server | None = None,
    kafka: services.Kafka | None = None,
    log: Callable[[str], None] = print,
) -> Iterator[Showcase]:
    """Start every service (or reuse the ones given) and a real Airflow that sees the showcase DAG.

    ``extra_dags`` are folders whose DAG files are served beside it (the end-to-end tests use this
    to share one Airflow).
    """
    with contextlib.ExitStack() as stack:
        log("starting PostgreSQL, an S3 API server, a Kafka-protocol broker and the batch API on 127.0.0.1 ...")
        pg = postgres or stack.enter_context(services.postgres())
        s3_server = s3 or stack.enter_context(services.s3_server())
        broker = kafka or stack.enter_context(services.kafka())
        api_url = stack.enter_context(batch_api())
        prepare(pg, s3_server, broker)
        dags = Path(tempfile.mkdtemp(prefix="adk-demo-dags-"))
        stack.callback(shutil.rmtree, dags, ignore_errors=True)
        shutil.copy(ROOT / "dags" / "showcase.py", dags / "showcase.py")
        for folder in extra_dags:
            for path in folder.glob("*.py"):
                shutil.copy(path, dags / path.name)
        log("starting Airflow (api-server, scheduler, triggerer, dag-processor) ...")
        airflow = stack.enter_context(local_airflow(dags, connections_env(pg, s3_server, broker, api_url)))
        log(f"Airflow is up at {airflow.base_url}")
        yield Showcase(airflow=airflow, postgres=pg, s3=s3_server, kafka=broker, batch_api_url=api_url)


def run_showcase(
    show: Showcase,
    *,
    delay: float = 3.0,
    log: Callable[[str], None] = print,
    timeout: float = 420,
    on_all_deferred: Callable[[], None] | None = None,
) -> WatchedRun:
    """Trigger the showcase, make each condition true once every wait has deferred, watch it end.

    ``on_all_deferred``, if given, is called once, the first time all five tasks are seen
    deferred and before any condition is made true (tests use it to inspect the trigger table).
    """
    show.airflow.wait_for_dag(DAG_ID)
    started = time.time()
    run_id = show.airflow.trigger(DAG_ID, {"batch": show.batch, "moment_delay_seconds": 30})
    log(f"triggered {DAG_ID} run {run_id}")
    pending = show.actions()
    next_action_at = [0.0]

    def on_change(task_id: str, state: str, previous: str | None) -> None:
        log(f"[{time.time() - started:6.1f}s] {task_id:<24} {previous or '-'} -> {state}")

    def on_tick(watched: WatchedRun) -> None:
        if not pending:
            return
        deferred = [watched.first_seen(task, "deferred") for task in TASKS]
        if all(at is not None for at in deferred) and not next_action_at[0]:
            # Let the scheduler take in every worker's exit after deferring before the first
            # wait comes true: a resume within about a second of the deferral can race Airflow's
            # own bookkeeping of that exit under load.
            next_action_at[0] = max(at for at in deferred if at is not None) + SETTLE_SECONDS
            if on_all_deferred is not None:
                on_all_deferred()
        elif time.time() - started > 180 and not next_action_at[0]:
            next_action_at[0] = time.time()
        if not next_action_at[0] or time.time() < next_action_at[0]:
            return
        task_id, action = pending.pop(0)
        log(f"[{time.time() - started:6.1f}s] making it true for {task_id}: {action()}")
        show.made_true[task_id] = time.time()
        next_action_at[0] = time.time() + delay

    return show.airflow.watch_run(DAG_ID, run_id, timeout=timeout, on_change=on_change, on_tick=on_tick)


def report(show: Showcase, watched: WatchedRun) -> list[dict[str, Any]]:
    """One row per task: deferral times, worker-held vs wall seconds, and the payload."""
    rows = []
    for task_id in TASKS:
        ti = watched.last.get(task_id, {})
        deferred_at = watched.first_seen(task_id, "deferred")
        resumed_at = next(
            (
                at
                for at, state in watched.timeline.get(task_id, [])
                if deferred_at and at > deferred_at and state != "deferred"
            ),
            None,
        )
        first = watched.timeline[task_id][0][0] if watched.timeline.get(task_id) else None
        ended = watched.first_seen(task_id, str(ti.get("state")))
        payload: Any = None
        with contextlib.suppress(Exception):
            payload = show.airflow.xcom(DAG_ID, watched.run_id, task_id)
        rows.append(
            {
                "task_id": task_id,
                "state": ti.get("state"),
                "deferred_at": deferred_at,
                "resumed_at": resumed_at,
                "worker_seconds": watched.seconds_in(task_id, "running", until=ended),
                "wall_seconds": (ended - first) if (ended and first) else None,
                "payload": payload,
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]], start: float, out: Callable[[str], None] = print) -> None:
    def clock(at: float | None) -> str:
        return f"+{at - start:6.1f}s" if at else "     -  "

    out("")
    out(f"{'task':<24} {'state':<8} {'deferred':>9} {'resumed':>9} {'worker s':>9} {'wall s':>8}")
    for row in rows:
        wall = f"{row['wall_seconds']:8.1f}" if row["wall_seconds"] is not None else "       -"
        out(
            f"{row['task_id']:<24} {row['state']!s:<8} {clock(row['deferred_at']):>9} {clock(row['resumed_at']):>9} "
            f"{row['worker_seconds']:9.1f} {wall}"
        )
        out(textwrap.indent(textwrap.fill(json.dumps(row["payload"]), 100), "    payload: "))
    out("")
    out("deferred/resumed: seconds after the run was triggered; worker s: seconds the task was seen running")
    out("on a worker (to ~0.5 s); wall s: from the task's first state to its end.")


def main() -> int:
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    start = time.time()
    try:
        with showcase() as show:
            watched = run_showcase(show)
            rows = report(show, watched)
            print_table(rows, min(at for seen in watched.timeline.values() for at, _ in seen))
            failed = [row for row in rows if row["state"] != "success"]
            if watched.run_state == "success" and not failed:
                print(f"all {len(rows)} waits succeeded in {time.time() - start:.0f}s")
                return 0
            for row in failed:
                print(f"--- {row['task_id']} ended {row['state']}; log excerpt:")
                print(show.airflow.task_log(DAG_ID, watched.run_id, row["task_id"])[-3000:])
            return 1
    except KeyboardInterrupt:
        print("interrupted: stopped everything the demo started", file=sys.stderr)
        return 130
    except services.ServiceUnavailable as exc:
        print(f"demo could not start: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
