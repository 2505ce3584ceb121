"""The one rule combining acceptors and a predicate, table-driven, as every wait applies it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_deferrable_kit.conditions import DEFAULT, MISSING, ConditionSet, lookup
from airflow_deferrable_kit.errors import FatalError

#: A wait with JSON-path conditions (the shape HTTP, Postgres columns and Kafka fields share).
MATCHERS = {"path": True}

READY = {"path": "state", "equals": "ready"}
FAILED = {"path": "state", "in": ["failed", "cancelled"]}
RUNNING = {"path": "state", "equals": "running"}
PRED = "tests.unit.predicates:returns"

# (name, success, failure, retry, predicate, subject, expected state)
RULE = [
    ("no conditions: the wait's default", [], [], [], None, {"state": "x"}, DEFAULT),
    ("success acceptor matches", [READY], [], [], None, {"state": "ready"}, "success"),
    ("success acceptor does not match", [READY], [], [], None, {"state": "running"}, "retry"),
    ("failure matches first", [READY], [FAILED], [], None, {"state": "failed"}, "failure"),
    (
        "retry matches before success",
        [{"path": "ok", "equals": True}],
        [],
        [RUNNING],
        None,
        {"state": "running", "ok": True},
        "retry",
    ),
    ("a missing path matches nothing", [READY], [FAILED], [], None, {}, "retry"),
    ("predicate alone, truthy count", [], [], [], PRED, {"returns": 5}, "success"),
    ("predicate alone, zero count", [], [], [], PRED, {"returns": 0}, "retry"),
    ("predicate alone, 'yes'", [], [], [], PRED, {"returns": "yes"}, "success"),
    ("predicate alone, empty list", [], [], [], PRED, {"returns": []}, "retry"),
    ("predicate alone, non-empty list", [], [], [], PRED, {"returns": [1]}, "success"),
    ("predicate alone, None", [], [], [], PRED, {"returns": None}, "retry"),
    ("predicate says failure explicitly", [], [], [], PRED, {"returns": "failure"}, "failure"),
    ("predicate says retry explicitly", [], [], [], PRED, {"returns": "retry"}, "retry"),
    (
        "success acceptor picks the candidate, predicate agrees",
        [READY],
        [],
        [],
        PRED,
        {"state": "ready", "returns": True},
        "success",
    ),
    (
        "success acceptor picks the candidate, predicate declines",
        [READY],
        [],
        [],
        PRED,
        {"state": "ready", "returns": False},
        "retry",
    ),
    (
        "not a candidate: the predicate is not asked",
        [READY],
        [],
        [],
        PRED,
        {"state": "running", "returns": True},
        "retry",
    ),
    (
        "failure acceptor decides before the predicate",
        [],
        [FAILED],
        [],
        PRED,
        {"state": "failed", "returns": True},
        "failure",
    ),
    (
        "failure only plus predicate: the predicate decides the rest",
        [],
        [FAILED],
        [],
        PRED,
        {"state": "running", "returns": True},
        "success",
    ),
]


class _Wait:
    """How one wait looks at a subject, through its own code (matchers, lookups, predicate subject)."""

    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def matchers(self) -> Any:
        if self.name == "http":
            from airflow_deferrable_kit.triggers.http import MATCHERS as matchers
        elif self.name == "postgres":
            from airflow_deferrable_kit.triggers.postgres import MATCHERS as matchers
        else:
            from airflow_deferrable_kit._kafka.messages import MATCHERS as matchers
        return matchers

    def value_of(self, document: dict[str, Any]) -> Any:
        if self.name == "http":
            return lambda acceptor: lookup(document, acceptor.parts)
        if self.name == "postgres":
            from airflow_deferrable_kit.triggers.postgres import value_in_row

            return lambda acceptor: value_in_row(document, acceptor)
        message = self.message(document)
        return lambda acceptor: message.lookup("json", acceptor.matcher, acceptor.argument)

    def subject(self, document: dict[str, Any]) -> Any:
        if self.name == "http":
            return {"status_code": 200, "headers": {}, "text": json.dumps(document), "json": document}
        if self.name == "postgres":
            return document
        return self.message(document).subject("json")

    @staticmethod
    def message(document: dict[str, Any]) -> Any:
        from airflow_deferrable_kit._kafka.messages import KafkaMessage
        from tests.unit.kafka.fakes import record

        return KafkaMessage(record(json.dumps(document).encode()))


@pytest.mark.parametrize("wait", ["http", "postgres", "kafka"])
@pytest.mark.parametrize(
    ("success", "failure", "retry", "predicate", "subject", "expected"),
    [row[1:] for row in RULE],
    ids=[row[0] for row in RULE],
)
async def test_the_rule_is_the_same_for_every_wait(
    wait: str, success: list, failure: list, retry: list, predicate: str | None, subject: dict, expected: str
) -> None:
    # The same table through each wait's own matchers, lookups and predicate subject.
    through = _Wait(wait)
    canonical = ConditionSet.canonicalise(matchers=through.matchers, success=success, failure=failure, retry=retry)
    conditions = ConditionSet.load(canonical, predicate, matchers=through.matchers)
    verdict = await conditions.evaluate(through.value_of(subject), lambda: through.subject(subject))
    assert verdict.state == expected
    if expected != DEFAULT and verdict.decided_by is not None:
        assert verdict.decided_by["state"] == expected
        assert verdict.explain()


def _value_of(subject: dict[str, Any]):
    return lambda acceptor: lookup(subject, acceptor.parts) if acceptor.matcher == "path" else MISSING


async def test_an_async_predicate_follows_the_same_contract() -> None:
    conditions = ConditionSet.load([], "tests.unit.predicates:returns_async", matchers=MATCHERS)
    assert (await conditions.evaluate(_value_of({}), lambda: {"returns": 3})).state == "success"
    assert (await conditions.evaluate(_value_of({}), lambda: {"returns": 0})).state == "retry"


async def test_the_predicate_verdict_names_it_and_what_it_returned() -> None:
    conditions = ConditionSet.load(
        ConditionSet.canonicalise(matchers=MATCHERS, success=[READY]), PRED, matchers=MATCHERS
    )
    verdict = await conditions.evaluate(_value_of({"state": "ready"}), lambda: {"returns": 42})
    assert verdict.decided_by is not None
    assert verdict.decided_by["argument"] == PRED and verdict.decided_by["returned"] == "42"
    assert verdict.decided_by["candidate"]["argument"] == "state"
    assert verdict.explain() == f"predicate {PRED} returned 42"


@pytest.mark.parametrize(
    ("predicate", "message"),
    [
        (
            "tests.unit.predicates:raises",
            r"predicate 'tests.unit.predicates:raises' failed: RuntimeError: cannot judge",
        ),
        (
            "tests.unit.predicates:ambiguous",
            r"predicate 'tests.unit.predicates:ambiguous' failed: TypeError: .*ambiguous",
        ),
        ("tests.unit.predicates:nowhere", r"predicate 'tests.unit.predicates:nowhere' failed: .*cannot be imported"),
    ],
)
async def test_a_predicate_that_raises_ends_the_wait_naming_it(predicate: str, message: str) -> None:
    conditions = ConditionSet.load([], predicate, matchers=MATCHERS)
    with pytest.raises(FatalError, match=message) as info:
        await conditions.evaluate(_value_of({}), lambda: {"state": "x"})
    assert info.value.error_type == "predicate_error"


@pytest.mark.parametrize(
    "groups",
    [{"failure": [FAILED]}, {"retry": [RUNNING]}, {"failure": [FAILED], "retry": [RUNNING]}],
)
def test_a_set_that_could_never_succeed_is_refused(groups: dict) -> None:
    canonical = ConditionSet.canonicalise(matchers=MATCHERS, **groups)
    with pytest.raises(ValueError, match="could never succeed"):
        ConditionSet.load(canonical, None, matchers=MATCHERS)


def test_acceptors_are_compiled_once_with_their_paths_parsed() -> None:
    canonical = ConditionSet.canonicalise(matchers=MATCHERS, success=[{"path": 'data.items[0]["a.b"]', "equals": 1}])
    (acceptor,) = ConditionSet.load(canonical, None, matchers=MATCHERS).acceptors
    assert acceptor.parts == ("data", "items", 0, "a.b")
