"""The official example DAGs' sensor calls, with only the import changed: each builds in a DAG,
or is refused at parse with the message docs/migration.md documents.

How each one then behaves against the real service is in the wait's own directory
(tests/integration/{s3,http,kafka}/test_official_examples.py) and, for the standard
provider's example, in test_official_examples_time.py.
"""

from __future__ import annotations

import datetime as dt
import inspect
from typing import Any

import pytest
from airflow.sdk import DAG, BaseSensorOperator

from tests.fixtures.official_examples import amazon_s3, apache_kafka, http
from tests.fixtures.official_examples.calls import ExampleCall
from tests.unit.migration.test_migration_coverage import official_parameters

CALLS = [*amazon_s3.CALLS, *http.CALLS, *apache_kafka.CALLS]
#: Values for the placeholders; parsing needs their shape only.
VALUES: dict[str, Any] = {
    "bucket": "example-s3-bucket",
    "bucket_2": "example-s3-bucket-2",
    "key": "example-key",
    "key_2": "example-key2",
    "wait_for_event": lambda message, **context: None,
}


def build_in_dag(call: ExampleCall) -> Any:
    """The kit's sensor built from the call's arguments inside a DAG, as the DAG file would."""
    with DAG(f"ported_{call.task_id}", schedule=None, start_date=dt.datetime(2026, 1, 1)) as dag:
        task = call.kit_class()(**call.filled(VALUES))
    assert dag.get_task(call.task_id) is task
    return task


def _ids(call: ExampleCall) -> str:
    return f"{call.source.rsplit('/', 1)[-1]}:{call.task_id}"


@pytest.mark.parametrize("call", [c for c in CALLS if c.kit and not c.refused], ids=_ids)
def test_the_call_builds_with_the_kit_class(call: ExampleCall) -> None:
    task = build_in_dag(call)
    assert task.task_id == call.task_id
    expected_deferrable = call.arguments.get("deferrable", False)  # [operators] default_deferrable is off here
    assert task.deferrable is expected_deferrable


@pytest.mark.parametrize("call", [c for c in CALLS if c.kit and c.refused], ids=_ids)
def test_the_call_is_refused_at_parse_naming_the_replacement(call: ExampleCall) -> None:
    assert call.refused is not None
    with pytest.raises(TypeError, match=call.refused) as refused:
        build_in_dag(call)
    assert f"(task_id={call.task_id!r})" in str(refused.value)
    assert "Invalid arguments" not in str(refused.value)


@pytest.mark.parametrize("call", CALLS, ids=_ids)
def test_the_fixture_passes_only_parameters_the_official_class_has(call: ExampleCall) -> None:
    """Transcription check: every argument is one of the official signature's (or the sensor base's)."""
    name = call.official.partition(":")[2]
    base = {p for klass in BaseSensorOperator.__mro__ for p in _init_parameters(klass)}
    unknown = sorted(set(call.arguments) - set(official_parameters(name)) - base)
    assert unknown == []


def _init_parameters(klass: type) -> list[str]:
    init = klass.__dict__.get("__init__")
    if init is None or klass is object:
        return []
    return [p for p in inspect.signature(init).parameters if p not in ("self", "args", "kwargs")]
