"""Event watchers: N assets watched in one triggerer loop, all on one S3 prefix, table or topic.

Each watcher is the kit's event trigger with its own pattern (S3: ``drop/*-<i>.csv``) or its own
condition (Postgres: ``dataset = 'd<i>'``), run the way Airflow 3.3's triggerer runs
``AssetWatcher`` triggers: through Airflow's own ``SharedStreamManager`` in ack mode, with an
asset state store each (in memory here: ``WatcherHarness``). The servers run in their own
processes.

Phases: start N watchers -> first look (the starting points saved) -> ``--hold`` s of steady
watching (CPU, polls, requests, loop lag, RSS measured here) -> one new object or row for every
watcher at once -> wait until each watcher fired its event (latency from the moment the last
object or row was written).

* ``polls``: looks at the upstream during the hold (one listing or one query each, for all N).
* ``cpu_ms_per_round``: CPU (user+sys) of this process during the hold / polls.
* ``lag_max_ms``: worst lateness of a 10 ms ticker during the hold and the events.
* ``rss_per_watcher_kb``: (RSS after the hold - RSS before any watcher) / N.
* ``latency_p50_s`` / ``latency_max_s``: from the last write to each watcher's event.

Usage::

    PYTHONPATH=. python -m benchmarks.event_watchers --kind s3 --n 1000 --poll-interval 5 --hold 20

``--kind kafka``: the kit's and the official provider's Kafka watchers side by side on one topic
(see :mod:`benchmarks.event_watchers_kafka`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import resource
import statistics
import time
from collections.abc import Iterator
from typing import Any

from airflow_deferrable_kit.testing_events import WatcherHarness
from airflow_deferrable_kit.triggers.postgres_events import PostgresRowEventTrigger
from airflow_deferrable_kit.triggers.s3_events import S3KeyEventTrigger
from scripts import services

POLLS: list[float] = []


class CountedS3(S3KeyEventTrigger):
    async def poll(self, board: Any) -> Any:
        POLLS.append(time.monotonic())
        return await super().poll(board)


class CountedPostgres(PostgresRowEventTrigger):
    async def poll(self, board: Any) -> Any:
        POLLS.append(time.monotonic())
        return await super().poll(board)


def rss_kb() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@contextlib.contextmanager
def upstream(kind: str) -> Iterator[dict[str, Any]]:
    if kind == "s3":
        with services.s3_server() as server:
            import botocore.session

            client = botocore.session.get_session().create_client(
                "s3", endpoint_url=server.endpoint_url, region_name="us-east-1",
                aws_access_key_id="bench", aws_secret_access_key="bench",
            )  # fmt: skip
            client.create_bucket(Bucket="bench")
            os.environ["AIRFLOW_CONN_BENCH_S3"] = json.dumps(
                {"conn_type": "aws", "login": "bench", "password": "bench-secret",
                 "extra": {"endpoint_url": server.endpoint_url, "region_name": "us-east-1"}}
            )  # fmt: skip
            yield {"client": client}
    else:
        with services.postgres() as server:
            server.psql("CREATE TABLE loads (id serial PRIMARY KEY, dataset text NOT NULL)")
            os.environ["AIRFLOW_CONN_BENCH_PG"] = json.dumps(
                {"conn_type": "postgres", "host": "127.0.0.1", "port": server.port, "login": "postgres",
                 "schema": "postgres"}
            )  # fmt: skip
            yield {"server": server}


def watchers(kind: str, n: int, interval: float) -> list[Any]:
    if kind == "s3":
        return [
            CountedS3(bucket_key=f"s3://bench/drop/*-{i:05d}.csv", wildcard_match=True, aws_conn_id="bench_s3",
                      poll_interval=interval)
            for i in range(n)
        ]  # fmt: skip
    return [
        CountedPostgres(postgres_conn_id="bench_pg", table="loads", order_column="id", poll_interval=interval,
                        batch_size=2000, success=[{"column": "dataset", "equals": f"d{i:05d}"}])
        for i in range(n)
    ]  # fmt: skip


def make_news(kind: str, up: dict[str, Any], n: int) -> None:
    """One new object or row for every watcher (written in one go, as a burst)."""
    if kind == "s3":
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: up["client"].put_object(Bucket="bench", Key=f"drop/f-{i:05d}.csv", Body=b"x"),
                          range(n)))  # fmt: skip
    else:
        values = ", ".join(f"('d{i:05d}')" for i in range(n))
        up["server"].psql(f"INSERT INTO loads (dataset) VALUES {values}")


async def measure(kind: str, n: int, interval: float, hold: float) -> dict[str, Any]:
    up_ctx = upstream(kind)
    up = up_ctx.__enter__()
    try:
        return await _measure(kind, up, n, interval, hold)
    finally:
        up_ctx.__exit__(None, None, None)


async def _measure(kind: str, up: dict[str, Any], n: int, interval: float, hold: float) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    lag = {"max": 0.0, "on": False}

    async def ticker() -> None:
        while True:
            start = loop.time()
            await asyncio.sleep(0.01)
            if lag["on"]:
                lag["max"] = max(lag["max"], loop.time() - start - 0.01)

    tick = asyncio.ensure_future(ticker())
    rss_before = rss_kb()
    started = time.monotonic()
    async with WatcherHarness() as triggerer:
        watches = [await triggerer.start(w, assets=(f"asset-{i}",)) for i, w in enumerate(watchers(kind, n, interval))]
        for _ in range(6000):  # until every starting point is saved
            if sum(store.writes for store in triggerer.stores.by_asset.values()) >= n:
                break
            await asyncio.sleep(0.05)
        start_s = time.monotonic() - started
        await asyncio.sleep(interval)
        polls0, cpu0 = len(POLLS), cpu()
        lag["on"] = True
        await asyncio.sleep(hold)
        polls, cpu_s = len(POLLS) - polls0, cpu() - cpu0
        rss_after = rss_kb()
        await asyncio.to_thread(make_news, kind, up, n)
        written = time.monotonic()
        fired: dict[int, float] = {}
        while len(fired) < n and time.monotonic() - written < 300:
            for i, watch in enumerate(watches):
                if i not in fired and watch.events:
                    fired[i] = time.monotonic() - written
            await asyncio.sleep(0.02)
        lag["on"] = False
        extra = sum(max(len(w.events) - 1, 0) for w in watches)
    tick.cancel()
    latencies = sorted(fired.values())
    return {
        "kind": kind,
        "watchers": n,
        "poll_interval_s": interval,
        "hold_s": hold,
        "start_s": round(start_s, 1),
        "polls": polls,
        "polls_due": round(hold / interval, 1),
        "cpu_ms_per_round": round(cpu_s / max(polls, 1) * 1000, 1),
        "cpu_core_pct": round(cpu_s / hold * 100, 1),
        "lag_max_ms": round(lag["max"] * 1000, 1),
        "rss_per_watcher_kb": round((rss_after - rss_before) / n, 1),
        "events": len(fired),
        "missing": n - len(fired),
        "extra_events": extra,
        "latency_p50_s": round(statistics.median(latencies), 2) if latencies else None,
        "latency_max_s": round(latencies[-1], 2) if latencies else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("s3", "postgres", "kafka"), required=True)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--poll-interval", type=float, default=5.0)
    parser.add_argument("--hold", type=float, default=20.0)
    parser.add_argument("--freeze-gc", action="store_true", help="kafka: gc.freeze() after start-up in each process")
    args = parser.parse_args()
    logging.disable(logging.INFO)  # a thousand "Watching ..." lines are not the measurement
    if args.kind == "kafka":
        from benchmarks.event_watchers_kafka import side_by_side

        print(json.dumps(side_by_side(args.n, args.poll_interval, args.hold, freeze_gc=args.freeze_gc)))
        return
    print(json.dumps(asyncio.run(measure(args.kind, args.n, args.poll_interval, args.hold))))


if __name__ == "__main__":
    main()
