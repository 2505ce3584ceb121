"""Connection -> aiokafka options for the Kafka wait, and every per-process tunable of its engine.

A Kafka connection's host/port, extras and credentials become the keyword arguments every
aiokafka client of the wait is started with, and its TLS files one shared ``SSLContext``. The
secret is read here, in the triggerer, and never leaves the returned options. Errors name the
connection and are fatal ``bad_connection``: asking again cannot fix a malformed connection.
"""

from __future__ import annotations

import dataclasses
import ssl
from collections.abc import Iterator, Mapping
from typing import Any, Final

from airflow_deferrable_kit._tls import TlsFiles, build_ssl_context
from airflow_deferrable_kit.connections import get_connection, get_extra
from airflow_deferrable_kit.errors import ErrorType, FatalError

SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI")


# ============================================================================ connection
def options_from_connection(
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


@dataclasses.dataclass(frozen=True)
class KafkaOptions(Mapping[str, Any]):
    """One connection's aiokafka client keyword arguments: frozen, hashable, secret kept out of its repr.

    A mapping of exactly the keywords every client of the wait is started with
    (``AIOKafkaConsumer(**options)``); ``conn_id`` names the connection and is not one of them.
    """

    conn_id: str
    bootstrap_servers: tuple[str, ...]
    security_protocol: str = "PLAINTEXT"
    client_id: str = "airflow-deferrable-kit"
    sasl_mechanism: str | None = None
    sasl_kerberos_service_name: str | None = None
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = dataclasses.field(default=None, repr=False)
    ssl_context: ssl.SSLContext | None = dataclasses.field(default=None, repr=False)

    @property
    def lease_key(self) -> tuple[str, str]:
        """The shared reader's key: one reader per connection id in the process (:func:`reader_key`)."""
        return reader_key(self.conn_id)

    def _keywords(self) -> dict[str, Any]:
        keywords = {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if field.name != "conn_id" and getattr(self, field.name) is not None
        }
        keywords["bootstrap_servers"] = list(self.bootstrap_servers)
        return keywords

    def __getitem__(self, key: str) -> Any:
        return self._keywords()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keywords())

    def __len__(self) -> int:
        return len(self._keywords())


def reader_key(conn_id: str) -> tuple[str, str]:
    """The lease key of a connection's shared reader, known before its options are loaded: the
    reader loads them once, when the first wait on the connection opens it."""
    return ("kafka-connection", conn_id)


async def load_options(conn_id: str) -> KafkaOptions:
    """Resolve ``conn_id`` in the triggerer into aiokafka's client options (secrets never leave them)."""
    conn = await get_connection(conn_id, argument="kafka_conn_id", conn_types=("kafka",))
    extra = await get_extra(conn)
    options, tls = options_from_connection(
        conn_id=conn_id, host=conn.host, port=conn.port, login=conn.login, password=conn.password, extra=extra
    )
    context = None
    if tls is not None:
        files = TlsFiles(tls["cafile"], tls["certfile"], tls["keyfile"], tls["password"], bool(tls["check_hostname"]))
        context = await build_ssl_context(files, where=f"kafka_conn_id={conn_id!r}")
    servers = tuple(options.pop("bootstrap_servers"))
    return KafkaOptions(conn_id=conn_id, bootstrap_servers=servers, ssl_context=context, **options)


__all__ = [
    "SASL_MECHANISMS",
    "SECURITY_PROTOCOLS",
    "KafkaOptions",
    "load_options",
    "options_from_connection",
    "reader_key",
]

# ============================================================================ tunables
# Per process, not per wait: the reader, its hand-out and its gates are shared by every wait of a
# connection, so these are module constants read when used (a test or an operator may set them).

# client
#: How long a probe connection (telling a SASL rejection from a broker that is down) may take.
PROBE_TIMEOUT_MS = 5_000

# gate
#: Backoff between connection attempts to one broker: full jitter on base * 2^n, capped.
CONNECT_BACKOFF_BASE = 0.5
CONNECT_BACKOFF_CAP = 30.0

# reader
#: How often the reader looks for new partitions and topics (and for log ends that moved back).
PARTITION_REFRESH_SECONDS = 30.0
#: How long one fetch waits for data before the reader loop turns over.
FETCH_WAIT_MS = 1000
#: Records taken from the consumer per fetch.
MAX_RECORDS_PER_FETCH = 5000
#: How stale the shared consumers' own view of leaders may get (errors refresh it at once).
METADATA_MAX_AGE_MS = 300_000
#: How often the positions of partitions that returned nothing are re-read from the consumer.
POSITION_SYNC_SECONDS = 1.0
#: Restarts (each after a backoff) of a fetch or lookup that fails with an error naming no topic,
#: before it counts as the connection's error and ends the waits it concerns.
FETCH_RESTARTS = 5

# fanout
#: A waiter's queue of messages awaiting its predicate; past either bound it leaves the reader
#: and catches up on its own, so a slow waiter never makes the process hold the stream for it.
WAITER_QUEUE_MESSAGES = 256
WAITER_QUEUE_BYTES = 4 * 1024 * 1024
#: Fan-out work after which the reader yields to the event loop...
DISPATCH_SLICE_SECONDS = 0.01
#: ...or waits woken (each then builds its event on the loop) after which it does.
WAKES_PER_SLICE = 32

# catchup
#: Own-pace catch-up consumers (waits whose predicate fell behind) at once per connection.
MAX_CATCHUPS_PER_CONNECTION = 8
#: How long a connection keeps its catch-up consumer after the last pass, for the next late wait.
CATCH_UP_LINGER_SECONDS = 30.0

# lookups
#: How long a question waits for others to join it before the batch is asked.
GATHER_SECONDS = 0.005

# offsets
#: How long the worker's one-off lookup of the log end offsets may take (bootstrap included).
LOG_END_LOOKUP_SECONDS = 30.0

# stream
#: The most messages (and value bytes) a stream queues from the shared reader between two
#: batches; past either it leaves the reader and reads on at its own pace, batch by batch.
STREAM_QUEUE_MESSAGES = 5000
STREAM_QUEUE_BYTES = 16 * 1024 * 1024
