"""A fleet of triggerers: N waits on one upstream, held by 1, 2 or 4 real Airflow 3.3 triggerers.

The kit shares what waits on one upstream ask within one triggerer process: one listing per S3
folder, one response per identical HTTP request, one statement per Postgres table and round.
Airflow hands each new trigger to whichever triggerer claims it first, so with T triggerers the
waits on one group (a folder, a URL, a table) spread over up to T processes and the group is
asked up to T times per round. With ``[triggerer] queues_enabled`` and ``trigger_queue``, the
waits of one group go to a pool of triggerers (two for failover), and each group is asked once
per pool member.

Kinds (``--kind``), each N waits over ``--groups`` groups (wait ``i`` on group ``i % groups``):

* ``s3``: the kit's ``S3KeyTrigger`` on key ``u{j}/k-{i}.csv``; upstream requests: the S3
  server's; the flip puts every wait's object (8 threads), each its own moment.
* ``http``: ``HttpBatchReadyTrigger`` on ``ready/{j}`` of one batch API (404 until the flip);
  upstream requests: the API's; the flip turns every URL ready at one moment.
* ``postgres``: ``PostgresBatchMarkerTrigger`` on table ``markers_{j}`` for its own batch id;
  upstream requests: statements on the marker tables (``pg_stat_statements`` on the upstream's
  own cluster); the flip inserts every marker in one transaction.
* ``kafka``: ``KafkaMessageTrigger`` on topic ``fleet-{j}`` (4 partitions) for the message
  ``{"id": i}``; the broker counts no requests, so its figure is ``upstream_sockets``; the flip
  produces every wait's message, each its own moment (the broker's acknowledgement).
* ``datetime``: the kit's ``DateTimeTrigger``, no upstream; its moments are planned as the
  floor's are (below: ``--floor-after``, and with ``--flow`` a steady flow of them), so the
  kit's clock waits and Airflow's own run the same schedule.

Every cell reports ``upstream_sockets_per_triggerer``: each triggerer's open connections to the
upstream at the end of the hold (its clients' pools: the kit keeps one client per connection
per triggerer, however many waits it holds).

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
* ``--hold`` seconds of steady waiting: the upstream's requests in it, per round
  (``requests_per_round`` = requests / (hold / poll interval)), and each triggerer's CPU
  (supervisor and runner processes), as % of one core. A shared answer serves the polls of its
  group for one reuse window (a tenth of the poll interval, at most 1 s), so with the polls
  spread over the round the least is one request per second per group in each triggerer
  holding waits on it: 30 per group and holder at a 30 s poll.
* the flip (see the kinds), each wait's moment recorded; ``event_p50_s`` / ``event_p99_s``:
  from a wait's moment to its task instance's ``scheduled_dttm``;
  ``events`` / ``missing`` within ``--events-timeout`` of the last put (the floor: of its
  moment); ``all_events_s``: from the first put to the last event committed.

With ``--flow S`` the flip is a steady flow instead: ``--flow-rate`` waits made true each second
for ``S`` seconds (in wait order, so spread over the groups; an HTTP URL at a time, so with
``--groups`` equal to N one wait each), while the others keep polling. The events, latencies and
``cpu_pct_flow_total`` are those of the flow. Every cell also reports the oldest triggerer
heartbeat seen from the hold on (``heartbeat_age_max_s``, sampled every 2 s; Airflow takes a
triggerer's triggers away past 30 s by default) and the runner's blocked-loop warnings in the
same span (``blocked_warnings``, ``blocked_max_s``).

``--triggerer-cpus K`` limits the triggerers to the last K CPUs (``sched_setaffinity``, inherited
by the runner each forks) and keeps the harness, the metadata DB and the upstream on the others:
one core for a triggerer, as a managed offering's 1-vCPU triggerer has.

The floors, side by side with the kit's cells in the same session: the same N task instances
deferred on Airflow's own ``DateTimeTrigger`` (standard provider).

* ``T:idle``, its moment a day away: each trigger sleeps an hour at a time and logs nothing in
  the hold, so the CPU is what T triggerers cost holding N triggers that do nothing (Airflow's
  runner floor). Nothing fires; no event is measured.
* ``T:floor``, every one firing at one moment ``--floor-after`` seconds after they were
  written: how fast Airflow's triggerer turns N simultaneous events into scheduled task
  instances. Its CPU is *not* a floor: in the last two minutes before its moment each
  ``DateTimeTrigger`` wakes and logs every 10 s (every second in the last 20 s), so its hold
  includes Airflow's trigger logging 1,000 lines a second at N=10,000. With ``--flow``, a
  steady flow instead: ``--flow-rate`` moments a second for ``--flow`` seconds from
  ``--floor-after``, the other triggers a day away (how fast Airflow's triggerer stores a steady
  flow of its own events, beside the kit's flow cells).

Routing (each cell's ``TRIGGERERS:ROUTING[:POOL_SIZE]``): ``none`` (no queue, triggerers
without ``--queues``), or ``queue``: the waits of group ``j`` carry the queue ``trg-u{j}``,
and the triggerers form pools of ``POOL_SIZE`` (default 2), each pool listing the queues of
its groups (``j % pools``).

Usage::

    PYTHONPATH=. .venv/bin/python -m benchmarks.fleet --kind http --n 10000 --groups 4 \\
        --cells 1:none 2:none 4:none 4:queue:2 4:queue:1 --poll-interval 30 --hold 120

Each cell runs in its own quiet window (:func:`benchmarks.quiet.quiet_cell`), with its own
metadata DB and its own upstream (a fresh server or cluster); the metadata cluster and its
migrated template are shared by the cells. Prints one JSON line per cell (``--out`` appends
them to a file too). Lines of the S3 kind before the other kinds came name the groups
``folders``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime as dt
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
DAG_ID = "fleet_bench"
RUN_ID = "fleet_run"
UTC = dt.timezone.utc
#: The triggerer's own periodic line: how many triggers its runner has running.
RUNNING = re.compile(r"(\d+) triggers currently running")


def queue_of(i: int, groups: int) -> str:
    return f"trg-u{i % groups}"


def pools(triggerers: int, groups: int, pool_size: int) -> list[list[str]]:
    """The queues each triggerer lists: pools of ``pool_size``, group ``j`` on pool ``j % pools``."""
    count = max(1, triggerers // pool_size)
    return [
        [f"trg-u{j}" for j in range(groups) if j % count == min(t // pool_size, count - 1)] for t in range(triggerers)
    ]


class Upstream:
    """What every wait of one cell is on: its connection, its triggers, its counter and its flip.

    A kind subclasses it (:class:`S3Folders`, :class:`HttpUrls`, :class:`PostgresTables`);
    :func:`upstream` starts a fresh one for each cell, so a flip never leaks into the next.
    """

    kind: str
    #: The ``--kind`` it is, and the load benchmark's name for its connection.
    name: str
    #: The sensor a worker would have deferred from (the task instances' ``operator``).
    operator: str
    #: The upstream server's process (its CPU is reported: on a small machine it can be the limit).
    pid: int | None = None
    #: Whether its waits fire at planned moments (:class:`Moments`) rather than when flipped.
    fires_by_itself = False

    def __init__(self, endpoint: str, groups: int, poll: float) -> None:
        self.endpoint, self.groups, self.poll = endpoint, groups, poll
        self.deadline = (dt.datetime.now(UTC) + dt.timedelta(days=1)).isoformat()

    def connections(self) -> dict[str, str]:
        """``AIRFLOW_CONN_*`` variables the triggerers need: the load benchmark's own."""
        from benchmarks.triggerer_load import connections

        return connections(self.name, "kit", self.endpoint, 0)

    def trigger(self, i: int) -> Any:
        """Wait ``i``'s trigger, on group ``i % groups``."""
        raise NotImplementedError

    def served(self) -> int:
        """Requests (statements) the upstream has answered so far for the waits."""
        return requests_served(self.endpoint)

    def port(self) -> int:
        """The upstream's TCP port (the last ``:port`` of its endpoint, URL, DSN or bootstrap address)."""
        found = re.findall(r":(\d+)(?=/|$)", self.endpoint)
        return int(found[-1])

    def served_by_method(self) -> dict[str, int]:
        """The requests of :meth:`served` by HTTP method (S3: ``HEAD`` and listing ``GET``s); ``{}`` if not HTTP."""
        return requests_by_method(self.endpoint)

    def flip(self, n: int) -> dict[str, float]:
        """Make every wait's condition true; each task id -> the moment its condition came true."""
        raise NotImplementedError

    def flip_some(self, waits: list[int], n: int) -> dict[str, float]:
        """Make the conditions of ``waits`` (of ``n``) true, for a steady flow of events; as :meth:`flip`."""
        raise NotImplementedError


class S3Folders(Upstream):
    kind, name, operator = "s3-folders", "s3", "S3KeySensor"

    def __init__(self, endpoint: str, groups: int, poll: float) -> None:
        import botocore.session

        super().__init__(endpoint, groups, poll)
        self.bucket = f"fleet-{uuid.uuid4().hex[:8]}"
        self.s3 = botocore.session.get_session().create_client(
            "s3", endpoint_url=endpoint, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
        )  # fmt: skip
        self.s3.create_bucket(Bucket=self.bucket)

    def key(self, i: int) -> str:
        return f"u{i % self.groups}/k-{i:05d}.csv"

    def trigger(self, i: int) -> Any:
        from airflow_deferrable_kit.triggers.s3 import S3KeyTrigger

        return S3KeyTrigger(
            bucket_key=self.key(i), bucket_name=self.bucket, aws_conn_id="bench_aws",
            poll_interval=self.poll, deadline=self.deadline,
        )  # fmt: skip

    def flip(self, n: int) -> dict[str, float]:
        return self.flip_some(list(range(n)), n)

    def flip_some(self, waits: list[int], n: int) -> dict[str, float]:
        put_at: dict[str, float] = {}

        def put(i: int) -> None:
            self.s3.put_object(Bucket=self.bucket, Key=self.key(i), Body=b"1\n")
            put_at[f"wait_{i}"] = time.time()

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(put, waits))
        return put_at


class HttpUrls(Upstream):
    kind, name, operator = "http-urls", "http", "HttpBatchReadySensor"

    def trigger(self, i: int) -> Any:
        from airflow_deferrable_kit.triggers.http import HttpBatchReadyTrigger

        return HttpBatchReadyTrigger(
            http_conn_id="bench_http", endpoint=f"ready/{i % self.groups}", poll_interval=self.poll,
            deadline=self.deadline,
        )  # fmt: skip

    def flip(self, n: int) -> dict[str, float]:
        request = urllib.request.Request(f"{self.endpoint}/flip", method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            ready_at = float(json.loads(response.read())["ready_at"])
        return {f"wait_{i}": ready_at for i in range(n)}

    def flip_some(self, waits: list[int], n: int) -> dict[str, float]:
        """Turn the URLs of ``waits`` ready one by one: every wait on a flipped URL fires."""
        urls: dict[int, float] = {}
        for j in sorted({i % self.groups for i in waits}):
            request = urllib.request.Request(f"{self.endpoint}/flip/{j}", method="POST")
            with urllib.request.urlopen(request, timeout=30) as response:
                urls[j] = float(json.loads(response.read())["ready_at"])
        return {f"wait_{i}": at for j, at in urls.items() for i in range(j, n, self.groups)}


class PostgresTables(Upstream):
    kind, name, operator = "postgres-tables", "postgres", "PostgresBatchMarkerSensor"

    def __init__(self, endpoint: str, groups: int, poll: float) -> None:
        super().__init__(endpoint, groups, poll)
        for j in range(groups):
            query(endpoint, f"CREATE TABLE markers_{j} (batch_id text PRIMARY KEY, state text NOT NULL)", fetch=False)
        query(endpoint, "SELECT pg_stat_statements_reset()")

    def trigger(self, i: int) -> Any:
        from airflow_deferrable_kit.triggers.postgres import PostgresBatchMarkerTrigger
        from benchmarks.triggerer_load import marker_key

        return PostgresBatchMarkerTrigger(
            postgres_conn_id="bench_pg", table=f"markers_{i % self.groups}", match={"batch_id": marker_key(i)},
            poll_interval=self.poll, deadline=self.deadline,
        )  # fmt: skip

    def served(self) -> int:
        """The waits' statements (selects on a marker table) the server has run, as it counts them."""
        rows = query(
            self.endpoint,
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements "
            "WHERE query ILIKE 'select%' AND query LIKE '%markers\\_%'",
        )
        return int(rows[0][0])

    def served_by_method(self) -> dict[str, int]:
        return {}  # statements, not HTTP requests

    def flip(self, n: int) -> dict[str, float]:
        statements = [
            f"INSERT INTO markers_{j} SELECT 'batch-' || lpad(g::text, 6, '0'), 'ready' "
            f"FROM generate_series(0, {n - 1}) g WHERE g % {self.groups} = {j}"
            for j in range(self.groups)
        ]
        query(self.endpoint, "; ".join(statements), fetch=False)  # one transaction: every marker at once
        committed = time.time()
        return {f"wait_{i}": committed for i in range(n)}

    def flip_some(self, waits: list[int], n: int) -> dict[str, float]:
        """The markers of ``waits``, in one transaction."""
        from benchmarks.triggerer_load import marker_key

        statements = [f"INSERT INTO markers_{i % self.groups} VALUES ('{marker_key(i)}', 'ready')" for i in waits]
        query(self.endpoint, "; ".join(statements), fetch=False)
        committed = time.time()
        return {f"wait_{i}": committed for i in waits}


class KafkaTopics(Upstream):
    """Waits on ``--groups`` topics (4 partitions each), wait ``i`` for the message ``{"id": i}``.

    The broker has no request counter: what is reported per round is 0, and the figure that
    shows the sharing is each triggerer's open sockets to the broker (``upstream_sockets``):
    the kit reads a connection's topics through one reader per triggerer, not one per wait.
    """

    kind, name, operator = "kafka-topics", "kafka", "KafkaMessageSensor"
    partitions = 4

    def __init__(self, endpoint: str, groups: int, poll: float) -> None:
        import asyncio
        import threading

        super().__init__(endpoint, groups, poll)
        self.start_ms = int((time.time() - 60) * 1000)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="fleet-kafka-producer", daemon=True).start()
        self.producer = self._run(self._start())

    def _run(self, coroutine: Any) -> Any:
        import asyncio

        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=120)

    def topic(self, i: int) -> str:
        return f"fleet-{i % self.groups}"

    async def _start(self) -> Any:
        from aiokafka import AIOKafkaProducer
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic

        admin = AIOKafkaAdminClient(bootstrap_servers=self.endpoint, request_timeout_ms=120_000)
        await admin.start()
        try:
            topics = [NewTopic(f"fleet-{j}", self.partitions, replication_factor=1) for j in range(self.groups)]
            await admin.create_topics(topics)
        finally:
            await admin.close()
        producer = AIOKafkaProducer(bootstrap_servers=self.endpoint, linger_ms=5)
        await producer.start()
        for j in range(self.groups):  # something for every reader to skip
            await producer.send_and_wait(f"fleet-{j}", json.dumps({"id": -1 - j}).encode())
        return producer

    def trigger(self, i: int) -> Any:
        from airflow_deferrable_kit.triggers.kafka import KafkaMessageTrigger

        return KafkaMessageTrigger(
            topics=[self.topic(i)], kafka_conn_id="bench_kafka", start_after_ms=self.start_ms,
            acceptors=[
                {"state": "success", "matcher": "path", "argument": "id", "comparator": "equals", "expected": i}
            ],
            poll_interval=self.poll, deadline=self.deadline,
        )  # fmt: skip

    def served(self) -> int:
        return 0

    def served_by_method(self) -> dict[str, int]:
        return {}

    def flip(self, n: int) -> dict[str, float]:
        return self.flip_some(list(range(n)), n)

    def flip_some(self, waits: list[int], n: int) -> dict[str, float]:
        """Produce each wait's message; its moment is when the broker acknowledged it."""

        async def send() -> dict[str, float]:
            import asyncio

            acked: dict[str, float] = {}

            def stamp(i: int) -> Callable[[Any], None]:
                return lambda _: acked.__setitem__(f"wait_{i}", time.time())

            futures = []
            for i in waits:
                future = await self.producer.send(self.topic(i), json.dumps({"id": i}).encode())
                future.add_done_callback(stamp(i))
                futures.append(future)
            await asyncio.gather(*futures)
            return acked

        return dict(self._run(send()))

    def close(self) -> None:
        self._run(self.producer.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)


class Moments(Upstream):
    """The kit's ``DateTimeTrigger``: no upstream, each wait's moment planned when it is written.

    Its waits fire by themselves, as Airflow's own floor does: :func:`measure` plans the moments
    (``--floor-after`` from now; with ``--flow``, ``--flow-rate`` of them a second, the others a
    day away) and each wait's moment is its flip. Nothing is asked of any server, so requests
    and upstream sockets are 0; the figures are the triggerers' CPU and the event latency.
    """

    kind, name, operator = "kit-datetime", "datetime", "DateTimeSensor"
    fires_by_itself = True

    def connections(self) -> dict[str, str]:
        return {}

    def trigger_at(self, moment: dt.datetime) -> Any:
        from airflow_deferrable_kit.triggers.temporal import DateTimeTrigger

        return DateTimeTrigger(target_time=moment.isoformat(), poll_interval=self.poll)

    def served(self) -> int:
        return 0

    def served_by_method(self) -> dict[str, int]:
        return {}

    def port(self) -> int:
        return 0  # no upstream: no socket is to it


KINDS: dict[str, type[Upstream]] = {
    kind.name: kind for kind in (S3Folders, HttpUrls, PostgresTables, KafkaTopics, Moments)
}


@contextlib.contextmanager
def upstream(kind: str, groups: int, poll: float) -> Iterator[Upstream]:
    """A fresh upstream of ``kind`` for one cell: its own server (or cluster), stopped after."""
    from benchmarks.triggerer_load import bench_server, servers

    if kind == "postgres":
        with servers("postgres") as (dsn, pid):
            up: Upstream = PostgresTables(dsn, groups, poll)
            up.pid = pid
            yield up
    elif kind == "datetime":
        yield Moments("", groups, poll)
    elif kind == "kafka":
        with servers("kafka") as (bootstrap, pid):
            kafka = KafkaTopics(bootstrap, groups, poll)
            kafka.pid = pid
            try:
                yield kafka
            finally:
                kafka.close()
    else:
        with bench_server(kind) as (endpoint, _, pid):
            up = KINDS[kind](endpoint, groups, poll)
            up.pid = pid
            yield up


def write_waits(
    dsn: str, up: Upstream, n: int, routed: bool, moments: list[dt.datetime] | None = None, airflows: bool = True
) -> None:
    """N deferred task instances of one run and their triggers on ``up``, in one transaction.

    Written with Airflow's own table objects, so their Python-side defaults apply as when
    Airflow writes them; the columns given are those the triggerer reads (a task instance
    without ``dag_version_id`` is skipped, one without ``queue`` or ``priority_weight`` stops
    the triggerer) and the kwargs are stored as the Execution API stores a worker's deferral.
    With ``moments`` (one per wait), every trigger is Airflow's own ``DateTimeTrigger`` instead (the
    floor), or with ``airflows=False`` the kit's (``up.trigger_at``, :class:`Moments`).
    """
    import sqlalchemy as sa
    from airflow.models import import_all_models
    from airflow.models.base import Base
    from airflow.sdk.serde import serialize

    import_all_models()
    tables = Base.metadata.tables
    now = dt.datetime.now(UTC)
    version = uuid.uuid4()
    floors: dict[dt.datetime, str] = {}  # Airflow's own trigger: what the triggerer costs with nothing of ours
    triggers = []
    for i in range(n):
        if moments is None:
            classpath, kwargs = up.trigger(i).serialize()
            stored = json.dumps(serialize(kwargs))
        else:
            from airflow.providers.standard.triggers.temporal import DateTimeTrigger

            if moments[i] not in floors:
                at = DateTimeTrigger(moment=moments[i]) if airflows else up.trigger_at(moments[i])
                classpath, kwargs = at.serialize()
                floors[moments[i]] = json.dumps(serialize(kwargs))
            stored = floors[moments[i]]
        triggers.append(
            {
                "classpath": classpath,
                "kwargs": stored,
                "created_date": now,
                "queue": queue_of(i, up.groups) if routed else None,
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
                        "queue": queue_of(i, up.groups) if routed else "default", "pool": "default_pool",
                        "pool_slots": 1, "operator": up.operator, "start_date": now,
                    }
                    for i, trigger_id in enumerate(ids)
                ],
            )  # fmt: skip
    finally:
        engine.dispose()


def query(dsn: str, sql: str, *args: Any, fetch: bool = True) -> list[tuple[Any, ...]]:
    import psycopg2

    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql, args or None)  # none: a literal % is no placeholder
            return list(cur.fetchall()) if fetch else []
    finally:
        conn.close()


def requests_served(endpoint: str) -> int:
    with urllib.request.urlopen(f"{endpoint}/__requests__", timeout=10) as response:
        return int(json.loads(response.read())["requests"])


def requests_by_method(endpoint: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{endpoint}/__requests__", timeout=10) as response:
        return {method: int(count) for method, count in json.loads(response.read()).get("methods", {}).items()}


def running(airflow: Any, name: str) -> int:
    """How many triggers the triggerer ``name`` last said it runs (its runner, not the claim)."""
    found = RUNNING.findall(airflow.log_tail(name, 200_000))
    return int(found[-1]) if found else 0


def tree(pid: int) -> Iterator[psutil.Process]:
    """A process and every process under it, as they are now (none if it is gone)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        root = psutil.Process(pid)
        yield from [root, *root.children(recursive=True)]


def sockets_to(pid: int, port: int) -> int:
    """Open TCP connections from a process tree to ``port`` on this machine (its clients' pools)."""
    count = 0
    for proc in tree(pid):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            count += sum(1 for c in proc.net_connections(kind="tcp") if c.raddr and c.raddr.port == port)
    return count


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + sys) of a process and every process under it."""
    total = 0.0
    for proc in tree(pid):
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
def on_cpus(count: int) -> Iterator[None]:
    """Processes started inside run on the last ``count`` CPUs (none: no limit); the harness on the rest.

    ``main`` puts the harness (and so the metadata DB and the upstream it starts) on the other
    CPUs, so a triggerer limited to one core shares it with nothing but its own two processes.
    """
    if not count:
        yield
        return
    rest = os.sched_getaffinity(0)
    os.sched_setaffinity(0, triggerer_cpus(count))
    try:
        yield
    finally:
        os.sched_setaffinity(0, rest)


#: The CPUs this harness may use, read before ``main`` narrows its own.
CPUS = sorted(os.sched_getaffinity(0))


def triggerer_cpus(count: int) -> set[int]:
    return set(CPUS[-count:])


def tree_affinity(pids: Any) -> set[int]:
    """Every CPU any process of the given trees may run on (the proof of a limit)."""
    cpus: set[int] = set()
    for pid in pids:
        for proc in tree(pid):
            with contextlib.suppress(psutil.NoSuchProcess):
                cpus |= set(proc.cpu_affinity())
    return cpus


class Machine:
    """How busy each CPU and the upstream server were over a span (from construction to :meth:`report`).

    With the triggerers on their own core, the other cores carry the harness, the metadata DB and
    the upstream: a cell whose other cores are saturated measured the machine, not the triggerer.
    """

    def __init__(self, up: Upstream) -> None:
        self.up, self.start = up, time.monotonic()
        self.cores = psutil.cpu_times(percpu=True)
        self.upstream = tree_cpu(up.pid) if up.pid else None

    def report(self) -> dict[str, Any]:
        elapsed = time.monotonic() - self.start
        busy = []
        for before, after in zip(self.cores, psutil.cpu_times(percpu=True), strict=True):
            total = sum(after) - sum(before)
            idle = (after.idle + after.iowait) - (before.idle + before.iowait)
            busy.append(round(100 * (1 - idle / total), 1) if total > 0 else 0.0)
        out: dict[str, Any] = {"core_busy_pct": busy}
        if self.upstream is not None and self.up.pid:
            out["upstream_cpu_pct"] = round((tree_cpu(self.up.pid) - self.upstream) / elapsed * 100, 1)
        return out


class Heartbeats:
    """The oldest triggerer heartbeat, sampled every 2 s while the harness waits.

    Airflow's scheduler takes a triggerer's triggers away when its heartbeat is older than
    ``[triggerer] triggerer_health_check_threshold`` (30 s by default; the fleet's deployment
    raises it so a slow start-up is no failover): the figure says whether that default held.
    """

    def __init__(self, dsn: str) -> None:
        self.dsn, self.ages = dsn, [0.0]

    def watch(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            ((age,),) = query(
                self.dsn,
                "SELECT coalesce(max(extract(epoch FROM now() - latest_heartbeat)), 0) FROM job "
                "WHERE job_type = 'TriggererJob' AND state = 'running'",
            )
            self.ages.append(float(age))
            time.sleep(min(2.0, max(left, 0.0)))

    def report(self) -> dict[str, Any]:
        return {"heartbeat_age_max_s": round(max(self.ages), 1), "heartbeat_samples": len(self.ages) - 1}


#: Airflow's runner watchdog: its loop missed a 0.1 s sleep by more than the warning threshold.
BLOCKED = re.compile(rb"async thread was blocked for ([\d.]+) seconds")


def blocked_loops(logs: dict[str, Path], start: dict[str, int]) -> dict[str, Any]:
    """How often, and how long at most, each runner's loop was blocked since ``start`` (log offsets)."""
    found: list[float] = []
    for name, path in logs.items():
        with path.open("rb") as handle:
            handle.seek(start[name])
            found += [float(value) for value in BLOCKED.findall(handle.read())]
    return {"blocked_warnings": len(found), "blocked_max_s": round(max(found), 2) if found else 0.0}


def flow(
    args: argparse.Namespace,
    result: dict[str, Any],
    up: Upstream,
    flip: Callable[[list[int]], dict[str, float]],
    health: Heartbeats,
    pids: dict[str, int],
) -> dict[str, float]:
    """A steady flow of events: ``--flow-rate`` waits made true each second for ``--flow`` seconds.

    The other waits keep polling, so this is what a triggerer holding N waits does while a
    steady share of them fires; the CPU of the flow window is reported beside the hold's.
    """
    put_at: dict[str, float] = {}
    cpu0 = {name: tree_cpu(pid) for name, pid in pids.items()}
    machine = Machine(up)
    start, nxt = time.monotonic(), 0
    for second in range(int(args.flow)):
        health.watch(start + second - time.monotonic())
        waits = list(range(nxt, min(nxt + args.flow_rate, result["n"])))
        nxt += len(waits)
        if waits:
            put_at.update(flip(waits))
    health.watch(start + args.flow - time.monotonic())
    elapsed = time.monotonic() - start
    result["flow"] = {"rate_per_s": args.flow_rate, "seconds": args.flow, "waits": len(put_at)}
    spent = sum(tree_cpu(pid) - cpu0[name] for name, pid in pids.items())
    result["cpu_pct_flow_total"] = round(spent / elapsed * 100, 1)
    result["flow_machine"] = machine.report()
    return put_at


@contextlib.contextmanager
def deployment(pg_dsn: str, connections: dict[str, str], routed: bool, capacity: int) -> Iterator[Any]:
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
    airflow = LocalAirflow(
        dags_folder=dags,
        sql_alchemy_conn=dsn.replace("postgresql://", "postgresql+psycopg2://"),
        extra_env={
            **connections,
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


def cell(args: argparse.Namespace, triggerers: int, routing: str, pool_size: int, pg_dsn: str) -> dict[str, Any]:
    """One fleet: ``triggerers`` triggerers, the waits routed (``routing="queue"``) or not, measured."""
    routed = routing == "queue"
    n, groups, t = args.n, args.groups, triggerers
    with upstream(args.kind, groups, args.poll_interval) as up:
        kind = {"floor": "airflow-datetime", "idle": "airflow-datetime-idle"}.get(routing, up.kind)
        result: dict[str, Any] = {
            "bench": "fleet", "kind": kind, "n": n, "groups": groups,
            "triggerers": t, "routing": routing, "pool_size": pool_size if routed else None,
            "poll_interval": args.poll_interval, "hold_s": args.hold,
        }  # fmt: skip
        # Capacity for every wait on one triggerer: the claim balance is Airflow's, not a cap's.
        with deployment(pg_dsn, up.connections(), routed, capacity=n) as (airflow, dsn):
            return measure(args, result, up, airflow, dsn)


def measure(args: argparse.Namespace, result: dict[str, Any], up: Upstream, airflow: Any, dsn: str) -> dict[str, Any]:
    """Claim, hold and flip the fleet ``result`` describes (the module docstring's figures) into it."""
    n, t, routing, pool_size = result["n"], result["triggerers"], result["routing"], result["pool_size"]
    routed = pool_size is not None
    # The floor's triggers all fire at one moment, late enough for every one to be running (with
    # --flow, --flow-rate of them a second from that moment, the rest a day away); the idle
    # floor's a day away: each sleeps an hour at a time and logs nothing in the hold. The kit's
    # DateTime waits (a kind, not a routing) are planned as the floor is.
    airflows = routing in ("floor", "idle")
    after = {"floor": args.floor_after, "idle": 86_400.0}.get(routing, args.floor_after if up.fires_by_itself else None)
    moments = None
    if after is not None:
        at = dt.datetime.now(UTC) + dt.timedelta(seconds=after)
        flowing = int(args.flow * args.flow_rate) if args.flow and routing != "idle" else n
        later = at + dt.timedelta(days=1)
        moments = [at + dt.timedelta(seconds=i // args.flow_rate) if args.flow else at for i in range(flowing)]
        moments += [later] * (n - len(moments))
    write_waits(dsn, up, n, routed, moments, airflows)
    queues = pools(t, up.groups, pool_size) if routed else [[] for _ in range(t)]
    result["queues"] = queues
    started = time.monotonic()
    names = []
    for number, listed in enumerate(queues, start=1):
        name = "triggerer" if number == 1 else f"triggerer-{number}"
        with on_cpus(args.triggerer_cpus):  # the process and the runner it forks inherit the harness's mask
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
        if exited := [name for name in names if airflow.processes[name].poll() is not None]:
            result["error"] = f"{exited[0]} exited: {airflow.log_tail(exited[0])}"
            return result
        time.sleep(2)
    result["running_s"] = round(time.monotonic() - started, 1)
    time.sleep(args.warmup)  # every wait has made its first poll and its group's sharing formed
    pids = {name: airflow.processes[name].pid for name in names}
    if args.triggerer_cpus:
        result["triggerer_affinity"] = sorted(tree_affinity(pids.values()))
    logs = {name: airflow.home / f"{name}.log" for name in names}
    log_from = {name: path.stat().st_size for name, path in logs.items()}
    health = Heartbeats(dsn)
    cpu0 = {name: tree_cpu(pid) for name, pid in pids.items()}
    machine = Machine(up)
    served0, methods0, hold0 = up.served(), up.served_by_method(), time.monotonic()
    health.watch(args.hold)
    elapsed = time.monotonic() - hold0
    served = up.served() - served0
    if methods := up.served_by_method():
        rounds = elapsed / args.poll_interval
        result["requests_per_round_by_method"] = {
            method: round((count - methods0.get(method, 0)) / rounds, 2) for method, count in sorted(methods.items())
        }
    cpu = {name: (tree_cpu(pid) - cpu0[name]) / elapsed * 100 for name, pid in pids.items()}
    result["hold_machine"] = machine.report()
    result["requests_per_round"] = round(served / (elapsed / args.poll_interval), 2)
    result["upstream_sockets_per_triggerer"] = [sockets_to(pids[name], up.port()) for name in names]
    result["cpu_pct_per_triggerer"] = [round(cpu[name], 1) for name in names]
    result["cpu_pct_total"] = round(sum(cpu.values()), 1)
    if routing == "idle":
        result.update(health.report(), **blocked_loops(logs, log_from))
        return result  # nothing fires: holding N triggers is the figure

    if moments is not None:
        if time.time() > moments[0].timestamp():
            result["error"] = "the moment passed before every trigger ran: raise --floor-after"
            return result
        health.watch(moments[0].timestamp() - time.time())  # the floor's flip is its first moment

    def flip(waits: list[int]) -> dict[str, float]:
        if moments is None:
            return up.flip_some(waits, n)
        return {f"wait_{i}": moments[i].timestamp() for i in waits}  # they fire by themselves

    flip0 = time.time()
    if args.flow:
        put_at = flow(args, result, up, flip, health, pids)
    else:
        put_at = flip(list(range(n))) if moments is not None else up.flip(n)
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
        fired = {task: float(at) for task, at in rows}
        if len(fired) >= len(put_at):
            break
        health.watch(2)
    latencies = [fired[task] - put_at[task] for task in fired if task in put_at]
    result["events"], result["missing"] = len(fired), len(put_at) - len(fired)
    result.update(health.report(), **blocked_loops(logs, log_from))
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
    from scripts import services

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=sorted(KINDS), default="s3")
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--groups", "--folders", type=int, default=4, help="S3 folders, HTTP URLs or Postgres tables")
    parser.add_argument(
        "--cells",
        nargs="+",
        default=["1:none", "2:none", "4:none", "4:queue:2", "4:queue:1"],
        help="TRIGGERERS:ROUTING[:POOL_SIZE] per cell, run one after another (routing: none, queue, or Airflow's "
        "own DateTimeTrigger: idle, its moment a day away, or floor, all firing at one moment)",
    )
    parser.add_argument("--poll-interval", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=45.0)
    parser.add_argument("--hold", type=float, default=120.0)
    parser.add_argument("--floor-after", type=float, default=420.0, help="seconds to the floor cell's moment")
    parser.add_argument("--claim-timeout", type=float, default=900.0)
    parser.add_argument("--events-timeout", type=float, default=300.0)
    parser.add_argument(
        "--flow", type=float, default=0.0,
        help="seconds of a steady flow of events after the hold, instead of one flip of every wait",
    )  # fmt: skip
    parser.add_argument("--flow-rate", type=int, default=10, help="waits made true each second of --flow")
    parser.add_argument(
        "--triggerer-cpus", type=int, default=0,
        help="limit the triggerers to the last K CPUs (the harness, metadata DB and upstream on the rest)",
    )  # fmt: skip
    parser.add_argument("--allow-busy", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    failed = False
    if args.triggerer_cpus:  # set before any service starts: each inherits the harness's CPUs
        os.sched_setaffinity(0, os.sched_getaffinity(0) - triggerer_cpus(args.triggerer_cpus))
    with services.postgres(max_connections=400) as pg:
        for spec in args.cells:
            parts = spec.split(":")
            triggerers, routing = int(parts[0]), parts[1]
            pool_size = int(parts[2]) if len(parts) > 2 else 2
            with quiet_cell(allow_busy=args.allow_busy) as record:
                result = {**cell(args, triggerers, routing, pool_size, pg.dsn), **record}
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
