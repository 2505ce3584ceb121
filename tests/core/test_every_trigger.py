"""Every trigger the provider registers: JSON-only kwargs that rebuild an equal trigger.

A new trigger module or class without an example here fails the first test, so none can ship
without its round trip being checked.
"""

from __future__ import annotations

import importlib
import inspect
import json
from types import GenericAlias
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_deferrable_kit.get_provider_info import get_provider_info
from airflow_deferrable_kit.triggers.base import PollingTrigger, deadline_after

EXAMPLES: dict[str, dict[str, Any]] = {
    "DateTimeTrigger": {"target_time": "2030-01-01T00:00:00+00:00"},
    "S3KeyTrigger": {"bucket_key": ["s3://bucket-a/a/b.csv", "s3://bucket-a/c/*.csv"], "wildcard_match": True},
    "HttpBatchReadyTrigger": {"http_conn_id": "batch_api", "endpoint": "v1/batches/1/status"},
    "PostgresBatchMarkerTrigger": {
        "postgres_conn_id": "warehouse",
        "table": "etl.batch_markers",
        "match": {"batch_id": "b1"},
        "status_column": "status",
        "ready_values": ["done"],
    },
    "KafkaMessageTrigger": {
        "kafka_conn_id": "kafka_default",
        "topics": ["events"],
        "start_after_ms": 1_700_000_000_000,
    },
}


def registered_triggers() -> list[type[PollingTrigger]]:
    found = []
    for group in get_provider_info()["triggers"]:
        for module_name in group["python-modules"]:
            module = importlib.import_module(module_name)
            # Python 3.10 counts aliases such as ``list[str]`` as classes; they are not triggers.
            for _, cls in inspect.getmembers(module, lambda m: inspect.isclass(m) and not isinstance(m, GenericAlias)):
                if issubclass(cls, PollingTrigger) and cls is not PollingTrigger and cls.__module__ == module_name:
                    found.append(cls)
    return found


def test_every_registered_trigger_has_an_example() -> None:
    names = sorted(cls.__name__ for cls in registered_triggers())
    assert names == sorted(EXAMPLES)


@pytest.mark.parametrize("cls", registered_triggers(), ids=lambda cls: cls.__name__)
@settings(max_examples=25, deadline=None)
@given(
    poll_interval=st.floats(min_value=0.01, max_value=86_400, allow_nan=False),
    seconds=st.floats(min_value=-3600, max_value=30 * 86_400, allow_nan=False),
    end_from_trigger=st.booleans(),
    soft_fail=st.booleans(),
)
def test_kwargs_are_json_and_rebuild_an_equal_trigger(
    cls: type[PollingTrigger], poll_interval: float, seconds: float, end_from_trigger: bool, soft_fail: bool
) -> None:
    trigger = cls(
        **EXAMPLES[cls.__name__],
        poll_interval=poll_interval,
        deadline=deadline_after(seconds),
        end_from_trigger=end_from_trigger,
        soft_fail=soft_fail,
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == f"{cls.__module__}.{cls.__qualname__}"
    through_json = json.loads(json.dumps(kwargs, allow_nan=False))
    rebuilt = cls(**through_json)
    assert rebuilt == trigger
    assert rebuilt.serialize() == (classpath, kwargs)
    assert rebuilt.deadline == trigger.deadline  # the absolute deadline survives a rebuild unchanged
