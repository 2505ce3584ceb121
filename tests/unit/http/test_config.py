"""HttpBatchReadyTrigger without a network: validation and round trip."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_deferrable_kit.triggers.http import HttpBatchReadyTrigger

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
        predicate="tests.integration.http.predicates:even_count_ready",
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
        ({"acceptors": [{"state": "success", "matcher": "status", "expected": "2xx"}]}, "HTTP status integers"),
        ({"acceptors": [{"state": "success", "matcher": "path", "argument": "a..b", "expected": 1}]}, "valid JSON"),
        ({"acceptors": {"state": "success"}}, "acceptors must be a list"),
        (
            {"acceptors": [{"state": "failure", "matcher": "status", "expected": 410}]},
            "add a success condition",
        ),
        ({"predicate": "not a path"}, "predicate must be a dotted path"),
        ({"not_yet_codes": [404, "4o9"]}, "not_yet_codes must be a list of HTTP status integers"),
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
        predicate="tests.integration.http.predicates:even_count_ready",
    )
    assert t.predicate == "tests.integration.http.predicates:even_count_ready"


# ------------------------------------------------------------------------- body limit
def test_a_predicate_raises_the_body_read_and_never_shares_a_response_read_for_less() -> None:
    from airflow_deferrable_kit.triggers import http as http_trigger
    from airflow_deferrable_kit.triggers.http_events import HttpBatchReadyEventTrigger

    limit = getattr(http_trigger, "PREDICATE_BODY_BYTES", None)
    assert limit is not None and limit >= 32 * 1024 * 1024  # a status document of a few MB is read whole
    predicate = "tests.integration.http.predicates:even_count_ready"
    assert trigger(predicate=predicate).body_limit() == limit
    assert trigger(predicate=predicate, max_body_bytes=limit * 2).body_limit() == limit * 2  # never lowered
    assert trigger(acceptors=[READY]).body_limit() == 1024 * 1024  # conditions alone: max_body_bytes
    # Watchers of one request share one response: one with a predicate must not get a body cut
    # at another's 1 MiB, so their shared looks differ.
    plain = HttpBatchReadyEventTrigger(http_conn_id="batch_api", endpoint="v1/status", success=[{"status": 200}])
    judged = HttpBatchReadyEventTrigger(http_conn_id="batch_api", endpoint="v1/status", predicate=predicate)
    assert plain.shared_stream_key() != judged.shared_stream_key()
