"""JSON values -> asyncpg's types for bound parameters (no server; rows out are tested on a real one)."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_deferrable_kit._postgres.values import coerce_arguments
from airflow_deferrable_kit.errors import FatalError


def _types(*names: str) -> list[Any]:
    return [SimpleNamespace(name=n, kind="array" if n.endswith("[]") else "scalar") for n in names]


def test_bound_values_are_converted_to_the_placeholder_types() -> None:
    values = ["2024-01-31", "2024-01-31T10:00:00+02:00", "2024-01-31T10:00:00", "1.50", 7, "42", str(uuid.UUID(int=1))]
    types = _types("date", "timestamptz", "timestamp", "numeric", "text", "int8", "uuid")
    out = coerce_arguments(values, types, [f"p{i}" for i in range(len(values))])
    assert out == [
        dt.date(2024, 1, 31),
        dt.datetime(2024, 1, 31, 10, tzinfo=dt.timezone(dt.timedelta(hours=2))),
        dt.datetime(2024, 1, 31, 10),
        decimal.Decimal("1.50"),
        "7",
        42,
        uuid.UUID(int=1),
    ]
    assert coerce_arguments([["1", "2"]], _types("int4[]"), ["ids"]) == [[1, 2]]
    with pytest.raises(FatalError, match=r"match\['day'\]='soon' is not a valid date") as raised:
        coerce_arguments(["soon"], _types("date"), ["match['day']"])
    assert raised.value.error_type == "bad_configuration"
    with pytest.raises(FatalError, match="2 placeholder"):
        coerce_arguments([1], _types("int4", "int4"), ["a"])
