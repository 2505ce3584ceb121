"""Kafka event watchers side by side: N assets on one topic, the kit's watcher and the official one.

Each of N watchers fires for the messages whose JSON value has ``"id": "k<i>"``:

* ``kit``: ``KafkaMessageEventTrigger`` with one acceptor (``path id equals k<i>``);
* ``official``: the apache-kafka provider's ``KafkaSharedStreamTrigger`` (the provider's own
  AssetWatcher trigger with a shared consumer and commits behind persistence), with
  ``filter_shared_stream`` overridden to keep the same ``id``, as its docstring says to.

Both run through Airflow's own ``SharedStreamManager`` in ack mode (``WatcherHarness``, events
stored at once), each in a process of its own, one after the other, on the same tansu broker.
Phases: start N watchers -> ready (kit: every starting point saved; official: a probe message
for watcher 0 fired, so its consumer group is joined and assigned) -> ``hold`` s idle (CPU, RSS,
loop lag) -> one message per watcher in one burst -> every watcher's event.

* ``broker_sockets_max``: TCP connections of the process to the broker (sampled every 0.5 s).
* ``consumers``: Kafka consumers started (the kit: aiokafka, fetch / lookup / own-pace; the
  official: confluent-kafka).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

from airflow.triggers.base import TriggerEvent

from airflow_deferrable_kit.testing_events import WatcherHarness
from benchmarks.event_watchers import POLLS, cpu, rss_kb
from scripts import services

IMPLS = ("kit", "official")


def broker_sockets(port: int) -> int:
    """Established TCP connections from this process to ``port`` (from /proc)."""
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as handle:
            next(handle)
            for line in handle:
                fields = line.split()
                if fields[3] == "01" and int(fields[2].rsplit(":", 1)[1], 16) == port and fields[9] in inodes:
                    count += 1
    return count


def make_watchers(impl: str, topic: str, n: int, interval: float) -> list[Any]:
    if impl == "kit":
        from airflow_deferrable_kit.triggers.kafka_events import KafkaMessageEventTrigger

        class CountedKafka(KafkaMessageEventTrigger):
            async def poll(self, board: Any) -> Any:
                POLLS.append(time.monotonic())
                return await super().poll(board)

        condition = {"state": "success", "matcher": "path", "argument": "id", "comparator": "equals"}
        return [
            CountedKafka(topics=[topic], kafka_conn_id="bench_kafka", poll_interval=interval,
                         acceptors=[{**condition, "expected": f"k{i:05d}"}])
            for i in range(n)
        ]  # fmt: skip
    return [
        OfficialWatcher(wanted=f"k{i:05d}", topics=[topic], kafka_config_id="bench_kafka_official") for i in range(n)
    ]


def _official_base() -> type:
    from airflow.providers.apache.kafka.triggers.shared_stream import KafkaSharedStreamTrigger

    return KafkaSharedStreamTrigger


class OfficialWatcher(_official_base()):  # type: ignore[misc]
    """The official shared-stream watcher, keeping only the messages whose ``id`` is ``wanted``."""

    def __init__(self, *, wanted: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.wanted = wanted

    def serialize(self) -> tuple[str, dict[str, Any]]:
        _, kwargs = super().serialize()
        return f"{__name__}.OfficialWatcher", {**kwargs, "wanted": self.wanted}

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncGenerator[TriggerEvent, None]:
        async for value in shared_stream:
            text = self._decode(value)
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                if json.loads(text).get("id") == self.wanted:
                    yield TriggerEvent(text)


def count_consumers(impl: str) -> list[Any]:
    """Every consumer started from now on."""
    started: list[Any] = []
    if impl == "kit":
        from airflow_deferrable_kit._kafka import catchup as _kafka_catchup
        from airflow_deferrable_kit._kafka import reader as _kafka_reader

        for module in (_kafka_reader, _kafka_catchup):
            original = module.start_consumer

            async def counting(options: Any, *, _original: Any = original, **kwargs: Any) -> Any:
                consumer = await _original(options, **kwargs)
                started.append(consumer)
                return consumer

            module.start_consumer = counting  # type: ignore[assignment]
    else:
        from airflow.providers.apache.kafka.hooks.consume import KafkaConsumerHook

        get_consumer = KafkaConsumerHook.get_consumer

        def counted(self: Any) -> Any:
            consumer = get_consumer(self)
            started.append(consumer)
            return consumer

        KafkaConsumerHook.get_consumer = counted  # type: ignore[method-assign]
    return started


async def produce(bootstrap: str, topic: str, ids: list[str]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        sent = [await producer.send(topic, json.dumps({"id": i}).encode()) for i in ids]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


async def create_topic(bootstrap: str, topic: str, partitions: int = 3) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    finally:
        await admin.close()


async def measure(impl: str, bootstrap: str, n: int, interval: float, hold: float) -> dict[str, Any]:
    topic = f"bench-watch-{uuid.uuid4().hex[:8]}"
    await create_topic(bootstrap, topic)
    os.environ["AIRFLOW_CONN_BENCH_KAFKA"] = json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": bootstrap}}
    )
    os.environ["AIRFLOW_CONN_BENCH_KAFKA_OFFICIAL"] = json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": bootstrap, "group.id": f"bench-{topic}",
                                         "enable.auto.commit": False, "auto.offset.reset": "latest"}}
    )  # fmt: skip
    port = int(bootstrap.rsplit(":", 1)[1])
    consumers = count_consumers(impl)

    async def produce_elsewhere(ids: list[str]) -> float:
        """Produce from another process, so that its work (and GIL) is not measured as the watchers';
        returns the moment the last message was acknowledged (the process says so, then exits)."""
        command = [sys.executable, "-m", "benchmarks.event_watchers_kafka", "produce", bootstrap, topic, *ids]
        process = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE)
        assert process.stdout is not None
        line = await process.stdout.readline()
        sent = time.monotonic()
        if await process.wait() or line.strip() != b"sent":
            raise RuntimeError(f"producing {len(ids)} messages failed")
        return sent

    loop = asyncio.get_running_loop()
    lag = {"max": 0.0, "on": False, "sockets": 0}

    async def ticker() -> None:
        while True:
            start = loop.time()
            await asyncio.sleep(0.01)
            if lag["on"]:
                lag["max"] = max(lag["max"], loop.time() - start - 0.01)

    async def sampler() -> None:
        # In a thread: reading /proc/net/tcp on a busy host takes long enough to show as loop lag.
        while True:
            lag["sockets"] = max(lag["sockets"], await asyncio.to_thread(broker_sockets, port))
            await asyncio.sleep(0.5)

    sampling = asyncio.ensure_future(sampler())
    tick = asyncio.ensure_future(ticker())
    rss_before = rss_kb()
    started = time.monotonic()
    async with WatcherHarness() as triggerer:
        watches = [
            await triggerer.start(w, assets=(f"asset-{i}",))
            for i, w in enumerate(make_watchers(impl, topic, n, interval))
        ]
        if impl == "kit":
            for _ in range(6000):  # until every starting point is saved
                if sum(store.writes for store in triggerer.stores.by_asset.values()) >= n:
                    break
                await asyncio.sleep(0.05)
        else:
            while not watches[0].events and time.monotonic() - started < 300:  # its group joined, assigned
                await produce_elsewhere(["k00000"])
                await asyncio.sleep(1.0)
            watches[0].events.clear()
        start_s = time.monotonic() - started
        await asyncio.sleep(interval)
        polls0, cpu0 = len(POLLS), cpu()
        lag["on"] = True
        await asyncio.sleep(hold)
        polls, cpu_s = len(POLLS) - polls0, cpu() - cpu0
        rss_after = rss_kb()
        streams = len(triggerer.manager._groups)
        written = await produce_elsewhere([f"k{i:05d}" for i in range(n)])
        fired: dict[int, float] = {}
        while len(fired) < n and time.monotonic() - written < 300:
            for i, watch in enumerate(watches):
                if i not in fired and watch.events:
                    fired[i] = time.monotonic() - written
            await asyncio.sleep(0.02)
        burst_cpu = cpu() - cpu0 - cpu_s
        lag["on"] = False
        extra = sum(max(len(w.events) - 1, 0) for w in watches)
    tick.cancel()
    sampling.cancel()
    latencies = sorted(fired.values())
    return {
        "impl": impl,
        "watchers": n,
        "poll_interval_s": interval,
        "hold_s": hold,
        "start_s": round(start_s, 1),
        "kit_looks": polls if impl == "kit" else None,
        "idle_cpu_core_pct": round(cpu_s / hold * 100, 1),
        "burst_cpu_s": round(burst_cpu, 2),
        "lag_max_ms": round(lag["max"] * 1000, 1),
        "rss_per_watcher_kb": round((rss_after - rss_before) / n, 1),
        "broker_sockets_max": lag["sockets"],
        "shared_streams": streams,
        "consumers": len(consumers),
        "events": len(fired),
        "missing": n - len(fired),
        "extra_events": extra,
        "latency_p50_s": round(statistics.median(latencies), 2) if latencies else None,
        "latency_max_s": round(latencies[-1], 2) if latencies else None,
    }


def side_by_side(n: int, interval: float, hold: float, *, freeze_gc: bool = False) -> dict[str, Any]:
    """Both implementations, each in a fresh process, on one broker; and the official/kit ratios.

    ``freeze_gc``: each process moves its start-up objects (Airflow's ~160k) out of the collector's
    reach first, so a full collection (0.4-0.6 s here) is not counted as the watchers' loop lag.
    """
    results: dict[str, Any] = {}
    env = {**os.environ, "ADK_BENCH_FREEZE_GC": "1" if freeze_gc else ""}
    with services.kafka() as broker:
        for impl in IMPLS:
            command = [sys.executable, "-m", "benchmarks.event_watchers_kafka", impl, broker.bootstrap_servers,
                       str(n), str(interval), str(hold)]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=1200, env=env)
            results[impl] = json.loads(done.stdout.strip().splitlines()[-1])
    kit, official = results["kit"], results["official"]
    ratios = {}
    for key in ("idle_cpu_core_pct", "burst_cpu_s", "rss_per_watcher_kb", "broker_sockets_max", "latency_max_s"):
        if kit.get(key) and official.get(key) is not None:
            ratios[key] = round(official[key] / kit[key], 2)
    return {**results, "official_over_kit": ratios, "gc_frozen": freeze_gc}


def main() -> None:
    import logging

    if sys.argv[1] == "produce":
        bootstrap, topic, *ids = sys.argv[2:]
        asyncio.run(produce(bootstrap, topic, ids))
        print("sent", flush=True)
        return
    impl, bootstrap, n, interval, hold = sys.argv[1:6]
    logging.disable(logging.INFO)
    if os.environ.get("ADK_BENCH_FREEZE_GC"):
        import gc

        import airflow.providers.apache.kafka.triggers.shared_stream  # noqa: F401 - imported before the freeze

        import airflow_deferrable_kit.triggers.kafka_events  # noqa: F401

        gc.collect()
        gc.freeze()
    print(json.dumps(asyncio.run(measure(impl, bootstrap, int(n), float(interval), float(hold)))))


if __name__ == "__main__":
    main()
