"""JSON values <-> asyncpg's Python values, for the Postgres wait.

Trigger kwargs are JSON, so a bound date arrives as ``"2024-01-31"``: :func:`coerce_arguments`
turns each value into what asyncpg expects for the type the server inferred for its
placeholder. The other way, :func:`row_document` turns a fetched row into a JSON object for
acceptors and the payload. Both use only asyncpg's public types (``asyncpg.types.Type`` from
``PreparedStatement.get_parameters()``, ``Record``, ``Range``, ``BitString``), recognised by their
attributes, so this module never imports asyncpg.
"""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from collections.abc import Sequence
from typing import Any

from airflow_deferrable_kit.errors import ErrorType, FatalError
from airflow_deferrable_kit.payload import PayloadError, json_safe

# ---------------------------------------------------------------------------- values in
_TEXT_TYPES = frozenset({"text", "varchar", "bpchar", "name", "citext", "char"})
_INT_TYPES = frozenset({"int2", "int4", "int8", "oid"})
_FLOAT_TYPES = frozenset({"float4", "float8"})


def _parse_datetime(value: str, *, aware: bool) -> dt.datetime:
    moment = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    if aware:
        return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.timezone.utc)
    if moment.tzinfo is not None:
        moment = moment.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return moment


def _parse_date(value: str) -> dt.date:
    try:
        return dt.date.fromisoformat(value.strip())
    except ValueError:
        return dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00")).date()


def _coerce_scalar(value: Any, type_name: str) -> Any:
    """Turn a JSON value into what asyncpg expects for ``type_name`` (e.g. ``"{{ ds }}"`` -> date)."""
    if isinstance(value, bool):
        if type_name in _TEXT_TYPES:
            return "true" if value else "false"
        return value
    if isinstance(value, str):
        if type_name == "date":
            return _parse_date(value)
        if type_name in ("timestamp", "timestamptz"):
            return _parse_datetime(value, aware=type_name == "timestamptz")
        if type_name in ("time", "timetz"):
            return dt.time.fromisoformat(value.strip())
        if type_name == "numeric":
            return decimal.Decimal(value.strip())
        if type_name in _INT_TYPES:
            return int(value.strip())
        if type_name in _FLOAT_TYPES:
            return float(value.strip())
        if type_name == "uuid":
            return uuid.UUID(value.strip())
        if type_name == "bool":
            lowered = value.strip().lower()
            if lowered in ("true", "t", "yes", "y", "on", "1"):
                return True
            if lowered in ("false", "f", "no", "n", "off", "0"):
                return False
            raise ValueError("not a boolean")
        return value
    if isinstance(value, (int, float)):
        if type_name in _TEXT_TYPES:
            return str(value)
        if type_name == "numeric":
            return decimal.Decimal(str(value))
        if type_name in _INT_TYPES and isinstance(value, float):
            if value.is_integer():
                return int(value)
            # asyncpg would truncate 1.5 to 1 and the query would match the wrong row.
            raise ValueError("not a whole number, and the placeholder is an integer (it would be truncated)")
        if type_name in _FLOAT_TYPES:
            return float(value)
        if type_name == "interval":
            return dt.timedelta(seconds=value)
    return value


def coerce_arguments(values: Sequence[Any], types: Sequence[Any], labels: Sequence[str]) -> list[Any]:
    """Convert bound values to the types the server inferred for ``$1..$n``.

    Trigger kwargs are JSON, so a date arrives as ``"2024-01-31"``; asyncpg wants a ``date``.
    A value that cannot be converted is a fatal error naming the argument.
    """
    if len(values) != len(types):
        raise FatalError(
            f"the query has {len(types)} placeholder(s) ($1..${len(types)}) but {len(values)} value(s) were given",
            error_type=ErrorType.BAD_CONFIGURATION,
        )
    out = []
    for value, typ, label in zip(values, types, labels, strict=True):
        try:
            if value is None or typ.name in ("json", "jsonb"):
                out.append(value)
            elif typ.kind == "array" and isinstance(value, list):
                element = typ.name.removesuffix("[]").removeprefix("_")
                out.append([None if item is None else _coerce_scalar(item, element) for item in value])
            else:
                out.append(_coerce_scalar(value, typ.name))
        except (ValueError, ArithmeticError) as exc:
            raise FatalError(
                f"{label}={value!r} is not a valid {typ.name} value: {exc}", error_type=ErrorType.BAD_CONFIGURATION
            ) from exc
    return out


# --------------------------------------------------------------------------- the row out
def _cell(value: Any) -> Any:
    """A JSON-safe form of one column value (ranges as objects, inet and the like as text)."""
    if isinstance(value, dict):
        return {str(k): _cell(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):  # arrays, and geometric types (tuples of points)
        return [_cell(v) for v in value]
    if hasattr(value, "isempty") and hasattr(value, "lower_inc"):  # asyncpg.Range
        return {
            "lower": _cell(value.lower),
            "upper": _cell(value.upper),
            "lower_inc": value.lower_inc,
            "upper_inc": value.upper_inc,
            "empty": value.isempty,
        }
    if hasattr(value, "as_string"):  # asyncpg.BitString
        return str(value.as_string())
    try:
        return json_safe(value)
    except PayloadError:
        return str(value)  # ipaddress objects and anything else with a faithful text form


def row_document(record: Any) -> dict[str, Any]:
    """The row as a JSON object: timestamps ISO 8601, Decimal/UUID strings, bytes base64."""
    return {str(key): _cell(value) for key, value in record.items()}
