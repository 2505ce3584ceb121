"""Payload conversion and limits."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_deferrable_kit.payload import (
    MAX_PAYLOAD_BYTES,
    Found,
    PayloadError,
    build_payload,
    error_payload,
    json_safe,
    json_size,
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


# ------------------------------------------------------------------------------ fitting to the cap
def _fits(payload: dict) -> None:
    assert json_size(payload) <= MAX_PAYLOAD_BYTES
    json.loads(json.dumps(payload))  # still plain JSON


def test_a_large_non_ascii_value_is_cut_in_bytes_of_escaped_json() -> None:
    # 16,000 non-ASCII characters are ~96,000 bytes once JSON-escaped: measured in bytes, not characters.
    payload = build_payload("success", {"excerpt": "é" * 16_000, "status_code": 200})
    _fits(payload)
    assert payload["status"] == "success" and payload["status_code"] == 200
    (cut,) = payload["truncated"]
    assert cut["path"] == "$.excerpt" and cut["kind"] == "text" and cut["original_chars"] == 16_000
    assert payload["excerpt"].startswith("é" * cut["kept_chars"])
    assert payload["excerpt"].endswith(f"[{16_000 - cut['kept_chars']} more characters]")


def test_ten_thousand_found_keys_keep_a_prefix_and_say_how_many() -> None:
    keys = [{"key": f"orders/2026-12-01/part-{i:05}.csv", "size": i, "etag": "0" * 32} for i in range(10_000)]
    payload = build_payload("success", {"bucket": "dropbox", "keys": keys})
    _fits(payload)
    (cut,) = payload["truncated"]
    assert cut == {"path": "$.keys", "kind": "list", "original_items": 10_000, "kept_items": len(payload["keys"])}
    assert payload["keys"] == keys[: len(payload["keys"])] and len(payload["keys"]) > 100
    assert payload["bucket"] == "dropbox"


def test_two_large_parts_are_both_cut_so_neither_is_emptied() -> None:
    payload = build_payload(
        "success",
        {"row": {"doc": "d" * 120_000, "id": 7}, "headers": {f"h{i}": "v" * 60 for i in range(3_000)}},
    )
    _fits(payload)
    paths = {cut["path"] for cut in payload["truncated"]}
    assert paths == {"$.row.doc", "$.headers"}
    assert payload["row"]["id"] == 7 and len(payload["row"]["doc"]) > 1_000 and len(payload["headers"]) > 10


def test_many_small_top_level_fields_keep_the_first_and_the_contract_keys() -> None:
    payload = build_payload("error", {f"f{i}": "v" * 50 for i in range(5_000)}, error_type="internal", message="m")
    _fits(payload)
    assert payload["status"] == "error" and payload["error_type"] == "internal" and payload["message"] == "m"
    assert payload["truncated"][-1]["path"] == "$" and "f0" in payload


def test_a_payload_under_the_cap_is_returned_untouched() -> None:
    data = {"key": "k", "value": "é" * 1000}
    assert build_payload("success", data) == {"status": "success", **data}


def test_truncated_is_reserved_for_the_cut_report() -> None:
    with pytest.raises(PayloadError, match="reserved key 'truncated'"):
        build_payload("success", {"truncated": True})


@settings(max_examples=60, deadline=None)
@given(
    st.recursive(
        st.text(max_size=3_000) | st.integers() | st.booleans() | st.none(),
        lambda children: st.lists(children, max_size=40) | st.dictionaries(st.text(max_size=8), children, max_size=40),
        max_leaves=400,
    )
)
def test_any_json_document_fits_the_cap(document: object) -> None:
    payload = build_payload("success", {"found": document, "pad": "p" * 40_000})
    _fits(payload)
    assert payload["status"] == "success"
