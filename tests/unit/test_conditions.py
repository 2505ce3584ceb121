"""Acceptors and predicates: validation with clear errors, first-match decisions, no blocking."""

from __future__ import annotations

import dataclasses
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_deferrable_kit.conditions import (
    MISSING,
    Acceptor,
    ConditionSet,
    build_acceptors,
    call_predicate,
    decide,
    import_predicate,
    lookup,
    parse_path,
)
from airflow_deferrable_kit.testing import watch_blocking

HTTP = {"status": False, "path": True}


def test_sugar_expands_to_canonical_acceptors_failure_first() -> None:
    acceptors = build_acceptors(
        matchers=HTTP,
        success=[{"path": "state", "equals": "ready"}, {"status": 204}],
        failure=[{"path": "state", "in": ["failed", "cancelled"]}],
        retry=[{"path": "progress", "exists": False}],
    )
    assert acceptors == [
        {
            "state": "failure",
            "matcher": "path",
            "comparator": "in",
            "argument": "state",
            "expected": ["failed", "cancelled"],
        },
        {"state": "retry", "matcher": "path", "comparator": "exists", "argument": "progress", "expected": False},
        {"state": "success", "matcher": "path", "comparator": "equals", "argument": "state", "expected": "ready"},
        {"state": "success", "matcher": "status", "comparator": "equals", "expected": 204},
    ]
    assert build_acceptors(matchers=HTTP, acceptors=acceptors) == acceptors  # canonical is a fixed point


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"success": {"path": "a", "equals": 1}}, "success must be a list"),
        ({"success": [{"path": "a"}]}, r"success\[0\] needs one of equals, in, exists"),
        ({"success": [{"equals": 1}]}, r"success\[0\] must name exactly one of path, status"),
        ({"failure": [{"path": "a..b", "equals": 1}]}, r"failure\[0\]: argument 'a..b' is not a valid JSON path"),
        ({"success": [{"path": "a", "in": []}]}, "needs a non-empty list"),
        ({"success": [{"path": "a", "exists": "yes"}]}, "takes true or false"),
        ({"acceptors": [{"state": "done", "matcher": "path", "argument": "a", "expected": 1}]}, "state must be one of"),
        ({"acceptors": [{"state": "success", "matcher": "header", "expected": 1}]}, "matcher must be one of"),
        (
            {"acceptors": [{"state": "success", "matcher": "status", "argument": "x", "expected": 1}]},
            "takes no argument",
        ),
        ({"acceptors": [{"state": "success", "matcher": "status"}]}, "needs an expected value"),
        ({"acceptors": [{"state": "success", "matcher": "status", "expected": 1, "extra": 2}]}, "unknown keys"),
    ],
)
def test_bad_conditions_are_rejected_naming_the_entry(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_acceptors(matchers=HTTP, **kwargs)


def test_first_matching_acceptor_decides_and_every_looked_at_value_is_reported() -> None:
    acceptors = ConditionSet.load(
        build_acceptors(
            matchers=HTTP,
            success=[{"path": "state", "equals": "ready"}],
            failure=[{"path": "state", "in": ["failed"]}, {"path": "error.code", "exists": True}],
        ),
        None,
        matchers=HTTP,
    ).acceptors
    body = {"state": "ready", "rows": 10}
    decision, observed = decide(acceptors, lambda a: lookup(body, a.argument or ""))
    assert decision is not None
    assert decision.state == "success"
    assert decision.as_dict()["actual"] == "ready"
    assert observed == {"path:state": "ready", "path:error.code": None}
    decision, _ = decide(acceptors, lambda a: lookup({"state": "running"}, a.argument or ""))
    assert decision is None


def test_equality_follows_json_types() -> None:
    acceptors = ConditionSet.load(
        build_acceptors(matchers=HTTP, success=[{"path": "n", "equals": 1}]), None, matchers=HTTP
    ).acceptors
    for value, expected in [(1, True), (1.0, True), (True, False), ("1", False)]:
        decision, _ = decide(acceptors, lambda a, v=value: lookup({"n": v}, "n"))
        assert (decision is not None) is expected, value


def test_paths_reach_into_nested_documents() -> None:
    doc = {"data": {"items": [{"state": "a"}, {"state": "b"}], "x.y": 3}}
    assert lookup(doc, "data.items[1].state") == "b"
    assert lookup(doc, "data.items[-1].state") == "b"
    assert lookup(doc, 'data["x.y"]') == 3
    assert lookup(doc, "data.items[5].state") is MISSING
    assert lookup(doc, "data.nope") is MISSING
    assert lookup("not a dict", "a") is MISSING


@given(
    st.lists(st.text(alphabet=st.characters(blacklist_characters='.[]"'), min_size=1, max_size=6), min_size=1).filter(
        # Refused on purpose: an all-blank path; JSONPath's own steps, a lone * or @ (such keys
        # are written ["*"]); and a first key "$", which is JSONPath's root (written ["$"]).
        lambda keys: ".".join(keys).strip() and not {"*", "@"} & set(keys) and keys[0] != "$"
    )
)
def test_dotted_paths_parse_back_into_their_keys(keys: list[str]) -> None:
    assert parse_path(".".join(keys)) == tuple(keys)


@pytest.mark.parametrize(
    ("path", "parts"),
    [
        ("$", ()),
        ("$.state", ("state",)),
        ("$[0]", (0,)),
        ("$.data.items[-1].state", ("data", "items", -1, "state")),
        ('$["x.y"]', ("x.y",)),
        ("$['x.y'].z", ("x.y", "z")),
        ("$ref", ("$ref",)),  # a key that merely starts with $ (JSON Schema's "$ref")
        ("@type", ("@type",)),  # JSON-LD's keys stay keys; only a lone @ step is JSONPath syntax
        ('items["*"]', ("items", "*")),
    ],
)
def test_a_jsonpath_root_adds_no_step_so_copied_jsonpaths_work(path: str, parts: tuple) -> None:
    assert parse_path(path) == parts
    document = {"state": "ready", "data": {"items": [{"state": "a"}, {"state": "b"}]}, "x.y": {"z": 1}}
    assert lookup(document, "$.state") == lookup(document, "state") == "ready"
    assert lookup(document, "$") == document


@pytest.mark.parametrize(
    ("path", "feature"),
    [
        ("items[*].state", "a wildcard '[*]'"),
        ("items.*", "a wildcard '*'"),
        ("$..state", "recursive descent '..'"),
        ("a..b", "recursive descent '..'"),
        ("items[?(@.state == 'ready')]", "a filter '[?(...)]'"),
        ("@.state", "the current node '@'"),
        ("items[0:2]", "a slice or union"),
        ("items[0,1]", "a slice or union"),
        ("$.", "problem at character 3"),
    ],
)
def test_jsonpath_syntax_the_parser_does_not_read_is_refused_saying_what_is_supported(path: str, feature: str) -> None:
    """Accepting such a path and never matching it ran the wait to its timeout."""
    with pytest.raises(ValueError) as caught:
        build_acceptors(matchers=HTTP, success=[{"path": "state", "equals": "ready"}, {"path": path, "equals": 1}])
    message = str(caught.value)
    assert message.startswith(f"success[1]: argument {path!r} is not a valid JSON path ({feature}"), message
    assert 'use names joined by dots, [index] and ["key"] steps, optionally after a leading $' in message


def test_a_waits_own_rule_runs_as_each_acceptor_is_built_under_the_users_label() -> None:
    def digits_to_int(acceptor: Acceptor, where: str) -> Acceptor:
        if isinstance(acceptor.expected, str) and not acceptor.expected.isdigit():
            raise ValueError(f"{where}: expected digits, got {acceptor.expected!r}")
        return dataclasses.replace(acceptor, expected=int(acceptor.expected))

    canonical = build_acceptors(matchers=HTTP, success=[{"status": "204"}], refine=digits_to_int)
    assert canonical == [{"state": "success", "matcher": "status", "comparator": "equals", "expected": 204}]
    with pytest.raises(ValueError, match=r"^failure\[1\]: expected digits, got 'x'$"):
        build_acceptors(
            matchers=HTTP, success=[{"status": 200}], failure=[{"status": 410}, {"status": "x"}], refine=digits_to_int
        )
    with pytest.raises(ValueError, match=r"^acceptors\[0\]: expected digits"):
        ConditionSet.load(
            [{"state": "success", "matcher": "status", "expected": "x"}], None, matchers=HTTP, refine=digits_to_int
        )


def sync_ready(subject: dict) -> bool:
    time.sleep(0.2)  # a blocking library call, as users' predicates sometimes are
    return subject.get("state") == "ready"


async def async_verdict(subject: dict) -> str:
    return "failure" if subject.get("state") == "failed" else "retry"


async def _state(path: str, subject: dict) -> str:
    state, _ = await call_predicate(path, subject)
    return state


async def test_predicates_run_without_blocking_the_loop() -> None:
    with watch_blocking(0.05) as blocked:
        assert await _state("tests.unit.test_conditions:sync_ready", {"state": "ready"}) == "success"
        assert await _state("tests.unit.test_conditions.sync_ready", {"state": "no"}) == "retry"
        assert await _state("tests.unit.test_conditions:async_verdict", {"state": "failed"}) == "failure"
    assert blocked == []


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("not a path", "must be a dotted path"),
        ("tests.core.nope:fn", "cannot be imported"),
        ("tests.unit.test_conditions:HTTP", "is not callable"),
    ],
)
def test_bad_predicates_are_refused_clearly(path: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        import_predicate(path)
