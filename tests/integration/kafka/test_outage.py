"""Broker outages and rejected credentials, against a real broker.

While a broker is down, connection attempts per connection fall off exponentially (jittered,
capped) whatever the number of waits and topics, aiokafka's fixed retry loops included, and
the kit logs one line per backoff step instead of aiokafka's error per attempt; recovery comes
within one backoff step. Wrong SASL credentials end every wait with one fatal
``authentication`` error within seconds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import pytest

from airflow_deferrable_kit import _backoff, leases
from airflow_deferrable_kit._kafka import gate as _kafka_gate
from airflow_deferrable_kit._kafka import settings as kafka_settings
from airflow_deferrable_kit._kafka.gate import ConnectGate, ConnectGates, gates_for
from airflow_deferrable_kit._kafka.settings import CONNECT_BACKOFF_CAP
from airflow_deferrable_kit.testing import run_trigger
from scripts import services
from tests.integration.kafka.conftest import (
    Message,
    PrivateBroker,
    ProxiedBroker,
    create_topics,
    eventually,
    key_is,
    make,
    produce_elsewhere,
    set_connection,
    unique,
)

#: How long the broker stays down in the outage test.
OUTAGE_SECONDS = 10.0
#: The outage test's waits: their ``max_backoff`` caps the gate (the default would be 30 s).
MAX_BACKOFF = 8.0
POLL_INTERVAL = 1.0


async def test_the_gate_backs_off_exponentially_up_to_its_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_backoff.random, "uniform", lambda low, high: high)  # the ceiling of each step
    gate = ConnectGate("conn", "broker:9092")
    delays = []
    for _ in range(9):
        assert gate.try_begin()
        delays.append(round(gate.failed("refused"), 3))
        assert not gate.try_begin()  # refused until the delay has passed
        gate.not_before = 0.0  # as if it had
    assert delays == [
        1,
        2,
        4,
        8,
        16,
        CONNECT_BACKOFF_CAP,
        CONNECT_BACKOFF_CAP,
        CONNECT_BACKOFF_CAP,
        CONNECT_BACKOFF_CAP,
    ]
    assert gate.try_begin()
    gate.succeeded()
    assert not gate.down and gate.try_begin() and gate.try_begin()  # healthy: every client at once


async def test_the_gates_cap_is_the_smallest_max_backoff_of_the_waits_using_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_backoff.random, "uniform", lambda low, high: high)  # the ceiling of each step
    gates = ConnectGates("conn")
    gate = gates.for_address("broker", 9092)

    def delays(steps: int) -> list[float]:
        gate.failures, found = 0, []
        for _ in range(steps):
            assert gate.try_begin()
            found.append(round(gate.failed("refused"), 3))
            gate.not_before = 0.0
        return found

    assert gates.cap == CONNECT_BACKOFF_CAP
    for _ in range(20):
        gates.hold_cap(300.0)  # twenty waits with the default max_backoff
    gates.hold_cap(5.0)  # one that asked to be retried at least every 5 s
    assert gates.cap == 5.0 and delays(6) == [1, 2, 4, 5, 5, 5]
    gates.drop_cap(5.0)  # it ended: the others are back to the package's cap
    assert gates.cap == CONNECT_BACKOFF_CAP and delays(7)[-2:] == [CONNECT_BACKOFF_CAP] * 2
    # A gate already holding off for 30 s is brought forward when a wait asking for 5 s comes.
    assert gate.try_begin()
    assert gate.failed("refused") == CONNECT_BACKOFF_CAP and gate.seconds_to_wait() > 29
    gates.hold_cap(5.0)
    assert gate.seconds_to_wait() <= 5.0


async def test_waits_that_asked_for_a_short_max_backoff_are_not_held_to_the_package_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Twenty waits with the default ``max_backoff`` and one with a short one, on a connection whose
    broker is down: every reconnect delay the shared gate draws is within the short one."""
    monkeypatch.setattr(_backoff.random, "uniform", lambda low, high: high)
    monkeypatch.setattr(kafka_settings, "CONNECT_BACKOFF_BASE", 0.05)  # steps 0.1, 0.2, 0.4, 0.8, 1.6, ...
    drawn: list[float] = []
    failed = ConnectGate.failed

    def recording(self: ConnectGate, error: str | None = None) -> float:
        delay = failed(self, error)
        drawn.append(round(delay, 3))
        return delay

    monkeypatch.setattr(ConnectGate, "failed", recording)
    conn = set_connection(monkeypatch, "kafka_down", f"127.0.0.1:{services.free_port()}")  # nothing listens
    triggers = [make(f"t{i % 5}", conn, poll_interval=1.0) for i in range(20)]
    triggers.append(make("t0", conn, poll_interval=0.1, max_backoff=0.5))
    tasks = [asyncio.ensure_future(run_trigger(t, timeout=60)) for t in triggers]
    try:
        await eventually(lambda: len(drawn) >= 7, timeout=30)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    print(f"delays drawn: {drawn}")
    # Without the cap the fifth step would be 1.6 s and the sixth 3.2 s.
    assert max(drawn) == 0.5 and drawn[:4] == [0.1, 0.2, 0.4, 0.5], drawn
    assert gates_for(conn).cap == CONNECT_BACKOFF_CAP  # every wait ended: nothing held
    assert leases.held_keys() == {}


async def test_attempts_during_an_outage_fall_off_and_recovery_comes_within_one_step(
    monkeypatch: pytest.MonkeyPatch, proxied_broker: ProxiedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """50 waits over 10 topics, the broker unreachable for 10 s, then back.

    The gate's cap is the waits' ``max_backoff`` (8 s here; 30 s by default): the first attempt
    after the broker is back is at most one step away, so the waiting message is delivered within
    ``max_backoff`` plus what a reconnected wait needs anyway: a probe's timeout, one fetch wait
    and one poll interval (the bound below, from the settings, not a timing of this machine).
    """
    caplog.set_level(logging.INFO)
    conn = set_connection(monkeypatch, "kafka_proxied", proxied_broker.bootstrap_servers)
    bootstrap = proxied_broker.bootstrap_servers
    names = await asyncio.to_thread(asyncio.run, create_topics(bootstrap, [unique("out") for _ in range(10)], 2))
    triggers = [
        make(names[i % 10], conn, acceptors=[key_is(f"k{i}")], poll_interval=POLL_INTERVAL, max_backoff=MAX_BACKOFF)
        for i in range(50)
    ]
    tasks = [asyncio.ensure_future(run_trigger(t, timeout=120)) for t in triggers]
    await eventually(
        lambda: all(t._subscription is not None and t.topics[0] in t._subscription.waiter.attached for t in triggers),
        30,
    )
    proxy = proxied_broker.proxy
    caplog.clear()

    down_at = time.monotonic()
    proxy.go_down()
    await asyncio.sleep(OUTAGE_SECONDS)
    gates = [gate for gate in gates_for(conn).gates.values() if gate.down]
    wait_left = max(gate.seconds_to_wait() for gate in gates)
    up_at = time.monotonic()
    proxy.come_back()
    placed = await produce_elsewhere(bootstrap, names[0], Message({"n": 0}, key="k0"))
    payload = (await tasks[0]).payload
    recovered_in = time.monotonic() - up_at

    attempts = proxy.attempts_between(down_at, up_at)
    first_half = proxy.attempts_between(down_at, down_at + OUTAGE_SECONDS / 2)
    second_half = attempts - first_half
    gaps = [round(b - a, 2) for a, b in zip(proxy.accepts, proxy.accepts[1:], strict=False)]
    print(
        f"{len(triggers)} waits, 10 topics: {attempts} attempts in {OUTAGE_SECONDS:.0f}s, gaps {gaps}; "
        f"recovered in {recovered_in:.2f}s (next attempt was due in {wait_left:.2f}s)"
    )
    assert payload["status"] == "success" and (payload["partition"], payload["offset"]) == placed[0]
    # aiokafka alone retries every 250 ms per consumer (two here): ~80 attempts in 10 s.
    assert 2 <= attempts <= 12, proxy.accepts
    assert second_half <= first_half, gaps
    gate_lines = [r for r in caplog.records if r.name == _kafka_gate.__name__ and r.levelno == logging.WARNING]
    assert 1 <= len(gate_lines) <= attempts  # one line per backoff step
    loud = [r for r in caplog.records if r.name.startswith("aiokafka") and r.levelno >= logging.WARNING]
    assert loud == [], [r.getMessage() for r in loud][:5]
    assert any("reachable again" in r.getMessage() for r in caplog.records)
    assert gates_for(conn).cap == MAX_BACKOFF  # the waits' max_backoff capped the gate
    reconnected_wait = kafka_settings.PROBE_TIMEOUT_MS / 1000 + kafka_settings.FETCH_WAIT_MS / 1000 + POLL_INTERVAL
    assert wait_left <= MAX_BACKOFF
    assert recovered_in <= wait_left + reconnected_wait
    assert recovered_in <= MAX_BACKOFF + reconnected_wait  # within one backoff step, whatever the draw
    for task in tasks[1:]:
        task.cancel()
    await asyncio.gather(*tasks[1:], return_exceptions=True)
    assert leases.held_keys() == {}


def sasl_connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, bootstrap: str, mechanism: str) -> None:
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}",
        json.dumps(
            {
                "conn_type": "kafka",
                "login": "nobody",
                "password": "s3cret-pw",
                "extra": {
                    "bootstrap.servers": bootstrap,
                    "security.protocol": "SASL_PLAINTEXT",
                    "sasl.mechanism": mechanism,
                },
            }
        ),
    )


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
async def test_wrong_credentials_are_one_fatal_authentication_error_within_seconds(
    monkeypatch: pytest.MonkeyPatch, authenticating_broker: PrivateBroker, mechanism: str
) -> None:
    """tansu closes the connection in the SASL exchange on PLAIN (no error answer) and answers
    SCRAM with an error aiokafka cannot parse; both are a rejected login, not an outage."""
    sasl_connection(monkeypatch, "kafka_sasl", authenticating_broker.bootstrap_servers, mechanism)
    triggers = [make(f"topic-{i}", "kafka_sasl", poll_interval=5) for i in range(5)]
    started = time.monotonic()
    payloads: list[dict[str, Any]] = [
        e.payload for e in await asyncio.gather(*(run_trigger(t, timeout=20) for t in triggers))
    ]
    took = time.monotonic() - started
    assert [p["error_type"] for p in payloads] == ["authentication"] * 5, payloads[0]
    assert "SASL" in payloads[0]["message"] and "s3cret-pw" not in json.dumps(payloads)
    assert took < 10, took
