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

from airflow_deferrable_kit._redact import redact_value
from airflow_deferrable_kit.errors import ErrorType

Status = Literal["success", "timeout", "error"]
SUCCESS: Final = "success"
TIMEOUT: Final = "timeout"
ERROR: Final = "error"

#: Upper bound for one serialized payload: it lands in the trigger event and in XCom.
MAX_PAYLOAD_BYTES: Final = 64 * 1024
#: Keys the base classes own; a check's data may not use them.
RESERVED_KEYS: Final = frozenset({"status", "error_type", "message", "truncated"})
#: Longest error message an error payload carries, in characters.
MAX_MESSAGE_CHARS: Final = 2000


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
    """Cut ``text`` to ``limit`` characters, marking the cut so nobody mistakes it for the whole.

    The one value capper: readability limits (an excerpt, a column value, a SQL preview) use it;
    the size of the whole payload is enforced by :func:`fit_payload`, in bytes.
    """
    if len(text) <= limit:
        return text
    return text[:limit] + _cut_marker(len(text) - limit)


def cap_text(text: str, limit: int) -> tuple[str, bool]:
    """Cut ``text`` so its JSON form (non-ASCII escaped) is about ``limit`` bytes; say if it was cut.

    The cut is marked (``... [N more characters]``); the marker may take the result a few dozen
    bytes past ``limit``, which :func:`fit_payload` allows for.
    """
    if len(text) * 12 + 2 <= limit:  # no character takes more than 12 bytes escaped: it fits
        return text, False
    if json_size(text) <= limit:
        return text, False
    keep = _prefix_within(text, limit)
    return text[:keep] + _cut_marker(len(text) - keep), True


def cap_value(value: Any, limit: int) -> Any:
    """A JSON value as it is if its JSON form fits ``limit`` bytes, else a marked cut of that text."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return cap_text(value, limit)[0]
    text = json.dumps(value, separators=(",", ":"), default=str)
    return value if len(text) <= limit else cap_text(text, limit)[0]


def _cut_marker(cut: int) -> str:
    return f"... [{cut} more characters]"


def json_size(value: Any) -> int:
    """Bytes of ``value`` as Airflow's JSON columns store it: ``json.dumps`` with its default
    separators (a space after each ``,`` and ``:``) and non-ASCII escaped. Compact JSON would
    undercount a payload of many small values by several per cent."""
    return len(json.dumps(value))


#: Bytes kept free for the ``truncated`` report itself while a payload is being fitted.
_REPORT_RESERVE: Final = 512
#: A payload needing more cuts than this is summarised instead (a pathological shape).
_MAX_CUTS: Final = 32


def fit_payload(payload: dict[str, Any], limit: int = MAX_PAYLOAD_BYTES) -> dict[str, Any]:
    """Make a JSON-safe payload fit ``limit`` bytes by cutting its largest parts, never by failing.

    A met condition must stay a success however large the row, body, message or key list it
    found. The largest string is shortened (marked with how much was cut), the largest list or
    object loses its tail items, until the payload fits; each cut is listed under ``truncated``
    (``path``, what it was, and how much was kept), so nobody mistakes a part for the whole.
    ``status``, ``error_type`` and ``message`` are never cut.
    """
    if json_size(payload) <= limit:
        return payload
    fitted: dict[str, Any] = json.loads(json.dumps(payload))  # a private copy to cut
    cuts: list[dict[str, Any]] = []
    budget = limit - _REPORT_RESERVE
    for _ in range(_MAX_CUTS):
        excess = json_size(fitted) - budget
        if excess <= 0:
            break
        target = _largest_part(fitted)
        if target is None:
            break
        size = target[3]
        # Cut the biggest part to what the excess asks, but not below a share of the budget in one
        # step, so a second large part gives its share too (it is cut again if still needed).
        cuts.append(_cut(target, min(excess, size - min(size // 2, budget // 4))))
    if json_size(fitted) > budget:  # many small top-level fields: keep the first that fit
        kept: dict[str, Any] = {key: fitted[key] for key in _PROTECTED if key in fitted}
        used = json_size(kept)
        for key, value in fitted.items():
            if key not in kept and used + json_size({key: value}) <= budget:
                kept[key] = value
                used += json_size({key: value})
        cuts.append({"path": "$", "kind": "object", "original_keys": len(fitted), "kept_keys": len(kept)})
        fitted = kept
    fitted["truncated"] = cuts[:_MAX_CUTS]
    if json_size(fitted) > limit:
        fitted["truncated"] = [{"path": "$", "cuts": len(cuts)}]
    return fitted


#: Top-level keys that are never cut: the contract every consumer of a payload relies on.
_PROTECTED: Final = ("status", "error_type", "message", "truncated")
_Part = tuple[Any, Any, str, int]  # (container, key or index, path, size in bytes)


def _largest_part(payload: dict[str, Any]) -> _Part | None:
    """The part most worth cutting: the biggest string, else the biggest list or object."""
    best_text: _Part | None = None
    best_container: _Part | None = None
    stack: list[tuple[Any, Any, str]] = [(payload, key, f"$.{key}") for key in payload if key not in _PROTECTED]
    while stack:
        container, key, path = stack.pop()
        value = container[key]
        if isinstance(value, str):
            size = json_size(value)
            if size > 64 and (best_text is None or size > best_text[3]):
                best_text = (container, key, path, size)
        elif isinstance(value, (list, dict)) and value:
            size = json_size(value)
            if len(value) > 1 and (best_container is None or size > best_container[3]):
                best_container = (container, key, path, size)
            items = enumerate(value) if isinstance(value, list) else ((k, v) for k, v in value.items())
            stack.extend((value, k, f"{path}[{k}]" if isinstance(value, list) else f"{path}.{k}") for k, _ in items)
    if best_text is not None and (best_container is None or best_text[3] * 4 >= best_container[3]):
        return best_text
    return best_container or best_text


def _cut(part: _Part, excess: int) -> dict[str, Any]:
    """Shrink one part by about ``excess`` bytes and describe the cut."""
    container, key, path, size = part
    value = container[key]
    if isinstance(value, str):
        keep = _prefix_within(value, max(size - excess - 40, 0))
        container[key] = value[:keep] + _cut_marker(len(value) - keep)
        return {"path": path, "kind": "text", "original_chars": len(value), "kept_chars": keep}
    items = list(value.items()) if isinstance(value, dict) else value
    room = max(size - excess, 2)
    kept, used = 0, 2
    for item in items:
        used += json_size(item) + 2  # ", " between items
        if used > room:
            break
        kept += 1
    if isinstance(value, dict):
        container[key] = dict(items[:kept])
        return {"path": path, "kind": "object", "original_keys": len(items), "kept_keys": kept}
    container[key] = value[:kept]
    return {"path": path, "kind": "list", "original_items": len(items), "kept_items": kept}


def _prefix_within(text: str, budget: int) -> int:
    """The longest prefix length of ``text`` whose JSON form is at most ``budget`` bytes."""
    low, high = 0, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if json_size(text[:middle]) <= budget:
            low = middle
        else:
            high = middle - 1
    return low


def build_payload(status: Status, data: Mapping[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    """Assemble a payload: ``status`` first, then the data, made JSON-safe and fitted to the cap.

    Common values (datetimes, ``Decimal``, ``UUID``, bytes) are converted by :func:`json_safe`;
    anything else raises :class:`PayloadError`. A payload over :data:`MAX_PAYLOAD_BYTES` is cut
    to fit by :func:`fit_payload`, never refused: a met condition stays a success.
    """
    payload: dict[str, Any] = {"status": status}
    for key, value in (data or {}).items():
        if key in RESERVED_KEYS:
            raise PayloadError(f"payload data may not use the reserved key {key!r}")
        payload[key] = value
    payload.update(fields)
    return fit_payload(redact_value(json_safe(payload, _path="$")))


def success_payload(found: Found) -> dict[str, Any]:
    return build_payload(SUCCESS, found.data)


def timeout_payload(message: str) -> dict[str, Any]:
    return build_payload(TIMEOUT, message=truncate_text(message, MAX_MESSAGE_CHARS))


def error_payload(
    error_type: ErrorType | str, message: str, details: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    return build_payload(ERROR, details, error_type=str(error_type), message=truncate_text(message, MAX_MESSAGE_CHARS))


__all__ = [
    "ERROR",
    "MAX_PAYLOAD_BYTES",
    "SUCCESS",
    "TIMEOUT",
    "Found",
    "PayloadError",
    "build_payload",
    "cap_text",
    "cap_value",
    "error_payload",
    "fit_payload",
    "json_safe",
    "json_size",
    "success_payload",
    "timeout_payload",
    "truncate_text",
]
