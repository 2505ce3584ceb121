"""A fleet of triggerers: N S3 waits on a few folders, held by 1, 2 or 4 real Airflow 3.3 triggerers.

The kit shares one listing per S3 folder among the waits on it, within one triggerer process.
Airflow hands each new trigger to whichever triggerer claims it first, so with T triggerers the
waits on one folder spread over up to T processes and the folder is listed up to T times per
round. With ``[triggerer] queues_enabled`` and ``trigger_queue``, the waits of one folder go to
a pool of triggerers (two for failover), and each folder is listed once per pool member.

Each cell: a fresh PostgreSQL metadata DB (a clone of one migrated by ``airflow db migrate``), N
deferred task instances and their trigger rows written directly (in one transaction, as the
Execution API would after N worker deferrals: 10,000 worker starts would measure the executor,
not the triggerers), then T real ``airflow triggerer`` processes started and left to claim them
(Airflow's own claim: 50 per loop, ``[triggerer] max_trigger_to_select_per_loop``). No
scheduler runs: a fired trigger leaves its task instance ``scheduled``, with the commit time in
``scheduled_dttm``. Then:

* ``claim_s``: from the triggerers' start until every trigger is held; ``held``: triggers per
  triggerer (the claim balance); ``running_s``: until every triggerer's runner says it runs
  what it holds (the warm-up counts from there).
* ``--hold`` seconds of steady waiting: the S3 server's requests in it, per round
  (``requests_per_round`` = requests / (hold / poll interval)), and each triggerer's CPU
  (supervisor and runner processes), as % of one core. A listing answers the polls of its
  folder for one reuse window (a tenth of the poll interval, at most 1 s), so with the polls
  spread over the round the least is one listing per second per folder in each triggerer
  holding waits on it: 30 per folder and holder at a 30 s poll.
* the flip: every wait's object put (8 threads), its put time recorded; ``event_p50_s`` /
  ``event_p99_s``: from each object's put to its task instance's ``scheduled_dttm``;
  ``events`` / ``missing`` within ``--events-timeout`` of the last put (the floor: of its
  moment); ``all_events_s``: from the first put to the last event committed.

The floor (a cell ``T:floor``): the same N task instances deferred on Airflow's own
``DateTimeTrigger`` (standard provider), every one firing at one moment ``--floor-after``
seconds after they were written: the CPU of T triggerers holding N triggers that make no
request, and how fast Airflow's triggerer turns N simultaneous events into scheduled task
instances, side by side with the kit's cells in the same session.

Routing (each cell's ``TRIGGERERS:ROUTING[:POOL_SIZE]``): ``none`` (no queue, triggerers
without ``--queues``), or ``queue``: the waits of folder ``j`` carry the queue ``trg-u{j}``,
and the triggerers form pools of ``POOL_SIZE`` (default 2), each pool listing the queues of
its folders (``j % pools``).

Usage::

    PYTHONPATH=. .venv/bin/python -m benchmarks.fleet --n 10000 --folders 4 \\
        --cells 1:none 2:none 4:none 4:queue:2 4:queue:1 --poll-interval 30 --hold 120

Each cell runs in its own quiet window (:func:`benchmarks.quiet.quiet_cell`), with its own
metadata DB and bucket; the servers and the migrated template are shared by the cells. Prints
one JSON line per cell (``--out`` appends them to a file too).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime as dt
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
DAG_ID = "fleet_bench"
RUN_ID = "fleet_run"
UTC = dt.timezone.utc
#: The triggerer's own periodic line: how many triggers its runner has running.
RUNNING = re.compile(r"(\d+) triggers currently running")


def key_of(i: int, folders: int) -> str:
    return f"u{i % folders}/k-{i:05d}.csv"


def queue_of(i: int, folders: int) -> str:
    return f"trg-u{i % folders}"


def pools(triggerers: int, folders: int, pool_size: int) -> list[list[str]]:
    """The queues each triggerer lists: pools of ``pool_size``, folder ``j`` on pool ``j % pools``."""
    count = max(1, triggerers // pool_size)
    return [
        [f"trg-u{j}" for j in range(folders) if j % count == min(t // pool_size, count - 1)] for t in range(triggerers)
    ]


def write_waits(
    dsn: str, bucket: str, n: int, folders: int, poll: float, routed: bool, moment: dt.datetime | None = None
) -> None:
    """N deferred task instances of one run and their S3 triggers, in one transaction.

    Written with Airflow's own table objects, so their Python-side defaults apply as when
    Airflow writes them; the columns given are those the triggerer reads (a task instance
    without ``dag_version_id`` is skipped, one without ``queue`` or ``priority_weight`` stops
    the triggerer) and the kwargs are stored as the Execution API stores a worker's deferral.
    """
    import sqlalchemy as sa
    from airflow.models import import_all_models
    from airflow.models.base import Base
    from airflow.sdk.serde import serialize

    from airflow_deferrable_kit.triggers.s3 import S3KeyTrigger

    import_all_models()
    tables = Base.metadata.tables
    now = dt.datetime.now(UTC)
    deadline = (now + dt.timedelta(days=1)).isoformat()
    version = uuid.uuid4()
    floor = None
    if moment is not None:  # Airflow's own trigger: what the triggerer costs with nothing of ours
        from airflow.providers.standard.triggers.temporal import DateTimeTrigger

        floor = DateTimeTrigger(moment=moment).serialize()
    triggers = []
    for i in range(n):
        if floor is not None:
            classpath, kwargs = floor
        else:
            classpath, kwargs = S3KeyTrigger(
                bucket_key=key_of(i, folders), bucket_name=bucket, aws_conn_id="bench_aws",
                poll_interval=poll, deadline=deadline,
            ).serialize()  # fmt: skip
        triggers.append(
            {
                "classpath": classpath,
                "kwargs": json.dumps(serialize(kwargs)),
                "created_date": now,
                "queue": queue_of(i, folders) if routed else None,
            }
        )
    engine = sa.create_engine(dsn.replace("postgresql://", "postgresql+psycopg2://"))
    try:
        with engine.begin() as connection:
            connection.execute(tables["dag_bundle"].insert().values(name="dags-folder"))
            connection.execute(
                tables["dag"].insert().values(
                    dag_id=DAG_ID, bundle_name="dags-folder", is_stale=False, max_active_tasks=16,
                    max_consecutive_failed_dag_runs=0, has_task_concurrency_limits=False, relative_fileloc="fleet.py",
                )
            )  # fmt: skip
            connection.execute(
                tables["dag_version"]
                .insert()
                .values(id=version, dag_id=DAG_ID, version_number=1, bundle_name="dags-folder", created_at=now)
            )
            connection.execute(
                tables["dag_run"].insert().values(
                    dag_id=DAG_ID, run_id=RUN_ID, run_type="manual", state="running", run_after=now, start_date=now,
                    logical_date=None, data_interval_end=None, created_dag_version_id=version, bundle_version="b",
                )
            )  # fmt: skip
            trigger = tables["trigger"]
            ids = (
                connection.execute(trigger.insert().returning(trigger.c.id, sort_by_parameter_order=True), triggers)
                .scalars()
                .all()
            )
            connection.execute(
                tables["task_instance"].insert(),
                [
                    {
                        "id": uuid.uuid4(), "dag_id": DAG_ID, "task_id": f"wait_{i}", "run_id": RUN_ID,
                        "map_index": -1, "try_number": 1, "max_tries": 0, "state": "deferred",
                        "trigger_id": trigger_id, "trigger_timeout": now + dt.timedelta(days=1),
                        "next_method": "execute_complete", "dag_version_id": version, "priority_weight": 1,
                        "queue": queue_of(i, folders) if routed else "default", "pool": "default_pool",
                        "pool_slots": 1, "operator": "S3KeySensor", "start_date": now,
                    }
                    for i, trigger_id in enumerate(ids)
                ],
            )  # fmt: skip
    finally:
        engine.dispose()


def query(dsn: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    import psycopg2

    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())
    finally:
        conn.close()


def requests_served(endpoint: str) -> int:
    with urllib.request.urlopen(f"{endpoint}/__requests__", timeout=10) as response:
        return int(json.loads(response.read())["requests"])


def running(airflow: Any, name: str) -> int:
    """How many triggers the triggerer ``name`` last said it runs (its runner, not the claim)."""
    found = RUNNING.findall(airflow.log_tail(name, 200_000))
    return int(found[-1]) if found else 0


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + sys) of a process and every process under it."""
    total = 0.0
    with contextlib.suppress(psutil.NoSuchProcess):
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                times = proc.cpu_times()
                total += times.user + times.system
    return total


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextlib.contextmanager
def deployment(pg_dsn: str, endpoint: str, routed: bool, capacity: int) -> Iterator[Any]:
    """A migrated metadata DB of its own and an Airflow home whose triggerers are started by the caller."""
    from scripts.airflow_local import LocalAirflow, clone_migrated
    from scripts.services import free_port

    dags = Path(tempfile.mkdtemp(prefix="adk-fleet-dags-"))
    database = f"fleet_{uuid.uuid4().hex[:8]}"
    import psycopg2

    admin = psycopg2.connect(pg_dsn)
    admin.autocommit = True
    admin.cursor().execute(f"CREATE DATABASE {database}")
    admin.close()
    dsn = pg_dsn.rsplit("/", 1)[0] + f"/{database}"
    connection = {
        "conn_type": "aws",
        "login": "testing",
        "password": "testing",
        "extra": {"endpoint_url": endpoint, "region_name": "us-east-1"},
    }
    airflow = LocalAirflow(
        dags_folder=dags,
        sql_alchemy_conn=dsn.replace("postgresql://", "postgresql+psycopg2://"),
        extra_env={
            "AIRFLOW_CONN_BENCH_AWS": json.dumps(connection),
            "AIRFLOW__TRIGGERER__CAPACITY": str(capacity),
            "AIRFLOW__TRIGGERER__QUEUES_ENABLED": str(routed),
            "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "120",
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
        },
    )
    airflow.home.mkdir(parents=True, exist_ok=True)
    try:
        clone_migrated(airflow.metadata_url, airflow.home, airflow.env, airflow._airflow())
        yield airflow, dsn
    finally:
        for name in list(airflow.processes):
            airflow.stop_component(name)
        shutil.rmtree(airflow.home, ignore_errors=True)
        shutil.rmtree(dags, ignore_errors=True)


def cell(
    args: argparse.Namespace, triggerers: int, routing: str, pool_size: int, pg_dsn: str, endpoint: str, s3: Any
) -> dict[str, Any]:
    """One fleet: ``triggerers`` triggerers, the waits routed (``routing="queue"``) or not, measured."""
    routed, floor = routing == "queue", routing == "floor"
    n, folders, t = args.n, args.folders, triggerers
    bucket = f"fleet-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    result: dict[str, Any] = {
        "bench": "fleet", "kind": "airflow-datetime" if floor else "s3-folders", "n": n, "folders": folders,
        "triggerers": t,
        "routing": routing, "pool_size": pool_size if routed else None, "poll_interval": args.poll_interval,
        "hold_s": args.hold,
    }  # fmt: skip
    # Capacity for every wait on one triggerer: the claim balance is Airflow's, not a cap's.
    with deployment(pg_dsn, endpoint, routed, capacity=n) as (airflow, dsn):
        # The floor's triggers all fire at one moment, late enough for every one to be running.
        moment = dt.datetime.now(UTC) + dt.timedelta(seconds=args.floor_after) if floor else None
        write_waits(dsn, bucket, n, folders, args.poll_interval, routed, moment)
        queues = pools(t, folders, pool_size) if routed else [[] for _ in range(t)]
        result["queues"] = queues
        started = time.monotonic()
        names = []
        for number, listed in enumerate(queues, start=1):
            name = "triggerer" if number == 1 else f"triggerer-{number}"
            airflow.start_component("triggerer", name=name, options=["--queues", ",".join(listed)] if listed else [])
            names.append(name)
        while True:
            (unheld,) = query(dsn, "SELECT count(*) FROM trigger WHERE triggerer_id IS NULL")[0]
            if not unheld:
                break
            if time.monotonic() - started > args.claim_timeout:
                result["error"] = f"{unheld} triggers unclaimed after {args.claim_timeout:.0f}s"
                return result
            for name in names:
                if airflow.processes[name].poll() is not None:
                    result["error"] = f"{name} exited: {airflow.log_tail(name)}"
                    return result
            time.sleep(1)
        result["claim_s"] = round(time.monotonic() - started, 1)
        result["held"] = sorted(
            int(count) for _, count in query(dsn, "SELECT triggerer_id, count(*) FROM trigger GROUP BY triggerer_id")
        )
        # Claimed is not running: each runner builds and starts what its triggerer claimed.
        while sum(running(airflow, name) for name in names) < n:
            if time.monotonic() - started > args.claim_timeout:
                result["error"] = f"only {[running(airflow, name) for name in names]} running"
                return result
            time.sleep(2)
        result["running_s"] = round(time.monotonic() - started, 1)
        time.sleep(args.warmup)  # every wait has made its first poll (a HEAD) and its folder's group formed
        pids = {name: airflow.processes[name].pid for name in names}
        cpu0 = {name: tree_cpu(pid) for name, pid in pids.items()}
        served0, hold0 = requests_served(endpoint), time.monotonic()
        time.sleep(args.hold)
        elapsed = time.monotonic() - hold0
        served = requests_served(endpoint) - served0
        cpu = {name: (tree_cpu(pid) - cpu0[name]) / elapsed * 100 for name, pid in pids.items()}
        result["requests_per_round"] = round(served / (elapsed / args.poll_interval), 2)
        result["cpu_pct_per_triggerer"] = [round(cpu[name], 1) for name in names]
        result["cpu_pct_total"] = round(sum(cpu.values()), 1)

        put_at: dict[str, float] = {}

        def put(i: int) -> None:
            key = key_of(i, folders)
            s3.put_object(Bucket=bucket, Key=key, Body=b"1\n")
            put_at[f"wait_{i}"] = time.time()

        flip0 = time.time()
        if moment is not None:
            if time.time() > moment.timestamp():
                result["error"] = "the moment passed before every trigger ran: raise --floor-after"
                return result
            put_at = {f"wait_{i}": moment.timestamp() for i in range(n)}
        else:
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                list(pool.map(put, range(n)))
        result["flip_s"] = round(time.time() - flip0, 1)
        # From the last put, or from the floor's moment: until it comes there is nothing to wait for.
        deadline = time.monotonic() + max(min(put_at.values()) - time.time(), 0.0) + args.events_timeout
        fired: dict[str, float] = {}
        while time.monotonic() < deadline:
            rows = query(
                dsn,
                "SELECT task_id, extract(epoch FROM scheduled_dttm) FROM task_instance "
                "WHERE dag_id = %s AND state <> 'deferred' AND scheduled_dttm IS NOT NULL",
                DAG_ID,
            )
            fired = {task: float(moment) for task, moment in rows}
            if len(fired) >= n:
                break
            time.sleep(2)
        latencies = [fired[task] - put_at[task] for task in fired if task in put_at]
        result["events"], result["missing"] = len(fired), n - len(fired)
        if fired:  # from the first put (the floor: the moment) to the last event committed
            result["all_events_s"] = round(max(fired.values()) - min(put_at.values()), 1)
        result["event_p50_s"] = round(statistics.median(latencies), 2) if latencies else None
        result["event_p99_s"] = round(percentile(latencies, 0.99) or 0.0, 2) if latencies else None
        for name in names:
            if airflow.processes[name].poll() is not None:
                result.setdefault("exited", []).append(name)
    return result


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    from benchmarks.quiet import quiet_cell
    from benchmarks.triggerer_load import bench_server
    from scripts import services

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--folders", type=int, default=4)
    parser.add_argument(
        "--cells",
        nargs="+",
        default=["1:none", "2:none", "4:none", "4:queue:2", "4:queue:1"],
        help="TRIGGERERS:ROUTING[:POOL_SIZE] per cell, run one after another (routing: none, queue, or floor: "
        "Airflow's own DateTimeTrigger, all firing at one moment)",
    )
    parser.add_argument("--poll-interval", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=45.0)
    parser.add_argument("--hold", type=float, default=120.0)
    parser.add_argument("--floor-after", type=float, default=420.0, help="seconds to the floor cell's moment")
    parser.add_argument("--claim-timeout", type=float, default=900.0)
    parser.add_argument("--events-timeout", type=float, default=300.0)
    parser.add_argument("--allow-busy", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    import botocore.session

    failed = False
    with services.postgres(max_connections=400) as pg, bench_server("s3") as (endpoint, _, _):
        s3 = botocore.session.get_session().create_client(
            "s3", endpoint_url=endpoint, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
        )  # fmt: skip
        for spec in args.cells:
            parts = spec.split(":")
            triggerers, routing = int(parts[0]), parts[1]
            pool_size = int(parts[2]) if len(parts) > 2 else 2
            with quiet_cell(allow_busy=args.allow_busy) as record:
                result = {**cell(args, triggerers, routing, pool_size, pg.dsn, endpoint, s3), **record}
            result["finished_utc"] = dt.datetime.now(UTC).isoformat(timespec="seconds")
            failed = failed or "error" in result
            line = json.dumps(result)
            print(line, flush=True)
            if args.out:
                with args.out.open("a") as handle:
                    handle.write(line + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
