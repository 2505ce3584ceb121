"""Payload conversion and limits."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_deferrable_kit.payload import (
    Found,
    PayloadError,
    build_payload,
    error_payload,
    json_safe,
    success_payload,
    truncate_text,
)


def test_json_safe_converts_database_and_client_values() -> None:
    when = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    value = {
        "ts": when,
        "day": dt.date(2026, 1, 2),
        "amount": decimal.Decimal("12.50"),
        "id": uuid.UUID(int=1),
        "raw": b"\x00\xff",
        "pair": (1, 2),
        "nan": float("nan"),
        "nested": [{"at": when}],
    }
    assert json_safe(value) == {
        "ts": "2026-01-02T03:04:05+00:00",
        "day": "2026-01-02",
        "amount": "12.50",
        "id": "00000000-0000-0000-0000-000000000001",
        "raw": base64.b64encode(b"\x00\xff").decode(),
        "pair": [1, 2],
        "nan": "nan",
        "nested": [{"at": "2026-01-02T03:04:05+00:00"}],
    }


def test_json_safe_names_where_an_unknown_value_is() -> None:
    with pytest.raises(PayloadError, match=r"\$\.rows\[1\]\.x has type object"):
        json_safe({"rows": [{}, {"x": object()}]})
    with pytest.raises(PayloadError, match="key 3 at"):
        json_safe({3: "a"})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_json_values_pass_through_unchanged_and_serialize(value: object) -> None:
    assert json_safe(value) == value
    json.dumps(json_safe(value), allow_nan=False)


def test_payload_shape_for_each_status() -> None:
    assert success_payload(Found({"key": "a"})) == {"status": "success", "key": "a"}
    assert error_payload("fatal", "no", {"code": 403}) == {
        "status": "error",
        "code": 403,
        "error_type": "fatal",
        "message": "no",
    }
    with pytest.raises(PayloadError, match="reserved key 'message'"):
        build_payload("success", {"message": "x"})


def test_long_error_messages_are_truncated_visibly() -> None:
    payload = error_payload("fatal", "x" * 5000)
    assert len(payload["message"]) < 2100
    assert payload["message"].endswith("[3000 more characters]")
    assert truncate_text("short", 10) == "short"
