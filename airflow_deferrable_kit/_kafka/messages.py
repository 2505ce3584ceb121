"""What the Kafka wait looks at: a record decoded once for every waiter, and a wait's condition.

:class:`KafkaMessage` decodes a record's value lazily, once, however many waiters look at it, and
builds the size-capped payload. :class:`MatchSpec` is a wait's condition (acceptors as data, an
optional predicate, a value format); its :meth:`~MatchSpec.index_keys` say which values a message
must show for the condition to care, which lets the shared reader hand a message only to the waits
that can match it.
"""

from __future__ import annotations

import base64
import functools
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any, Final

from airflow_deferrable_kit.conditions import (
    ASK_PREDICATE,
    DEFAULT,
    MISSING,
    ConditionSet,
    Decision,
    lookup,
    parse_path,
)
from airflow_deferrable_kit.payload import cap_text

#: Matchers a Kafka condition may use, and whether each takes an argument.
MATCHERS: Final = {"key": False, "value": False, "path": True, "header": True}
#: Caps for what a message contributes to the payload (the whole payload is capped at 64 KiB).
MAX_VALUE_CHARS = 32_000
MAX_KEY_CHARS = 1_024
MAX_HEADER_CHARS = 256
MAX_HEADERS = 16
MAX_ACTUAL_CHARS = 1_024

#: What a message means to a wait (see :meth:`MatchSpec.evaluate`).
SUCCESS: Final = "success"
FAILURE: Final = "failure"
PREDICATE: Final = "predicate"
#: Why a message cannot be matched in a value format (see :meth:`KafkaMessage.problem`).
PROBLEMS: Final = ("tombstone", "undecodable", "malformed")

_UNSET: Final = object()


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


class ConfluentStyleMessage:
    """A message as confluent-kafka's ``Message`` shows it, for an official ``apply_function``.

    The official Kafka sensors call ``apply_function(message)`` with a confluent ``Message``:
    methods, not attributes, and the key and value as the raw bytes (``json.loads(message.value())``).
    This gives the same methods over the record the shared reader fetched, so such a function
    runs here unchanged. ``error()`` is always ``None``: a broker error never reaches a predicate.
    """

    #: confluent-kafka's ``TIMESTAMP_NOT_AVAILABLE`` and ``TIMESTAMP_CREATE_TIME``.
    TIMESTAMP_NOT_AVAILABLE: Final = 0
    TIMESTAMP_CREATE_TIME: Final = 1

    __slots__ = ("_message",)

    def __init__(self, message: KafkaMessage) -> None:
        self._message = message

    def topic(self) -> str:
        return self._message.topic

    def partition(self) -> int:
        return self._message.partition

    def offset(self) -> int:
        return self._message.offset

    def key(self) -> bytes | None:
        return self._message.key

    def value(self) -> bytes | None:
        return self._message.raw_value

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return list(self._message.headers) or None

    def timestamp(self) -> tuple[int, int]:
        stamp = self._message.timestamp
        return (self.TIMESTAMP_CREATE_TIME, stamp) if stamp >= 0 else (self.TIMESTAMP_NOT_AVAILABLE, -1)

    def error(self) -> None:
        return None

    def __len__(self) -> int:
        return self._message.size

    def __repr__(self) -> str:
        return f"<Message {self.topic()}[{self.partition()}]@{self.offset()}>"


_cap = cap_text  # the one capper, in bytes of JSON


def _readable(raw: bytes) -> str:
    return raw.decode("utf-8", "backslashreplace")


@functools.lru_cache(maxsize=1024)
def _parsed_path(path: str) -> tuple[str | int, ...]:
    return parse_path(path)


# ============================================================================ conditions
def canonical_acceptors(
    *,
    acceptors: Iterable[Mapping[str, Any]] | None = None,
    success: Iterable[Mapping[str, Any]] | None = None,
    failure: Iterable[Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Kafka conditions (canonical or grouped sugar) in the canonical JSON form triggers carry."""
    return ConditionSet.canonicalise(matchers=MATCHERS, acceptors=acceptors, success=success, failure=failure)


def canonical_value(value: Any) -> tuple[str, Any] | None:
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


#: Where a condition looks in a message: (matcher, argument).
Point = tuple[str, str | None]


class MatchSpec:
    """A waiter's condition: acceptors (data), an optional predicate, and the value format."""

    def __init__(self, conditions: ConditionSet, value_format: str) -> None:
        self.conditions = conditions
        self.acceptors = conditions.acceptors
        self.predicate = conditions.predicate
        self.value_format = value_format
        self.has_success = conditions.has_success
        self.match_all = not conditions

    def evaluate(self, message: KafkaMessage) -> tuple[str, Decision | None] | None:
        """What this message means to the wait: success, failure, "ask the predicate", or nothing.

        The acceptor stage of the one rule (:meth:`ConditionSet.screen`), run for every message
        the shared reader hands over; the predicate stage runs in the wait itself. No condition
        at all: any message matches.
        """
        fmt = self.value_format
        state, decision, _ = self.conditions.screen(lambda a: message.lookup(fmt, a.matcher, a.argument))
        if state in (DEFAULT, SUCCESS):
            return (SUCCESS, decision)
        if state == FAILURE:
            return (FAILURE, decision)
        if state == ASK_PREDICATE:
            return (PREDICATE, decision)
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
                canonical = canonical_value(value)
                if canonical is None:
                    return None
                keys.append(((acceptor.matcher, acceptor.argument), canonical))
        return keys


__all__ = [
    "FAILURE",
    "MATCHERS",
    "PREDICATE",
    "PROBLEMS",
    "SUCCESS",
    "KafkaMessage",
    "MatchSpec",
    "Point",
    "canonical_acceptors",
    "canonical_value",
]
