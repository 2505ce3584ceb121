"""A private cluster for what the shared one cannot do: restarts, passwords, TLS.

Restarting the session-wide server would disturb other waits' tests, so this module starts its
own cluster with scram-sha-256 for one role, TLS-only access for another, and a self-signed
certificate for 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_deferrable_kit.errors import FatalError, TransientError, WaitError
from airflow_deferrable_kit.testing import run_trigger_payload
from airflow_deferrable_kit.triggers.postgres import PostgresBatchMarkerTrigger
from scripts import services

from .helpers import define_connection, until

PASSWORD = "right-horse-battery-staple"


def _self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    key, cert = directory / f"{name}.key", directory / f"{name}.crt"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return key, cert


@pytest.fixture(scope="module")
def private_pg() -> Iterator[tuple[services.Postgres, Path]]:
    """Yields the server and a directory holding ``server.crt`` (the CA) and ``other.crt``."""
    certs = Path(tempfile.mkdtemp(prefix="adk-pg-certs-"))
    with services.postgres() as server:
        data = server.directory / "data"
        key, cert = _self_signed(certs, "server")
        _self_signed(certs, "other")
        for source, target in ((key, data / "server.key"), (cert, data / "server.crt")):
            shutil.copy(source, target)
            target.chmod(0o600)
            shutil.chown(target, "postgres", "postgres") if server._as_user else None
        hba = data / "pg_hba.conf"
        hba.write_text(
            "host all adk_secret 127.0.0.1/32 scram-sha-256\n"
            "hostssl all adk_tls 127.0.0.1/32 trust\n"
            "hostnossl all adk_tls 127.0.0.1/32 reject\n" + hba.read_text()
        )
        server.psql("ALTER SYSTEM SET ssl = on")
        server.psql("SELECT pg_reload_conf()")
        server.psql(
            f"CREATE ROLE adk_secret LOGIN PASSWORD '{PASSWORD}'; CREATE ROLE adk_tls LOGIN; "
            "CREATE TABLE markers (batch_id text, status text); "
            "GRANT SELECT ON markers TO adk_secret, adk_tls"
        )
        yield server, certs
    shutil.rmtree(certs, ignore_errors=True)


async def test_the_server_restarts_mid_wait_and_both_polling_and_listening_recover(
    private_pg: tuple[services.Postgres, Path], monkeypatch: pytest.MonkeyPatch, classified: list[WaitError]
) -> None:
    server, _ = private_pg
    conn_id = define_connection(monkeypatch, server)
    polling = PostgresBatchMarkerTrigger(
        postgres_conn_id=conn_id, table="markers", match={"batch_id": "restart"}, poll_interval=0.1, max_backoff=0.5
    )
    listening = PostgresBatchMarkerTrigger(
        postgres_conn_id=conn_id,
        table="markers",
        match={"batch_id": "restart"},
        notify_channel="adk_restart",
        poll_interval=30,  # only the listener (re-established after the restart) can wake it in time
    )
    tasks = [asyncio.create_task(run_trigger_payload(t, timeout=45)) for t in (polling, listening)]
    await asyncio.sleep(0.5)
    await asyncio.to_thread(server.restart, 1.0)
    restarted = time.perf_counter()
    await until(lambda: any(isinstance(e, TransientError) for e in classified))
    await asyncio.to_thread(server.psql, "INSERT INTO markers VALUES ('restart', 'done'); NOTIFY adk_restart")
    payloads = await asyncio.gather(*tasks)
    recovered = time.perf_counter() - restarted
    assert [p["status"] for p in payloads] == ["success", "success"]
    assert classified and all(isinstance(e, TransientError) for e in classified)
    kinds = {(e.error_type, e.details.get("condition")) for e in classified}
    assert kinds <= {
        ("network", None),  # refused, reset, or asyncpg saying its connection is closed
        ("network", "connection_exception"),
        ("unavailable", "server_restarting"),
        ("unavailable", "server_unavailable"),
    }, kinds
    seen = sorted(kinds, key=str)
    print(f"\nrestart: both waits succeeded {recovered:.2f}s after the server came back; errors seen: {seen}")


async def test_a_wrong_password_is_fatal_and_the_right_one_works(
    private_pg: tuple[services.Postgres, Path], monkeypatch: pytest.MonkeyPatch, classified: list[WaitError]
) -> None:
    server, _ = private_pg
    wrong = define_connection(monkeypatch, server, login="adk_secret", password="not-the-password")
    payload = await run_trigger_payload(PostgresBatchMarkerTrigger(postgres_conn_id=wrong, sql="SELECT 1 AS one"))
    assert payload["status"] == "error" and payload["error_type"] == "authentication"
    assert payload["condition"] == "authentication_failed" and payload["sqlstate"] == "28P01"
    assert "not-the-password" not in str(payload)
    assert len(classified) == 1 and isinstance(classified[0], FatalError)
    right = define_connection(monkeypatch, server, login="adk_secret", password=PASSWORD)
    trigger = PostgresBatchMarkerTrigger(postgres_conn_id=right, sql="SELECT current_user AS who")
    assert PASSWORD not in str(trigger.serialize())
    payload = await run_trigger_payload(trigger)
    assert payload["row"] == {"who": "adk_secret"}


def _tls_trigger(conn_id: str) -> PostgresBatchMarkerTrigger:
    return PostgresBatchMarkerTrigger(
        postgres_conn_id=conn_id,
        sql="SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
        success=[{"column": "ssl", "equals": True}],
    )


@pytest.mark.parametrize(
    "extra",
    [{"sslmode": "require"}, {"sslmode": "verify-full", "sslrootcert": "server.crt"}],
    ids=["require", "verify-full"],
)
async def test_sslmode_from_the_connection_is_honoured(
    private_pg: tuple[services.Postgres, Path], monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any]
) -> None:
    server, certs = private_pg
    if "sslrootcert" in extra:
        extra = {**extra, "sslrootcert": str(certs / extra["sslrootcert"])}
    conn_id = define_connection(monkeypatch, server, login="adk_tls", extra=extra)
    payload = await run_trigger_payload(_tls_trigger(conn_id))
    assert payload["status"] == "success"
    assert payload["row"]["ssl"] is True and payload["row"]["version"].startswith("TLS")


@pytest.mark.parametrize(
    ("extra", "error_type", "condition"),
    [
        ({"sslmode": "disable"}, "authentication", "authentication_failed"),  # pg_hba rejects plain connections
        ({"sslmode": "verify-full", "sslrootcert": "other.crt"}, "tls", None),  # not signed by our CA
    ],
    ids=["disable", "wrong-ca"],
)
async def test_tls_misconfiguration_is_fatal(
    private_pg: tuple[services.Postgres, Path],
    monkeypatch: pytest.MonkeyPatch,
    classified: list[WaitError],
    extra: dict[str, Any],
    error_type: str,
    condition: str | None,
) -> None:
    server, certs = private_pg
    if "sslrootcert" in extra:
        extra = {**extra, "sslrootcert": str(certs / extra["sslrootcert"])}
    conn_id = define_connection(monkeypatch, server, login="adk_tls", extra=extra)
    payload = await run_trigger_payload(_tls_trigger(conn_id))
    assert payload["status"] == "error" and payload["error_type"] == error_type, payload
    assert payload.get("condition") == condition, payload
    assert len(classified) == 1
