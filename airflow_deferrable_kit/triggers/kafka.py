"""Wait for a Kafka message that matches a condition, on aiokafka, without joining a group.

What makes this wait cheap and safe at scale:

* **No group membership.** Partitions are assigned explicitly and positions are sought, so
  there is no rebalance, no offset commit and no side effect when two triggerers run the same
  trigger (Airflow HA). Reading a group's committed offsets is read-only; committing is opt-in
  and done by the sensor after Airflow has stored the event (at-least-once).
* **One reader per (connection, topic) per triggerer process.** Every waiter on a topic leases
  the same :class:`TopicReader`: one consumer, one fetch stream. The reader decodes each message
  once and fans it out to the waiters whose conditions can match it (an index on the values the
  conditions compare), so 10,000 waiters cost one consumer and CPU in proportion to the message
  rate. Waiters whose start lies behind the reader are brought up to it together by one shared
  :class:`CatchUpPass` (one more consumer, whatever their number), then join; a waiter too slow
  to keep up (a slow predicate) leaves, catches up at its own pace and joins again, so buffers
  stay bounded.
* **Nothing missed.** The default start is "every message produced after the task first
  deferred": the sensor fixes that moment (``start_after_ms``) once and it travels in the
  kwargs, so a triggerer restart maps it to the same offsets with ``offsets_for_times``.
* **Never blocks, never sleeps per message.** The reader scans as fast as the broker serves,
  yields to the loop during long fan-outs and after every batch of wake-ups, and wakes a waiter
  the moment a match arrives.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import dataclasses
import functools
import heapq
import itertools
import json
import logging
import math
import random
import re
import ssl
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

from airflow_deferrable_kit.conditions import (
    MISSING,
    Acceptor,
    Decision,
    build_acceptors,
    decide,
    import_predicate,
    load_acceptors,
    lookup,
    parse_path,
    run_predicate,
    validate_predicate_path,
)
from airflow_deferrable_kit.connections import get_connection, get_extra
from airflow_deferrable_kit.payload import (
    ConditionFailed,
    FatalError,
    Found,
    TransientError,
    WaitError,
    truncate_text,
)
from airflow_deferrable_kit.triggers.base import PollingTrigger

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

log = logging.getLogger(__name__)

#: Matchers a Kafka condition may use, and whether each takes an argument.
MATCHERS: Final = {"key": False, "value": False, "path": True, "header": True}
START_FROM: Final = ("timestamp", "earliest", "committed")
VALUE_FORMATS: Final = ("json", "text", "bytes")
SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI")

# Tunables. Module constants rather than kwargs: the reader is shared, so they are per process.
#: How often a reader looks for new partitions (and for a topic that does not exist yet).
PARTITION_REFRESH_SECONDS = 30.0
#: How long one fetch waits for data before the reader loop turns over.
FETCH_WAIT_MS = 1000
#: Records taken from the consumer per fetch.
MAX_RECORDS_PER_FETCH = 500
#: A waiter's queue of messages awaiting its predicate; past either bound it leaves the reader
#: and catches up on its own, so a slow waiter never makes the process hold the stream for it.
WAITER_QUEUE_MESSAGES = 256
WAITER_QUEUE_BYTES = 4 * 1024 * 1024
#: Own-pace catch-up consumers (waits whose predicate fell behind) at once per connection.
MAX_CATCHUPS_PER_CONNECTION = 8
#: How long a reader keeps its catch-up consumer after the last pass, for the next late wait.
CATCH_UP_LINGER_SECONDS = 30.0
#: Fan-out work after which the reader yields to the event loop...
DISPATCH_SLICE_SECONDS = 0.01
#: ...or waits woken (each then builds its event on the loop) after which it does.
WAKES_PER_SLICE = 32
#: Caps for what a message contributes to the payload (the whole payload is capped at 64 KiB).
MAX_VALUE_CHARS = 32_000
MAX_KEY_CHARS = 1_024
MAX_HEADER_CHARS = 256
MAX_HEADERS = 16
MAX_ACTUAL_CHARS = 1_024

SUCCESS: Final = "success"
FAILURE: Final = "failure"
PREDICATE: Final = "predicate"
PROBLEMS: Final = ("tombstone", "undecodable", "malformed")

_UNSET: Final = object()


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
            error_type="configuration",
        )
    for server in servers:
        _, _, server_port = server.rpartition(":")
        if not server_port.isdigit():
            raise FatalError(f"{where}: bootstrap server {server!r} must be host:port", error_type="configuration")
    protocol = str(pick("security.protocol", "security_protocol") or "PLAINTEXT").upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise FatalError(
            f"{where}: security.protocol must be one of {', '.join(SECURITY_PROTOCOLS)}, got {protocol!r}",
            error_type="configuration",
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
                error_type="configuration",
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
                    error_type="configuration",
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


def _ssl_context(tls: Mapping[str, Any]) -> ssl.SSLContext:
    """Build the TLS context (reads certificate files, so it runs in a worker thread)."""
    from aiokafka.helpers import create_ssl_context

    context = create_ssl_context(
        cafile=tls["cafile"], certfile=tls["certfile"], keyfile=tls["keyfile"], password=tls["password"]
    )
    if not tls["check_hostname"]:
        context.check_hostname = False
    return context


async def load_client_options(conn_id: str) -> dict[str, Any]:
    """Resolve ``conn_id`` in the triggerer into aiokafka kwargs (secrets never leave this call)."""
    conn = await get_connection(conn_id, argument="kafka_conn_id")
    extra = await get_extra(conn)
    options, tls = client_options(
        conn_id=conn_id, host=conn.host, port=conn.port, login=conn.login, password=conn.password, extra=extra
    )
    if tls is not None:
        try:
            options["ssl_context"] = await asyncio.to_thread(_ssl_context, tls)
        except (OSError, ValueError) as exc:
            raise FatalError(
                f"kafka_conn_id={conn_id!r}: cannot load the TLS settings: {exc}", error_type="configuration"
            ) from exc
    return options


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
        return FatalError(f"authentication failed: {name}: {exc}", error_type="authentication")
    if name in _ACCESS_ERRORS:
        return FatalError(f"not authorized: {name}: {exc}", error_type="authorization")
    if isinstance(exc, errors.RecordTooLargeError):
        return FatalError(f"{name}: {exc}", error_type="record_too_large")
    if isinstance(exc, ssl.SSLError):
        return FatalError(f"TLS failed: {exc}", error_type="tls")
    if isinstance(exc, errors.KafkaError):
        if getattr(exc, "retriable", False) or isinstance(
            exc, (errors.KafkaConnectionError, errors.KafkaTimeoutError, errors.NodeNotReadyError)
        ):
            return TransientError(f"{name}: {exc}", error_type="broker")
        return FatalError(f"{name}: {exc}", error_type="kafka")
    return None


async def _diagnose_bootstrap(options: Mapping[str, Any], exc: BaseException) -> WaitError:
    """aiokafka reports every bootstrap failure as "unable to bootstrap"; probe one broker to
    tell bad credentials or TLS (fatal) from a broker that is down (transient)."""
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
    try:
        conn = await create_conn(host, port, request_timeout_ms=10_000, **probe_options)
    except asyncio.CancelledError:
        raise
    except Exception as probe_error:
        error = classify_kafka_error(probe_error)
        if isinstance(error, FatalError):
            return error
        network = error is not None or isinstance(probe_error, (OSError, asyncio.TimeoutError))
        if str(options.get("security_protocol", "")).startswith("SASL") and not network:
            return FatalError(
                f"authentication failed: the SASL exchange broke off ({type(probe_error).__name__}: {probe_error})",
                error_type="authentication",
            )
        return TransientError(f"cannot reach the bootstrap servers: {probe_error}", error_type="broker")
    conn.close()
    return TransientError(f"cannot bootstrap from {options['bootstrap_servers']}: {exc}", error_type="broker")


LEGAL_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
#: How long a cancelled waiter lets a consumer's start finish before stopping it.
START_GRACE_SECONDS = 10.0


async def start_consumer(options: Mapping[str, Any], **overrides: Any) -> AIOKafkaConsumer:
    """A started consumer with no group, no auto-commit and no silent offset reset."""
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
        "metadata_max_age_ms": int(PARTITION_REFRESH_SECONDS * 1000),
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
        if classify_kafka_error(exc) is None and str(options.get("security_protocol", "")).startswith("SASL"):
            raise FatalError(
                f"authentication failed: the SASL exchange broke off ({type(exc).__name__}: {exc})",
                error_type="authentication",
            ) from exc
        raise
    return consumer


async def topic_partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int] | None:
    """The topic's partition ids, or ``None`` if it does not exist.

    Asks with ``allow_auto_topic_creation=False``: merely waiting must never create a topic on a
    broker that auto-creates them.
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
        raise FatalError(f"not authorized to describe topic {topic!r}", error_type="authorization")
    partitions = cluster.partitions_for_topic(topic)
    return set(partitions) if partitions else None


async def track_topic(consumer: AIOKafkaConsumer, topic: str) -> None:
    """Have a consumer keep the topic's metadata without assigning it (offset lookups need the
    partition leaders; without this the first lookup fails once on stale metadata and retries)."""
    await consumer._client.add_topic(topic)


def _known_position(consumer: AIOKafkaConsumer, tp: TopicPartition) -> int | None:
    """The consumer's fetch position for ``tp`` if it has a valid one, without waiting."""
    try:
        state = consumer._subscription.subscription.assignment.state_value(tp)
    except (AttributeError, KeyError):
        return None
    if state is None or not state.has_valid_position:
        return None
    return int(state.position)


async def clamp_to_log(consumer: AIOKafkaConsumer, exc: Exception) -> dict[TopicPartition, int]:
    """Where reads that fell outside the log resume: the oldest retained offset when retention
    deleted the position, the log end when the position lies beyond it (the log was cut back)."""
    offsets = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else {}
    targets: dict[TopicPartition, int] = {}
    for tp, offset in offsets.items():
        begin = int((await consumer.beginning_offsets([tp]))[tp])
        end = int((await consumer.end_offsets([tp]))[tp])
        if offset < begin:
            log.warning(
                "%s[%d]: offsets %d..%d were deleted before they were read", tp.topic, tp.partition, offset, begin
            )
        targets[tp] = begin if offset < begin else min(offset, end)
    return targets


# ============================================================================== messages
def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class KafkaMessage:
    """One record, decoded once and shared by every waiter that looks at it."""

    __slots__ = (
        "_cache",
        "_json",
        "_text",
        "headers",
        "key",
        "offset",
        "partition",
        "raw_value",
        "size",
        "timestamp",
        "topic",
    )

    def __init__(self, record: Any) -> None:
        self.topic: str = record.topic
        self.partition: int = record.partition
        self.offset: int = record.offset
        self.timestamp: int = record.timestamp if record.timestamp is not None else -1
        self.key: bytes | None = record.key
        self.raw_value: bytes | None = record.value
        self.headers: tuple[tuple[str, bytes | None], ...] = tuple(record.headers or ())
        self.size: int = len(record.value) if record.value is not None else 0
        self._text: Any = _UNSET
        self._json: Any = _UNSET
        self._cache: dict[tuple[str, str, str | None], Any] = {}

    def text(self) -> Any:
        """The value as UTF-8 text, or MISSING if it is not UTF-8."""
        if self._text is _UNSET:
            try:
                self._text = self.raw_value.decode("utf-8") if self.raw_value is not None else MISSING
            except UnicodeDecodeError:
                self._text = MISSING
        return self._text

    def json(self) -> Any:
        """The value parsed as JSON, or MISSING if it is not (NaN/Infinity count as not JSON)."""
        if self._json is _UNSET:
            text = self.text()
            try:
                self._json = MISSING if text is MISSING else json.loads(text, parse_constant=_reject_constant)
            except ValueError:
                self._json = MISSING
        return self._json

    def problem(self, value_format: str) -> str | None:
        """Why this message cannot be matched in ``value_format``, or None if it can."""
        if self.raw_value is None:
            return "tombstone"
        if value_format == "bytes":
            return None
        if self.text() is MISSING:
            return "undecodable"
        if value_format == "json" and self.json() is MISSING:
            return "malformed"
        return None

    def value(self, value_format: str) -> Any:
        if value_format == "json":
            return self.json()
        if value_format == "text":
            return self.text()
        return self.raw_value

    def key_text(self) -> Any:
        if self.key is None:
            return MISSING
        try:
            return self.key.decode("utf-8")
        except UnicodeDecodeError:
            return MISSING

    def header(self, name: str) -> Any:
        """The last header called ``name`` as text (Kafka's "last header wins"), else MISSING."""
        for header_name, raw in reversed(self.headers):
            if header_name == name:
                if raw is None:
                    return None
                try:
                    return raw.decode("utf-8")
                except UnicodeDecodeError:
                    return MISSING
        return MISSING

    def lookup(self, value_format: str, matcher: str, argument: str | None) -> Any:
        """What a condition's matcher points at in this message (cached across waiters)."""
        cache_key = (value_format, matcher, argument)
        cached = self._cache.get(cache_key, _UNSET)
        if cached is not _UNSET:
            return cached
        if matcher == "key":
            result = self.key_text()
        elif matcher == "header":
            result = self.header(argument or "")
        elif matcher == "value":
            result = self.value(value_format)
        else:
            result = lookup(self.value(value_format), _parsed_path(argument or ""))
        self._cache[cache_key] = result
        return result

    def subject(self, value_format: str) -> dict[str, Any]:
        """What a predicate receives: the whole message, uncapped, value decoded."""
        value = self.value(value_format)
        return {
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "timestamp": self.timestamp,
            "key": None if self.key is None else _readable(self.key),
            "headers": {name: (None if raw is None else _readable(raw)) for name, raw in self.headers},
            "value": None if value is MISSING else value,
        }

    def payload(self, value_format: str) -> dict[str, Any]:
        """The message as it goes into the event: coordinates, key, headers, value; size-capped."""
        headers: dict[str, str | None] = {}
        for name, raw in self.headers:
            if name not in headers and len(headers) >= MAX_HEADERS:
                continue
            headers[_cap(name, MAX_HEADER_CHARS)[0]] = (
                None if raw is None else _cap(_readable(raw), MAX_HEADER_CHARS)[0]
            )
        value: Any = None
        truncated = False
        if self.raw_value is not None:
            if value_format == "bytes":
                value, truncated = _cap(base64.b64encode(self.raw_value).decode("ascii"), MAX_VALUE_CHARS)
            elif value_format == "text":
                value, truncated = _cap(self.text(), MAX_VALUE_CHARS)
            else:
                value = self.json()
                # Re-encoded JSON is at most ~6 characters per byte of the original (escapes).
                if (
                    self.size * 6 + 16 > MAX_VALUE_CHARS
                    and len(json.dumps(value, separators=(",", ":"))) > MAX_VALUE_CHARS
                ):
                    value, truncated = _cap(self.text(), MAX_VALUE_CHARS)
        return {
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "timestamp": self.timestamp,
            "key": None if self.key is None else _cap(_readable(self.key), MAX_KEY_CHARS)[0],
            "headers": headers,
            "value_format": value_format,
            "size": self.size,
            "value": value,
            "value_truncated": truncated,
        }


def _cap(text: str, limit: int) -> tuple[str, bool]:
    """Cut ``text`` so its JSON encoding (non-ASCII escaped) fits in about ``limit`` characters."""
    if len(text) * 12 + 2 <= limit:  # no character takes more than 12 escaped: it fits as it is
        return text, False
    encoded = len(json.dumps(text))
    if encoded <= limit:
        return text, False
    keep = len(text)
    while keep > 0 and len(json.dumps(text[:keep])) > limit:
        keep = int(keep * limit / len(json.dumps(text[:keep])) * 0.95)
    return truncate_text(text, max(keep, 0)), True


def _readable(raw: bytes) -> str:
    return raw.decode("utf-8", "backslashreplace")


@functools.lru_cache(maxsize=1024)
def _parsed_path(path: str) -> tuple[str | int, ...]:
    return parse_path(path)


def _capped(value: Any) -> Any:
    """A decision's observed value, cut down to a short excerpt if it is a large document."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str) and len(value) * 12 + 2 <= MAX_ACTUAL_CHARS:
        return value
    text = json.dumps(value, separators=(",", ":"), default=str)
    return value if len(text) <= MAX_ACTUAL_CHARS else _cap(text, MAX_ACTUAL_CHARS)[0]


# ============================================================================ conditions
def _canonical_value(value: Any) -> tuple[str, Any] | None:
    """A hashable key under which JSON-equal scalars meet (``True`` is not ``1``); None if not indexable."""
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, (int, float)):
        return ("n", value) if not (isinstance(value, float) and math.isnan(value)) else None
    if isinstance(value, str):
        return ("s", value)
    if value is None:
        return ("z", None)
    return None


Point = tuple[str, str | None]


class MatchSpec:
    """A waiter's condition: acceptors (data), an optional predicate, and the value format."""

    def __init__(self, acceptors: list[Acceptor], predicate: str | None, value_format: str) -> None:
        self.acceptors = acceptors
        self.predicate = predicate
        self.value_format = value_format
        self.has_success = any(a.state == "success" for a in acceptors)
        self.match_all = not acceptors and predicate is None

    def evaluate(self, message: KafkaMessage) -> tuple[str, Decision | None] | None:
        """What this message means to the wait: success, failure, "ask the predicate", or nothing.

        Acceptors go first (the first match decides). A success acceptor with a predicate hands
        the message to the predicate; without any success acceptor, the predicate sees every
        message the acceptors did not decide. No condition at all: any message matches.
        """
        if self.match_all:
            return (SUCCESS, None)
        fmt = self.value_format
        decision, _ = decide(self.acceptors, lambda a: message.lookup(fmt, a.matcher, a.argument))
        if decision is not None:
            if decision.state == "failure":
                return (FAILURE, decision)
            if decision.state == "retry":
                return None
            return (PREDICATE if self.predicate else SUCCESS, decision)
        if self.predicate is not None and not self.has_success:
            return (PREDICATE, None)
        return None

    def index_keys(self) -> list[tuple[Point, tuple[str, Any]]] | None:
        """The (point, value) pairs one of which a message must show for this spec to care.

        ``None`` when the spec must see every message (a predicate without success acceptors,
        ``exists`` comparisons, non-scalar expected values, or no condition at all).
        """
        if self.match_all or (self.predicate is not None and not self.has_success):
            return None
        keys: list[tuple[Point, tuple[str, Any]]] = []
        for acceptor in self.acceptors:
            if acceptor.state == "retry":
                continue
            if acceptor.comparator == "exists":
                return None
            expected = acceptor.expected if acceptor.comparator == "in" else [acceptor.expected]
            for value in expected:
                canonical = _canonical_value(value)
                if canonical is None:
                    return None
                keys.append(((acceptor.matcher, acceptor.argument), canonical))
        return keys


# ================================================================================ waiter
#: What a fan-out counts per value format and partition: messages examined, then skipped by reason.
COUNTED: Final = ("examined", *PROBLEMS)
_SLOT: Final = {name: i for i, name in enumerate(COUNTED)}
_ZERO: Final = (0,) * len(COUNTED)


class _Wake:
    """What a waiter sleeps on: an ``asyncio.Event`` with a timeout, without a task per sleep.

    ``asyncio.wait_for(event.wait(), t)`` starts a task each time; ten thousand waits sleeping a
    poll interval at a time would start thousands a second. This costs a future and a timer.
    Only the waiter's own task sleeps on it.
    """

    __slots__ = ("_set", "_sleeper")

    def __init__(self) -> None:
        self._set = False
        self._sleeper: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._set = True
        if self._sleeper is not None and not self._sleeper.done():
            self._sleeper.set_result(None)

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set

    async def wait(self, timeout: float) -> bool:
        """Sleep until set or until ``timeout`` seconds pass; True if it was set."""
        if self._set:
            return True
        loop = asyncio.get_running_loop()
        sleeper = self._sleeper = loop.create_future()
        timer = loop.call_later(timeout, _resolve, sleeper)
        try:
            await sleeper
        finally:
            timer.cancel()
            self._sleeper = None
        return self._set


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Waiter:
    """One trigger's side of the shared readers: where it is in each partition and what it found.

    ``cursor[tp]`` is the next offset this waiter has not looked at. While it is attached to a
    fan-out only the messages handed to it move the cursor (the fan-out's position says how far
    it has really got). Partitions it has no cursor for (added after it started) are read from
    where the reader found them, keeping only messages stamped at or after the start moment
    (for ``earliest``, all of them).
    """

    __slots__ = (
        "attached",
        "behind",
        "counts",
        "cursor",
        "finished",
        "index_keys",
        "marks",
        "own_pace",
        "queue",
        "queued_bytes",
        "readers",
        "spec",
        "start_after_ms",
        "start_from",
        "ts_filter",
        "wake",
    )

    def __init__(self, spec: MatchSpec, *, start_from: str, start_after_ms: int | None) -> None:
        self.spec = spec
        self.start_from = start_from
        self.start_after_ms = start_after_ms
        self.cursor: dict[TopicPartition, int] = {}
        self.ts_filter: set[TopicPartition] = set()
        self.queue: collections.deque[tuple[KafkaMessage, str, Decision | None]] = collections.deque()
        self.queued_bytes = 0
        self.wake = _Wake()
        self.readers: dict[str, TopicReader] = {}
        #: The fan-out feeding this waiter on each topic: the shared reader, or a catch-up pass.
        self.attached: dict[str, FanOut] = {}
        #: Per partition, the fan-out's counts when it reached this waiter's cursor (None: not yet).
        self.marks: dict[TopicPartition, tuple[int, ...] | None] = {}
        #: Topics this waiter must catch up on itself (see :meth:`KafkaMessageTrigger._catch_up`).
        self.behind: set[str] = set()
        #: Set once its predicate could not keep up: from then on it catches up at its own pace.
        self.own_pace = False
        self.finished = False
        self.counts: collections.Counter[str] = collections.Counter()
        self.index_keys = spec.index_keys()

    # ------------------------------------------------------------------- windows
    def admit(self, message: KafkaMessage, tp: TopicPartition) -> bool:
        """Advance past ``message``; True if it is new to this waiter and not before its start."""
        cursor = self.cursor.get(tp)
        if cursor is not None and message.offset < cursor:
            return False
        if cursor is None and self.start_from != "earliest":
            self.ts_filter.add(tp)
        self.cursor[tp] = message.offset + 1
        if tp in self.ts_filter and self.start_after_ms is not None:
            # A partition this waiter did not resolve: keep what was stamped at or after the start.
            return not 0 <= message.timestamp < self.start_after_ms
        return True

    def position_in(self, tp: TopicPartition, feed: FanOut) -> int:
        """The cursor for ``tp``; a partition first seen now starts where the reader found it."""
        cursor = self.cursor.get(tp)
        if cursor is None:
            cursor = self.cursor[tp] = feed.origins.get(tp, 0)
            if self.start_from != "earliest":
                self.ts_filter.add(tp)
        return cursor

    # --------------------------------------------------------------- from a feed
    def offer(self, message: KafkaMessage, tp: TopicPartition, feed: FanOut) -> bool:
        """Called by a fan-out (synchronously) with every message this waiter may care about.

        Returns True when the waiter was woken (it has something to act on).
        """
        if self.finished or not self.admit(message, tp):
            return False
        outcome = self.spec.evaluate(message)
        if outcome is None:
            return False
        kind, decision = outcome
        if kind == PREDICATE and (
            len(self.queue) >= WAITER_QUEUE_MESSAGES or self.queued_bytes + message.size > WAITER_QUEUE_BYTES
        ):
            self._fall_behind(feed, tp, message.offset)
            return True
        self.queue.append((message, kind, decision))
        self.queued_bytes += message.size
        if kind != PREDICATE:
            # Nothing after a data decision matters: stop receiving from every feed.
            self.finished = True
            for topic in list(self.attached):
                self.detach(topic)
        self.wake.set()
        return True

    def _fall_behind(self, feed: FanOut, tp: TopicPartition, offset: int) -> None:
        """Too much is waiting for the predicate: leave the stream and catch up on our own later."""
        self.detach(feed.topic)
        for other, position in feed.positions.items():
            if other == tp:
                continue
            if other not in self.cursor and self.start_from != "earliest":
                self.ts_filter.add(other)
            self.cursor[other] = max(self.cursor.get(other, position), position)
        self.cursor[tp] = offset
        self.behind.add(feed.topic)
        self.own_pace = True
        self.counts["fell_behind"] += 1
        self.wake.set()

    # ---------------------------------------------------------------- attachment
    def join(self, feed: FanOut) -> bool:
        """Start receiving from ``feed`` if level with (or ahead of) it; atomic on the loop."""
        if not feed.attach(self):
            return False
        self.attached[feed.topic] = feed
        self.behind.discard(feed.topic)
        return True

    def try_attach(self, topic: str) -> bool:
        """Join the topic's shared reader, or note that this waiter has to catch up first."""
        if self.join(self.readers[topic]):
            return True
        self.behind.add(topic)
        return False

    def detach(self, topic: str) -> None:
        feed = self.attached.pop(topic, None)
        if feed is None:
            return
        feed.detach(self)
        self.counts.update(self._counted_by(feed))
        for tp in [tp for tp in self.marks if tp.topic == topic]:
            del self.marks[tp]

    def _counted_by(self, feed: FanOut) -> dict[str, int]:
        """What ``feed`` counted for this waiter: per partition, its counts now minus the mark."""
        totals = _ZERO
        for tp, tally in feed.tallies.get(self.spec.value_format, {}).items():
            mark = self.marks.get(tp, _ZERO)  # no mark: the partition appeared after the attach
            if mark is not None:
                totals = tuple(total + now - then for total, now, then in zip(totals, tally, mark, strict=True))
        return {name: total for name, total in zip(COUNTED, totals, strict=True) if total}

    def stats(self) -> dict[str, Any]:
        """How much this wait looked at: messages examined and skipped (by reason)."""
        counts = collections.Counter(self.counts)
        for feed in self.attached.values():
            counts.update(self._counted_by(feed))
        skipped = {name: counts.get(name, 0) for name in (*PROBLEMS, "predicate_error")}
        return {"examined": counts.get("examined", 0), "skipped": skipped}

    def count(self, message: KafkaMessage) -> str | None:
        """Count a message this waiter read itself; return its problem, if any."""
        self.counts["examined"] += 1
        problem = message.problem(self.spec.value_format)
        if problem is not None:
            self.counts[problem] += 1
        return problem


# ============================================================================== fan-out
class _Group:
    """The waiters of one value format on a fan-out, indexed by the values they compare."""

    def __init__(self) -> None:
        self.index: dict[tuple[Point, tuple[str, Any]], set[Waiter]] = collections.defaultdict(set)
        self.points: collections.Counter[Point] = collections.Counter()
        self.scan_all: set[Waiter] = set()
        self.size = 0

    def add(self, waiter: Waiter) -> None:
        self.size += 1
        if waiter.index_keys is None:
            self.scan_all.add(waiter)
            return
        for point, value in waiter.index_keys:
            if waiter not in self.index[(point, value)]:
                self.index[(point, value)].add(waiter)
                self.points[point] += 1

    def remove(self, waiter: Waiter) -> None:
        self.size -= 1
        if waiter.index_keys is None:
            self.scan_all.discard(waiter)
            return
        for point, value in waiter.index_keys:
            bucket = self.index.get((point, value))
            if bucket is not None and waiter in bucket:
                bucket.discard(waiter)
                if not bucket:
                    del self.index[(point, value)]
                self.points[point] -= 1
                if self.points[point] <= 0:
                    del self.points[point]

    def candidates(self, message: KafkaMessage, value_format: str) -> list[Waiter]:
        found: set[Waiter] = set(self.scan_all)
        for point in self.points:
            value = message.lookup(value_format, point[0], point[1])
            canonical = _canonical_value(value) if value is not MISSING else None
            if canonical is not None:
                bucket = self.index.get((point, canonical))
                if bucket:
                    found.update(bucket)
        return list(found)

    def members(self) -> set[Waiter]:
        everyone = set(self.scan_all)
        for bucket in self.index.values():
            everyone.update(bucket)
        return everyone


class FanOut:
    """Waiters on one topic, indexed by the values they compare, and the hand-out of messages.

    The shared :class:`TopicReader` is one; a :class:`CatchUpPass` that brings late waiters up to
    the reader is another. ``positions[tp]`` is the next offset handed out. Counts are kept per
    value format and partition, and each waiter marks the counts at the moment the hand-out
    reaches its cursor, so what each wait examined is exact without counting per wait.
    """

    def __init__(self, topic: str, origins: dict[TopicPartition, int]) -> None:
        self.topic = topic
        #: Where the reader first found each partition (a waiter new to a partition starts there).
        self.origins = origins
        self.positions: dict[TopicPartition, int] = {}
        self.last_timestamp: dict[TopicPartition, int] = {}
        self.groups: dict[str, _Group] = {}
        self.tallies: dict[str, dict[TopicPartition, list[int]]] = collections.defaultdict(dict)
        self.evaluations = 0
        #: Per partition, waiters attached ahead of the hand-out: (cursor, order, waiter), a heap.
        self._crossings: dict[TopicPartition, list[tuple[int, int, Waiter]]] = collections.defaultdict(list)
        self._order = itertools.count()

    # ------------------------------------------------------------------- waiters
    def behind(self, waiter: Waiter) -> dict[TopicPartition, int]:
        """Partitions where ``waiter`` has not yet reached this fan-out, with its position."""
        return {tp: position for tp, position in self.positions.items() if waiter.position_in(tp, self) < position}

    def attach(self, waiter: Waiter) -> bool:
        """Add the waiter if it is level with (or ahead of) the hand-out; atomic on the loop."""
        if self.behind(waiter):
            return False
        group = self.groups.get(waiter.spec.value_format)
        if group is None:
            group = self.groups[waiter.spec.value_format] = _Group()
        group.add(waiter)
        for tp in self.positions:
            self.mark(waiter, tp)
        return True

    def mark(self, waiter: Waiter, tp: TopicPartition) -> None:
        """Note where counting starts for ``waiter`` in ``tp``: now, or when the hand-out gets to its cursor."""
        cursor = waiter.position_in(tp, self)
        if cursor <= self.positions[tp]:
            waiter.marks[tp] = tuple(self._tally(waiter.spec.value_format, tp))
        else:
            waiter.marks[tp] = None
            heapq.heappush(self._crossings[tp], (cursor, next(self._order), waiter))

    def detach(self, waiter: Waiter) -> None:
        group = self.groups.get(waiter.spec.value_format)
        if group is not None:
            group.remove(waiter)
            if group.size <= 0:
                del self.groups[waiter.spec.value_format]

    def waiters(self) -> list[Waiter]:
        everyone: set[Waiter] = set()
        for group in self.groups.values():
            everyone.update(group.members())
        return list(everyone)

    def _tally(self, value_format: str, tp: TopicPartition) -> list[int]:
        tallies = self.tallies[value_format]
        tally = tallies.get(tp)
        if tally is None:
            tally = tallies[tp] = [0] * len(COUNTED)
        return tally

    def _cross(self, tp: TopicPartition, offset: int) -> None:
        """The hand-out reached ``offset``: start counting for the waiters whose cursor it passed."""
        crossings = self._crossings[tp]
        while crossings and crossings[0][0] <= offset:
            waiter = heapq.heappop(crossings)[2]
            if waiter.attached.get(self.topic) is self and waiter.marks.get(tp, _ZERO) is None:
                waiter.marks[tp] = tuple(self._tally(waiter.spec.value_format, tp))

    # ------------------------------------------------------------------ hand-out
    async def _dispatch(self, batch: Mapping[TopicPartition, list[Any]]) -> None:
        """Hand each record to the waiters that may care about it.

        Yields to the event loop after a slice of work or a batch of wake-ups, so neither a long
        fan-out nor a burst of matches (each waking a wait that then builds its event) holds the
        loop for long.
        """
        slice_start = time.monotonic()
        woken = 0
        for tp, records in batch.items():
            if not self.groups:
                if records:
                    self.positions[tp] = max(self.positions.get(tp, 0), records[-1].offset + 1)
                    self.last_timestamp[tp] = records[-1].timestamp
                continue
            crossings = self._crossings[tp]
            for record in records:
                if record.offset < self.positions.get(tp, 0):
                    continue
                if crossings and crossings[0][0] <= record.offset:
                    self._cross(tp, record.offset)
                message = KafkaMessage(record)
                for value_format, group in list(self.groups.items()):
                    tally = self._tally(value_format, tp)
                    tally[0] += 1
                    problem = message.problem(value_format)
                    if problem is not None:
                        tally[_SLOT[problem]] += 1
                        continue
                    for waiter in group.candidates(message, value_format):
                        self.evaluations += 1
                        woken += waiter.offer(message, tp, self)
                self.positions[tp] = record.offset + 1
                if message.timestamp >= 0:
                    self.last_timestamp[tp] = message.timestamp
                if woken >= WAKES_PER_SLICE or time.monotonic() - slice_start > DISPATCH_SLICE_SECONDS:
                    await asyncio.sleep(0)
                    slice_start = time.monotonic()
                    woken = 0

    def sync_positions(self, consumer: AIOKafkaConsumer) -> None:
        """Move past offsets the consumer skipped without returning records (gaps, control batches)."""
        for tp in list(self.positions):
            position = _known_position(consumer, tp)
            if position is not None and position > self.positions[tp]:
                self.positions[tp] = position

    def rewind(self, tp: TopicPartition, offset: int) -> None:
        """Hand out ``tp`` from ``offset`` on, moving back the cursors of waiters that were past it."""
        self.positions[tp] = offset
        for waiter in self.waiters():
            if waiter.cursor.get(tp, 0) > offset:
                waiter.cursor[tp] = offset
                if waiter.start_from != "earliest":
                    waiter.ts_filter.add(tp)


class CatchUpPass(FanOut):
    """One shared read of the gap between late waiters and their reader, then a hand-over.

    A wait whose start lies behind the reader (it starts from its deferral moment and messages
    arrived since, the triggerer restarted, or it reads from ``earliest``/``committed``) has to
    read that gap before it can join the reader. A pass reads it once for all such waits, from
    the earliest of their positions, through the same index as the reader; when it is level
    with the reader it moves them onto the reader, each in one step, so nothing falls between
    the two. N late waits cost one read of the gap, not N.
    """

    def __init__(self, reader: TopicReader, waiters: Iterable[Waiter]) -> None:
        super().__init__(reader.topic, reader.origins)
        self.reader = reader
        for waiter in waiters:  # start at the earliest position of any of them
            for tp in reader.positions:
                cursor = waiter.position_in(tp, self)
                if cursor < self.positions.get(tp, cursor + 1):
                    self.positions[tp] = cursor
        self._leaving: list[Waiter] = []

    def extend(self) -> None:
        """Cover partitions the reader gained since the pass started."""
        new = [tp for tp in self.reader.positions if tp not in self.positions]
        if not new:
            return
        waiters = self.waiters()
        for tp in new:
            self.positions[tp] = min(
                (waiter.position_in(tp, self) for waiter in waiters), default=self.reader.positions[tp]
            )
            for waiter in waiters:
                self.mark(waiter, tp)

    def level(self) -> bool:
        """Whether the pass has handed out everything the reader has (so its waiters can move)."""
        return all(self.positions.get(tp, -1) >= position for tp, position in self.reader.positions.items())

    def hand_over(self) -> bool:
        """Move waiters onto the reader, for one slice of time; True once nobody is left.

        Call it only while the pass is level with the reader: each move happens in one step, so
        no message can slip in between, and the caller checks the level again after a yield.
        """
        if not self._leaving:
            self._leaving = self.waiters()
        slice_start = time.monotonic()
        while self._leaving:
            waiter = self._leaving.pop()
            if waiter.attached.get(self.topic) is not self:
                continue  # found its message or fell behind meanwhile
            waiter.detach(self.topic)
            for tp, position in self.positions.items():
                if waiter.cursor.get(tp, 0) < position:
                    waiter.cursor[tp] = position
            if not waiter.try_attach(self.topic):
                waiter.wake.set()  # cannot happen while level; if it did, the waiter catches up again
            if time.monotonic() - slice_start > DISPATCH_SLICE_SECONDS:
                break
        return not self.groups


# ================================================================================ reader
class TopicReader(FanOut):
    """One consumer per (connection, topic) per process, fanning each message out to waiters.

    Starts at the log end of every partition when created; ``positions[tp]`` is the next offset
    it will hand out. Waiters behind that are brought up to it by a :class:`CatchUpPass` (one at
    a time, on one more consumer of its own). Broker outages are absorbed by the consumers (they
    reconnect and resume from their positions); other transient errors back off here; fatal ones
    are handed to every waiter.
    """

    def __init__(self, conn_id: str, topic: str, options: dict[str, Any]) -> None:
        super().__init__(topic, {})
        self.conn_id = conn_id
        self.options = options
        self.consumer: AIOKafkaConsumer | None = None
        #: A second, never-fetching consumer for metadata and offset lookups: a broker answers a
        #: connection's requests in order, so lookups queued behind a long-poll fetch would wait.
        self.lookup: AIOKafkaConsumer | None = None
        self.admin: AIOKafkaAdminClient | None = None
        self.known = False
        self.fatal: WaitError | None = None
        self.fetches = 0
        #: Catch-up passes run so far, and the one running now.
        self.passes = 0
        self.catching_up: CatchUpPass | None = None
        self._late: dict[Waiter, None] = {}
        self._late_arrived = asyncio.Event()
        self._passes: asyncio.Task[None] | None = None
        self._start_lookups: dict[tuple[Any, ...], asyncio.Future[dict[TopicPartition, int]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._admin_lock = asyncio.Lock()
        self._refresh_lock = asyncio.Lock()

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    async def open(cls, conn_id: str, topic: str) -> TopicReader:
        reader = cls(conn_id, topic, await load_client_options(conn_id))
        await reader.start()
        return reader

    async def start(self) -> None:
        self.consumer = await start_consumer(self.options)
        try:
            self.lookup = await start_consumer(self.options)
            await self.refresh(initial=True)
        except BaseException:
            await self.consumer.stop()
            if self.lookup is not None:
                await self.lookup.stop()
            raise
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"kafka-reader:{self.topic}")
        log.info("Kafka reader for %s on %s started at %s", self.topic, self.conn_id, self._describe_positions())

    @staticmethod
    async def close_reader(reader: TopicReader) -> None:
        await reader.close()

    async def close(self) -> None:
        for task in (self._task, self._passes):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._task = self._passes = None
        if self.consumer is not None:
            await self.consumer.stop()
        if self.lookup is not None:
            await self.lookup.stop()
        if self.admin is not None:
            await self.admin.close()
        log.info("Kafka reader for %s on %s closed", self.topic, self.conn_id)

    def _describe_positions(self) -> str:
        return ", ".join(f"{tp.partition}:{offset}" for tp, offset in sorted(self.positions.items())) or "no partitions"

    # ------------------------------------------------------------------- waiters
    def everyone(self) -> list[Waiter]:
        """Every waiter this reader serves: attached, in a catch-up pass, or waiting for one."""
        everyone = set(self.waiters()) | set(self._late)
        if self.catching_up is not None:
            everyone.update(self.catching_up.waiters())
        return list(everyone)

    def forget(self, waiter: Waiter) -> None:
        self._late.pop(waiter, None)

    async def committed(self, group_id: str, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """The group's committed offsets (read-only: no join, no commit); -1 where none."""
        async with self._admin_lock:
            if self.admin is None:
                self.admin = await start_admin(self.options)
        return await committed_offsets(self.admin, group_id, tps)

    async def start_offsets(
        self, tps: list[TopicPartition], *, start_from: str, start_after_ms: int | None, group_id: str | None
    ) -> dict[TopicPartition, int]:
        """Where a wait starts in ``tps`` (see :func:`resolve_start`).

        Waits that ask the same question while it is being answered (a mass deferral, a
        triggerer restart) share one lookup instead of queueing thousands on one connection.
        """
        assert self.lookup is not None
        key = (start_from, start_after_ms, group_id, tuple(tps))
        lookup = self._start_lookups.get(key)
        if lookup is None:
            lookup = self._start_lookups[key] = asyncio.ensure_future(
                resolve_start(
                    self.lookup,
                    list(tps),
                    start_from=start_from,
                    start_after_ms=start_after_ms,
                    committed=functools.partial(self.committed, group_id) if group_id else None,
                )
            )

            def answered(done: asyncio.Future[dict[TopicPartition, int]]) -> None:
                if self._start_lookups.get(key) is done:
                    del self._start_lookups[key]
                if not done.cancelled():
                    done.exception()  # retrieved here: every asker may have been cancelled

            lookup.add_done_callback(answered)
        return dict(await asyncio.shield(lookup))

    # ------------------------------------------------------------------ catch-up
    def catch_up(self, waiter: Waiter) -> None:
        """Have a shared pass bring ``waiter`` (behind this reader) up to it, then attach it.

        Joins the running pass if that has not yet gone past the waiter's position; otherwise
        the waiter is in the next pass, which starts when the running one is done.
        """
        running = self.catching_up
        if running is not None and waiter.join(running):
            return
        waiter.behind.discard(self.topic)
        self._late[waiter] = None
        self._late_arrived.set()
        if self._passes is None:
            self._passes = asyncio.get_running_loop().create_task(
                self._run_passes(), name=f"kafka-catch-up:{self.topic}"
            )

    async def _run_passes(self) -> None:
        """Run passes while late waiters arrive; keep the consumer a little while, then close it."""
        consumer: AIOKafkaConsumer | None = None
        failures = 0
        try:
            while True:
                if not self._late:
                    self._late_arrived.clear()
                    if consumer is not None and consumer.assignment():
                        consumer.unsubscribe()  # stop prefetching while idle
                    try:
                        await asyncio.wait_for(self._late_arrived.wait(), CATCH_UP_LINGER_SECONDS)
                    except asyncio.TimeoutError:
                        if not self._late:
                            return
                    continue
                if consumer is None:
                    try:
                        consumer = await start_consumer(self.options)
                    except asyncio.CancelledError:
                        raise
                    except Exception as exc:
                        failures += 1
                        await self._back_off(exc, failures, "catch-up")
                        continue
                    failures = 0
                # Everyone who arrived while the consumer started goes in this pass.
                self.catching_up = run = CatchUpPass(self, list(self._late))
                self.passes += 1
                await self._fill(run)
                await self._read_pass(run, consumer)
                self.catching_up = None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # fatal: every waiter, the pass's included, ends with it
            self._fail(exc if isinstance(exc, WaitError) else FatalError(f"unexpected {type(exc).__name__}: {exc}"))
        finally:
            self.catching_up = self._passes = None
            if consumer is not None:
                await consumer.stop()

    async def _fill(self, run: CatchUpPass) -> None:
        """Move the late waiters into the pass, yielding to the loop between slices."""
        slice_start = time.monotonic()
        for waiter in list(self._late):
            if waiter in self._late:  # not released meanwhile
                del self._late[waiter]
                waiter.join(run)  # never behind: the pass starts at the earliest position
            if time.monotonic() - slice_start > DISPATCH_SLICE_SECONDS:
                await asyncio.sleep(0)
                slice_start = time.monotonic()

    async def _read_pass(self, run: CatchUpPass, consumer: AIOKafkaConsumer) -> None:
        """Read until the pass is level with the reader (then hand over) or has nobody left."""
        from aiokafka.errors import OffsetOutOfRangeError

        assigned: set[TopicPartition] = set()
        failures = 0
        while True:
            run.extend()
            if not run.groups:
                return
            if run.level():
                if run.hand_over():
                    return
                await asyncio.sleep(0)
                continue
            if assigned != set(run.positions):
                assigned = set(run.positions)
                consumer.assign(sorted(assigned))
                for tp, offset in run.positions.items():
                    consumer.seek(tp, offset)
            try:
                batch = await consumer.getmany(timeout_ms=FETCH_WAIT_MS, max_records=MAX_RECORDS_PER_FETCH)
            except asyncio.CancelledError:
                raise
            except OffsetOutOfRangeError as exc:
                assert self.lookup is not None
                for tp, target in (await clamp_to_log(self.lookup, exc)).items():
                    run.rewind(tp, target)
                    consumer.seek(tp, target)
                continue
            except Exception as exc:
                failures += 1
                await self._back_off(exc, failures, "catch-up")
                continue
            failures = 0
            if batch:
                await run._dispatch(batch)
            run.sync_positions(consumer)

    async def _back_off(self, exc: Exception, failures: int, what: str) -> None:
        """Sleep after a transient error (capped, full jitter); raise a fatal one."""
        error = classify_kafka_error(exc) or TransientError(f"{type(exc).__name__}: {exc}")
        if not isinstance(error, TransientError):
            raise error from exc
        delay = random.uniform(0.0, min(30.0, 0.5 * 2.0**failures))
        log.warning("Kafka %s for %s: %s; retrying in %.2fs", what, self.topic, error.message, delay)
        await asyncio.sleep(max(delay, 0.1))

    def _fail(self, error: WaitError) -> None:
        log.error("Kafka reader for %s failed: %s", self.topic, error.message)
        self.fatal = error
        for waiter in self.everyone():
            waiter.wake.set()

    # ------------------------------------------------------------------ the loop
    async def _run(self) -> None:
        from aiokafka.errors import OffsetOutOfRangeError

        assert self.consumer is not None
        failures = 0
        next_refresh = time.monotonic() + PARTITION_REFRESH_SECONDS
        while True:
            try:
                if self.positions:
                    batch = await self.consumer.getmany(timeout_ms=FETCH_WAIT_MS, max_records=MAX_RECORDS_PER_FETCH)
                    self.fetches += 1
                    if batch:
                        await self._dispatch(batch)
                    self.sync_positions(self.consumer)
                else:
                    await asyncio.sleep(max(0.0, next_refresh - time.monotonic()))
                if time.monotonic() >= next_refresh:
                    next_refresh = time.monotonic() + PARTITION_REFRESH_SECONDS
                    await self.refresh()
                if failures:
                    log.info("Kafka reader for %s recovered after %d error(s)", self.topic, failures)
                failures = 0
            except asyncio.CancelledError:
                raise
            except OffsetOutOfRangeError as exc:
                await self._out_of_range(exc)
            except Exception as exc:
                failures += 1
                try:
                    await self._back_off(exc, failures, "reader")
                except WaitError as error:
                    self._fail(error)
                    return

    async def refresh(self, *, initial: bool = False) -> None:
        """Pick up a topic that appeared, partitions that were added, and logs that were cut back."""
        async with self._refresh_lock:
            await self._refresh(initial)

    async def _refresh(self, initial: bool) -> None:
        from aiokafka import TopicPartition

        assert self.consumer is not None and self.lookup is not None
        partitions = await topic_partitions(self.lookup, self.topic)
        if partitions is None:
            if self.known:
                log.warning("Kafka topic %s is not visible on %s; still waiting for it", self.topic, self.conn_id)
            self.known = False
            return
        if not self.known:
            await track_topic(self.lookup, self.topic)
        self.known = True
        new = [tp for tp in (TopicPartition(self.topic, p) for p in sorted(partitions)) if tp not in self.positions]
        if new:
            # The reader starts at the log end. Partitions (or a whole topic) that appear later
            # hold only messages newer than the reader: read them from their beginning (waiters
            # keep what was stamped at or after their start).
            if initial:
                starts = await self.lookup.end_offsets(new)
            else:
                starts = await self.lookup.beginning_offsets(new)
            for tp in new:
                self.origins[tp] = self.positions[tp] = int(starts[tp])
            self.consumer.assign(list(self.positions))
            for tp, offset in self.positions.items():
                self.consumer.seek(tp, offset)
            if len(new) != len(self.positions):
                log.info("Kafka topic %s gained partitions %s", self.topic, [tp.partition for tp in new])
            return
        ends = await self.lookup.end_offsets(list(self.positions))
        for tp, end in ends.items():
            if self.positions.get(tp, 0) > end:
                await self._reset_beyond_end(tp, int(end))

    async def _out_of_range(self, exc: Exception) -> None:
        """The broker no longer has our position: retention deleted it, or the log was cut back."""
        assert self.lookup is not None
        offsets = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else {}
        for tp, offset in offsets.items():
            begin = (await self.lookup.beginning_offsets([tp]))[tp]
            end = (await self.lookup.end_offsets([tp]))[tp]
            if offset < begin:
                log.warning(
                    "Kafka %s[%d]: offsets %d..%d were deleted before they were read",
                    tp.topic,
                    tp.partition,
                    offset,
                    begin,
                )
                self._move(tp, int(begin))
            else:
                await self._reset_beyond_end(tp, int(end))

    async def _reset_beyond_end(self, tp: TopicPartition, end: int) -> None:
        """Our position is past the log end (topic recreated, unclean leader change): resume at the
        first message stamped at or after the last one we saw, so the new messages are not skipped."""
        assert self.lookup is not None
        target = end
        last = self.last_timestamp.get(tp)
        if last is not None:
            found = (await self.lookup.offsets_for_times({tp: last})).get(tp)
            if found is not None and found.timestamp is not None and found.timestamp >= 0 and 0 <= found.offset <= end:
                target = int(found.offset)
        log.warning(
            "Kafka %s[%d]: position %d is past the log end %d; resuming at %d",
            tp.topic,
            tp.partition,
            self.positions[tp],
            end,
            target,
        )
        self._move(tp, target)

    def _move(self, tp: TopicPartition, offset: int) -> None:
        assert self.consumer is not None
        self.rewind(tp, offset)
        self.consumer.seek(tp, offset)


async def start_admin(options: Mapping[str, Any]) -> AIOKafkaAdminClient:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(**options, request_timeout_ms=30_000)
    try:
        await admin.start()
    except BaseException:
        await admin.close()
        raise
    return admin


async def committed_offsets(
    admin: AIOKafkaAdminClient, group_id: str, tps: list[TopicPartition]
) -> dict[TopicPartition, int]:
    """A group's committed offsets for ``tps`` (-1 where it has none), read without joining it."""
    offsets = await admin.list_consumer_group_offsets(group_id, partitions=list(tps))
    return {tp: int(offsets[tp].offset) if tp in offsets and offsets[tp] is not None else -1 for tp in tps}


async def resolve_start(
    consumer: AIOKafkaConsumer,
    tps: list[TopicPartition],
    *,
    start_from: str,
    start_after_ms: int | None,
    committed: Callable[[list[TopicPartition]], Any] | None = None,
) -> dict[TopicPartition, int]:
    """The first offset to look at in each partition for this start rule.

    ``timestamp``: the first message stamped at or after ``start_after_ms`` (the end offsets are
    read *before* the time lookup, so a "not found" answer can safely mean "the end").
    ``committed``: the group's committed offset; partitions without one use the timestamp rule.
    """
    if not tps:
        return {}
    if start_from == "earliest":
        return {tp: int(offset) for tp, offset in (await consumer.beginning_offsets(tps)).items()}
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


# ======================================================================= catch-up slots
_catchup_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary()
)


def _catchup_slot(conn_id: str) -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    slots = _catchup_slots.setdefault(loop, {})
    if conn_id not in slots:
        slots[conn_id] = asyncio.Semaphore(MAX_CATCHUPS_PER_CONNECTION)
    return slots[conn_id]


# =============================================================================== trigger
class KafkaMessageTrigger(PollingTrigger):
    """Fire on the first Kafka message (on any of ``topics``) that matches the condition.

    :param topics: topic names (a single string is accepted).
    :param kafka_conn_id: an Airflow ``kafka`` connection: bootstrap servers and security
        settings (SASL/SSL) come from it, inside the triggerer.
    :param acceptors: conditions as data (canonical form, see :mod:`~airflow_deferrable_kit.conditions`)
        with matchers ``key``, ``value``, ``path`` (a JSON path into the value) and ``header``.
    :param predicate: dotted path of a callable ``f(message) -> bool | "success" | "failure"``;
        it receives ``{"topic", "partition", "offset", "timestamp", "key", "headers", "value"}``.
    :param start_from: ``timestamp`` (messages stamped at or after ``start_after_ms``),
        ``earliest`` (the whole retained log) or ``committed`` (``group_id``'s committed offsets,
        read-only; partitions without one use the timestamp rule).
    :param start_after_ms: the start moment in epoch milliseconds; filled with "now" when absent,
        and carried in the kwargs so a restart never moves it.
    :param group_id: the consumer group whose offsets ``start_from="committed"`` reads.
    :param value_format: ``json`` (non-JSON values are skipped as malformed), ``text`` or ``bytes``.
    :param wait_for_topic: wait for a topic that does not exist yet instead of failing.
    """

    topics: list[str]
    kafka_conn_id: str = "kafka_default"
    acceptors: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    predicate: str | None = None
    start_from: str = "timestamp"
    start_after_ms: int | None = None
    group_id: str | None = None
    value_format: str = "json"
    wait_for_topic: bool = False

    extra = "kafka"
    extra_modules = ("aiokafka",)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._spec = MatchSpec(load_acceptors(self.acceptors, matchers=MATCHERS), self.predicate, self.value_format)
        self._waiter: Waiter | None = None
        self._pending_topics: list[str] = []
        self._catchups: dict[str, AIOKafkaConsumer] = {}
        self._slots_held: dict[str, asyncio.Semaphore] = {}
        self._scanning = False
        self._phased = False
        self._resume: dict[tuple[str, int], int] = {}
        #: After a bounded scan (the poke path): the next offset to look at per (topic, partition).
        self.scan_cursor: dict[tuple[str, int], int] = {}

    # ---------------------------------------------------------------- validation
    def validate(self) -> None:
        if isinstance(self.topics, str):
            self.topics = [self.topics]
        if (
            not isinstance(self.topics, list)
            or not self.topics
            or not all(isinstance(t, str) and t.strip() and t == t.strip() for t in self.topics)
        ):
            raise ValueError(f"topics must be a non-empty list of topic names, got {self.topics!r}")
        if len(set(self.topics)) != len(self.topics):
            raise ValueError(f"topics must not repeat a topic, got {self.topics!r}")
        for topic in self.topics:
            if not LEGAL_TOPIC.fullmatch(topic) or topic in (".", ".."):
                raise ValueError(
                    f"topics: {topic!r} is not a legal Kafka topic name "
                    "(1-249 characters of letters, digits, '.', '_' and '-')"
                )
        if not isinstance(self.kafka_conn_id, str) or not self.kafka_conn_id:
            raise ValueError(f"kafka_conn_id must be a non-empty string, got {self.kafka_conn_id!r}")
        if self.value_format not in VALUE_FORMATS:
            raise ValueError(f"value_format must be one of {', '.join(VALUE_FORMATS)}, got {self.value_format!r}")
        if not isinstance(self.acceptors, list):
            raise ValueError(f"acceptors must be a list of conditions, got {type(self.acceptors).__name__}")
        self.acceptors = build_acceptors(matchers=MATCHERS, acceptors=self.acceptors)
        for i, acceptor in enumerate(self.acceptors):
            if self.value_format == "bytes" and acceptor["matcher"] in ("path", "value"):
                raise ValueError(
                    f"acceptors[{i}]: matcher {acceptor['matcher']!r} needs value_format 'json' or 'text', not 'bytes'"
                )
            if self.value_format == "text" and acceptor["matcher"] == "path":
                raise ValueError(f"acceptors[{i}]: matcher 'path' needs value_format 'json'")
        if self.predicate is not None:
            validate_predicate_path(self.predicate)
        if self.acceptors and self.predicate is None and not any(a["state"] == "success" for a in self.acceptors):
            raise ValueError(
                "acceptors: the conditions can never succeed; add a success condition or a predicate "
                "(with no condition at all, the first message matches)"
            )
        if self.start_from not in START_FROM:
            raise ValueError(f"start_from must be one of {', '.join(START_FROM)}, got {self.start_from!r}")
        if self.group_id is not None and (not isinstance(self.group_id, str) or not self.group_id):
            raise ValueError(f"group_id must be a non-empty string or None, got {self.group_id!r}")
        if self.start_from == "committed" and self.group_id is None:
            raise ValueError("group_id is required with start_from='committed'")
        if self.start_after_ms is not None and (
            isinstance(self.start_after_ms, bool) or not isinstance(self.start_after_ms, int) or self.start_after_ms < 0
        ):
            raise ValueError(f"start_after_ms must be epoch milliseconds (an int >= 0), got {self.start_after_ms!r}")
        if self.start_after_ms is None and self.start_from != "earliest":
            self.start_after_ms = int(self.clock.time() * 1000)
        if not isinstance(self.wait_for_topic, bool):
            raise ValueError(f"wait_for_topic must be true or false, got {self.wait_for_topic!r}")

    def describe(self) -> str:
        condition = f"{len(self.acceptors)} condition(s)" if self.acceptors else "any message"
        if self.predicate:
            condition += f" + predicate {self.predicate}"
        start = self.start_from if self.start_from != "timestamp" else f"after {self.start_after_ms} ms"
        return f"Kafka message on {', '.join(self.topics)} via {self.kafka_conn_id} ({condition}; from {start})"

    def classify_error(self, exc: Exception) -> WaitError:
        return classify_kafka_error(exc) or super().classify_error(exc)

    # ------------------------------------------------------------------- the check
    async def check(self) -> Found | None:
        """Deferred: wait up to ``poll_interval`` for the shared readers to deliver a match.

        The check itself is the interruptible sleep: it returns the moment a match is delivered,
        and the base loop re-enters it at once (see :meth:`next_poll_delay`).
        """
        if self._scanning:
            return await self._scan()
        waiter = self._waiter
        if waiter is None:
            waiter = self._waiter = Waiter(self._spec, start_from=self.start_from, start_after_ms=self.start_after_ms)
            self._pending_topics = list(self.topics)
            if self.predicate is not None:
                await self._import_predicate()
        while self._pending_topics:
            await self._join(self._pending_topics[0])
            self._pending_topics.pop(0)
        interval = float(self.poll_interval)
        if not self._phased:
            # Waits that started together would otherwise all come back together every interval.
            self._phased = True
            interval = self.phase(interval)
        budget = asyncio.get_running_loop().time() + interval
        while True:
            waiter.wake.clear()
            if waiter.queue:
                message, kind, decision = waiter.queue.popleft()
                waiter.queued_bytes -= message.size
                found = await self._settle(message, kind, decision)
                if found is not None:
                    return found
                continue
            if waiter.finished:
                return None
            for reader in waiter.readers.values():
                if reader.fatal is not None:
                    raise reader.fatal
            if waiter.behind:
                found = await self._catch_up(next(iter(sorted(waiter.behind))))
                if found is not None:
                    return found
                continue
            remaining = budget - asyncio.get_running_loop().time()
            if remaining <= 0 or not await waiter.wake.wait(remaining):
                return None

    def next_poll_delay(self) -> float:
        # check() already waited (interruptibly) for up to poll_interval; go straight back in.
        return 0.0 if not self._scanning else float(self.poll_interval)

    async def _import_predicate(self) -> None:
        assert self.predicate is not None
        try:
            await asyncio.to_thread(import_predicate, self.predicate)
        except ValueError as exc:
            raise FatalError(str(exc), error_type="predicate") from exc

    async def _join(self, topic: str) -> None:
        """Lease the topic's shared reader, resolve where this wait starts, attach or fall behind."""
        waiter = self._waiter
        assert waiter is not None
        reader: TopicReader = await self.lease(
            ("kafka-reader", self.kafka_conn_id, topic),
            functools.partial(TopicReader.open, self.kafka_conn_id, topic),
            TopicReader.close_reader,
        )
        waiter.readers[topic] = reader
        if reader.fatal is not None:
            raise reader.fatal
        if not reader.known:
            await reader.refresh()
        if not reader.known:
            if not self.wait_for_topic:
                raise FatalError(
                    f"topic {topic!r} does not exist on kafka_conn_id={self.kafka_conn_id!r} "
                    "(set wait_for_topic=True to wait for it)",
                    error_type="unknown_topic",
                )
            self.log.info("Topic %s does not exist yet; waiting for it", topic)
        else:
            start = await reader.start_offsets(
                sorted(reader.positions),
                start_from=self.start_from,
                start_after_ms=self.start_after_ms,
                group_id=self.group_id,
            )
            for tp, offset in start.items():
                waiter.cursor.setdefault(tp, offset)
        if not waiter.try_attach(topic):
            self.log.info("Catching up on %s from %s", topic, {tp.partition: o for tp, o in waiter.cursor.items()})

    async def _settle(self, message: KafkaMessage, kind: str, decision: Decision | None) -> Found | None:
        """Turn a delivered message into the outcome: run the predicate if needed, then decide."""
        matched: dict[str, Any] | None = None
        if decision is not None:
            matched = decision.as_dict()
            matched["actual"] = _capped(matched["actual"])
        if kind == PREDICATE:
            assert self.predicate is not None and self._waiter is not None
            try:
                state = await run_predicate(self.predicate, message.subject(self.value_format))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._waiter.counts["predicate_error"] += 1
                self.log.warning(
                    "Predicate %s raised on %s[%d]@%d; skipping the message: %s: %s",
                    self.predicate,
                    message.topic,
                    message.partition,
                    message.offset,
                    type(exc).__name__,
                    exc,
                )
                return None
            if state == "retry":
                return None
            kind = SUCCESS if state == "success" else FAILURE
            matched = {"predicate": self.predicate, "result": state, **({"acceptor": matched} if matched else {})}
        data = self._payload(message, matched)
        if kind == SUCCESS:
            return Found(data)
        raise ConditionFailed(
            f"a failure condition matched message {message.topic}[{message.partition}]@{message.offset}",
            details=data,
        )

    def _payload(self, message: KafkaMessage, matched: dict[str, Any] | None) -> dict[str, Any]:
        data = message.payload(self.value_format)
        data["matched"] = matched
        data["start"] = {"from": self.start_from, "after_ms": self.start_after_ms, "group_id": self.group_id}
        if self._waiter is not None:
            data.update(self._waiter.stats())
        return data

    # ------------------------------------------------------------------- catch-up
    async def _catch_up(self, topic: str) -> Found | None:
        """Get level with the topic's shared reader and join it.

        Normally the reader's shared catch-up pass reads the gap (this returns at once and the
        pass attaches the wait when it is level). A wait that fell behind because its predicate
        could not keep up reads the gap at its own pace, with a short-lived consumer of its own.
        """
        waiter = self._waiter
        assert waiter is not None
        reader = waiter.readers[topic]
        if reader.fatal is not None:
            raise reader.fatal
        if not waiter.own_pace:
            if not waiter.try_attach(topic):
                reader.catch_up(waiter)
            return None
        while True:
            if not reader.behind(waiter) and waiter.try_attach(topic):
                # Level with the reader, and attached in the same step (no await in between).
                await self._close_catchup(topic)
                self.log.info("Caught up on %s; joined the shared reader", topic)
                return None
            behind = reader.behind(waiter)
            consumer = self._catchups.get(topic)
            if consumer is None:
                consumer = await self._open_catchup(topic)
                continue
            found = await self._read_some(consumer, behind, topic)
            if found is not None:
                await self._close_catchup(topic)
                return found
            if waiter.queue:
                return None

    async def _open_catchup(self, topic: str) -> AIOKafkaConsumer:
        waiter = self._waiter
        assert waiter is not None
        reader = waiter.readers[topic]
        slot = _catchup_slot(self.kafka_conn_id)
        await slot.acquire()
        self._slots_held[topic] = slot
        try:
            consumer = await start_consumer(reader.options)
        except BaseException:
            self._slots_held.pop(topic).release()
            raise
        self._catchups[topic] = consumer
        return consumer

    async def _close_catchup(self, topic: str) -> None:
        consumer = self._catchups.pop(topic, None)
        if consumer is not None:
            await consumer.stop()
        slot = self._slots_held.pop(topic, None)
        if slot is not None:
            slot.release()

    async def _read_some(
        self, consumer: AIOKafkaConsumer, targets: Mapping[TopicPartition, int], topic: str
    ) -> Found | None:
        """One fetch on a private consumer: examine what came back, advance this wait's cursors."""
        from aiokafka.errors import OffsetOutOfRangeError

        waiter = self._waiter
        assert waiter is not None
        wanted = set(targets)
        if consumer.assignment() != wanted:
            consumer.assign(sorted(wanted))
            for tp in wanted:
                consumer.seek(tp, waiter.cursor[tp])
        try:
            batch = await consumer.getmany(timeout_ms=FETCH_WAIT_MS, max_records=MAX_RECORDS_PER_FETCH)
        except OffsetOutOfRangeError as exc:
            await self._clamp(consumer, exc)
            return None
        for tp, records in batch.items():
            for record in records:
                message = KafkaMessage(record)
                if not waiter.admit(message, tp):
                    continue
                if waiter.count(message) is not None:
                    continue
                outcome = self._spec.evaluate(message)
                if outcome is not None:
                    found = await self._settle(message, *outcome)
                    if found is not None:
                        return found
        for tp in wanted:
            position = _known_position(consumer, tp)
            if position is not None and position > waiter.cursor.get(tp, 0):
                waiter.cursor[tp] = position
        return None

    async def _clamp(self, consumer: AIOKafkaConsumer, exc: Exception) -> None:
        """A private read fell outside the log: move into it (deleted by retention, or cut back)."""
        waiter = self._waiter
        assert waiter is not None
        for tp, target in (await clamp_to_log(consumer, exc)).items():
            waiter.cursor[tp] = target
            consumer.seek(tp, target)

    # ------------------------------------------------------------ bounded scan
    async def poll_once(self) -> dict[str, Any] | None:
        """The poke path: one bounded scan from the start position to the log end at this moment."""
        self._scanning = True
        return await super().poll_once()

    def resume_scan_from(self, cursor: Mapping[tuple[str, int], int]) -> None:
        """Start the next bounded scan where an earlier one stopped (the sensor's poke mode)."""
        self._resume = dict(cursor)

    async def _scan(self) -> Found | None:
        from aiokafka import TopicPartition

        options = await load_client_options(self.kafka_conn_id)
        consumer = await start_consumer(options)
        admin: AIOKafkaAdminClient | None = None
        self._waiter = waiter = Waiter(self._spec, start_from=self.start_from, start_after_ms=self.start_after_ms)
        try:
            if self.predicate is not None:
                await self._import_predicate()
            for topic in self.topics:
                partitions = await topic_partitions(consumer, topic)
                if partitions is None:
                    if self.wait_for_topic:
                        continue
                    raise FatalError(
                        f"topic {topic!r} does not exist on kafka_conn_id={self.kafka_conn_id!r} "
                        "(set wait_for_topic=True to wait for it)",
                        error_type="unknown_topic",
                    )
                tps = [TopicPartition(topic, p) for p in sorted(partitions)]
                await track_topic(consumer, topic)
                fresh = [tp for tp in tps if (tp.topic, tp.partition) not in self._resume]
                for tp in tps:
                    if (tp.topic, tp.partition) in self._resume:
                        waiter.cursor[tp] = self._resume[(tp.topic, tp.partition)]

                async def committed(t: list[TopicPartition]) -> dict[TopicPartition, int]:
                    nonlocal admin
                    if admin is None:
                        admin = await start_admin(options)
                    assert self.group_id is not None
                    return await committed_offsets(admin, self.group_id, t)

                waiter.cursor.update(
                    await resolve_start(
                        consumer,
                        fresh,
                        start_from=self.start_from,
                        start_after_ms=self.start_after_ms,
                        committed=committed if self.group_id else None,
                    )
                )
                ends = {tp: int(offset) for tp, offset in (await consumer.end_offsets(tps)).items()}
                while True:
                    behind = {tp: end for tp, end in ends.items() if waiter.cursor[tp] < end}
                    if not behind:
                        break
                    found = await self._read_some(consumer, behind, topic)
                    if found is not None:
                        return found
                self.scan_cursor.update({(tp.topic, tp.partition): waiter.cursor[tp] for tp in tps})
            return None
        finally:
            await consumer.stop()
            if admin is not None:
                await admin.close()

    # ------------------------------------------------------------------- release
    async def release(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            waiter.finished = True
            for topic in list(waiter.attached):
                waiter.detach(topic)
            for reader in waiter.readers.values():
                reader.forget(waiter)
        for topic in list(self._catchups):
            await self._close_catchup(topic)
        for topic, slot in list(self._slots_held.items()):
            slot.release()
            del self._slots_held[topic]
        await super().release()


# ================================================================================ commit
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


def canonical_acceptors(
    *,
    acceptors: Iterable[Mapping[str, Any]] | None = None,
    success: Iterable[Mapping[str, Any]] | None = None,
    failure: Iterable[Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Kafka conditions (canonical or grouped sugar) in the canonical JSON form triggers carry."""
    return build_acceptors(matchers=MATCHERS, acceptors=acceptors, success=success, failure=failure)


__all__ = [
    "MATCHERS",
    "KafkaMessage",
    "KafkaMessageTrigger",
    "MatchSpec",
    "TopicReader",
    "Waiter",
    "canonical_acceptors",
    "classify_kafka_error",
    "client_options",
    "commit_offset",
]
