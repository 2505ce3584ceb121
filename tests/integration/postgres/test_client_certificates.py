"""TLS client certificates: a certificate the server rejects ends the wait at once, saying why.

A private cluster (the shared one has no TLS) with ``cert`` authentication for one role, the
server's own CA as ``ssl_ca_file``, and client certificates of three kinds: signed by that CA for
the role (accepted), signed by that CA for another name, and signed by a CA the server does not
know. Each rejection must be one fatal error naming the connection, within seconds, never an
outage retried until the deadline.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_deferrable_kit.errors import FatalError, WaitError
from airflow_deferrable_kit.testing import run_trigger_payload
from airflow_deferrable_kit.triggers.postgres import PostgresBatchMarkerTrigger
from scripts import services
from tests.support.certificates import authority, signed

from .helpers import define_connection

ROLE = "adk_cert"


@pytest.fixture(scope="module")
def cert_pg() -> Iterator[tuple[services.Postgres, Path]]:
    """Yields the server and a directory of ``ca.crt`` and client ``<name>.crt``/``<name>.key``."""
    certs = Path(tempfile.mkdtemp(prefix="adk-pg-client-certs-"))
    ca = authority(certs, "ca")
    stranger = authority(certs, "stranger-ca")
    server_cert = signed(certs, "server", "127.0.0.1", ca, server=True)
    signed(certs, "good", ROLE, ca, server=False)
    signed(certs, "other-name", "somebody_else", ca, server=False)
    signed(certs, "unknown-ca", ROLE, stranger, server=False)
    with services.postgres() as server:
        data = server.directory / "data"
        for source, target in (
            (certs / "server.key", data / "server.key"),
            (server_cert, data / "server.crt"),
            (ca[1], data / "root.crt"),
        ):
            shutil.copy(source, target)
            target.chmod(0o600)
            shutil.chown(target, "postgres", "postgres") if server._as_user else None
        hba = data / "pg_hba.conf"
        rules = f"hostssl all {ROLE} 127.0.0.1/32 cert\nhostnossl all {ROLE} 127.0.0.1/32 reject\n"
        hba.write_text(rules + hba.read_text())
        server.psql("ALTER SYSTEM SET ssl = on")
        server.psql("ALTER SYSTEM SET ssl_ca_file = 'root.crt'")
        server.psql("SELECT pg_reload_conf()")
        server.psql(f"CREATE ROLE {ROLE} LOGIN")
        yield server, certs
    shutil.rmtree(certs, ignore_errors=True)


def _connection(monkeypatch: pytest.MonkeyPatch, server: services.Postgres, certs: Path, client: str | None) -> str:
    extra: dict[str, Any] = {"sslmode": "verify-full", "sslrootcert": str(certs / "ca.crt")}
    if client is not None:
        extra |= {"sslcert": str(certs / f"{client}.crt"), "sslkey": str(certs / f"{client}.key")}
    return define_connection(monkeypatch, server, login=ROLE, extra=extra)


def _who_am_i(conn_id: str) -> PostgresBatchMarkerTrigger:
    return PostgresBatchMarkerTrigger(
        postgres_conn_id=conn_id,
        sql="SELECT current_user AS who, ssl, client_dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
    )


async def test_a_certificate_the_server_trusts_logs_in(
    cert_pg: tuple[services.Postgres, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, certs = cert_pg
    payload = await run_trigger_payload(_who_am_i(_connection(monkeypatch, server, certs, "good")))
    assert payload["status"] == "success", payload
    assert payload["row"]["who"] == ROLE and payload["row"]["ssl"] is True
    assert payload["row"]["client_dn"] == f"/CN={ROLE}"


@pytest.mark.parametrize(
    ("client", "error_type", "says"),
    [
        (None, "authentication", "certificate"),  # no certificate at all: the server asks for one
        ("other-name", "authentication", "certificate authentication failed"),  # CN is not the role
        ("unknown-ca", "tls", "unknown ca"),  # signed by a CA the server does not trust
    ],
    ids=["no-certificate", "another-name", "unknown-authority"],
)
async def test_a_rejected_client_certificate_is_one_clear_fatal_error_within_seconds(
    cert_pg: tuple[services.Postgres, Path],
    monkeypatch: pytest.MonkeyPatch,
    classified: list[WaitError],
    client: str | None,
    error_type: str,
    says: str,
) -> None:
    server, certs = cert_pg
    conn_id = _connection(monkeypatch, server, certs, client)
    started = time.perf_counter()
    payload = await run_trigger_payload(_who_am_i(conn_id), timeout=30)
    elapsed = time.perf_counter() - started
    assert payload["status"] == "error" and payload["error_type"] == error_type, payload
    assert says in payload["message"].lower(), payload["message"]
    assert conn_id in payload["message"], payload["message"]  # names the connection
    assert len(classified) == 1 and isinstance(classified[0], FatalError), classified  # no retries
    assert elapsed < 10, f"took {elapsed:.1f}s"
