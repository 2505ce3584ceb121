"""The event payload contract shared by every trigger and sensor.

A trigger fires exactly one event whose payload is a JSON object with a ``status`` of
``success``, ``timeout`` or ``error``. On success it carries what was found; on error an
``error_type`` and a ``message``. Payloads are JSON-safe and size-capped because they travel
through the metadata database and become the task's XCom.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
import uuid
from collections.abc import Mapping
from typing import Any, Final, Literal

Status = Literal["success", "timeout", "error"]
SUCCESS: Final = "success"
TIMEOUT: Final = "timeout"
ERROR: Final = "error"

#: Upper bound for one serialized payload: it lands in the trigger event and in XCom.
MAX_PAYLOAD_BYTES: Final = 64 * 1024
#: Keys the base classes own; a check's data may not use them.
RESERVED_KEYS: Final = frozenset({"status", "error_type", "message"})


class Found:
    """What a check returns when the wait is over: the data that becomes the success payload."""

    __slots__ = ("data",)

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        self.data: dict[str, Any] = dict(data or {})

    def __repr__(self) -> str:
        return f"Found({self.data!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Found) and other.data == self.data

    __hash__ = None  # type: ignore[assignment]


class WaitError(Exception):
    """Base of the errors a check raises to tell the loop what kind of failure it saw."""

    error_type: str = "WaitError"

    def __init__(self, message: str, *, error_type: str | None = None, details: Mapping[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        if error_type:
            self.error_type = error_type
        self.details: dict[str, Any] = dict(details or {})


class TransientError(WaitError):
    """Worth retrying after a backoff: throttling, 5xx, resets, a restarting server."""

    error_type = "transient"

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        error_type: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message, error_type=error_type, details=details)
        self.retry_after = retry_after


class FatalError(WaitError):
    """Retrying cannot help (403, bad SQL, unknown bucket, bad config): end the wait with an error."""

    error_type = "fatal"


class ConditionFailed(FatalError):
    """A failure acceptor matched: the awaited thing reported that it will never be ready."""

    error_type = "condition_failed"


class PayloadError(TypeError):
    """A check produced data that cannot travel as a trigger event."""


def json_safe(value: Any, *, _path: str = "$") -> Any:
    """Convert common database and client values into JSON primitives.

    Datetimes become ISO 8601, ``Decimal`` and ``UUID`` strings, bytes base64, tuples/sets lists.
    Anything else that is not a JSON primitive raises :class:`PayloadError` naming where it was.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return str(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise PayloadError(f"payload key {key!r} at {_path} must be a string")
            out[key] = json_safe(item, _path=f"{_path}.{key}")
        return out
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(item, _path=f"{_path}[{i}]") for i, item in enumerate(value)]
    raise PayloadError(f"payload value at {_path} has type {type(value).__name__}, which is not JSON-safe")


def require_json_primitives(value: Any, *, what: str, _path: str = "$") -> None:
    """Raise :class:`PayloadError` unless ``value`` is made only of JSON primitives (no conversion)."""
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PayloadError(f"{what} at {_path} is {value}, which JSON cannot carry")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise PayloadError(f"{what} key {key!r} at {_path} must be a string")
            require_json_primitives(item, what=what, _path=f"{_path}.{key}")
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            require_json_primitives(item, what=what, _path=f"{_path}[{i}]")
        return
    raise PayloadError(f"{what} at {_path} has type {type(value).__name__}; only JSON primitives are allowed")


def truncate_text(text: str, limit: int) -> str:
    """Cut ``text`` to ``limit`` characters, marking the cut so nobody mistakes it for the whole."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"... [{len(text) - limit} more characters]"


def build_payload(status: Status, data: Mapping[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    """Assemble a payload: ``status`` first, then the data, made JSON-safe and size-capped.

    Common values (datetimes, ``Decimal``, ``UUID``, bytes) are converted by :func:`json_safe`;
    anything else raises :class:`PayloadError`, as does a payload over :data:`MAX_PAYLOAD_BYTES`.
    """
    payload: dict[str, Any] = {"status": status}
    for key, value in (data or {}).items():
        if key in RESERVED_KEYS:
            raise PayloadError(f"payload data may not use the reserved key {key!r}")
        payload[key] = value
    payload.update(fields)
    payload = json_safe(payload, _path="$")
    size = len(json.dumps(payload, separators=(",", ":")))
    if size > MAX_PAYLOAD_BYTES:
        raise PayloadError(
            f"payload is {size} bytes once serialized; the limit is {MAX_PAYLOAD_BYTES}. "
            "Cap lists and excerpts in the check."
        )
    return payload


def success_payload(found: Found) -> dict[str, Any]:
    return build_payload(SUCCESS, found.data)


def timeout_payload(message: str) -> dict[str, Any]:
    return build_payload(TIMEOUT, message=message)


def error_payload(error_type: str, message: str, details: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return build_payload(ERROR, details, error_type=error_type, message=truncate_text(message, 2000))
