"""`make demo`: the showcase DAG on a real Airflow, against real local services.

Starts PostgreSQL, an S3 API server, a Kafka-protocol broker and the batch API on 127.0.0.1,
then a real Airflow (api-server, scheduler, triggerer, dag-processor; SQLite + LocalExecutor)
whose processes see none of the caller's own Airflow settings. Runs ``deferrable_kit_showcase``;
once its five sensors have deferred, makes each awaited condition true after a delay, and prints
per task when it deferred and resumed, the seconds it held a worker against the seconds it
waited - measured by ``airflow-deferrable-kit audit``'s own code on this Airflow's metadata DB -
with a total, and each payload. Exit 0 if every task succeeded; otherwise 1 with the failing
task's log excerpt. Everything it started is stopped, also on Ctrl-C; with ``--keep`` only once
you press Ctrl-C, so that you can open the UI and audit the run first.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
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

from airflow_deferrable_kit.audit import run_audit  # noqa: E402
from airflow_deferrable_kit.plugins._paths import URL_ROUTE  # noqa: E402
from scripts import services  # noqa: E402
from scripts.airflow_local import PASSWORDS_FILE, LocalAirflow, WatchedRun, local_airflow  # noqa: E402

DAG_ID = "deferrable_kit_showcase"
BUCKET = "adk-demo"
TOPIC = "batch-events"
API_TOKEN = "demo-token"  # a local demo credential, only ever in the connection
#: A pause once every wait has deferred, so that the demo's watcher sees them all waiting.
SETTLE_SECONDS = 1.0
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
        log(up_message(airflow))
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
        # A wait deferred by a worker comes true only once the scheduler has taken in that
        # worker's exit (LocalAirflow.worker_exits: Airflow's own race, the official sensors'
        # too); one that started in the triggerer had no worker.
        from_workers = {task for task in TASKS if watched.first_seen(task, "running") is not None}
        if (
            all(at is not None for at in deferred)
            and not next_action_at[0]
            and from_workers <= show.airflow.worker_exits(DAG_ID, run_id)
        ):
            next_action_at[0] = time.time() + SETTLE_SECONDS
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


def up_message(airflow: LocalAirflow) -> str:
    """Where Airflow is, said so that nobody keeps a URL that dies with the demo."""
    return f"Airflow is up at {airflow.base_url} while the demo runs (--keep keeps it up after the run)"


def report(show: Showcase, watched: WatchedRun) -> list[dict[str, Any]]:
    """One row per task: when it deferred and resumed, the worker seconds it held and the seconds
    it waited, and its payload.

    The seconds come from ``airflow-deferrable-kit audit``'s own measure of this run, read from
    this Airflow's metadata DB: one implementation, and it sees what polling the REST API misses
    (a worker holds its slot from its own start, seconds before a cold API server records it
    running). The deferred/resumed times are when the REST API first showed the change.
    """
    audited = run_audit(show.airflow.metadata_url, dag_ids=[DAG_ID], run_ids=[watched.run_id], days=1)
    measured = {row.key["task_id"]: row.totals for row in audited.rows}
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
        totals = measured.get(task_id)
        payload: Any = None
        with contextlib.suppress(Exception):
            payload = show.airflow.xcom(DAG_ID, watched.run_id, task_id)
        rows.append(
            {
                "task_id": task_id,
                "state": ti.get("state"),
                "deferred_at": deferred_at,
                "resumed_at": resumed_at,
                "worker_seconds": totals.worker if totals else None,
                "waited_seconds": totals.wall if totals else None,
                "worker_runs": totals.worker_runs if totals else None,
                "payload": payload,
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]], start: float, out: Callable[[str], None] = print) -> None:
    """The per-task table with a TOTAL row, what its columns mean, then each task's payload."""

    def clock(at: float | None) -> str:
        return f"+{at - start:.1f}s" if at else "-"

    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    def line(task: str, state: str, deferred: str, resumed: str, worker: str, waited: str, runs: str) -> str:
        return f"{task:<22}  {state:<7}  {deferred:>8}  {resumed:>8}  {worker:>8}  {waited:>8}  {runs:>11}"

    def total(column: str) -> float:
        return sum(row[column] or 0 for row in rows)

    out("")
    out(line("task", "state", "deferred", "resumed", "worker s", "waited s", "worker runs"))
    for row in rows:
        out(
            line(
                row["task_id"],
                str(row["state"]),
                clock(row["deferred_at"]),
                clock(row["resumed_at"]),
                seconds(row["worker_seconds"]),
                seconds(row["waited_seconds"]),
                "-" if row["worker_runs"] is None else str(row["worker_runs"]),
            )
        )
    runs = f"{total('worker_runs'):.0f}"
    out(line("TOTAL", "", "", "", seconds(total("worker_seconds")), seconds(total("waited_seconds")), runs))
    out("")
    out("deferred/resumed: when the REST API first showed the task deferred and then out of it, seconds after")
    out("the run was triggered. worker s: seconds a worker slot was held, measured from this Airflow's metadata")
    out("DB as `airflow-deferrable-kit audit` measures it (from the worker's own start, cold start included);")
    out("waited s: from the task's first start on a worker to its end; worker runs: worker processes it took")
    out("(2: deferred, then resumed on a worker; 1: ended by the triggerer, end_from_trigger=True; 0: started")
    out("and ended by the triggerer, start_from_trigger=True).")
    out("")
    out(saving_sentence(rows))
    out("")
    out("payloads (each task's XCom):")
    for row in rows:
        text = json.dumps(row["payload"])
        out(textwrap.fill(text, 100, initial_indent=f"  {row['task_id']}: ", subsequent_indent="    "))


def saving_sentence(rows: list[dict[str, Any]]) -> str:
    """What deferring saved on this run, in one sentence: worker seconds held against the seconds a
    sensor in poke mode would have held (the whole wait), and the waits that took no worker."""
    held = sum(row["worker_seconds"] or 0 for row in rows)
    waited = sum(row["waited_seconds"] or 0 for row in rows)
    without = [row["task_id"] for row in rows if row["worker_runs"] == 0]
    sentence = (
        f"Saving: these {len(rows)} waits held a worker slot for {held:.1f} s in all; in poke mode each would have "
        f"held one for its whole wait, {waited:.1f} s"
    )
    if held > 0:
        sentence += f" ({waited / held:.0f} times as long)"
    if without:
        sentence += f". {', '.join(without)} never took a worker slot (start_from_trigger=True)"
    return sentence + "."


def waits_page_url(airflow: LocalAirflow) -> str:
    """The kit's Waits page in Airflow's UI (the plugin's nav entry, docs/waits-page.md)."""
    return f"{airflow.base_url}/plugin/{URL_ROUTE}"


def kept_message(airflow: LocalAirflow) -> str:
    """What ``--keep`` leaves running, how to log in, audit it and stop it."""
    user, password = airflow.login()
    console = Path(sys.executable).with_name("airflow-deferrable-kit")
    command = [str(console)] if console.exists() else [sys.executable, "-m", "airflow_deferrable_kit.cli"]
    audit = [*command, "audit", "--sql-alchemy-conn", airflow.metadata_url, "--dag-id", DAG_ID]
    return "\n".join(
        [
            "",
            f"Airflow keeps running at {airflow.base_url} - log in as {user!r}, password {password!r}",
            f"(the password is in {airflow.home / PASSWORDS_FILE}).",
            f"The Waits page (what is deferred, the triggerers, what waiting cost): {waits_page_url(airflow)}",
            f"Audit it: {shlex.join(audit)}",
            f"Stop it: press Ctrl-C here (or run: kill {os.getpid()}); that stops everything the demo",
            f"started and deletes its files, {airflow.home} included.",
        ]
    )


def wait_until_stopped() -> None:
    """Block until Ctrl-C or SIGTERM (both arrive as KeyboardInterrupt, see :func:`main`)."""
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(3600)


def finish(
    airflow: LocalAirflow,
    *,
    keep: bool,
    out: Callable[[str], None] = print,
    until_stopped: Callable[[], None] = wait_until_stopped,
) -> None:
    """After the run: with ``keep``, say how to use what is still running and wait until stopped."""
    if keep:
        out(kept_message(airflow))
        until_stopped()
    else:
        out("Airflow stops with the demo; `make demo ARGS=--keep` keeps it up to browse and audit the run.")


@dataclass
class DemoResult:
    watched: WatchedRun
    rows: list[dict[str, Any]]
    code: int


def run_demo(
    show: Showcase,
    *,
    keep: bool = False,
    delay: float = 3.0,
    log: Callable[[str], None] = print,
    out: Callable[[str], None] = print,
    until_stopped: Callable[[], None] = wait_until_stopped,
) -> DemoResult:
    """What ``make demo`` does once everything is up: run the showcase, print the table, finish."""
    started = time.time()
    watched = run_showcase(show, delay=delay, log=log)
    rows = report(show, watched)
    print_table(rows, min(at for seen in watched.timeline.values() for at, _ in seen), out=out)
    failed = [row for row in rows if row["state"] != "success"]
    code = 0 if watched.run_state == "success" and not failed else 1
    if code == 0:
        out(f"all {len(rows)} waits succeeded in {time.time() - started:.0f}s")
    for row in failed:
        out(f"--- {row['task_id']} ended {row['state']}; log excerpt:")
        out(show.airflow.task_log(DAG_ID, watched.run_id, row["task_id"])[-3000:])
    finish(show.airflow, keep=keep, out=out, until_stopped=until_stopped)
    return DemoResult(watched, rows, code)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--keep",
        action="store_true",
        help="after the run, leave Airflow (and the services it waits on) running until Ctrl-C, "
        "to open its UI and audit the run",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with showcase() as show:
            result = run_demo(show, keep=args.keep)
        if args.keep:
            print("stopped everything the demo started")
        return result.code
    except KeyboardInterrupt:
        print("interrupted: stopped everything the demo started", file=sys.stderr)
        return 130
    except services.ServiceUnavailable as exc:
        print(f"demo could not start: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
