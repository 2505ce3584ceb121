"""Triggerer load: N concurrent triggers of one kind in one asyncio loop, as the triggerer runs them.

Each trigger is rebuilt from its serialized kwargs (``cls(**kwargs)``, as the triggerer does),
run as an ``asyncio.Task`` iterating ``run()`` until its first event, and ``cleanup()`` is
awaited at the end. The servers run in separate processes; so does the *flipper*, a helper
process that prepares the server (bucket, table, topic) and, when told, makes every wait's
condition true and reports the moment it did so for each wait.

Phases: start N triggers -> ``--warmup`` s (first polls, client creation) -> ``--hold`` s of
steady waiting (CPU, RSS, sockets, loop lag measured here) -> flip -> wait for the events
(event latency = event time - moment the condition turned true for that wait) -> cleanup.

Measured in this (the trigger) process only:

* ``cpu_s_per_poll``: CPU seconds (user+sys) during the hold / the polls made in it: the
  requests the server answered where one poll is one request (``polls_made``: S3 one key per
  wait, HTTP), else the polls due (``polls_due`` = N x hold / poll interval). A trigger that
  falls behind makes fewer polls than are due; dividing by the due count would flatter it.
  ``cpu_core_pct``: the same CPU as % of one core.
* ``rss_per_trigger_kb``: (RSS at end of hold - RSS before any trigger existed) / N. This
  includes the shared clients; ``run_all.py`` also reports the slope between two N.
* ``sockets_max``: socket fds in ``/proc/self/fd`` (sampled every 0.25 s, whole run).
* ``latency_*``: per-wait event latency; ``events`` / ``missing`` count waits that fired / not.
* ``lag_max_ms``: worst lateness of a 10 ms ticker during hold + flip + events
  (``lag_max_startup_ms``: during start + warmup); split into ``lag_max_hold_ms`` (the waits
  waiting) and ``lag_max_events_ms`` (the flip and the burst of events after it).
* ``gc_pause_max_ms`` / ``gc_full_collections``: the longest garbage-collector pause and the
  number of full collections in the same window (``--freeze-gc`` freezes the start-up objects),
  and the same for the hold alone (``gc_pause_max_hold_ms``, ``gc_full_collections_hold``) and
  the events (``gc_pause_max_events_ms``).

Usage::

    python -m benchmarks.triggerer_load --kind s3 --impl kit --n 1000 --poll-interval 5 --hold 10

S3 layouts (:func:`s3_wait`): ``s3`` puts every key under its own prefix, sharing no folder
(``own-{i}/data.csv``: one HEAD per poll); ``s3-one-prefix`` waits with wildcard patterns
``shared/*-{i:05d}.csv`` under one prefix; ``s3-shared-prefix`` waits on exact keys
``shared/k-{i:05d}.csv`` (no wildcard) in one folder; ``s3-run-prefix`` waits on exact keys each
in its own folder under one run prefix (``runs/run-1/{i}/data.csv``, the layout of partitioned
outputs). The layouts after ``s3`` also hold ``SHARED_OTHER_OBJECTS`` unrelated objects under
their prefix.
HTTP layouts: ``http`` gives wait ``i`` its own URL (``/ready/{i}``); ``http-one-url`` puts every
wait on one URL (``/ready/0``, the same connection and request), where the kit's waits share
responses; its result adds ``requests_served``, the requests the server answered over the run.

Kafka layouts: ``kafka`` puts every wait on one topic (``bench``, 4 partitions); ``kafka-topics``
puts wait ``i`` on topic ``bench-{i % topics}`` (``--topics``, default one topic per wait, as the
official ``AwaitMessageSensor`` is used), 2 partitions each. ``--unrelated-topics`` fills the
broker with that many other topics first (a cluster where asking for every topic is costly).

Prints one JSON line. Run it with ``PYTHONPATH`` at the repository root.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime as dt
import gc
import json
import logging
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
KINDS = (
    "s3",
    "s3-one-prefix",
    "s3-shared-prefix",
    "s3-run-prefix",
    "http",
    "http-one-url",
    "postgres",
    "postgres-tables",
    "kafka",
    "kafka-topics",
    "datetime",
)
BUCKET = "bench"
TOPIC = "bench"
#: ``kafka-topics``: wait ``i`` is on topic ``bench-{i % topics}``, each of this many partitions.
TOPIC_PARTITIONS = 2
#: Topics created per admin request when the flipper fills the broker.
TOPICS_PER_REQUEST = 500
SHARED_OTHER_OBJECTS = 100
#: ``s3-run-prefix``: the run prefix every key's own folder is in.
RUN_PREFIX = "runs/run-1/"
#: ``postgres-tables``: wait ``i`` is on table ``markers_{i % POSTGRES_TABLES}`` (``postgres``: ``markers``).
POSTGRES_TABLES = 100
#: Kinds whose every poll is exactly one request (waits on one S3 prefix share listings).
POLL_IS_ONE_REQUEST = ("s3", "http")
#: stderr prefix of the steady-state figures, printed before the flip.
HOLD_PREFIX = "HOLD "


# ------------------------------------------------------------------------------ measuring
def s3_wait(kind: str, i: int) -> tuple[str, bool]:
    """``(bucket_key, wildcard_match)`` of wait ``i`` of an S3 kind, the same for both implementations."""
    if kind == "s3":
        return f"own-{i}/data.csv", False
    if kind == "s3-one-prefix":
        return f"shared/*-{i:05d}.csv", True
    if kind == "s3-run-prefix":
        return f"{RUN_PREFIX}{i}/data.csv", False
    return f"shared/k-{i:05d}.csv", False


def s3_object(kind: str, i: int) -> str:
    """The key the flip puts for wait ``i`` of an S3 kind."""
    return f"shared/k-{i:05d}.csv" if kind == "s3-one-prefix" else s3_wait(kind, i)[0]


def s3_unrelated(kind: str) -> list[str]:
    """Objects under a layout's prefix that no wait is on."""
    if kind in ("s3-one-prefix", "s3-shared-prefix"):
        return [f"shared/other-{j}.txt" for j in range(SHARED_OTHER_OBJECTS)]
    if kind == "s3-run-prefix":
        return [f"{RUN_PREFIX}_logs/{j}.txt" for j in range(SHARED_OTHER_OBJECTS)]
    return []


def marker_key(i: int) -> str:
    """Wait ``i``'s batch id: a text key, as marker tables have them (``batch-000042``)."""
    return f"batch-{i:06d}"


def table_of(kind: str, i: int) -> str:
    """The marker table wait ``i`` is on."""
    return "markers" if kind == "postgres" else f"markers_{i % POSTGRES_TABLES}"


def statements_sent(kind: str, impl: str) -> int | None:
    """Statements the Postgres triggers of this process have sent so far (else ``None``)."""
    if not kind.startswith("postgres"):
        return None
    if impl == "kit":
        from airflow_deferrable_kit._postgres.batches import statement_count

        return statement_count()
    from benchmarks.naive_postgres import STATEMENTS

    return STATEMENTS[0]


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def socket_count() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                count += 1
    return count


def start_profiler(out: str, seconds: float) -> subprocess.Popen[bytes]:
    """Sample this process's stacks for ``seconds`` (``--profile-hold``): py-spy, from the outside.

    A sampling profiler in its own process, not attached in between samples (``--nonblocking``):
    the hold's CPU figures stay this process's own. The raw stacks (one line per distinct stack,
    with its sample count) go to ``out``; ``benchmarks/poll_profile.py`` sums them by family.
    """
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        raise SystemExit("--profile-hold needs py-spy: install the bench extra (pip install -e '.[bench]')")
    command = [spy, "record", "--pid", str(os.getpid()), "--duration", str(max(1, round(seconds)))]
    command += ["--rate", "200", "--nonblocking", "--format", "raw", "--output", out]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


class LagMeter:
    """A 10 ms ticker; records how late each tick fires."""

    def __init__(self) -> None:
        self.max_lag = 0.0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            expected = loop.time() + 0.01
            await asyncio.sleep(0.01)
            self.max_lag = max(self.max_lag, loop.time() - expected)

    def take(self) -> float:
        value, self.max_lag = self.max_lag, 0.0
        return value


class GcMeter:
    """The longest garbage-collector pause and the number of full collections, per phase.

    A full collection walks every object in the process, most of them Airflow's own (about
    155,000 after ``import airflow``), so it shows up as loop lag whatever the triggers do.
    """

    def __init__(self) -> None:
        self.max_pause = 0.0
        self.full = 0
        self._started = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.max_pause = max(self.max_pause, time.perf_counter() - self._started)
        self.full += info["generation"] == 2

    def take(self) -> tuple[float, int]:
        value = (self.max_pause, self.full)
        self.max_pause, self.full = 0.0, 0
        return value


def traced_memory(snapshot: tracemalloc.Snapshot, n: int, top: int = 60) -> dict[str, Any]:
    """What the waits hold at the end of the hold, by the line that allocated it (``--trace-memory``).

    Every live block allocated since the triggers were built, in bytes per wait: what the waits
    keep, with the one-off objects of the first client spread over N (measure at two N to tell them
    apart). Unlike ``--object-census`` it counts strings, tuples and numbers, and says where from.
    """
    stats = snapshot.statistics("lineno")
    here = str(ROOT) + os.sep

    def site(stat: tracemalloc.Statistic) -> str:
        frame = stat.traceback[0]
        name = frame.filename
        name = name.split("site-packages" + os.sep, 1)[-1] if "site-packages" in name else name.replace(here, "")
        return f"{name}:{frame.lineno}"

    def package(where: str) -> str:
        if where.startswith((os.sep, "<frozen")):  # the standard library: by module
            return "python: " + Path(where.split(":", 1)[0]).stem.strip("<>")
        return where.split(os.sep, 1)[0] if os.sep in where else where.split(":", 1)[0]

    by_package: collections.Counter[str] = collections.Counter()
    for stat in stats:
        by_package[package(site(stat))] += stat.size
    return {
        "traced_bytes_per_wait": round(sum(stat.size for stat in stats) / n),
        "traced_bytes_per_wait_by_package": {name: round(size / n) for name, size in by_package.most_common(top)},
        "traced_bytes_per_wait_by_line": {site(stat): round(stat.size / n) for stat in stats[:top]},
        "traced_bytes_per_wait_by_kit_line": {
            site(stat): round(stat.size / n) for stat in stats if "airflow_deferrable_kit" in site(stat)
        },
    }


def object_census() -> tuple[collections.Counter[str], collections.Counter[str]]:
    """Objects the garbage collector tracks, by type, and their bytes (``sys.getsizeof``) by type
    (``--object-census``). Bytes count each object alone: not what it refers to, not the strings,
    numbers and tuples of them that the collector does not track."""
    counts: collections.Counter[str] = collections.Counter()
    sizes: collections.Counter[str] = collections.Counter()
    for o in gc.get_objects():
        name = f"{type(o).__module__}.{type(o).__qualname__}"
        counts[name] += 1
        sizes[name] += sys.getsizeof(o)
    return counts, sizes


# -------------------------------------------------------------------------------- servers
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


@contextlib.contextmanager
def bench_server(name: str):  # type: ignore[no-untyped-def]
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.servers", name, "--port", str(port)],
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, proc)
        yield f"http://127.0.0.1:{port}", port, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.contextmanager
def servers(kind: str, sessions: int = 0):  # type: ignore[no-untyped-def]
    """Start what ``kind`` needs; yield (endpoint, server pid or None); ``sessions``: Postgres connections needed."""
    sys.path.insert(0, str(ROOT))
    from scripts import services

    if kind.startswith("s3"):
        with bench_server("s3") as (url, _, pid):
            yield url, pid
    elif kind in ("http", "http-one-url"):
        with bench_server("http") as (url, _, pid):
            yield url, pid
    elif kind.startswith("postgres"):
        # pg_stat_statements preloaded: the server's side of a poll round is reported beside ours.
        settings = {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all"}
        with services.postgres(max_connections=max(200, sessions + 50), settings=settings) as pg:
            pg.psql("CREATE EXTENSION pg_stat_statements")
            postmaster = int((pg.directory / "data" / "postmaster.pid").read_text().split()[0])
            yield pg.dsn, postmaster
    elif kind.startswith("kafka"):
        with services.kafka() as broker:
            yield broker.bootstrap_servers, broker.process.pid if broker.process else None
    else:
        yield None, None


# -------------------------------------------------------------------------------- flipper
def flipper_main(kind: str, n: int, endpoint: str, topics: int = 0, unrelated: int = 0) -> None:
    """Separate process: prepare the server, print READY, flip on a line from stdin, print times."""
    asyncio.run(_flipper(kind, n, endpoint, topics, unrelated))


def http_endpoint(kind: str, i: int) -> str:
    """The endpoint wait ``i`` polls: its own (``http``), or one URL for every wait (``http-one-url``)."""
    return "ready/0" if kind == "http-one-url" else f"ready/{i}"


def topic_of(kind: str, i: int, topics: int) -> str:
    """The topic wait ``i`` is on."""
    return TOPIC if kind == "kafka" else f"{TOPIC}-{i % topics}"


async def _flipper(kind: str, n: int, endpoint: str, topics: int = 0, unrelated: int = 0) -> None:
    out = sys.stdout
    if kind == "http-one-url":
        kind = "http"  # the same server and flip: one URL or many is the waits' choice
    loop = asyncio.get_running_loop()
    if kind.startswith("s3"):
        import boto3
        from botocore.config import Config

        s3 = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
            config=Config(max_pool_connections=16),
        )
        s3.create_bucket(Bucket=BUCKET)
        for other in s3_unrelated(kind):
            s3.put_object(Bucket=BUCKET, Key=other, Body=b"x")
        print("READY", file=out, flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)
        times = [0.0] * n

        def put(i: int) -> None:
            s3.put_object(Bucket=BUCKET, Key=s3_object(kind, i), Body=b"a,b\n")
            times[i] = time.time()

        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(put, range(n)))
    elif kind == "http":
        import urllib.request

        print("READY", file=out, flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)

        def flip() -> float:
            with urllib.request.urlopen(urllib.request.Request(f"{endpoint}/flip", method="POST")) as resp:
                return float(json.loads(resp.read())["ready_at"])

        ready_at = await loop.run_in_executor(None, flip)
        times = [ready_at] * n
    elif kind.startswith("postgres"):
        import asyncpg

        conn = await asyncpg.connect(endpoint)
        tables = sorted({table_of(kind, i) for i in range(max(n, POSTGRES_TABLES))})
        for table in tables:
            await conn.execute(f"CREATE TABLE {table} (batch_id text PRIMARY KEY, state text NOT NULL)")
        print("READY", file=out, flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)
        async with conn.transaction():  # every marker appears at once
            for table in tables:
                await conn.execute(
                    f"INSERT INTO {table} SELECT 'batch-' || lpad(g::text, 6, '0'), 'ready' "
                    "FROM generate_series(0, $1::int - 1) g "
                    f"WHERE $2 = 'markers' OR 'markers_' || (g % {POSTGRES_TABLES}) = $2",
                    n,
                    table,
                )
        times = [time.time()] * n
        await conn.close()
    elif kind.startswith("kafka"):
        from aiokafka import AIOKafkaProducer
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic

        admin = AIOKafkaAdminClient(bootstrap_servers=endpoint, request_timeout_ms=120_000)
        await admin.start()
        if kind == "kafka":
            wanted = [NewTopic(TOPIC, num_partitions=4, replication_factor=1)]
        else:
            wanted = [
                NewTopic(f"{TOPIC}-{t}", num_partitions=TOPIC_PARTITIONS, replication_factor=1) for t in range(topics)
            ]
        wanted += [NewTopic(f"unrelated-{j}", num_partitions=1, replication_factor=1) for j in range(unrelated)]
        for start in range(0, len(wanted), TOPICS_PER_REQUEST):
            await admin.create_topics(wanted[start : start + TOPICS_PER_REQUEST])
        await admin.close()
        producer = AIOKafkaProducer(bootstrap_servers=endpoint, linger_ms=5)
        await producer.start()
        # A few unrelated messages so every reader has something to skip.
        if kind == "kafka":
            for j in range(10):
                await producer.send_and_wait(TOPIC, json.dumps({"id": -1 - j}).encode())
        else:
            sent = [await producer.send(f"{TOPIC}-{t}", json.dumps({"id": -1 - t}).encode()) for t in range(topics)]
            await asyncio.gather(*sent)
        print("READY", file=out, flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)
        times = [0.0] * n

        def stamp(i: int):  # type: ignore[no-untyped-def]
            return lambda _fut: times.__setitem__(i, time.time())

        futures = []
        for i in range(n):
            fut = await producer.send(topic_of(kind, i, topics), json.dumps({"id": i}).encode(), key=str(i).encode())
            fut.add_done_callback(stamp(i))
            futures.append(fut)
        await asyncio.gather(*futures)
        await producer.stop()
    else:
        raise SystemExit(f"no flipper for {kind}")
    print(json.dumps({"times": times}), file=out, flush=True)


# ------------------------------------------------------------------------------ triggers
def connections(kind: str, impl: str, endpoint: str | None, n: int) -> dict[str, str]:
    env: dict[str, str] = {}
    if kind.startswith("s3"):
        env["AIRFLOW_CONN_BENCH_AWS"] = json.dumps(
            {
                "conn_type": "aws",
                "login": "testing",
                "password": "testing",
                "extra": {"endpoint_url": endpoint, "region_name": "us-east-1"},
            }
        )
    elif kind in ("http", "http-one-url"):
        host, port = endpoint.removeprefix("http://").split(":")  # type: ignore[union-attr]
        env["AIRFLOW_CONN_BENCH_HTTP"] = json.dumps(
            {"conn_type": "http", "host": host, "port": int(port), "schema": "http"}
        )
    elif kind.startswith("postgres"):
        port = endpoint.rsplit(":", 1)[1].split("/")[0]  # type: ignore[union-attr]
        env["AIRFLOW_CONN_BENCH_PG"] = json.dumps(
            {"conn_type": "postgres", "host": "127.0.0.1", "port": int(port), "login": "postgres", "schema": "postgres"}
        )
    elif kind.startswith("kafka"):
        env["AIRFLOW_CONN_BENCH_KAFKA"] = json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": endpoint}})
        if impl == "official":
            # The official trigger takes its group from the connection: one group per wait, so
            # every wait reads every message (a shared group would split the partitions).
            for i in range(n):
                extra = {"bootstrap.servers": endpoint, "group.id": f"bench-{i}", "auto.offset.reset": "earliest"}
                env[f"AIRFLOW_CONN_BENCH_KAFKA_{i}"] = json.dumps({"conn_type": "kafka", "extra": extra})
    return env


def build(kind: str, impl: str, n: int, poll: float, target: str | None, topics: int = 1) -> list[Any]:
    """N triggers, each rebuilt from its serialized kwargs the way the triggerer does."""
    made: list[Any] = []
    if impl == "kit":
        if kind.startswith("s3"):
            from airflow_deferrable_kit.triggers.s3 import S3KeyTrigger as cls
        elif kind in ("http", "http-one-url"):
            from airflow_deferrable_kit.triggers.http import HttpBatchReadyTrigger as cls  # type: ignore[assignment]
        elif kind.startswith("postgres"):
            from airflow_deferrable_kit.triggers.postgres import PostgresBatchMarkerTrigger as cls  # type: ignore[assignment]
        elif kind.startswith("kafka"):
            from airflow_deferrable_kit.triggers.kafka import KafkaMessageTrigger as cls  # type: ignore[assignment]
        else:
            from airflow_deferrable_kit.triggers.temporal import DateTimeTrigger as cls  # type: ignore[assignment]
        start_ms = int((time.time() - 60) * 1000)
        for i in range(n):
            if kind.startswith("s3"):
                key, wildcard = s3_wait(kind, i)
                kw: dict[str, Any] = {"bucket_key": key, "bucket_name": BUCKET}
                if wildcard:
                    kw["wildcard_match"] = True
            elif kind.startswith("http"):
                kw = {"http_conn_id": "bench_http", "endpoint": http_endpoint(kind, i)}
            elif kind.startswith("postgres"):
                kw = {"postgres_conn_id": "bench_pg", "table": table_of(kind, i), "match": {"batch_id": marker_key(i)}}
            elif kind.startswith("kafka"):
                kw = {
                    "topics": [topic_of(kind, i, topics)],
                    "kafka_conn_id": "bench_kafka",
                    "start_after_ms": start_ms,
                    "acceptors": [
                        {"state": "success", "matcher": "path", "argument": "id", "comparator": "equals", "expected": i}
                    ],
                }
            else:
                kw = {"target_time": target}
            if kind.startswith("s3"):
                kw["aws_conn_id"] = "bench_aws"
            kw["poll_interval"] = poll
            _, kwargs = cls(**kw).serialize()
            made.append(cls(**kwargs))
        return made
    if kind.startswith("s3"):
        from airflow.providers.amazon.aws.triggers.s3 import S3KeyTrigger as ocls

        for i in range(n):
            key, wildcard = s3_wait(kind, i)
            made.append(
                ocls(
                    bucket_name=BUCKET,
                    bucket_key=key,
                    wildcard_match=wildcard,
                    aws_conn_id="bench_aws",
                    poke_interval=poll,
                )
            )
    elif kind.startswith("http"):
        from airflow.providers.http.triggers.http import HttpSensorTrigger as ocls  # type: ignore[assignment]

        made = [ocls(endpoint=http_endpoint(kind, i), http_conn_id="bench_http", poke_interval=poll) for i in range(n)]
    elif kind.startswith("postgres"):
        # No official deferrable SQL trigger exists: the anchor is the naive one-connection-per-wait trigger.
        from benchmarks.naive_postgres import NaivePostgresMarkerTrigger as ocls  # type: ignore[assignment]

        made = [
            ocls(postgres_conn_id="bench_pg", table=table_of(kind, i), batch_id=marker_key(i), poll_interval=poll)
            for i in range(n)
        ]
    elif kind.startswith("kafka"):
        from airflow.providers.apache.kafka.triggers.await_message import AwaitMessageTrigger as ocls  # type: ignore[assignment]

        made = [
            ocls(
                topics=[topic_of(kind, i, topics)],
                apply_function="benchmarks.kafka_match.match_id",
                apply_function_args=[i],
                kafka_config_id=f"bench_kafka_{i}",
                poll_interval=poll,
            )
            for i in range(n)
        ]
    elif kind == "datetime":
        from airflow.providers.standard.triggers.temporal import DateTimeTrigger as ocls  # type: ignore[assignment]

        moment = dt.datetime.fromisoformat(target)  # type: ignore[arg-type]
        made = [ocls(moment=moment) for _ in range(n)]
    else:
        raise SystemExit(f"no official trigger of kind {kind}")
    rebuilt = []
    for trigger in made:
        _, kwargs = trigger.serialize()
        rebuilt.append(type(trigger)(**kwargs))
    return rebuilt


# ---------------------------------------------------------------------------------- run
async def run_trigger(trigger: Any, index: int, fired: dict[int, float], events: dict[int, Any]) -> None:
    """What the TriggerRunner does with one trigger: iterate run() to the first event, then cleanup()."""
    try:
        async for event in trigger.run():
            fired[index] = time.time()
            events[index] = event.payload
            break
    finally:
        with contextlib.suppress(Exception):
            await trigger.cleanup()


def served_requests(kind: str, endpoint: str | None) -> int | None:
    """Requests the server has answered so far, where one poll is one request (else ``None``)."""
    if endpoint is None or kind not in POLL_IS_ONE_REQUEST:
        return None
    import urllib.request

    from benchmarks.servers import COUNT_PATH

    with urllib.request.urlopen(endpoint + COUNT_PATH, timeout=30) as resp:
        return int(json.loads(resp.read())["requests"])


def postgres_server_side(dsn: str, postmaster: int) -> dict[str, float]:
    """What the PostgreSQL server has done so far: CPU seconds of all its processes (the
    postmaster, the live backends, and those it reaped), statements run and their execution
    milliseconds (``pg_stat_statements``, the server's own statements left out), client backends."""
    sys.path.insert(0, str(ROOT))
    from scripts import services

    tick = os.sysconf("SC_CLK_TCK")
    cpu = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(stat.parent.name), int(fields[1])
        if pid == postmaster:  # its own time and that of the backends it has reaped
            cpu += sum(int(f) for f in fields[11:15]) / tick
        elif ppid == postmaster:
            cpu += (int(fields[11]) + int(fields[12])) / tick
    query = (
        "SELECT (SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE query NOT ILIKE '%pg_stat%'), "
        "(SELECT coalesce(sum(total_exec_time), 0) FROM pg_stat_statements WHERE query NOT ILIKE '%pg_stat%'), "
        "(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend') - 1"
    )
    out = subprocess.run(
        [str(services.postgres_bindir() / "psql"), "-At", "-F", " ", "-d", dsn, "-c", query],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    return {"cpu_s": cpu, "statements": float(out[0]), "exec_ms": float(out[1]), "backends": float(out[2])}


async def measure(
    args: argparse.Namespace,
    flipper: subprocess.Popen[str] | None,
    target_ts: float | None,
    endpoint: str | None,
    server_pid: int | None = None,
) -> dict:
    loop = asyncio.get_running_loop()
    lag = LagMeter()
    ticker = asyncio.ensure_future(lag.run())
    sockets_max = [socket_count()]
    stop_sampling = threading.Event()

    def sample() -> None:  # in a thread so sampling costs nothing on the loop under test
        while not stop_sampling.wait(0.25):
            sockets_max[0] = max(sockets_max[0], socket_count())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()

    faithful = args.harness == "airflow"
    target = dt.datetime.fromtimestamp(target_ts, tz=dt.timezone.utc).isoformat() if target_ts else None
    fired: dict[int, float] = {}
    events: dict[int, Any] = {}
    if faithful:
        from benchmarks import faithful as airflow_like

        # Built (as each sensor defers) before the baseline: the sensors are the worker's, not the triggerer's.
        pending_work = airflow_like.workloads(
            args.kind, args.impl, args.n, args.poll_interval, target, args.topics, int((time.time() - 60) * 1000)
        )
        probe = airflow_like.install_startup_probe(args.kind, args.impl)
    gc.collect()
    if args.freeze_gc:
        gc.freeze()  # what an operator can do after start-up: full collections skip the imports
    if args.gc_threshold:
        gc.set_threshold(*args.gc_threshold)  # what an operator can set at start-up (a sitecustomize module)
    gc_meter = GcMeter()
    rss0 = rss_kb()
    objects0 = len(gc.get_objects())
    census0 = object_census() if args.object_census else None
    if args.trace_memory:
        tracemalloc.start()  # from here every Python allocation is traced to the line that made it
    t_build, cpu_build = time.monotonic(), cpu_seconds()
    if faithful:
        runner = airflow_like.bench_runner(fired, events)
        runner.to_create.extend(pending_work)
        del pending_work
        watchdog = asyncio.ensure_future(runner.block_watchdog())
        keeper = asyncio.ensure_future(airflow_like.bookkeeping(runner) if args.bookkeeping else asyncio.sleep(0))
        await runner.create_triggers()  # Airflow's own: decode kwargs, build, one run_trigger task each
        tasks = [details["task"] for details in runner.triggers.values()]
    else:
        triggers = build(args.kind, args.impl, args.n, args.poll_interval, target, args.topics)
        tasks = [asyncio.ensure_future(run_trigger(t, i, fired, events)) for i, t in enumerate(triggers)]
        del triggers
    build_s = time.monotonic() - t_build

    # Start-up: the hold begins once every wait has made its first poll (and --warmup has passed).
    startup: dict[str, Any] = {}
    if faithful:
        limit = t_build + args.startup_timeout
        hold_by = (target_ts - 0.5 - args.hold) if target_ts else None  # a DateTime hold must end before the target
        while probe.count() < args.n and time.monotonic() < limit and not all(t.done() for t in tasks):  # noqa: ASYNC110
            await asyncio.sleep(0.25)
        seen = probe.count()
        startup = {
            "startup_s": round(time.monotonic() - t_build, 2),
            "startup_first_polls": seen,
            "startup_probe": probe.what,
            "steady_state": seen >= args.n,
        }
        probe.remove()  # the hold runs the unmodified code
        await asyncio.sleep(max(0.0, t_build + args.warmup - time.monotonic()))
        if hold_by is not None and time.time() > hold_by:
            startup["steady_state"] = False
            startup["startup_note"] = "start-up ended too close to the DateTime target for a full hold"
    else:
        await asyncio.sleep(args.warmup)
    objects1 = len(gc.get_objects())
    startup["objects_per_wait"] = round((objects1 - objects0) / args.n, 1) if args.n else None
    if census0 is not None and args.n:
        counts1, sizes1 = object_census()
        grown, grown_bytes = counts1 - census0[0], sizes1 - census0[1]
        startup["objects_per_wait_by_type"] = {name: round(count / args.n, 2) for name, count in grown.most_common(25)}
        startup["bytes_per_wait_by_type"] = {name: round(size / args.n) for name, size in grown_bytes.most_common(25)}
        startup["tracked_bytes_per_wait"] = round(sum(grown_bytes.values()) / args.n)
    lag_startup = lag.take()
    gc_meter.take()
    early = len(fired)
    if faithful and not startup["steady_state"]:
        cpu_now = cpu_seconds()
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
        watchdog.cancel()
        keeper.cancel()
        ticker.cancel()
        stop_sampling.set()
        return {
            "kind": args.kind,
            "impl": args.impl,
            "n": args.n,
            "harness": args.harness,
            "poll_interval": args.poll_interval,
            "build_s": round(build_s, 2),
            **startup,
            "fired_before_flip": early,
            "cpu_startup_core_pct": round(100 * (cpu_now - cpu_build) / max(time.monotonic() - t_build, 1e-9), 2),
            "rss_base_kb": rss0,
            "rss_hold_kb": rss_kb(),
            "sockets_max": sockets_max[0],
            "lag_max_startup_ms": round(lag_startup * 1000, 1),
            "freeze_gc": args.freeze_gc,
        }
    served0 = await loop.run_in_executor(None, served_requests, args.kind, endpoint)
    statements0 = statements_sent(args.kind, args.impl)
    on_server = args.kind.startswith("postgres") and endpoint is not None and server_pid is not None
    server0 = await loop.run_in_executor(None, postgres_server_side, endpoint, server_pid) if on_server else None
    cpu0, t0 = cpu_seconds(), time.monotonic()
    rss_samples = []
    hold_until = t0 + args.hold
    if target_ts is not None:  # a DateTime hold ends before the target
        hold_until = min(hold_until, t0 + target_ts - 0.5 - time.time())
    sampler_process = start_profiler(args.profile_hold, hold_until - t0) if args.profile_hold else None
    while time.monotonic() < hold_until:
        await asyncio.sleep(max(0.0, min(1.0, hold_until - time.monotonic())))
        rss_samples.append(rss_kb())
    cpu1, t1 = cpu_seconds(), time.monotonic()
    lag_hold = lag.take()  # the waits waiting: apart from the flip and the burst of events after it
    traced = traced_memory(tracemalloc.take_snapshot(), args.n) if args.trace_memory and args.n else {}
    tracemalloc.stop()
    gc_hold_pause, gc_hold_full = gc_meter.take()
    if sampler_process is not None:
        await loop.run_in_executor(None, sampler_process.wait)
    statements1 = statements_sent(args.kind, args.impl)
    server1 = await loop.run_in_executor(None, postgres_server_side, endpoint, server_pid) if on_server else None
    rss1 = rss_kb()
    hold = t1 - t0
    served1 = await loop.run_in_executor(None, served_requests, args.kind, endpoint)
    due = args.n * hold / args.poll_interval
    made = served1 - served0 if served0 is not None and served1 is not None else None
    polls = made or due
    steady = {
        **startup,
        "hold_s": round(hold, 2),
        "fired_before_flip": early,
        "cpu_hold_s": round(cpu1 - cpu0, 3),
        "cpu_core_pct": round(100 * (cpu1 - cpu0) / hold, 2),
        "cpu_s_per_poll": (cpu1 - cpu0) / polls if polls else None,
        "polls_due": round(due),
        "polls_made": made,
        "rss_base_kb": rss0,
        "rss_hold_kb": rss1,
        "rss_max_kb": max(rss_samples or [rss1]),
        "rss_per_trigger_kb": round((rss1 - rss0) / args.n, 3) if args.n else None,
        "lag_max_startup_ms": round(lag_startup * 1000, 1),
        "lag_max_hold_ms": round(lag_hold * 1000, 1),
        "gc_pause_max_hold_ms": round(gc_hold_pause * 1000, 1),
        "gc_full_collections_hold": gc_hold_full,
        **traced,
    }
    if statements0 is not None and statements1 is not None:  # Postgres: statements sent per poll round
        steady["statements_in_hold"] = statements1 - statements0
        steady["statements_per_round"] = round((statements1 - statements0) * args.poll_interval / hold, 1)
    if server0 is not None and server1 is not None:  # the server's side of the same hold
        rounds = hold / args.poll_interval
        steady["server_cpu_core_pct"] = round(100 * (server1["cpu_s"] - server0["cpu_s"]) / hold, 2)
        steady["server_statements_per_round"] = round((server1["statements"] - server0["statements"]) / rounds, 1)
        steady["server_exec_ms_per_round"] = round((server1["exec_ms"] - server0["exec_ms"]) / rounds, 2)
        steady["server_backends"] = int(server1["backends"])
    # The steady-state figures survive even if the flip or the events never finish.
    print(HOLD_PREFIX + json.dumps(steady), file=sys.stderr, flush=True)

    # Flip the condition and wait for the events.
    times: list[float]
    if flipper is not None:
        flipper.stdin.write("FLIP\n")  # type: ignore[union-attr]
        flipper.stdin.flush()  # type: ignore[union-attr]
        line = await loop.run_in_executor(None, flipper.stdout.readline)  # type: ignore[union-attr]
        times = json.loads(line)["times"]
    else:
        times = [target_ts or 0.0] * args.n
    deadline = time.monotonic() + args.event_timeout
    while len(fired) < args.n and time.monotonic() < deadline and not all(t.done() for t in tasks):  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    lag_events = lag.take()
    gc_events_pause, gc_events_full = gc_meter.take()
    lag_run = max(lag_hold, lag_events)
    gc_pause, gc_full = max(gc_hold_pause, gc_events_pause), gc_hold_full + gc_events_full
    cpu2 = cpu_seconds()

    pending = [t for t in tasks if not t.done()]
    for task in pending:
        task.cancel()
    t_cancel = time.monotonic()
    # A trigger whose cleanup blocks (a stuck sync thread) must not hang the benchmark.
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
    cancel_s = time.monotonic() - t_cancel
    ticker.cancel()
    if faithful:
        watchdog.cancel()
        keeper.cancel()
    stop_sampling.set()

    latencies = [fired[i] - times[i] for i in fired if times[i]]
    statuses: dict[str, int] = {}
    for payload in events.values():
        if isinstance(payload, dict):
            status = payload.get("status", "?")
        else:  # the faithful harness keeps only the status (or a short repr) of each event
            status = payload if isinstance(payload, str) else repr(payload)[:20]
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    return {
        "kind": args.kind,
        "impl": args.impl,
        "n": args.n,
        "harness": args.harness,
        **({} if args.bookkeeping else {"bookkeeping": False}),
        **({"topics": args.topics, "unrelated_topics": args.unrelated_topics} if args.kind.startswith("kafka") else {}),
        "poll_interval": args.poll_interval,
        "warmup_s": args.warmup,
        "build_s": round(build_s, 2),
        **steady,
        "cpu_flip_s": round(cpu2 - cpu1, 3),
        "sockets_max": sockets_max[0],
        "events": len(fired),
        "missing": args.n - len(fired),
        "statuses": statuses,
        "flip_spread_s": round(max(times) - min(times), 3) if times else None,
        "latency_p50_s": percentile(latencies, 0.5),
        "latency_p99_s": percentile(latencies, 0.99),
        "latency_max_s": max(latencies) if latencies else None,
        "latency_mean_s": statistics.fmean(latencies) if latencies else None,
        "lag_max_ms": round(lag_run * 1000, 1),
        "lag_max_events_ms": round(lag_events * 1000, 1),
        "gc_pause_max_events_ms": round(gc_events_pause * 1000, 1),
        "gc_pause_max_ms": round(gc_pause * 1000, 1),
        "gc_full_collections": gc_full,
        "freeze_gc": args.freeze_gc,
        **({"gc_threshold": list(args.gc_threshold)} if args.gc_threshold else {}),
        # What the collector ran with at the end: --gc-threshold, or the kit's own option
        # ([deferrable_kit] triggerer_gc_thresholds), applied when the first trigger ran.
        "gc_threshold_in_effect": list(gc.get_threshold()),
        "cancel_s": round(cancel_s, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--kind", choices=KINDS)
    parser.add_argument(
        "--impl",
        choices=["kit", "official", "floor"],
        default="kit",
        help="floor (datetime, airflow harness): a trigger that only sleeps, i.e. what Airflow's runner itself costs",
    )
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--poll-interval", type=float, default=30.0)
    parser.add_argument("--hold", type=float, default=30.0, help="seconds of steady waiting measured")
    parser.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="at least this many seconds before the hold (default: poll + 3 with --harness plain, else 0)",
    )
    parser.add_argument(
        "--harness",
        choices=["airflow", "plain"],
        default="airflow",
        help="airflow: waits deferred by their sensors and run by Airflow's own TriggerRunner (greenback portal, "
        "structlog JSON at INFO), the hold starting once every wait has polled; plain: cls(**kwargs) tasks, "
        "logging at WARNING, the hold after --warmup (the method before)",
    )
    parser.add_argument(
        "--no-bookkeeping",
        dest="bookkeeping",
        action="store_false",
        help="airflow harness: leave out the runner's once-a-second round over every trigger "
        "(cleanup_finished_triggers, one loop iteration per trigger)",
    )
    parser.add_argument(
        "--startup-timeout",
        type=float,
        default=300.0,
        help="airflow harness: seconds for every wait to make its first poll; past it the cell is reported "
        "as never reaching a steady state (no hold is measured)",
    )
    parser.add_argument("--event-timeout", type=float, default=None, help="default: 2 x poll + 20")
    parser.add_argument(
        "--datetime-startup",
        type=float,
        default=0.0,
        help="datetime, airflow harness: seconds allowed for start-up before the hold (the target comes after)",
    )
    parser.add_argument(
        "--object-census", action="store_true", help="report the objects each wait keeps alive, by type"
    )
    parser.add_argument(
        "--trace-memory",
        action="store_true",
        help="trace Python allocations from the build to the end of the hold: what each waiting wait holds, by "
        "line (the tracing slows the run: its CPU and lag figures are not comparable)",
    )
    parser.add_argument("--out", help="append the JSON line to this file too")
    parser.add_argument(
        "--freeze-gc", action="store_true", help="gc.freeze() after start-up, so full collections skip the imports"
    )
    parser.add_argument(
        "--profile-hold",
        metavar="FILE",
        help="sample the hold's stacks with py-spy into FILE (raw); summarise with benchmarks/poll_profile.py",
    )
    parser.add_argument(
        "--gc-threshold",
        type=lambda text: tuple(int(part) for part in text.split(",")),
        metavar="G0,G1,G2",
        help="gc.set_threshold(G0, G1, G2) before the triggers are built (default: Python's 700,10,10)",
    )
    parser.add_argument("--topics", type=int, help="kafka-topics: how many topics the waits spread over (default N)")
    parser.add_argument("--unrelated-topics", type=int, default=0, help="kafka: other topics on the broker")
    parser.add_argument("--flipper", nargs=3, metavar=("KIND", "N", "ENDPOINT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.topics is None:
        args.topics = 1 if args.kind == "kafka" else max(args.n, 1)
    if args.flipper:
        flipper_main(args.flipper[0], int(args.flipper[1]), args.flipper[2], args.topics, args.unrelated_topics)
        return 0
    if args.kind is None:
        parser.error("--kind is required")
    if args.warmup is None:
        args.warmup = args.poll_interval + 3 if args.harness == "plain" else 0.0
    if args.event_timeout is None:
        args.event_timeout = 2 * args.poll_interval + 20

    home = tempfile.mkdtemp(prefix="adk-bench-")
    os.environ.update(
        AIRFLOW_HOME=home,
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__LOGGING__LOGGING_LEVEL="WARNING" if args.harness == "plain" else "INFO",
        AIRFLOW__CORE__UNIT_TEST_MODE="False",
    )
    real_stdout = sys.stdout
    sessions = args.n if args.impl == "official" and args.kind.startswith("postgres") else 0
    with servers(args.kind, sessions) as (endpoint, server_pid), contextlib.ExitStack() as stack:
        os.environ.update(connections(args.kind, args.impl, endpoint, args.n))
        flipper = None
        if args.kind != "datetime":
            flipper = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.triggerer_load",
                    "--flipper",
                    args.kind,
                    str(args.n),
                    endpoint,
                    "--topics",
                    str(args.topics),
                    "--unrelated-topics",
                    str(args.unrelated_topics),
                ],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
            stack.callback(flipper.kill)
            ready = flipper.stdout.readline().strip()  # type: ignore[union-attr]
            if ready != "READY":
                raise SystemExit(f"flipper failed to prepare the {args.kind} server: {ready!r}")
        # Import Airflow and the trigger modules (and their clients) before the baseline.
        import airflow

        build(args.kind, args.impl, 1, args.poll_interval, dt.datetime.now(dt.timezone.utc).isoformat(), args.topics)
        if args.kind.startswith("kafka") and args.impl == "kit":
            import aiokafka  # noqa: F401
        if args.harness == "plain":
            logging.getLogger().setLevel(logging.WARNING)
            for name in ("airflow", "airflow_deferrable_kit", "airflow.triggers", "aiokafka", "botocore"):
                logging.getLogger(name).setLevel(logging.WARNING)
        else:
            import airflow.jobs.triggerer_job_runner  # noqa: F401 - the runner's imports belong to the baseline

            from benchmarks.faithful import configure_triggerer_logging

            configure_triggerer_logging()
        # The official S3 trigger print()s every poll; that cost stays, its output goes nowhere.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        target_ts = None
        if args.kind == "datetime":
            # The faithful harness builds every sensor's deferral first (about 1 ms each).
            setup = 0.0 if args.harness == "plain" else 5.0 + args.n / 500
            target_ts = time.time() + setup + max(args.warmup, args.datetime_startup) + args.hold + 0.5
        loop = asyncio.new_event_loop()
        try:
            result = loop.run_until_complete(measure(args, flipper, target_ts, endpoint, server_pid))
        finally:
            sys.stdout = real_stdout
        result["server_pid"] = server_pid
        if args.kind == "http-one-url":  # every request of the run, warm-up and events included
            result["requests_served"] = served_requests("http", endpoint)
    line = json.dumps(result)
    print(line, flush=True)
    if args.out:
        with open(args.out, "a") as handle:
            handle.write(line + "\n")
    # Official triggers may leave threads blocked in sync client calls: do not wait for them.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
