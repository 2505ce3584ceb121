"""HttpBatchReadyTrigger without a network: validation, round trip, connection rules, Retry-After."""

from __future__ import annotations

import base64
import email.utils
import json
from typing import Any

import pytest
from airflow.sdk import Connection

from airflow_deferrable_kit.payload import FatalError
from airflow_deferrable_kit.triggers.http import (
    MAX_RETRY_AFTER,
    HttpBatchReadyTrigger,
    base_url,
    connection_headers,
    parse_retry_after,
)

READY = {"state": "success", "matcher": "path", "argument": "state", "comparator": "equals", "expected": "ready"}


def trigger(**kwargs: Any) -> HttpBatchReadyTrigger:
    kwargs.setdefault("http_conn_id", "batch_api")
    return HttpBatchReadyTrigger(**kwargs)


# ------------------------------------------------------------------------- round trip
def test_kwargs_round_trip_exactly_and_are_plain_json() -> None:
    original = trigger(
        endpoint="v1/batches/2024-01-01/status",
        method="POST",
        query={"env": "prod", "ids": [1, 2], "dry": False, "skip": None},
        json_body={"batch": "2024-01-01", "nested": {"a": [1, 2.5, None, True]}},
        acceptors=[
            {"state": "failure", "matcher": "path", "argument": "state", "comparator": "in", "expected": ["failed"]},
            {"state": "retry", "matcher": "status", "comparator": "equals", "expected": 202},
            READY,
        ],
        predicate="tests.http.predicates:even_count_ready",
        not_yet_codes=[404, 409],
        select=["rows", 'meta["x.y"]'],
        request_timeout=5,
        max_body_bytes=4096,
        excerpt_chars=200,
        poll_interval=10,
        deadline="2030-01-01T00:00:00+00:00",
        end_from_trigger=True,
    )
    classpath, kwargs = original.serialize()
    assert classpath == "airflow_deferrable_kit.triggers.http.HttpBatchReadyTrigger"
    assert json.loads(json.dumps(kwargs)) == kwargs
    rebuilt = HttpBatchReadyTrigger(**kwargs)
    assert rebuilt == original
    assert rebuilt.serialize() == (classpath, kwargs)


def test_defaults() -> None:
    t = trigger()
    assert (t.endpoint, t.method, t.not_yet_codes, t.acceptors, t.request_timeout) == ("", "GET", [404], [], 30.0)


# ------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"http_conn_id": ""}, "http_conn_id must be a non-empty string"),
        ({"endpoint": "https://evil.example.com/x"}, "endpoint must be a path relative"),
        ({"endpoint": 5}, "endpoint must be a string"),
        ({"method": "FETCH"}, "method must be one of"),
        ({"query": ["a"]}, "query must be a dict"),
        ({"query": {"a": {"b": 1}}}, r"query\['a'\] must be a string"),
        ({"acceptors": [{"state": "success", "matcher": "header"}]}, r"acceptors\[0\]: matcher must be one of"),
        ({"acceptors": [{"state": "success", "matcher": "status", "expected": "200"}]}, "HTTP status integers"),
        ({"acceptors": [{"state": "success", "matcher": "path", "argument": "a..b", "expected": 1}]}, "valid JSON"),
        ({"acceptors": {"state": "success"}}, "acceptors must be a list"),
        (
            {"acceptors": [{"state": "failure", "matcher": "status", "expected": 410}]},
            "add a success condition",
        ),
        ({"predicate": "not a path"}, "predicate must be a dotted path"),
        ({"not_yet_codes": [404, "409"]}, "not_yet_codes must be a list of HTTP status integers"),
        ({"not_yet_codes": 404}, "not_yet_codes must be a list"),
        ({"select": ["ok", ""]}, "select must be a non-empty JSON path"),
        ({"request_timeout": 0}, "request_timeout must be a positive number"),
        ({"max_body_bytes": 0}, "max_body_bytes must be a positive integer"),
        ({"excerpt_chars": 100_000}, "excerpt_chars must be an integer from 0 to"),
        ({"poll_interval": -1}, "poll_interval must be a positive number"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        trigger(**kwargs)


def test_failure_only_acceptors_are_fine_with_a_predicate() -> None:
    t = trigger(
        acceptors=[{"state": "failure", "matcher": "status", "expected": 410}],
        predicate="tests.http.predicates:even_count_ready",
    )
    assert t.predicate == "tests.http.predicates:even_count_ready"


# ------------------------------------------------------------------------ connections
def conn(**fields: Any) -> Connection:
    return Connection(conn_id="c", conn_type="http", **fields)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"host": "api.example.com"}, "http://api.example.com"),
        ({"host": "api.example.com", "schema": "https"}, "https://api.example.com"),
        ({"host": "api.example.com", "port": 8443, "schema": "https"}, "https://api.example.com:8443"),
        ({"host": "https://api.example.com/v1/", "schema": "ignored"}, "https://api.example.com/v1/"),
        ({"host": "https://api.example.com:9000/v1", "port": 1234}, "https://api.example.com:9000/v1"),
        ({"host": "https://user:pw@api.example.com/v1"}, "https://api.example.com/v1"),
    ],
)
def test_base_url_rules(fields: dict[str, Any], expected: str) -> None:
    assert str(base_url(conn(**fields))) == expected


@pytest.mark.parametrize(
    ("fields", "message"),
    [({}, "has no host"), ({"host": "ftp://files.example.com"}, "http\\(s\\) host")],
)
def test_base_url_errors_are_fatal_config_errors(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(FatalError, match=message) as info:
        base_url(conn(**fields))
    assert info.value.error_type == "connection_config"


def basic(login: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{login}:{password}".encode()).decode()


@pytest.mark.parametrize(
    ("extra", "login", "password", "expected"),
    [
        ({}, None, None, {}),
        ({}, "u", "p", {"Authorization": basic("u", "p")}),
        ({"auth_type": "basic"}, None, "p", {"Authorization": basic("", "p")}),
        ({"auth_type": "none"}, "u", "p", {}),
        ({"auth_type": "requests.auth.HTTPBasicAuth"}, "u", "p", {"Authorization": basic("u", "p")}),
        ({"bearer_token": "t"}, "u", "p", {"Authorization": "Bearer t"}),
        ({"auth_type": "bearer"}, None, "pw-token", {"Authorization": "Bearer pw-token"}),
        ({"authorization": "Token x"}, None, None, {"authorization": "Token x"}),
        ({"authorization": "Token x"}, "u", "p", {"Authorization": basic("u", "p")}),
        (
            {"X-A": "1", "headers": {"X-B": 2, "X-C": True}, "verify": False, "timeout": 3, "proxies": {}},
            None,
            None,
            {"X-A": "1", "X-B": "2", "X-C": "true"},
        ),
    ],
)
def test_connection_header_rules(
    extra: dict[str, Any], login: str | None, password: str | None, expected: dict[str, str]
) -> None:
    assert connection_headers(extra, login=login, password=password) == expected


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"auth_type": "kerberos"}, "'auth_type' 'kerberos' is not supported"),
        ({"auth_type": "bearer"}, "needs a token"),
        ({"bearer_token": ""}, "bearer_token' must be a non-empty string"),
        ({"headers": ["X-A"]}, "'headers' must be an object"),
        ({"X-Nested": {"a": 1}}, "'X-Nested' is sent as a header"),
    ],
)
def test_bad_connection_extras_are_fatal(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(FatalError, match=message) as info:
        connection_headers(extra, login=None, password=None)
    assert info.value.error_type == "connection_config"


# ------------------------------------------------------------------------- Retry-After
NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("120", 120.0),
        (" 0 ", 0.0),
        ("1.5", 1.5),
        ("-5", 0.0),
        ("99999999", MAX_RETRY_AFTER),
        (email.utils.formatdate(NOW + 90, usegmt=True), 90.0),
        (email.utils.formatdate(NOW - 90, usegmt=True), 0.0),
        ("Wed, 21 Oct 2015 07:28:00", 0.0),  # a date without zone is read as UTC (and is past)
        ("soon", None),
        ("nan", None),
    ],
)
def test_parse_retry_after(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value, now=NOW) == expected
