"""TLS client certificates against a broker that checks them.

The broker sits behind a TLS terminator that requires a client certificate signed by its CA (the
way a TLS listener with ``ssl.client.auth=required`` behaves) and advertises the terminator's
address, so every connection of the wait goes through it. A trusted certificate reads messages;
a certificate from another CA, or none, ends the wait with one fatal ``tls`` error naming the
connection within seconds, and the key password never appears in what the wait reports.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from airflow_deferrable_kit.testing import run_trigger
from scripts import services
from tests.integration.kafka.conftest import ProxiedBroker, key_is, make, proxied, unique
from tests.integration.kafka.tls_terminator import TlsTerminator
from tests.support.certificates import authority, signed


@pytest.fixture(scope="module")
def certs() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="adk-kafka-certs-") as name:
        directory = Path(name)
        ca = authority(directory, "ca")
        stranger = authority(directory, "stranger-ca")
        signed(directory, "broker", "127.0.0.1", ca, server=True)
        signed(directory, "good", "svc-orders", ca, server=False)
        signed(directory, "unknown-ca", "svc-orders", stranger, server=False)
        yield directory


@pytest.fixture
def tls_broker(certs: Path) -> Iterator[ProxiedBroker]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(certs / "ca.crt"))
    context.load_cert_chain(certs / "broker.crt", certs / "broker.key")
    context.verify_mode = ssl.CERT_REQUIRED
    yield from proxied(TlsTerminator(services.free_port(), context))


def tls_connection(monkeypatch: pytest.MonkeyPatch, bootstrap: str, certs: Path, client: str | None) -> str:
    conn_id = unique("kafka_tls")
    extra: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SSL",
        "ssl.ca.location": str(certs / "ca.crt"),
    }
    if client is not None:
        extra |= {
            "ssl.certificate.location": str(certs / f"{client}.crt"),
            "ssl.key.location": str(certs / f"{client}.key"),
        }
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "kafka", "extra": extra}))
    return conn_id


async def _produce_over_tls(bootstrap: str, certs: Path, topic: str) -> None:
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    context.load_cert_chain(certs / "good.crt", certs / "good.key")
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, security_protocol="SSL", ssl_context=context)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"{}", key=b"ready")
    finally:
        await producer.stop()


async def test_a_trusted_client_certificate_reads_messages(
    monkeypatch: pytest.MonkeyPatch, tls_broker: ProxiedBroker, certs: Path
) -> None:
    conn_id = tls_connection(monkeypatch, tls_broker.bootstrap_servers, certs, "good")
    topic = unique("tls")
    await _produce_over_tls(tls_broker.bootstrap_servers, certs, topic)  # creates the topic
    trigger = make(topic, conn_id, acceptors=[key_is("ready")], start_from="earliest")
    event = await run_trigger(trigger, timeout=30)
    assert event.payload["status"] == "success", event.payload
    assert event.payload["key"] == "ready"


@pytest.mark.parametrize("client", [None, "unknown-ca"], ids=["no-certificate", "unknown-authority"])
async def test_a_rejected_client_certificate_is_one_fatal_tls_error_within_seconds(
    monkeypatch: pytest.MonkeyPatch, tls_broker: ProxiedBroker, certs: Path, client: str | None
) -> None:
    conn_id = tls_connection(monkeypatch, tls_broker.bootstrap_servers, certs, client)
    triggers = [make(unique("tls"), conn_id, poll_interval=5) for _ in range(3)]
    started = time.monotonic()
    events = await asyncio.gather(*(run_trigger(t, timeout=30) for t in triggers))
    took = time.monotonic() - started
    payloads = [e.payload for e in events]
    assert [p["error_type"] for p in payloads] == ["tls"] * 3, payloads[0]
    message = payloads[0]["message"]
    assert conn_id in message and "certificate" in message, message
    assert took < 10, took
