"""The kit's metrics arrive through Airflow's own StatsD backend, named per wait, bounded, off the loop.

A real StatsD listener (a UDP socket on 127.0.0.1) receives what a fresh process sends while it
runs real waits (``tests/unit/metrics_run.py``); Airflow reads its ``[metrics]`` options when it
is imported, so each configuration gets its own process.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import pytest

from airflow_deferrable_kit import _metrics
from airflow_deferrable_kit.testing import run_trigger
from airflow_deferrable_kit.triggers.base import PollingTrigger
from airflow_deferrable_kit.triggers.http import HttpBatchReadyTrigger
from airflow_deferrable_kit.triggers.kafka import KafkaMessageTrigger
from airflow_deferrable_kit.triggers.postgres import PostgresBatchMarkerTrigger
from airflow_deferrable_kit.triggers.s3 import S3KeyTrigger
from airflow_deferrable_kit.triggers.temporal import DateTimeTrigger
from tests import REPO
from tests.unit.sample import LeasingTrigger, ScriptedTrigger

ROOT = REPO
PREFIX = "kit_test.deferrable_kit"
LINE = re.compile(r"^(?P<name>[^:,]+)(?P<tags>(,[^:]*)?):(?P<value>[-0-9.]+)\|(?P<type>c|g|ms)$")


@dataclass
class Metric:
    name: str
    tags: dict[str, str]
    value: float
    type: str


@dataclass
class Run:
    result: dict[str, Any]
    metrics: list[Metric]
    stderr: str

    def values(self, name: str, type_: str) -> list[float]:
        return [m.value for m in self.metrics if m.name == f"{PREFIX}.{name}" and m.type == type_]

    def count(self, name: str) -> float:
        return sum(self.values(name, "c"))


def parse(datagrams: list[bytes]) -> list[Metric]:
    metrics = []
    for line in b"\n".join(datagrams).decode().splitlines():
        match = LINE.match(line)
        assert match, f"not a StatsD line: {line!r}"
        tags = dict(pair.split("=", 1) for pair in match["tags"].split(",") if pair)
        metrics.append(Metric(match["name"], tags, float(match["value"]), match["type"]))
    return metrics


def run_waits(*args: str, **options: str) -> Run:
    """Run tests/unit/metrics_run.py with these ``[metrics]`` options; collect what a StatsD listener got."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.settimeout(0.5)
        return _run_waits(listener, args, options)


def _run_waits(listener: socket.socket, args: tuple[str, ...], options: dict[str, str]) -> Run:
    env = {key: value for key, value in os.environ.items() if not key.startswith("AIRFLOW__METRICS__")}
    env.update(
        AIRFLOW__METRICS__STATSD_ON="True",
        AIRFLOW__METRICS__STATSD_HOST="127.0.0.1",
        AIRFLOW__METRICS__STATSD_PORT=str(listener.getsockname()[1]),
        AIRFLOW__METRICS__STATSD_PREFIX="kit_test",
    )
    env.update({f"AIRFLOW__METRICS__{key.upper()}": value for key, value in options.items()})
    done = subprocess.run(
        [sys.executable, "-m", "tests.unit.metrics_run", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-3000:]
    datagrams = []
    while True:
        try:
            datagrams.append(listener.recv(65535))
        except TimeoutError:
            break
    ours = [m for m in parse(datagrams) if m.name.startswith(PREFIX)]
    return Run(json.loads(lines[-1].removeprefix("RESULT ")), ours, done.stderr)


@pytest.fixture(scope="module")
def plain() -> Run:
    """StatsD on from the start, its host a name, and a resolver taking 0.3 s per lookup."""
    return run_waits("--slow-resolver", statsd_host="localhost")


@pytest.fixture(scope="module")
def tagged_core_only() -> Run:
    """Influx-style tags on; only the core's metrics layer set up (as the triggerer does)."""
    return run_waits("--core-only", statsd_on="False", statsd_influxdb_enabled="True")


ENDED = {"recovers": "success", "fatal": "error", "late": "timeout", "datetime": "success", "http": "success"}


def test_waits_report_polls_errors_events_backoff_and_clients_through_airflows_statsd(plain: Run) -> None:
    run = plain
    assert run.result["statuses"] == ENDED
    assert run.result["blocked"] == []

    # The scripted custom wait, named by its class: none, transient, found; fatal; already late.
    assert run.count("ScriptedTrigger.polls") == 4  # the late one times out before any poll
    assert run.count("ScriptedTrigger.transient_errors.transient") == 1
    assert run.count("ScriptedTrigger.fatal_errors.authorization") == 1
    assert [run.count(f"ScriptedTrigger.events.{s}") for s in ("success", "error", "timeout")] == [1, 1, 1]
    (backoff,) = run.values("ScriptedTrigger.backoff", "ms")
    assert 10 <= backoff <= 20  # full jitter over 0.01 * 2^1 s, floored at the 0.01 s interval
    (took,) = run.values("ScriptedTrigger.time_to_event.success", "ms")
    assert backoff <= took < 30_000

    # The HTTP wait against a real server: 503 (unavailable), then 200.
    assert run.count("http.polls") == 2
    assert run.count("http.transient_errors.unavailable") == 1
    assert run.count("http.events.success") == 1
    assert len(run.values("http.backoff", "ms")) == 1
    assert len(run.values("http.time_to_event.success", "ms")) == 1
    assert run.count("datetime.events.success") == 1

    # Shared clients per client kind: built, leased, given back, closed.
    assert run.values("shared_clients.aiohttp-session.open", "g") == [1, 0]
    assert run.values("shared_clients.aiohttp-session.leases", "g") == [1, 0]
    assert run.values("shared_clients.sample.open", "g") == [1, 0]

    # Bounded cardinality: no connection id, key, path or address in any name.
    names = {m.name for m in run.metrics}
    assert not [n for n in names if re.search(r"metrics_api|v1|status\b|127|k1", n)], names
    assert all(n.count(".") <= 4 for n in names), names


def test_dimensions_also_travel_as_tags_for_backends_that_keep_them(tagged_core_only: Run) -> None:
    tagged = {(m.name.removeprefix(f"{PREFIX}."), tuple(m.tags.items())) for m in tagged_core_only.metrics}
    assert ("http.transient_errors.unavailable", (("wait", "http"), ("error_type", "unavailable"))) in tagged
    assert ("ScriptedTrigger.events.timeout", (("wait", "ScriptedTrigger"), ("status", "timeout"))) in tagged
    assert ("datetime.polls", (("wait", "datetime"),)) in tagged
    assert ("shared_clients.sample.open", (("client", "sample"),)) in tagged


def test_building_the_backend_in_a_fresh_triggerer_process_does_not_block_the_loop(plain: Run) -> None:
    """Airflow builds its StatsD client on a process's first metric, resolving the host name;
    with a 0.3 s resolver that would hold the loop if it happened there."""
    run = plain
    assert run.result["blocked"] == []
    assert run.result["statuses"] == ENDED
    assert run.count("ScriptedTrigger.polls") == 4  # what came while it was built is sent, not lost


def test_the_metrics_layer_the_triggerer_set_up_is_used_when_the_task_sdks_has_no_backend(
    tagged_core_only: Run,
) -> None:
    assert tagged_core_only.result["metrics"] == "on"
    assert tagged_core_only.count("http.events.success") == 1


def test_with_metrics_off_nothing_is_sent_and_nothing_fails() -> None:
    run = run_waits(statsd_on="False")
    assert run.result["statuses"] == ENDED
    assert run.result["metrics"] == "off"
    assert run.metrics == []
    assert "Traceback" not in run.stderr and "Could not" not in run.stderr


# ------------------------------------------------------------------------- naming rules
class Flags(PollingTrigger):
    async def check(self) -> None:
        return None


class NamedFlags(Flags):
    metrics_name = "feature.flags/v2"


def test_each_wait_kind_has_a_short_bounded_name() -> None:
    kinds = [S3KeyTrigger, HttpBatchReadyTrigger, PostgresBatchMarkerTrigger, KafkaMessageTrigger, DateTimeTrigger]
    assert [_metrics.wait_kind(k) for k in kinds] == ["s3", "http", "postgres", "kafka", "datetime"]
    assert _metrics.wait_kind(Flags) == "Flags"
    assert _metrics.wait_kind(NamedFlags) == "feature_flags_v2"  # one segment, safe characters
    assert _metrics.client_kind(("s3", "my_conn", "eu-west-1")) == "s3"
    assert _metrics.client_kind("my_conn") == _metrics.client_kind(42) == "other"
    assert _metrics.bounded_error_type("throttled") == "throttled"
    assert _metrics.bounded_error_type("Bucket my-secret-bucket not found") == "other"


def test_off_costs_one_check_and_never_reaches_airflow(monkeypatch: pytest.MonkeyPatch) -> None:
    sender = _metrics._Sender()
    sender.send("incr", "deferrable_kit.test.polls", 1, {})
    sender.wait_ready(10)
    assert sender._state == "off"  # this test process configures no metrics backend

    def refuse(*args: object) -> None:
        raise AssertionError("sent while off")

    monkeypatch.setattr(_metrics, "_emit", refuse)
    sender.send("incr", "deferrable_kit.test.polls", 1, {})


def test_a_broken_metrics_backend_turns_metrics_off_instead_of_failing_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no such metrics backend")

    class Broken:
        timer = staticmethod(broken)

    monkeypatch.setattr(_metrics, "_LAYERS", (Broken,))
    sender = _metrics._Sender()
    sender.send("incr", "deferrable_kit.test.polls", 1, {})
    sender.wait_ready(10)
    assert sender._state == "off"


async def test_gauges_follow_the_shared_client_registry() -> None:
    before = dict(_metrics._gauges._open), dict(_metrics._gauges._leases)
    waits = [asyncio.ensure_future(run_trigger(LeasingTrigger(key="gauge", poll_interval=0.01))) for _ in range(3)]
    for _ in range(1000):  # until all three hold their lease (bounded)
        if _metrics._gauges._leases["sample"] == before[1].get("sample", 0) + 3:
            break
        await asyncio.sleep(0.01)
    assert _metrics._gauges._open["sample"] == before[0].get("sample", 0) + 1  # three leases, one client
    for wait in waits:
        wait.cancel()
    await asyncio.gather(*waits, return_exceptions=True)
    assert (_metrics._gauges._open["sample"], _metrics._gauges._leases["sample"]) == (
        before[0].get("sample", 0),
        before[1].get("sample", 0),
    )


def test_metrics_are_built_once_per_wait_kind() -> None:
    trigger = ScriptedTrigger(script="x")
    assert isinstance(trigger._metrics, _metrics.WaitMetrics)
    assert trigger._metrics is ScriptedTrigger(script="y")._metrics  # one per wait kind, not per trigger
