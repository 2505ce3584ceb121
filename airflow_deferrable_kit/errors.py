"""The one error vocabulary: what went wrong, as a small closed set users can alert on.

Every failure a wait sees is either *transient* (retried with capped exponential backoff and
full jitter, logged as a warning, and named in the timeout message if the deadline passes) or
*fatal* (the wait ends at once with an ``error`` event). Each carries an ``error_type`` from
:class:`ErrorType`, and nothing else: a call site cannot invent a new string, because
:class:`WaitError` refuses any value that is not a member. The tree::

    WaitError
    ├── TransientError                      retried; the wait goes on
    │   ├── network          refused, reset, timed out, DNS failing after it once resolved
    │   ├── throttled        429, SlowDown, Retry-After, the server asking us to slow down
    │   ├── unavailable      5xx, a broker without a leader, a database starting or shutting down,
    │   │                    a pool or statement timeout
    │   └── transient        a custom wait's transient error with no type given
    └── FatalError                          the wait ends with an ``error`` event
        ├── connection_not_found   no Airflow connection with that id
        ├── bad_connection         the connection is of the wrong type, malformed or incomplete
        ├── bad_configuration      an argument that only turned out wrong at run time
        ├── authentication         credentials rejected (401, SASL, password)
        ├── authorization          credentials accepted but access denied (403, ACLs)
        ├── tls                    certificate rejected, handshake failed, bad TLS settings
        ├── not_found              the bucket, topic, table or endpoint does not exist
        ├── bad_request            the server refused what we asked (bad SQL, a 4xx status)
        ├── protocol               an answer we cannot understand
        ├── condition_failed       a failure condition matched: it will never be ready
        ├── predicate_error        the predicate raised or could not be imported
        ├── payload_error          a check produced data that cannot travel as an event
        ├── internal               an unexpected exception (its type is in the message)
        └── fatal                  a custom wait's fatal error with no type given

Details that refine an error (the HTTP status, the SQLSTATE, the Kafka error class) go in the
error's ``details``, not in its type, so an alert on ``authorization`` fires for S3, HTTP,
Postgres and Kafka alike.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from enum import Enum
from typing import Any


class ErrorType(str, Enum):
    """The closed set of ``error_type`` values (see the module docstring for the tree)."""

    # transient
    NETWORK = "network"
    THROTTLED = "throttled"
    UNAVAILABLE = "unavailable"
    TRANSIENT = "transient"
    # fatal
    CONNECTION_NOT_FOUND = "connection_not_found"
    BAD_CONNECTION = "bad_connection"
    BAD_CONFIGURATION = "bad_configuration"
    AUTHENTICATION = "authentication"
    AUTHORIZATION = "authorization"
    TLS = "tls"
    NOT_FOUND = "not_found"
    BAD_REQUEST = "bad_request"
    PROTOCOL = "protocol"
    CONDITION_FAILED = "condition_failed"
    PREDICATE_ERROR = "predicate_error"
    PAYLOAD_ERROR = "payload_error"
    INTERNAL = "internal"
    FATAL = "fatal"

    def __str__(self) -> str:
        return self.value


#: The types a :class:`TransientError` may carry; every other member is fatal.
TRANSIENT_TYPES: frozenset[str] = frozenset(
    member.value for member in (ErrorType.NETWORK, ErrorType.THROTTLED, ErrorType.UNAVAILABLE, ErrorType.TRANSIENT)
)


def error_type_value(value: ErrorType | str) -> str:
    """The plain string of a vocabulary member; anything outside the vocabulary is a ValueError."""
    try:
        return ErrorType(value).value
    except ValueError:
        allowed = ", ".join(member.value for member in ErrorType)
        raise ValueError(f"error_type must be one of {allowed}; got {value!r}") from None


def describe_exception(exc: BaseException) -> str:
    """``Type: message``, never an empty message (``TimeoutError()`` says what it is)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else f"{type(exc).__name__} (no message)"


#: ``getaddrinfo`` answers meaning "this name does not exist" (not "the resolver is unreachable").
_NO_SUCH_NAME = frozenset(
    code for code in (getattr(socket, "EAI_NONAME", None), getattr(socket, "EAI_NODATA", None)) if code is not None
)


def is_unknown_host(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) is the resolver saying a host name does not exist."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, socket.gaierror) and current.errno in _NO_SUCH_NAME:
            return True
        pending.extend((current.__cause__, current.__context__, getattr(current, "os_error", None)))
    return False


class WaitError(Exception):
    """Base of the errors a check raises to tell the loop what kind of failure it saw."""

    default_type: ErrorType = ErrorType.FATAL

    def __init__(
        self, message: str, *, error_type: ErrorType | str | None = None, details: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        #: Always a plain ``str`` (a member's value), so it travels through JSON as itself.
        self.error_type: str = error_type_value(error_type or self.default_type)
        self.details: dict[str, Any] = dict(details or {})


class TransientError(WaitError):
    """Worth retrying after a backoff: throttling, 5xx, resets, a restarting server."""

    default_type = ErrorType.TRANSIENT

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        error_type: ErrorType | str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message, error_type=error_type, details=details)
        if self.error_type not in TRANSIENT_TYPES:
            raise ValueError(f"a transient error cannot have the fatal error_type {self.error_type!r}")
        self.retry_after = retry_after


class FatalError(WaitError):
    """Retrying cannot help (403, bad SQL, unknown bucket, bad config): end the wait with an error."""

    default_type = ErrorType.FATAL

    def __init__(
        self, message: str, *, error_type: ErrorType | str | None = None, details: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(message, error_type=error_type, details=details)
        if self.error_type in TRANSIENT_TYPES:
            raise ValueError(f"a fatal error cannot have the transient error_type {self.error_type!r}")


class ConditionFailed(FatalError):
    """A failure condition matched: the awaited thing reported that it will never be ready."""

    default_type = ErrorType.CONDITION_FAILED


__all__ = [
    "TRANSIENT_TYPES",
    "ConditionFailed",
    "ErrorType",
    "FatalError",
    "TransientError",
    "WaitError",
    "describe_exception",
    "error_type_value",
    "is_unknown_host",
]
