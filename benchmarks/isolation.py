"""Blast radius at scale: one poisoned member among N waits of one shared mechanism.

The claim checked: one poisoned member among 1,000 leaves the others' event p99 and the
process CPU per poll within 10% of a run without it. For each cell two runs are made side by
side, each in a fresh process on fresh servers: (a) N healthy waits, (b) the same N waits and
one poisoned member (or, for ``s3-folder/listing-slowdown``, the shared listing itself failing).
Both runs do the same server-side work (the poison's objects, topics and rows exist in both);
only the poisoned member (or the fault) differs.

Each run is the triggerer-faithful harness of ``triggerer_load.py`` (``faithful.py``): every
wait is deferred by its own sensor and run by Airflow's ``TriggerRunner`` (greenback portal,
structlog JSON at INFO, the once-a-second bookkeeping round); the hold starts once every wait
has made its first poll. Phases: start-up -> hold (``--hold`` s: the poison acts from its
start; CPU and loop lag measured) -> flip (every healthy wait's condition made true by the
flipper process of ``triggerer_load.py``) -> the healthy waits' events.

Measured, for the healthy members only (the process cannot split its CPU, so (b)'s CPU also
holds what the poisoned member costs):

* ``p99``: event p99 = the runner queued the wait's event - its condition became true (S3: its
  key's PUT completed; HTTP: the server flipped the shared URL; Postgres: the ``INSERT`` of every
  marker committed; Kafka: its message's produce was acknowledged);
* ``cpu_ms_per_poll``: process CPU (user+sys, ``getrusage``) during the hold / the healthy
  polls due (N x hold / poll interval); the server's own count of requests (S3, HTTP) or the
  statements sent (Postgres) in the hold are reported beside it, so fewer polls made shows.

A cell passes when neither ratio (b)/(a) exceeds 1.10 and no healthy wait is missing or ends
other than ``success``. Cells (``--cell``, default all):

====================================  ======================================================
``s3-folder/head-403``                N exact keys ``shared/k-{i:05d}.csv`` of one folder (one
                                      shared listing); one more wait on ``shared/poison.csv``,
                                      whose HEAD answers 403 (fault proxy) once the object
                                      appears at the start of the hold
``s3-folder/listing-slowdown``        the same N waits; the folder's listing answers 503
                                      SlowDown for the first half of the hold (no extra wait)
``http-shared/500``                   N waits on one URL (one shared answer); one more wait on
                                      a URL that always answers 500
``http-shared/slow``                  the same; the poisoned URL answers after an hour, so its
                                      every request ends at the wait's ``request_timeout``
``postgres-batch/slow-query``         N waits of one query shape (one batched statement per
                                      round, ``statement_timeout`` 2 s); one more wait whose
                                      row, inserted at the start of the hold, makes the query
                                      run 10 s (``pg_sleep``): past any batch's budget (8 s)
``kafka-topics/undecodable``          N waits on one connection over ``--topics`` topics; one
                                      more wait on a topic whose lz4 batch, produced at the
                                      start of the hold, this process cannot decode (as
                                      ``tests/integration/kafka/test_isolation.py`` injects it)
====================================  ======================================================

The quiet run (about 10 minutes at N=1,000 on two cores)::

    PYTHONPATH=. .venv/bin/python -m benchmarks.isolation --n 1000
    PYTHONPATH=. .venv/bin/python -m benchmarks.isolation --report

Results go to ``benchmarks/isolation.json`` (``--out``), one entry per cell, replaced by a re-run.
``--repeat 2`` runs a b b a (each variant's median is used) when the machine drifts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.quiet import MachineBusy, quiet_cell
from benchmarks.triggerer_load import (
    BUCKET,
    LagMeter,
    connections,
    cpu_seconds,
    free_port,
    percentile,
    served_requests,
    servers,
    statements_sent,
    topic_of,
    wait_port,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "isolation.json"
#: A ratio (b)/(a) above this is a cell that fails the claim.
LIMIT = 1.10
#: The poisoned member's object, query key and topic.
POISON_KEY = "shared/poison.csv"
POISON_ID = -1
POISON_TOPIC = "poison"
#: Postgres: every wait's ``statement_timeout`` and how long the poisoned row makes the query run:
#: past the budget of a batch of any size (``statement_timeout`` x ``BUDGET_SCALE_MAX``, 4).
PG_TIMEOUT_S = 2.0
PG_SLOW_S = 10.0
#: HTTP ``slow``: the poisoned wait's own request timeout (its requests never answer).
HTTP_SLOW_TIMEOUT_S = 10.0


@dataclasses.dataclass(frozen=True)
class Cell:
    """One shared mechanism and one way of poisoning it."""

    name: str
    #: The ``triggerer_load`` kind whose servers, connection and flipper the cell uses.
    kind: str
    #: Whether (b) adds a member (``False``: the fault hits the shared mechanism itself).
    adds_member: bool = True

    @property
    def mechanism(self) -> str:
        return self.name.split("/")[0]

    @property
    def poison(self) -> str:
        return self.name.split("/")[1]


CELLS = {
    c.name: c
    for c in (
        Cell("s3-folder/head-403", "s3-shared-prefix"),
        Cell("s3-folder/listing-slowdown", "s3-shared-prefix", adds_member=False),
        Cell("http-shared/500", "http"),
        Cell("http-shared/slow", "http"),
        Cell("postgres-batch/slow-query", "postgres"),
        Cell("kafka-topics/undecodable", "kafka-topics"),
    )
}


# ---------------------------------------------------------------------------- the waits
def deferrals(cell: Cell, poisoned: bool, n: int, poll: float, topics: int) -> list[Any]:
    """Each wait as its sensor defers it: the N healthy ones, then the poisoned one (index N)."""
    from benchmarks.faithful import _deferred

    kit: dict[str, Any] = {"poke_interval": poll, "deferrable": True, "check_before_defer": False}
    start_ms = int((time.time() - 60) * 1000)

    def sensor(i: int, poison: bool) -> Any:
        kw = {"task_id": f"wait_{i}", **kit}
        if cell.mechanism == "s3-folder":
            from airflow_deferrable_kit.sensors.s3 import S3KeySensor

            key = POISON_KEY if poison else f"shared/k-{i:05d}.csv"
            return S3KeySensor(bucket_key=key, bucket_name=BUCKET, aws_conn_id="bench_aws", **kw)
        if cell.mechanism == "http-shared":
            from airflow_deferrable_kit.sensors.http import HttpBatchReadySensor

            if not poison:
                return HttpBatchReadySensor(http_conn_id="bench_http", endpoint="ready/0", **kw)
            extra: dict[str, Any] = {"request_timeout": HTTP_SLOW_TIMEOUT_S} if cell.poison == "slow" else {}
            return HttpBatchReadySensor(http_conn_id="bench_http", endpoint=f"poison/{cell.poison}", **extra, **kw)
        if cell.mechanism == "postgres-batch":
            from airflow_deferrable_kit.sensors.postgres import PostgresBatchMarkerSensor

            return PostgresBatchMarkerSensor(
                postgres_conn_id="bench_pg",
                table="markers_v",
                match={"id": POISON_ID if poison else i},
                statement_timeout=PG_TIMEOUT_S,
                **kw,
            )
        from airflow_deferrable_kit.sensors.kafka import KafkaMessageSensor

        return KafkaMessageSensor(
            topics=[POISON_TOPIC if poison else topic_of(cell.kind, i, topics)],
            kafka_conn_id="bench_kafka",
            start_after=start_ms,
            success=[{"path": "id", "equals": POISON_ID if poison else i}],
            **kw,
        )

    out = [_deferred(sensor(i, False)) for i in range(n)]
    if poisoned and cell.adds_member:
        out.append(_deferred(sensor(n, True)))
    return out


# ------------------------------------------------------------------------- fault proxy
def serve_proxy(upstream: str, port: int) -> None:
    """Separate process: ``tests/integration/s3/fault_proxy.py``'s proxy in front of the S3 server, with two rules.

    ``POST /__poison__/head403?key=K``: every HEAD of ``K`` answers 403 from then on;
    ``POST /__poison__/slowdown?seconds=S``: every ``ListObjectsV2`` answers 503 SlowDown for S s.
    Everything else is forwarded untouched (SigV4 still verifies). Its record of what it saw is
    dropped as it goes: the benchmark counts polls at the server.
    """
    import aiohttp
    from aiohttp import web

    from tests.integration.s3.fault_proxy import FaultProxy

    class PoisonProxy(FaultProxy):
        def __init__(self, upstream: str) -> None:
            super().__init__(upstream)
            self.forbidden: set[str] = set()
            self.slow_until = 0.0

        async def _handle(self, request: web.Request) -> web.StreamResponse:
            if request.path.startswith("/__poison__/"):
                if request.path.endswith("/head403"):
                    self.forbidden.add(request.query["key"])
                else:
                    self.slow_until = time.monotonic() + float(request.query["seconds"])
                return web.json_response({"ok": True})
            self.seen.clear()
            self.peers.clear()
            if request.method == "HEAD" and request.path.lstrip("/") in self.forbidden:  # path-style: bucket/key
                return web.Response(status=403)
            listing = request.method == "GET" and request.query.get("list-type") == "2"
            if listing and time.monotonic() < self.slow_until:
                self.fail_next(1, listings_only=True)
            return await super()._handle(request)

    async def main() -> None:
        proxy = PoisonProxy(upstream)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", proxy._handle)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        proxy._session = aiohttp.ClientSession(auto_decompress=False)
        await asyncio.Event().wait()

    asyncio.run(main())


# ---------------------------------------------------------------------------- poisoner
def poisoner_main(cell: Cell, poisoned: bool, endpoint: str, proxy: str | None, hold: float) -> None:
    """Separate process: prepare what both runs share, print READY; on a line from stdin, act, print DONE.

    Both runs get the same objects, rows and topics; a fault on the shared mechanism itself
    (the listing's SlowDown) only in (b). Kept out of the measured process so its CPU is not
    counted there.
    """
    import urllib.request

    def post(url: str) -> None:
        with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=30):
            pass

    act: Any = None
    if cell.mechanism == "s3-folder":
        import boto3

        s3 = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        assert proxy is not None

        def act() -> None:
            # 403 from the hold on (before, a HEAD of it says 404 as for any missing key); then the
            # object appears, so a shared listing holds it and the wait HEADs it.
            post(f"{proxy}/__poison__/head403?key={BUCKET}/{POISON_KEY}")
            s3.put_object(Bucket=BUCKET, Key=POISON_KEY, Body=b"a,b\n")
            if poisoned and cell.poison == "listing-slowdown":
                post(f"{proxy}/__poison__/slowdown?seconds={hold / 2}")

    elif cell.mechanism == "postgres-batch":
        import asyncpg

        async def prepare() -> None:
            conn = await asyncpg.connect(endpoint)
            await conn.execute(
                f"""CREATE FUNCTION slow_for(key int) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
                    BEGIN IF key = {POISON_ID} THEN PERFORM pg_sleep({PG_SLOW_S}); END IF; RETURN true; END $$"""
            )
            await conn.execute("CREATE VIEW markers_v AS SELECT * FROM markers WHERE slow_for(id)")
            await conn.close()

        async def insert() -> None:
            # The poisoned wait's row appears at the start of the hold: from then on its query
            # runs past the batch's budget (the first round) and its own timeout (every later one).
            conn = await asyncpg.connect(endpoint)
            await conn.execute(f"INSERT INTO markers VALUES ({POISON_ID}, 'ready')")
            await conn.close()

        asyncio.run(prepare())

        def act() -> None:
            asyncio.run(insert())
    elif cell.mechanism == "kafka-topics":
        from aiokafka import AIOKafkaProducer
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic

        async def create() -> None:
            admin = AIOKafkaAdminClient(bootstrap_servers=endpoint)
            await admin.start()
            await admin.create_topics([NewTopic(POISON_TOPIC, num_partitions=1, replication_factor=1)])
            await admin.close()

        async def produce() -> None:
            producer = AIOKafkaProducer(bootstrap_servers=endpoint, compression_type="lz4", linger_ms=20)
            await producer.start()
            try:
                sent = [await producer.send(POISON_TOPIC, json.dumps({"id": POISON_ID}).encode()) for _ in range(3)]
                await asyncio.gather(*sent)
            finally:
                await producer.stop()

        asyncio.run(create())

        def act() -> None:
            asyncio.run(produce())

    print("READY", flush=True)
    sys.stdin.readline()
    if act is not None:
        act()
    print("DONE", flush=True)


# ------------------------------------------------------------------------ one variant
def _helper(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        start_new_session=True,
    )


def _ready(proc: subprocess.Popen[str], what: str) -> None:
    line = proc.stdout.readline().strip()  # type: ignore[union-attr]
    if line != "READY":
        raise SystemExit(f"{what} failed to prepare: {line!r}")


@contextlib.contextmanager
def fault_proxy(upstream: str) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.isolation", "--serve-proxy", upstream, "--port", str(port)],
        cwd=ROOT,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        wait_port(port, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def run_variant(cell: Cell, poisoned: bool, args: argparse.Namespace) -> dict[str, Any]:
    """One run (a) or (b) in this process: servers, flipper and poisoner in others."""
    os.environ.update(
        AIRFLOW_HOME=tempfile.mkdtemp(prefix="adk-iso-"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__LOGGING__LOGGING_LEVEL="INFO",
        AIRFLOW__CORE__UNIT_TEST_MODE="False",
    )
    real_stdout = sys.stdout
    with servers(cell.kind) as (upstream, _), contextlib.ExitStack() as stack:
        endpoint = stack.enter_context(fault_proxy(upstream)) if cell.mechanism == "s3-folder" else upstream
        os.environ.update(connections(cell.kind, "kit", endpoint, args.n))
        flipper = _helper(
            ["benchmarks.triggerer_load", "--flipper", cell.kind, str(args.n), upstream, "--topics", str(args.topics)]
        )
        stack.callback(flipper.kill)
        _ready(flipper, "the flipper")
        poisoner = _helper(
            ["benchmarks.isolation", "--poisoner", cell.name, "poisoned" if poisoned else "healthy", upstream]
            + (["--proxy", endpoint] if endpoint != upstream else [])
            + ["--hold", str(args.hold)]
        )
        stack.callback(poisoner.kill)
        _ready(poisoner, "the poisoner")
        import airflow.jobs.triggerer_job_runner  # noqa: F401 - the runner's imports belong to the baseline

        from benchmarks.faithful import configure_triggerer_logging

        if cell.mechanism == "kafka-topics":
            # This process cannot decode lz4 (in both runs: only (b) waits on the lz4 topic), as
            # tests/integration/kafka/test_isolation.py injects an undecodable batch; the poisoner encodes it.
            import aiokafka.codec

            aiokafka.codec.has_lz4 = lambda: False
        configure_triggerer_logging()
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        loop = asyncio.new_event_loop()
        try:
            result = loop.run_until_complete(measure(cell, poisoned, args, flipper, poisoner, upstream))
        finally:
            sys.stdout = real_stdout
    return result


async def measure(
    cell: Cell,
    poisoned: bool,
    args: argparse.Namespace,
    flipper: subprocess.Popen[str],
    poisoner: subprocess.Popen[str],
    upstream: str,
) -> dict[str, Any]:
    from benchmarks import faithful

    loop = asyncio.get_running_loop()
    n = args.n
    pending_work = faithful.run_trigger_workloads(deferrals(cell, poisoned, n, args.poll_interval, args.topics))
    total = len(pending_work)
    probe = faithful.install_startup_probe(cell.kind, "kit")
    fired: dict[int, float] = {}
    statuses: dict[int, Any] = {}
    gc.collect()
    lag = LagMeter()
    ticker = asyncio.ensure_future(lag.run())
    runner = faithful.bench_runner(fired, statuses)
    runner.to_create.extend(pending_work)
    del pending_work
    t_build = time.monotonic()
    watchdog = asyncio.ensure_future(runner.block_watchdog())
    keeper = asyncio.ensure_future(faithful.bookkeeping(runner))
    await runner.create_triggers()
    tasks = [details["task"] for details in runner.triggers.values()]

    limit = t_build + args.startup_timeout
    while probe.count() < total and time.monotonic() < limit and not all(t.done() for t in tasks):  # noqa: ASYNC110
        await asyncio.sleep(0.25)
    first_polls = probe.count()
    probe.remove()  # the hold runs the unmodified code
    startup_s = time.monotonic() - t_build
    result: dict[str, Any] = {
        "cell": cell.name,
        "variant": "poisoned" if poisoned else "healthy",
        "n": n,
        "waits": total,
        "poll_interval": args.poll_interval,
        "startup_s": round(startup_s, 2),
        "steady_state": first_polls >= total,
        "fired_before_hold": sorted(fired),
    }
    if not result["steady_state"]:
        result["startup_first_polls"] = first_polls
    lag.take()

    # Hold: the poison acts from its start (the same server-side action in both runs).
    poisoner.stdin.write("GO\n")  # type: ignore[union-attr]
    poisoner.stdin.flush()  # type: ignore[union-attr]
    acted = loop.run_in_executor(None, poisoner.stdout.readline)  # type: ignore[union-attr]
    served0 = await loop.run_in_executor(None, _served, cell, upstream)
    statements0 = statements_sent(cell.kind, "kit")
    cpu0, t0 = cpu_seconds(), time.monotonic()
    await asyncio.sleep(args.hold)
    cpu1, t1 = cpu_seconds(), time.monotonic()
    statements1 = statements_sent(cell.kind, "kit")
    served1 = await loop.run_in_executor(None, _served, cell, upstream)
    hold = t1 - t0
    due = n * hold / args.poll_interval
    result.update(
        hold_s=round(hold, 2),
        cpu_hold_s=round(cpu1 - cpu0, 3),
        cpu_core_pct=round(100 * (cpu1 - cpu0) / hold, 2),
        healthy_polls_due=round(due),
        cpu_ms_per_poll=1000 * (cpu1 - cpu0) / due,
        poison_acted=(await acted).strip() == "DONE",
    )
    if served0 is not None and served1 is not None:
        result["requests_in_hold"] = served1 - served0
    if statements0 is not None and statements1 is not None:
        result["statements_in_hold"] = statements1 - statements0

    # Flip every healthy wait's condition and wait for their events.
    flipper.stdin.write("FLIP\n")  # type: ignore[union-attr]
    flipper.stdin.flush()  # type: ignore[union-attr]
    times: list[float] = json.loads(await loop.run_in_executor(None, flipper.stdout.readline))["times"]  # type: ignore[union-attr]
    deadline = time.monotonic() + args.event_timeout
    while sum(i < n for i in fired) < n and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    lag_run = lag.take()
    for task in tasks:
        if not task.done():
            task.cancel()
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
    for each in (ticker, watchdog, keeper):
        each.cancel()

    latencies = [fired[i] - times[i] for i in fired if i < n and times[i]]
    healthy_statuses: dict[str, int] = {}
    for i in range(n):
        status = str(statuses.get(i, "missing"))
        healthy_statuses[status] = healthy_statuses.get(status, 0) + 1
    result.update(
        healthy_events=sum(i < n for i in fired),
        healthy_statuses=healthy_statuses,
        p50_s=percentile(latencies, 0.5),
        p99_s=percentile(latencies, 0.99),
        max_s=max(latencies) if latencies else None,
        lag_max_ms=round(lag_run * 1000, 1),
    )
    if total > n:
        result["poison_event"] = statuses.get(n, "none (still waiting at the end)")
    return result


def _served(cell: Cell, upstream: str) -> int | None:
    """Requests the server answered so far (S3: HEADs and listings; HTTP: the waits' URLs)."""
    return served_requests("s3" if cell.mechanism == "s3-folder" else cell.kind, upstream)


# ------------------------------------------------------------------------ orchestration
def run_pair(cell: Cell, args: argparse.Namespace) -> dict[str, Any]:
    """(a) and (b) of one cell, each in a fresh process; ``--repeat 2``: a b b a."""
    order = [False, True]
    for r in range(1, args.repeat):
        order += [True, False] if r % 2 else [False, True]
    runs: dict[str, list[dict[str, Any]]] = {"healthy": [], "poisoned": []}
    for poisoned in order:
        variant = "poisoned" if poisoned else "healthy"
        command = [sys.executable, "-m", "benchmarks.isolation", "--variant", cell.name, variant]
        command += ["--n", str(args.n), "--poll-interval", str(args.poll_interval), "--hold", str(args.hold)]
        command += ["--topics", str(args.topics), "--event-timeout", str(args.event_timeout)]
        print(f"{cell.name} {variant} ...", file=sys.stderr, flush=True)
        done = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode or not lines:
            runs[variant].append({"variant": variant, "failed": done.stderr[-2000:]})
        else:
            runs[variant].append(json.loads(lines[-1]))
    return summarise(cell, args, runs)


def _median(runs: list[dict[str, Any]], name: str) -> float | None:
    values = [r[name] for r in runs if r.get(name) is not None]
    return statistics.median(values) if values else None


def summarise(cell: Cell, args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "cell": cell.name,
        "n": args.n,
        "poll_interval": args.poll_interval,
        "hold_s": args.hold,
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "runs": runs,
    }
    complete = True
    for variant, each in runs.items():
        for run in each:
            healthy = run.get("healthy_statuses", {})
            complete &= bool(run.get("steady_state")) and healthy.get("success", 0) == args.n
        out[variant] = {name: _median(each, name) for name in ("p99_s", "cpu_ms_per_poll", "p50_s", "lag_max_ms")}
    for name in ("p99_s", "cpu_ms_per_poll"):
        a, b = out["healthy"][name], out["poisoned"][name]
        out[f"ratio_{name}"] = b / a if a and b is not None else None
    ratios = [out["ratio_p99_s"], out["ratio_cpu_ms_per_poll"]]
    out["within_10pct"] = complete and all(r is not None and r <= LIMIT for r in ratios)
    out["every_healthy_wait_succeeded"] = complete
    return out


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def report(results: dict[str, Any]) -> str:
    """The results as a markdown table, one row per cell."""

    def num(value: Any, scale: float = 1.0, digits: int = 3) -> str:
        return "-" if value is None else f"{value * scale:.{digits}f}"

    lines = [
        "| mechanism / poison | N | event p99 s (a) | (b) | ratio | CPU ms/poll (a) | (b) | ratio "
        "| poisoned member's event | within 10% |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in CELLS:
        r = results.get(name)
        if r is None:
            continue
        poison = {run.get("poison_event") for run in r["runs"]["poisoned"] if "poison_event" in run}
        lines.append(
            f"| `{name}` | {r['n']:,} | {num(r['healthy']['p99_s'])} | {num(r['poisoned']['p99_s'])} "
            f"| {num(r['ratio_p99_s'], digits=2)} | {num(r['healthy']['cpu_ms_per_poll'])} "
            f"| {num(r['poisoned']['cpu_ms_per_poll'])} | {num(r['ratio_cpu_ms_per_poll'], digits=2)} "
            f"| {', '.join(sorted(map(str, poison))) or '(no extra member)'} "
            f"| {'yes' if r['within_10pct'] else '**no**'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cell", action="append", choices=list(CELLS), help="default: every cell")
    parser.add_argument("--n", type=int, default=1000, help="healthy waits per run")
    parser.add_argument("--poll-interval", type=float, default=5.0)
    parser.add_argument("--hold", type=float, default=20.0, help="seconds of steady waiting measured")
    parser.add_argument("--topics", type=int, default=None, help="kafka: topics the waits spread over (N/10)")
    parser.add_argument("--event-timeout", type=float, default=None, help="default: 2 x poll + 20")
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--repeat", type=int, default=1, help="runs per variant (2: a b b a)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--report", action="store_true", help="only print the table from --out")
    parser.add_argument("--patience", type=float, default=600.0, help="seconds to wait for a quiet machine per cell")
    parser.add_argument("--allow-busy", action="store_true", help="measure on a busy machine; marked busy")
    parser.add_argument("--variant", nargs=2, metavar=("CELL", "VARIANT"), help=argparse.SUPPRESS)
    parser.add_argument("--poisoner", nargs=3, metavar=("CELL", "VARIANT", "ENDPOINT"), help=argparse.SUPPRESS)
    parser.add_argument("--proxy", help=argparse.SUPPRESS)
    parser.add_argument("--serve-proxy", metavar="UPSTREAM", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.topics is None:
        args.topics = max(1, args.n // 10)
    if args.event_timeout is None:
        args.event_timeout = 2 * args.poll_interval + 20
    if args.serve_proxy:
        serve_proxy(args.serve_proxy, args.port)
        return 0
    if args.poisoner:
        name, variant, endpoint = args.poisoner
        poisoner_main(CELLS[name], variant == "poisoned", endpoint, args.proxy, args.hold)
        return 0
    if args.variant:
        name, variant = args.variant
        result = run_variant(CELLS[name], variant == "poisoned", args)
        print(json.dumps(result), flush=True)
        os._exit(0)  # a wait's client may leave threads behind: do not wait for them
    if args.report:
        print(report(load(args.out)))
        return 0
    results = load(args.out)
    for name in args.cell or list(CELLS):
        try:
            with quiet_cell(patience=args.patience, allow_busy=args.allow_busy) as machine:
                results[name] = {**run_pair(CELLS[name], args), **machine}
        except MachineBusy as busy:
            print(f"{name}: refused, {busy}; the recorded result (if any) is kept", file=sys.stderr, flush=True)
            continue
        args.out.write_text(json.dumps(results, indent=1) + "\n")
        print(report({name: results[name]}).splitlines()[-1], file=sys.stderr, flush=True)
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
