"""Connection -> aiokafka options for the Kafka wait (the first half of its client module).

A Kafka connection's host/port, extras and credentials become the keyword arguments every
aiokafka client of the wait is started with, and its TLS files one shared ``SSLContext``. The
secret is read here, in the triggerer, and never leaves the returned options. Errors name the
connection and are fatal ``bad_connection``: asking again cannot fix a malformed connection.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from airflow_deferrable_kit._tls import TlsFiles, build_ssl_context
from airflow_deferrable_kit.connections import get_connection, get_extra
from airflow_deferrable_kit.errors import ErrorType
from airflow_deferrable_kit.payload import FatalError

SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI")


# ============================================================================ connection
def client_options(
    *,
    conn_id: str,
    host: str | None,
    port: int | None,
    login: str | None,
    password: str | None,
    extra: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """aiokafka client kwargs from an Airflow Kafka connection, plus TLS file settings to load.

    Reads the keys the official ``kafka`` connection uses (librdkafka names such as
    ``bootstrap.servers``, ``security.protocol``, ``sasl.mechanism``, ``sasl.username``,
    ``ssl.ca.location``); the host/port and login/password fields fill in what the extra omits.
    Everything unknown (``group.id``, ``auto.offset.reset``...) is ignored: this wait never joins
    a group.
    """
    where = f"kafka_conn_id={conn_id!r}"

    def pick(*names: str) -> Any:
        for name in names:
            value = extra.get(name)
            if value not in (None, ""):
                return value
        return None

    servers = pick("bootstrap.servers", "bootstrap_servers")
    if servers is None and host:
        servers = ",".join(h if ":" in h or not port else f"{h}:{port}" for h in str(host).split(",") if h.strip())
    if isinstance(servers, str):
        servers = [s.strip() for s in servers.split(",") if s.strip()]
    if not servers or not isinstance(servers, list) or not all(isinstance(s, str) for s in servers):
        raise FatalError(
            f"{where}: no bootstrap servers; set extra 'bootstrap.servers' (e.g. 'broker1:9092,broker2:9092') "
            "or the connection host and port",
            error_type=ErrorType.BAD_CONNECTION,
        )
    for server in servers:
        _, _, server_port = server.rpartition(":")
        if not server_port.isdigit():
            raise FatalError(
                f"{where}: bootstrap server {server!r} must be host:port", error_type=ErrorType.BAD_CONNECTION
            )
    protocol = str(pick("security.protocol", "security_protocol") or "PLAINTEXT").upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise FatalError(
            f"{where}: security.protocol must be one of {', '.join(SECURITY_PROTOCOLS)}, got {protocol!r}",
            error_type=ErrorType.BAD_CONNECTION,
        )
    options: dict[str, Any] = {
        "bootstrap_servers": servers,
        "security_protocol": protocol,
        "client_id": str(pick("client.id", "client_id") or "airflow-deferrable-kit"),
    }
    if protocol.startswith("SASL"):
        mechanism = str(pick("sasl.mechanism", "sasl.mechanisms", "sasl_mechanism") or "PLAIN").upper()
        if mechanism not in SASL_MECHANISMS:
            raise FatalError(
                f"{where}: sasl.mechanism must be one of {', '.join(SASL_MECHANISMS)}, got {mechanism!r}",
                error_type=ErrorType.BAD_CONNECTION,
            )
        options["sasl_mechanism"] = mechanism
        if mechanism == "GSSAPI":
            options["sasl_kerberos_service_name"] = str(pick("sasl.kerberos.service.name") or "kafka")
        else:
            username = pick("sasl.username", "sasl_plain_username") or login
            secret = pick("sasl.password", "sasl_plain_password") or password
            if not username or not secret:
                raise FatalError(
                    f"{where}: {mechanism} needs a username and password (the connection's login and password, "
                    "or extra 'sasl.username' / 'sasl.password')",
                    error_type=ErrorType.BAD_CONNECTION,
                )
            options["sasl_plain_username"] = str(username)
            options["sasl_plain_password"] = str(secret)
    tls: dict[str, Any] | None = None
    if protocol in ("SSL", "SASL_SSL"):
        identification = pick("ssl.endpoint.identification.algorithm")
        tls = {
            "cafile": pick("ssl.ca.location", "ssl_cafile"),
            "certfile": pick("ssl.certificate.location", "ssl_certfile"),
            "keyfile": pick("ssl.key.location", "ssl_keyfile"),
            "password": pick("ssl.key.password", "ssl_password"),
            "check_hostname": str(identification).lower() != "none" if identification is not None else True,
        }
    return options, tls


async def load_client_options(conn_id: str) -> dict[str, Any]:
    """Resolve ``conn_id`` in the triggerer into aiokafka kwargs (secrets never leave this call)."""
    conn = await get_connection(conn_id, argument="kafka_conn_id", conn_types=("kafka",))
    extra = await get_extra(conn)
    options, tls = client_options(
        conn_id=conn_id, host=conn.host, port=conn.port, login=conn.login, password=conn.password, extra=extra
    )
    if tls is not None:
        files = TlsFiles(tls["cafile"], tls["certfile"], tls["keyfile"], tls["password"], bool(tls["check_hostname"]))
        options["ssl_context"] = await build_ssl_context(files, where=f"kafka_conn_id={conn_id!r}")
    return options


__all__ = ["SASL_MECHANISMS", "SECURITY_PROTOCOLS", "client_options", "load_client_options"]
