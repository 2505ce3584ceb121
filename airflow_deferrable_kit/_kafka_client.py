"""The aiokafka side of the Kafka wait: connection -> client options, library errors -> ours,
consumers and admin clients started safely, offset lookups and the opt-in commit.

Credentials never leave this module's :func:`load_client_options`: the trigger carries a
``kafka_conn_id`` and the secret is read here, in the triggerer.

Every use of an aiokafka private API is in the fenced section at the end of this module, each
with the reason and the version it was checked against, so an aiokafka upgrade has one place to
look at.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from airflow_deferrable_kit._tls import TlsFiles, build_ssl_context
from airflow_deferrable_kit.connections import get_connection, get_extra
from airflow_deferrable_kit.errors import ErrorType
from airflow_deferrable_kit.payload import FatalError, TransientError, WaitError

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

log = logging.getLogger(__name__)

SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI")
#: How long a cancelled waiter lets a consumer's start finish before stopping it.
START_GRACE_SECONDS = 10.0

#: How long the worker's one-off lookup of the log end offsets may take (bootstrap included).
LOG_END_LOOKUP_SECONDS = 30.0

#: A group's committed offsets for some partitions (-1 where it has none).
CommittedLookup = Callable[[list["TopicPartition"]], Awaitable[dict["TopicPartition", int]]]
#: Per-partition offsets as they travel in trigger kwargs: ``{topic: {"<partition>": offset}}``
#: (JSON object keys are strings).
StartOffsets = Mapping[str, Mapping[str, int]]


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


# ================================================================================ errors
_AUTH_ERRORS: Final = ("SaslAuthenticationFailed", "UnsupportedSaslMechanismError", "IllegalSaslStateError")
_ACCESS_ERRORS: Final = (
    "TopicAuthorizationFailedError",
    "GroupAuthorizationFailedError",
    "ClusterAuthorizationFailedError",
)


def classify_kafka_error(exc: BaseException) -> WaitError | None:
    """Transient or fatal for aiokafka's exceptions; ``None`` if it is not one of them."""
    if isinstance(exc, WaitError):
        return exc
    from aiokafka import errors

    name = type(exc).__name__
    if name in _AUTH_ERRORS:
        return FatalError(f"authentication failed: {name}: {exc}", error_type=ErrorType.AUTHENTICATION)
    if name in _ACCESS_ERRORS:
        return FatalError(f"not authorized: {name}: {exc}", error_type=ErrorType.AUTHORIZATION)
    if isinstance(exc, errors.RecordTooLargeError):
        return FatalError(f"{name}: {exc}", error_type=ErrorType.BAD_REQUEST)
    if isinstance(exc, ssl.SSLError):
        return FatalError(f"TLS failed: {exc}", error_type=ErrorType.TLS)
    if isinstance(exc, errors.KafkaError):
        if getattr(exc, "retriable", False) or isinstance(
            exc, (errors.KafkaConnectionError, errors.KafkaTimeoutError, errors.NodeNotReadyError)
        ):
            return TransientError(f"{name}: {exc}", error_type=ErrorType.UNAVAILABLE)
        return FatalError(f"{name}: {exc}", error_type=ErrorType.BAD_REQUEST)
    return None


def _uses_sasl(options: Mapping[str, Any]) -> bool:
    return str(options.get("security_protocol", "")).startswith("SASL")


def _sasl_broke_off(exc: BaseException) -> FatalError:
    """A SASL handshake that ended in something that is neither Kafka's error nor the network's."""
    return FatalError(
        f"authentication failed: the SASL exchange broke off ({type(exc).__name__}: {exc})",
        error_type=ErrorType.AUTHENTICATION,
    )


async def _diagnose_bootstrap(options: Mapping[str, Any], exc: BaseException) -> WaitError:
    """aiokafka reports every bootstrap failure as "unable to bootstrap"; probe one broker to
    tell bad credentials or TLS (fatal) from a broker that is down (transient)."""
    probe = _probe_first_broker(options)
    try:
        conn = await probe
    except asyncio.CancelledError:
        raise
    except Exception as probe_error:
        error = classify_kafka_error(probe_error)
        if isinstance(error, FatalError):
            return error
        network = error is not None or isinstance(probe_error, (OSError, asyncio.TimeoutError))
        if _uses_sasl(options) and not network:
            return _sasl_broke_off(probe_error)
        return TransientError(f"cannot reach the bootstrap servers: {probe_error}", error_type=ErrorType.UNAVAILABLE)
    conn.close()
    return TransientError(
        f"cannot bootstrap from {options['bootstrap_servers']}: {exc}", error_type=ErrorType.UNAVAILABLE
    )


# ============================================================================== clients
async def start_consumer(options: Mapping[str, Any], *, metadata_max_age_ms: int, **overrides: Any) -> AIOKafkaConsumer:
    """A started consumer with no group, no auto-commit and no silent offset reset.

    ``metadata_max_age_ms`` is how stale its view of partitions and leaders may get; the shared
    reader passes its partition refresh period, so consumers and reader agree.
    """
    await asyncio.to_thread(__import__, "aiokafka")  # the first import takes ~0.5 s: not on the loop
    from aiokafka import AIOKafkaConsumer
    from aiokafka.errors import KafkaConnectionError

    settings: dict[str, Any] = {
        **options,
        "group_id": None,
        "enable_auto_commit": False,
        "auto_offset_reset": "none",
        # Never act on a message whose transaction was aborted.
        "isolation_level": "read_committed",
        "retry_backoff_ms": 250,
        "metadata_max_age_ms": metadata_max_age_ms,
    }
    settings.update(overrides)
    consumer = AIOKafkaConsumer(**settings)
    # Shielded: cancelling aiokafka's bootstrap mid-request leaks the bootstrap connection (only
    # Kafka and timeout errors close it), so a cancelled waiter lets the start finish, bounded,
    # and then stops the consumer, leaving no socket behind.
    starting = asyncio.ensure_future(consumer.start())
    try:
        await asyncio.shield(starting)
    except asyncio.CancelledError:
        await asyncio.wait({starting}, timeout=START_GRACE_SECONDS)
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await consumer.stop()
        raise
    except Exception as exc:
        await consumer.stop()
        if isinstance(exc, KafkaConnectionError):
            raise await _diagnose_bootstrap(options, exc) from exc
        if classify_kafka_error(exc) is None and _uses_sasl(options):
            raise _sasl_broke_off(exc) from exc
        raise
    return consumer


async def start_admin(options: Mapping[str, Any]) -> AIOKafkaAdminClient:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(**options, request_timeout_ms=30_000)
    try:
        await admin.start()
    except BaseException:
        await admin.close()
        raise
    return admin


class CommittedOffsets:
    """Reads consumer groups' committed offsets through one admin client, started on first use.

    Read-only: no group join, no commit. Call :meth:`close` when done.
    """

    def __init__(self, options: Mapping[str, Any]) -> None:
        self._options = options
        self._admin: AIOKafkaAdminClient | None = None
        self._lock = asyncio.Lock()

    async def __call__(self, group_id: str, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """``group_id``'s committed offsets for ``tps`` (-1 where it has none)."""
        async with self._lock:
            if self._admin is None:
                self._admin = await start_admin(self._options)
        offsets = await self._admin.list_consumer_group_offsets(group_id, partitions=list(tps))
        return {tp: int(offsets[tp].offset) if tp in offsets and offsets[tp] is not None else -1 for tp in tps}

    async def close(self) -> None:
        if self._admin is not None:
            await self._admin.close()


# ================================================================================ offsets
async def resolve_start(
    consumer: AIOKafkaConsumer,
    tps: list[TopicPartition],
    *,
    start_from: str,
    start_after_ms: int | None,
    committed: CommittedLookup | None = None,
    start_offsets: StartOffsets | None = None,
) -> dict[TopicPartition, int]:
    """The first offset to look at in each partition for this start rule.

    ``timestamp`` with ``start_offsets``: those offsets (see :func:`from_start_offsets`).
    ``timestamp`` without: the first message stamped at or after ``start_after_ms`` (the end
    offsets are read *before* the time lookup, so a "not found" answer can safely mean "the end").
    ``committed``: the group's committed offset; partitions without one use the timestamp rule.
    """
    if not tps:
        return {}
    if start_from == "earliest":
        return {tp: int(offset) for tp, offset in (await consumer.beginning_offsets(tps)).items()}
    if start_from == "timestamp" and start_offsets is not None:
        return await from_start_offsets(consumer, tps, start_offsets)
    result: dict[TopicPartition, int] = {}
    todo = list(tps)
    if start_from == "committed" and committed is not None:
        for tp, offset in (await committed(todo)).items():
            if offset >= 0:
                result[tp] = offset
        todo = [tp for tp in todo if tp not in result]
    if todo:
        ends = await consumer.end_offsets(todo)
        found = await consumer.offsets_for_times(dict.fromkeys(todo, int(start_after_ms or 0)))
        for tp in todo:
            hit = found.get(tp)
            # Apache Kafka answers "no such message" with None; some brokers with timestamp -1.
            if hit is None or hit.offset is None or hit.offset < 0 or hit.timestamp is None or hit.timestamp < 0:
                result[tp] = int(ends[tp])
            else:
                result[tp] = int(hit.offset)
    return result


async def from_start_offsets(
    consumer: AIOKafkaConsumer, tps: list[TopicPartition], start_offsets: StartOffsets
) -> dict[TopicPartition, int]:
    """Where each partition starts given the log end offsets fixed when the task first deferred.

    A partition listed there starts at its offset; one that is not (added since, or its whole
    topic appeared since) holds only newer messages and starts at its beginning. Record
    timestamps play no part. An offset the log no longer covers is moved into it: up to the
    oldest retained one (retention deleted the rest), or down to the log end (the log was cut
    back, or the topic recreated), so the wait neither fails nor skips what comes next.
    """
    begins = await consumer.beginning_offsets(tps)
    ends = await consumer.end_offsets(tps)
    result: dict[TopicPartition, int] = {}
    for tp in tps:
        begin, end = int(begins[tp]), int(ends[tp])
        fixed = start_offsets.get(tp.topic, {}).get(str(tp.partition))
        if fixed is None:
            result[tp] = begin
            continue
        if not begin <= fixed <= end:
            log.warning(
                "%s[%d]: start offset %d is outside the log (%d..%d); starting at %d",
                tp.topic,
                tp.partition,
                fixed,
                begin,
                end,
                min(max(fixed, begin), end),
            )
        result[tp] = min(max(fixed, begin), end)
    return result


async def log_end_offsets(kafka_conn_id: str, topics: list[str]) -> dict[str, dict[str, int]]:
    """The log end offset of every partition of every topic now, as trigger kwargs carry them.

    Topics that do not exist are left out (with ``wait_for_topic`` they are read from their
    beginning when they appear). A short-lived group-less consumer, bounded in time, for the
    worker to fix "every message from now on" before it defers. Never creates a topic.
    """
    from aiokafka import TopicPartition

    async def lookup() -> dict[str, dict[str, int]]:
        options = await load_client_options(kafka_conn_id)
        consumer = await start_consumer(options, metadata_max_age_ms=30_000)
        try:
            result: dict[str, dict[str, int]] = {}
            for topic in topics:
                partitions = await topic_partitions(consumer, topic)
                if partitions is None:
                    continue
                await track_topic(consumer, topic)
                ends = await consumer.end_offsets([TopicPartition(topic, p) for p in sorted(partitions)])
                result[topic] = {str(tp.partition): int(offset) for tp, offset in sorted(ends.items())}
            return result
        finally:
            await consumer.stop()

    try:
        return await asyncio.wait_for(lookup(), LOG_END_LOOKUP_SECONDS)
    except asyncio.TimeoutError as exc:
        raise TransientError(
            f"kafka_conn_id={kafka_conn_id!r}: no answer within {LOG_END_LOOKUP_SECONDS:.0f}s looking up the log end",
            error_type=ErrorType.UNAVAILABLE,
        ) from exc


async def clamp_to_log(consumer: AIOKafkaConsumer, exc: Exception) -> dict[TopicPartition, int]:
    """Where reads that fell outside the log resume: the oldest retained offset when retention
    deleted the position, the log end when the position lies beyond it (the log was cut back)."""
    targets: dict[TopicPartition, int] = {}
    for tp, offset in out_of_range_offsets(exc).items():
        begin = int((await consumer.beginning_offsets([tp]))[tp])
        end = int((await consumer.end_offsets([tp]))[tp])
        if offset < begin:
            log.warning(
                "%s[%d]: offsets %d..%d were deleted before they were read", tp.topic, tp.partition, offset, begin
            )
        targets[tp] = begin if offset < begin else min(offset, end)
    return targets


async def commit_offset(*, kafka_conn_id: str, group_id: str, topic: str, partition: int, offset: int) -> None:
    """Commit ``offset + 1`` for one partition to ``group_id`` (the matched message is consumed).

    Runs where the sensor resumes, after Airflow has stored the event: a crash before this line
    means the message is found again (at-least-once), never lost. No group join: a manual
    assignment commits as a "simple" consumer, so the group should not have live members.
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.structs import OffsetAndMetadata

    options = await load_client_options(kafka_conn_id)
    consumer = AIOKafkaConsumer(**options, group_id=group_id, enable_auto_commit=False)
    try:
        await consumer.start()
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        await consumer.commit({tp: OffsetAndMetadata(offset + 1, "airflow-deferrable-kit")})
    finally:
        await consumer.stop()


# ======================================================================= private aiokafka API
# Everything below reaches into aiokafka beyond its documented API. Checked against aiokafka
# 0.14.0 (the extra allows >=0.11); look here first when upgrading it. The real-broker tests
# exercise all but ``out_of_range_offsets``, which the engine tests cover with aiokafka's own
# exception, raised the way its fetcher raises it.


def _probe_first_broker(options: Mapping[str, Any]) -> Awaitable[Any]:
    """A connection of our own to the first bootstrap server (awaiting it raises what failed).

    Private: ``aiokafka.conn.create_conn`` and ``get_ip_port_afi``. The consumer's own bootstrap
    folds every failure into one "unable to bootstrap" error; a single connection of our own
    surfaces the real cause (SASL rejected, TLS refused, nothing listening).
    """
    from aiokafka.conn import create_conn, get_ip_port_afi

    host, port, _ = get_ip_port_afi(options["bootstrap_servers"][0])
    probe_options = {
        key: options[key]
        for key in (
            "client_id",
            "ssl_context",
            "security_protocol",
            "sasl_mechanism",
            "sasl_plain_username",
            "sasl_plain_password",
            "sasl_kerberos_service_name",
        )
        if key in options
    }
    return create_conn(host, port, request_timeout_ms=10_000, **probe_options)


async def topic_partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int] | None:
    """The topic's partition ids, or ``None`` if it does not exist.

    Asks with ``allow_auto_topic_creation=False``: merely waiting must never create a topic on a
    broker that auto-creates them. Private: the consumer's ``_client`` (``get_random_node``,
    ``send``), ``aiokafka.protocol.metadata.MetadataRequest`` and ``ClusterMetadata`` to read the
    answer. The public ``partitions_for_topic`` only answers from metadata already fetched, and
    aiokafka's own metadata requests allow auto-creation.
    """
    from aiokafka.cluster import ClusterMetadata
    from aiokafka.errors import NodeNotReadyError
    from aiokafka.protocol.metadata import MetadataRequest

    client = consumer._client
    node = client.get_random_node()
    if node is None:
        raise NodeNotReadyError("no broker is known yet")
    response = await client.send(node, MetadataRequest([topic], allow_auto_topic_creation=False))
    cluster = ClusterMetadata()
    cluster.update_metadata(response)
    if topic in cluster.unauthorized_topics:
        raise FatalError(f"not authorized to describe topic {topic!r}", error_type=ErrorType.AUTHORIZATION)
    partitions = cluster.partitions_for_topic(topic)
    return set(partitions) if partitions else None


async def track_topic(consumer: AIOKafkaConsumer, topic: str) -> None:
    """Have a consumer keep the topic's metadata without assigning it (offset lookups need the
    partition leaders; without this the first lookup fails once on stale metadata and retries).

    Private: ``consumer._client.add_topic``; the public way (``subscribe``) joins a group. Only
    called for a topic known to exist (aiokafka's metadata requests allow auto-creation).
    """
    await consumer._client.add_topic(topic)


def known_position(consumer: AIOKafkaConsumer, tp: TopicPartition) -> int | None:
    """The consumer's fetch position for ``tp`` if it has a valid one, without waiting.

    Private: ``consumer._subscription.subscription.assignment.state_value``. The public
    ``position()`` waits for a position to be fetched; this is read after every batch, to move
    past offsets the consumer skipped (gaps, transaction markers), and must not wait.
    """
    try:
        state = consumer._subscription.subscription.assignment.state_value(tp)
    except (AttributeError, KeyError):
        return None
    if state is None or not state.has_valid_position:
        return None
    return int(state.position)


def out_of_range_offsets(exc: Exception) -> dict[TopicPartition, int]:
    """The positions an ``OffsetOutOfRangeError`` reports, per partition.

    Undocumented: aiokafka's fetcher raises it with ``{tp: fetch_offset}`` as its only argument.
    """
    return exc.args[0] if exc.args and isinstance(exc.args[0], dict) else {}


__all__ = [
    "CommittedOffsets",
    "StartOffsets",
    "clamp_to_log",
    "classify_kafka_error",
    "client_options",
    "commit_offset",
    "from_start_offsets",
    "known_position",
    "load_client_options",
    "log_end_offsets",
    "out_of_range_offsets",
    "resolve_start",
    "start_admin",
    "start_consumer",
    "topic_partitions",
    "track_topic",
]
