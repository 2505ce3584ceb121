"""aiokafka itself, below the Kafka engine: its clients started safely and scoped to the topics
they serve, its errors mapped to ours, every private-API use fenced.

The engine (offsets, lookups, fan-out, catch-up, the shared reader) asks aiokafka only through
this module; the trigger side asks the door, :mod:`airflow_deferrable_kit._kafka.client`, which
offers the classifier defined here (:func:`classify_kafka_error`). Credentials never leave the
options (:class:`~airflow_deferrable_kit._kafka.settings.KafkaOptions`) the clients are started
with: the trigger carries a ``kafka_conn_id`` and the secret is read in the triggerer.

Every client this package starts is *scoped* (:func:`scope_client`): its metadata requests name
the topics it serves and never the whole cluster (aiokafka asks for every topic whenever its
list of topics is empty, and at bootstrap, which on a broker with thousands of topics is a
large answer to parse for every client), never create a topic, open connections only through
the connection's :class:`~airflow_deferrable_kit._kafka.gate.ConnectGate`, and log aiokafka's
own per-attempt warnings at debug (the gate logs one line per backoff step).

Every use of an aiokafka private API is in the fenced section at the end of this module, each
with the reason and the version it was checked against, so an aiokafka upgrade has one place to
look at.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import random
import ssl
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from airflow_deferrable_kit._kafka import settings
from airflow_deferrable_kit._kafka.gate import ConnectGate, ConnectGates
from airflow_deferrable_kit._tls import read_refusal
from airflow_deferrable_kit.errors import ErrorType, FatalError, TransientError, WaitError, describe_exception

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

log = logging.getLogger(__name__)


# ================================================================================ errors
_AUTH_ERRORS: Final = ("SaslAuthenticationFailed", "UnsupportedSaslMechanismError", "IllegalSaslStateError")
_ACCESS_ERRORS: Final = (
    "TopicAuthorizationFailedError",
    "GroupAuthorizationFailedError",
    "ClusterAuthorizationFailedError",
)


#: What to install when aiokafka cannot decompress a batch (its codec extras bring cramjam).
CODEC_FIX: Final = 'pip install "airflow-deferrable-kit[kafka]"'


#: Fatal errors that are the connection's whatever topic was asked about (credentials, TLS, the
#: connection itself, a cluster or group we may not use): every wait on it ends with them at once.
CONNECTION_WIDE: Final = frozenset(
    member.value
    for member in (
        ErrorType.AUTHENTICATION,
        ErrorType.AUTHORIZATION,
        ErrorType.TLS,
        ErrorType.BAD_CONNECTION,
        ErrorType.CONNECTION_NOT_FOUND,
    )
)


def blames_connection(error: WaitError) -> bool:
    """Whether a fatal ``error`` naming no topic is the connection's (end every wait with it)
    rather than an accident of one read (restart the read)."""
    return error.error_type in CONNECTION_WIDE and "topic" not in error.details


def classify_kafka_error(exc: BaseException) -> WaitError | None:
    """Transient or fatal for aiokafka's exceptions; ``None`` if it is not one of them.

    A fatal error that concerns one topic (a record batch that cannot be decoded, a topic this
    client may not read, a record too large to fetch) names it in ``details["topic"]`` (and
    ``details["partition"]`` when known): the shared reader ends the waits of that topic only.
    """
    if isinstance(exc, WaitError):
        return exc
    from aiokafka import errors

    name = type(exc).__name__
    if isinstance(exc, (errors.UnsupportedCodecError, errors.CorruptRecordException)):
        return _undecodable(exc)
    if name in _AUTH_ERRORS:
        return FatalError(f"authentication failed: {name}: {exc}", error_type=ErrorType.AUTHENTICATION)
    if name in _ACCESS_ERRORS:
        topic = failed_topic(exc) if name == "TopicAuthorizationFailedError" else None
        return FatalError(
            f"not authorized: {name}: {exc}",
            error_type=ErrorType.AUTHORIZATION,
            details={"topic": topic} if topic is not None else None,
        )
    if isinstance(exc, errors.RecordTooLargeError):
        return FatalError(f"{name}: {exc}", error_type=ErrorType.BAD_REQUEST, details=_where(fetched_partition(exc)))
    if isinstance(exc, ssl.SSLError):
        return FatalError(f"TLS failed: {exc}", error_type=ErrorType.TLS)
    if isinstance(exc, errors.KafkaError):
        if getattr(exc, "retriable", False) or isinstance(
            exc, (errors.KafkaConnectionError, errors.KafkaTimeoutError, errors.NodeNotReadyError)
        ):
            return TransientError(f"{name}: {exc}", error_type=ErrorType.UNAVAILABLE)
        return FatalError(f"{name}: {exc}", error_type=ErrorType.BAD_REQUEST)
    return None


def _where(tp: TopicPartition | None) -> dict[str, Any] | None:
    return None if tp is None else {"topic": tp.topic, "partition": tp.partition}


def _undecodable(exc: Exception) -> FatalError:
    """A record batch aiokafka cannot decode: a codec it lacks (the fix is an install) or a corrupt batch."""
    from aiokafka import errors

    tp = fetched_partition(exc)
    where = f" of {tp.topic}[{tp.partition}]" if tp is not None else ""
    if isinstance(exc, errors.UnsupportedCodecError):
        return FatalError(
            f"cannot decode a record batch{where}: {exc} (snappy, lz4 and zstd need cramjam): {CODEC_FIX} "
            "on the triggerer and the workers",
            error_type=ErrorType.BAD_CONFIGURATION,
            details=_where(tp),
        )
    return FatalError(
        f"a corrupt record batch{where} cannot be read past ({type(exc).__name__}: {exc})",
        error_type=ErrorType.PROTOCOL,
        details=_where(tp),
    )


def _uses_sasl(options: Mapping[str, Any]) -> bool:
    return str(options.get("security_protocol", "")).startswith("SASL")


def _sasl_broke_off(exc: BaseException) -> FatalError:
    """A SASL handshake that ended in something that is neither Kafka's error nor the network's."""
    return FatalError(
        f"authentication failed: the SASL exchange broke off ({type(exc).__name__}: {exc})",
        error_type=ErrorType.AUTHENTICATION,
    )


def _describe(exc: BaseException) -> str:
    """``Type: message`` once (aiokafka's errors already start their text with their type)."""
    text = str(exc)
    return text if text.startswith(type(exc).__name__) else describe_exception(exc)


def _is_network(exc: BaseException) -> bool:
    error = classify_kafka_error(exc)
    return isinstance(error, TransientError) or isinstance(exc, (OSError, asyncio.TimeoutError))


def _named(error: WaitError, conn_id: str | None) -> WaitError:
    """``error`` with the connection it concerns named first (once)."""
    prefix = f"kafka_conn_id={conn_id!r}: "
    if conn_id is None or error.message.startswith(prefix):
        return error
    return type(error)(prefix + error.message, error_type=error.error_type, details=error.details)


async def _tls_refusal(options: Mapping[str, Any]) -> str | None:
    """The first bootstrap server's TLS alert for our handshake, if it refused our certificate.

    Private: ``aiokafka.conn.get_ip_port_afi`` (aiokafka 0.14.0), aiokafka's own parser of a
    bootstrap address, so the probe asks the server aiokafka asked.
    """
    from aiokafka.conn import get_ip_port_afi

    host, port, _ = get_ip_port_afi(options["bootstrap_servers"][0])
    return await read_refusal(host, port, options["ssl_context"])


class BootstrapFailed(Exception):
    """No bootstrap server answered: what each one that was tried raised, and how long the ones
    still in backoff wait before their next attempt."""

    def __init__(self, failures: list[BaseException], waits: list[float]) -> None:
        super().__init__(f"unable to bootstrap ({len(failures)} failed, {len(waits)} in backoff)")
        self.failures = failures
        self.waits = waits


async def bootstrap_error(
    options: Mapping[str, Any], failed: BootstrapFailed, *, conn_id: str | None = None
) -> WaitError:
    """What a failed bootstrap means: bad credentials or TLS (fatal) or a broker that is down.

    A SASL handshake that breaks off with a closed connection is ambiguous: some brokers close
    the connection on bad credentials instead of answering an authentication error. A
    connection without SASL to the same broker tells: if it is accepted and answered, the broker
    is up and refused this client's authentication. A TLS connection closed the same way is
    asked again by one handshake of our own, which reads the broker's alert if it refused our
    client certificate (:func:`~airflow_deferrable_kit._tls.read_refusal`). Fatal errors name
    ``conn_id``.
    """
    for exc in failed.failures:
        error = classify_kafka_error(exc)
        if isinstance(error, FatalError):
            return _named(error, conn_id)
    servers = ",".join(options["bootstrap_servers"])
    closed = [exc for exc in failed.failures if type(exc).__name__ == "KafkaConnectionError"]
    if closed and options.get("ssl_context") is not None:
        alert = await _tls_refusal(options)
        if alert is not None:
            return _named(
                FatalError(
                    f"TLS failed: {servers} rejected this client's certificate ({alert}): check "
                    "ssl.certificate.location / ssl.key.location and the CA the brokers trust",
                    error_type=ErrorType.TLS,
                ),
                conn_id,
            )
    if _uses_sasl(options):
        for exc in failed.failures:
            if not _is_network(exc):
                return _named(_sasl_broke_off(exc), conn_id)
        if closed and await _answers_without_sasl(options):
            return _named(
                FatalError(
                    f"authentication failed: {servers} accepts connections but closed this one during SASL "
                    f"{options.get('sasl_mechanism', 'PLAIN')} authentication of user "
                    f"{options.get('sasl_plain_username')!r}: check the credentials and sasl.mechanism",
                    error_type=ErrorType.AUTHENTICATION,
                ),
                conn_id,
            )
    if failed.failures:
        return TransientError(
            f"cannot reach the bootstrap servers {servers}: {_describe(failed.failures[-1])}",
            error_type=ErrorType.UNAVAILABLE,
        )
    return TransientError(
        f"the bootstrap servers {servers} were unreachable; next attempt in {min(failed.waits, default=0):.1f}s",
        error_type=ErrorType.UNAVAILABLE,
    )


@dataclass
class TopicsAnswer:
    """What the broker said about some topics: their partitions, or that they are missing or
    not visible to this client."""

    partitions: dict[str, set[int]] = field(default_factory=dict)
    missing: set[str] = field(default_factory=set)
    unauthorized: set[str] = field(default_factory=set)

    def raise_unauthorized(self) -> None:
        if self.unauthorized:
            raise FatalError(
                f"not authorized to describe topic(s) {', '.join(sorted(self.unauthorized))}",
                error_type=ErrorType.AUTHORIZATION,
            )


# ============================================================================== clients
async def import_aiokafka() -> None:
    """Import aiokafka off the loop the first time (long enough to stall the loop); at once afterwards."""
    if "aiokafka.consumer" not in sys.modules:
        await asyncio.to_thread(__import__, "aiokafka")


async def start_consumer(
    options: Mapping[str, Any],
    *,
    topics: Iterable[str],
    metadata_max_age_ms: int,
    gates: ConnectGates | None = None,
    **overrides: Any,
) -> AIOKafkaConsumer:
    """A started consumer with no group, no auto-commit and no silent offset reset, scoped to
    ``topics`` (its metadata names them only; ``assign()`` and :func:`refresh_topics` change the scope).

    ``metadata_max_age_ms`` is how stale its view of partitions and leaders may get. Cancelling
    the start leaves nothing behind: the scoped bootstrap closes its connection on any exit.
    """
    await import_aiokafka()
    from aiokafka import AIOKafkaConsumer

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
    scope_client(consumer, topics, gates)
    token = _QUIET.set(True)  # the consumer's own tasks, started here, inherit it
    try:
        await consumer.start()
    except BaseException as exc:
        await consumer.stop()
        if isinstance(exc, BootstrapFailed):
            raise await bootstrap_error(options, exc, conn_id=gates.conn_id if gates else None) from exc
        if isinstance(exc, Exception) and classify_kafka_error(exc) is None and _uses_sasl(options):
            raise _sasl_broke_off(exc) from exc
        raise
    finally:
        _QUIET.reset(token)
    return consumer


async def start_admin(
    options: Mapping[str, Any], *, topics: Iterable[str], gates: ConnectGates | None = None
) -> AIOKafkaAdminClient:
    """A started admin client scoped to ``topics``, like :func:`start_consumer`."""
    await import_aiokafka()
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(**options, request_timeout_ms=30_000)
    scope_client(admin, topics, gates)
    token = _QUIET.set(True)
    try:
        await admin.start()
    except BaseException as exc:
        await admin.close()
        if isinstance(exc, BootstrapFailed):
            raise await bootstrap_error(options, exc, conn_id=gates.conn_id if gates else None) from exc
        raise
    finally:
        _QUIET.reset(token)
    return admin


# ======================================================================= private aiokafka API
# Everything below reaches into aiokafka beyond its documented API. Checked against aiokafka
# 0.14.0 (the extra allows >=0.11); look here first when upgrading it. The real-broker tests
# exercise all of it but ``out_of_range_offsets`` and ``failed_topic``, which the engine tests
# cover with aiokafka's own exceptions, raised the way its fetcher raises them
# (``fetched_partition`` is exercised by a real lz4 batch that aiokafka is kept from decoding).

#: Set in the kit's own tasks (and inherited by the tasks its clients start): aiokafka's
#: warnings and errors logged there go out at debug.
_QUIET: contextvars.ContextVar[bool] = contextvars.ContextVar("adk_kafka_quiet", default=False)
#: The gate of the connection attempt in progress in this task: aiokafka's line saying why it
#: failed becomes the reason the gate logs.
_CAPTURE: contextvars.ContextVar[ConnectGate | None] = contextvars.ContextVar("adk_kafka_capture", default=None)
#: aiokafka's loggers (0.14: ``aiokafka`` for the client, ``aiokafka.<module>`` elsewhere).
_AIOKAFKA_LOGGERS: Final = (
    "aiokafka",
    "aiokafka.admin.client",
    "aiokafka.cluster",
    "aiokafka.conn",
    "aiokafka.consumer.consumer",
    "aiokafka.consumer.fetcher",
    "aiokafka.consumer.group_coordinator",
    "aiokafka.consumer.subscription_state",
)


def quiet_aiokafka() -> None:
    """Mark the running task as the kit's: aiokafka's warnings and errors in it go out at debug.

    For the kit's long-lived tasks (the shared reader's loops); set once, it lasts the task.
    """
    _QUIET.set(True)


class _KitClientLines(logging.Filter):
    """Logs aiokafka's INFO, WARNING and ERROR lines of the kit's clients at DEBUG.

    aiokafka logs an ERROR on every failed connection attempt and metadata refresh, from every
    consumer, for as long as a broker is down, one per refresh for a topic that does not exist
    yet, and an INFO naming every assigned topic on every re-assignment. The kit reports those
    conditions itself, once per backoff step (the gate) or as the wait's outcome; other users of
    aiokafka in the process are left alone (the mark is a context variable of the kit's tasks).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        gate = _CAPTURE.get()
        if (gate is None and not _QUIET.get()) or record.levelno < logging.INFO:
            return True
        if gate is not None and record.levelno >= logging.WARNING:
            gate.last_error = record.getMessage()
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


@functools.cache
def _install_log_filter() -> None:
    line_filter = _KitClientLines()
    for name in _AIOKAFKA_LOGGERS:
        logging.getLogger(name).addFilter(line_filter)


def scope_client(owner: Any, topics: Iterable[str], gates: ConnectGates | None) -> None:
    """Make the ``AIOKafkaClient`` of a consumer or admin client (not started yet) topic-scoped.

    Private: ``owner._client``; swaps that instance's class for :func:`_scoped_client_class`'s
    subclass (methods only, no state of its own) and sets ``_topics``, the set aiokafka's
    metadata requests name.
    """
    client = owner._client
    client.__class__ = _scoped_client_class()
    client._kit_gates = gates
    client._topics = set(topics)
    _install_log_filter()


@functools.cache
def _scoped_client_class() -> type:
    """``AIOKafkaClient`` with metadata scoped to its topics and connections through the gate.

    Overrides (aiokafka 0.14 ``aiokafka/client.py``):

    * ``bootstrap``: the same steps, but its ``MetadataRequest`` names the client's topics
      (aiokafka sends ``MetadataRequest([])``, which some brokers answer with every topic), with
      auto-creation off; each server is tried through its gate; the bootstrap connection is
      closed on *any* exit, cancellation included (aiokafka closes it only on Kafka and timeout
      errors, and leaked it when cancelled); the failures are kept for :func:`bootstrap_error`
      (aiokafka folds them into "Unable to bootstrap").
    * ``_metadata_update``: names the topics (aiokafka sends ``MetadataRequest(None)``, *all*
      topics, whenever its set is empty), never auto-creates, and with no topic sends nothing.
    * ``_get_conn``: a new connection only through the gate (a refusal costs no network and is
      a plain "not ready" to aiokafka, which retries on its own timer).
    """
    from aiokafka.client import AIOKafkaClient, ConnectionGroup
    from aiokafka.conn import create_conn
    from aiokafka.errors import KafkaError
    from aiokafka.protocol.metadata import MetadataRequest
    from aiokafka.util import create_task

    class TopicScopedClient(AIOKafkaClient):
        _kit_gates: ConnectGates | None = None
        _sync_task: asyncio.Task[None] | None

        def _kit_gate(self, host: str, port: int) -> ConnectGate | None:
            return self._kit_gates.for_address(host, port) if self._kit_gates is not None else None

        def _kit_request(self, topics: Iterable[str]) -> Any:
            return MetadataRequest(sorted(topics), allow_auto_topic_creation=False)

        async def bootstrap(self) -> None:
            failures: list[BaseException] = []
            waits: list[float] = []
            for host, port, _ in self.hosts:
                gate = self._kit_gate(host, port)
                if gate is not None and not gate.try_begin():
                    waits.append(gate.seconds_to_wait())
                    continue
                conn = None
                try:
                    conn = await create_conn(
                        host,
                        port,
                        client_id=self._client_id,
                        request_timeout_ms=self._request_timeout_ms,
                        ssl_context=self._ssl_context,
                        security_protocol=self._security_protocol,
                        max_idle_ms=self._connections_max_idle_ms,
                        sasl_mechanism=self._sasl_mechanism,
                        sasl_plain_username=self._sasl_plain_username,
                        sasl_plain_password=self._sasl_plain_password,
                        sasl_kerberos_service_name=self._sasl_kerberos_service_name,
                        sasl_kerberos_domain_name=self._sasl_kerberos_domain_name,
                        sasl_oauth_token_provider=self._sasl_oauth_token_provider,
                    )
                    metadata = await conn.send(self._kit_request(self._topics))
                except BaseException as exc:
                    if conn is not None:
                        conn.close()
                    if not isinstance(exc, Exception):  # cancelled: neither a success nor a failure
                        if gate is not None:
                            gate.abandoned()
                        raise
                    failures.append(exc)
                    if gate is not None:
                        gate.failed(_describe(exc))
                    continue
                if gate is not None:
                    gate.succeeded()
                self.cluster.update_metadata(metadata)
                if not len(self.cluster.brokers()):
                    # A cluster with no topics may list no brokers: keep this connection meanwhile.
                    self._conns[("bootstrap", ConnectionGroup.DEFAULT)] = conn
                else:
                    conn.close()
                break
            else:
                raise BootstrapFailed(failures, waits)
            if self._sync_task is None:
                self._sync_task = create_task(self._md_synchronizer())

        async def _metadata_update(self, cluster_metadata: Any, topics: Iterable[str]) -> bool:
            topics = set(topics)
            if not topics:
                return True  # nothing to learn: the brokers are known since the bootstrap
            request = self._kit_request(topics)
            nodeids: list[Any] = [b.nodeId for b in self.cluster.brokers()]
            bootstrap_id = ("bootstrap", ConnectionGroup.DEFAULT)
            if bootstrap_id in self._conns:
                nodeids.append("bootstrap")
            random.shuffle(nodeids)
            for node_id in nodeids:
                conn = await self._get_conn(node_id)
                if conn is None:
                    continue
                try:
                    metadata = await conn.send(request)
                except (KafkaError, asyncio.TimeoutError) as err:
                    log.debug("Kafka metadata request to node %s failed: %r", node_id, err)
                    continue
                if not metadata.brokers:
                    return False
                cluster_metadata.update_metadata(metadata)
                if bootstrap_id in self._conns and len(self.cluster.brokers()):
                    self._conns.pop(bootstrap_id).close()
                return True
            cluster_metadata.failed_update(None)
            return False

        async def _get_conn(self, node_id: Any, *, group: Any = ConnectionGroup.DEFAULT, no_hint: bool = False) -> Any:
            cached = self._conns.get((node_id, group))
            if cached is not None and cached.connected():
                return cached
            broker = self.cluster.broker_metadata(node_id)
            gate = self._kit_gate(broker.host, broker.port) if broker is not None else None
            if gate is None:
                return await super()._get_conn(node_id, group=group, no_hint=no_hint)
            if not gate.try_begin():
                return None
            token = _CAPTURE.set(gate)
            try:
                conn = await super()._get_conn(node_id, group=group, no_hint=no_hint)
            except BaseException:
                gate.abandoned()
                raise
            finally:
                _CAPTURE.reset(token)
            if conn is None:
                gate.failed()
            else:
                gate.succeeded()
            return conn

    return TopicScopedClient


def describe_topics(consumer: AIOKafkaConsumer, topics: Iterable[str]) -> TopicsAnswer:
    """What the consumer's metadata (scoped to these topics) says about them, without a request.

    Private: ``consumer._client.cluster`` (``partitions_for_topic`` is public on the consumer,
    ``unauthorized_topics`` is not).
    """
    cluster = consumer._client.cluster
    answer = TopicsAnswer()
    for topic in topics:
        partitions = cluster.partitions_for_topic(topic)
        if topic in cluster.unauthorized_topics:
            answer.unauthorized.add(topic)
        elif partitions:
            answer.partitions[topic] = set(partitions)
        else:
            answer.missing.add(topic)
    return answer


async def refresh_topics(consumer: AIOKafkaConsumer, topics: Iterable[str]) -> TopicsAnswer:
    """Ask the broker about exactly ``topics`` (one metadata request; never creates a topic).

    Private: sets ``consumer._client._topics`` and awaits ``force_metadata_update()``; the
    public ``partitions_for_topic`` only answers from metadata already fetched.
    """
    wanted = set(topics)
    client = consumer._client
    client._topics = wanted
    if not await client.force_metadata_update():
        raise TransientError("the broker did not answer a metadata request", error_type=ErrorType.UNAVAILABLE)
    return describe_topics(consumer, wanted)


async def _answers_without_sasl(options: Mapping[str, Any]) -> bool:
    """Whether the first bootstrap server accepts and answers a connection without SASL.

    Private: ``aiokafka.conn.create_conn`` and ``get_ip_port_afi`` (the connection runs the
    ApiVersions exchange, so success means a Kafka broker answered).
    """
    from aiokafka.conn import create_conn, get_ip_port_afi

    host, port, _ = get_ip_port_afi(options["bootstrap_servers"][0])
    protocol = "SSL" if options.get("security_protocol") == "SASL_SSL" else "PLAINTEXT"
    try:
        conn = await create_conn(
            host,
            port,
            client_id=options.get("client_id", "airflow-deferrable-kit"),
            ssl_context=options.get("ssl_context"),
            security_protocol=protocol,
            request_timeout_ms=settings.PROBE_TIMEOUT_MS,
        )
    except asyncio.CancelledError:
        raise
    except Exception:
        return False
    conn.close()
    return True


def known_position(consumer: AIOKafkaConsumer, tp: TopicPartition) -> int | None:
    """The consumer's fetch position for ``tp`` if it has a valid one, without waiting.

    Private: ``consumer._subscription.subscription.assignment.state_value``. The public
    ``position()`` waits for a position to be fetched; this is read after batches, to move
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


def failed_topic(exc: BaseException) -> str | None:
    """The topic a fetch's ``TopicAuthorizationFailedError`` is about, if it says.

    Undocumented: aiokafka's fetcher raises it with the topic name as its only argument (its
    offset lookups with the ``TopicPartition``).
    """
    from aiokafka import TopicPartition

    if exc.args and isinstance(exc.args[0], TopicPartition):
        return exc.args[0].topic
    return exc.args[0] if exc.args and isinstance(exc.args[0], str) else None


def fetched_partition(exc: BaseException) -> TopicPartition | None:
    """The partition whose fetched records raised ``exc`` in aiokafka, if it can be told.

    aiokafka raises a batch's decoding errors (``UnsupportedCodecError``,
    ``CorruptRecordException``) and per-partition fetch errors without naming the partition.
    Private: the innermost frame of aiokafka's own code in the traceback holding the partition,
    ``PartitionRecords._tp`` (records being unpacked) or a local ``tp`` (``Fetcher.fetched_records``,
    ``FetchResult.getall``), as in aiokafka 0.14.0; ``None`` when no frame says.
    """
    from aiokafka import TopicPartition

    found: TopicPartition | None = None
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if str(frame.f_globals.get("__name__", "")).startswith("aiokafka."):
            owner = frame.f_locals.get("self")
            candidate = getattr(owner, "_tp", None) if owner is not None else None
            if not isinstance(candidate, TopicPartition):
                candidate = frame.f_locals.get("tp")
            if isinstance(candidate, TopicPartition):
                found = candidate
        tb = tb.tb_next
    return found


__all__ = [
    "CODEC_FIX",
    "CONNECTION_WIDE",
    "BootstrapFailed",
    "TopicsAnswer",
    "blames_connection",
    "bootstrap_error",
    "classify_kafka_error",
    "describe_topics",
    "failed_topic",
    "fetched_partition",
    "import_aiokafka",
    "known_position",
    "out_of_range_offsets",
    "quiet_aiokafka",
    "refresh_topics",
    "scope_client",
    "start_admin",
    "start_consumer",
]
