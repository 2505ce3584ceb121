"""Every trigger the provider registers: JSON-only kwargs that rebuild an equal trigger.

A new trigger module or class without an example here fails the first test, so none can ship
without its round trip being checked. Waits carry a deadline and task-ending flags; event
triggers (for ``AssetWatcher``) carry none and are checked with what they take instead.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import sys
from types import GenericAlias
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_deferrable_kit.get_provider_info import get_provider_info
from airflow_deferrable_kit.triggers.base import PollingTrigger, deadline_after
from airflow_deferrable_kit.triggers.events import EdgeEventTrigger, EventTrigger

#: The base classes, for writing triggers: not triggers themselves.
BASES = (PollingTrigger, EventTrigger, EdgeEventTrigger)

EXAMPLES: dict[str, dict[str, Any]] = {
    "DateTimeTrigger": {"target_time": "2030-01-01T00:00:00+00:00"},
    "RunMomentTrigger": {"rule": "after_start", "span_seconds": 90.0},
    "S3KeyTrigger": {"bucket_key": ["s3://bucket-a/a/b.csv", "s3://bucket-a/c/*.csv"], "wildcard_match": True},
    "S3KeysUnchangedTrigger": {
        "bucket_name": "bucket-a",
        "prefix": "exports/2024-05-01/",
        "inactivity_period": 600,
        "min_objects": 2,
        "allow_delete": False,
        "last_look": {
            "observed_at": "2030-01-01T00:05:00+00:00",
            "changed_at": "2030-01-01T00:00:00+00:00",
            "fingerprint": "0" * 64,
            "count": 3,
            "digests": "0" * 16 + "1" * 16 + "2" * 16,  # with allow_delete=False: each key's digest
        },
    },
    "HttpBatchReadyTrigger": {"http_conn_id": "batch_api", "endpoint": "v1/batches/1/status"},
    "HttpJobTrigger": {
        "http_conn_id": "jobs_api",
        "endpoint": "https://jobs.example.com/v1/jobs/j-42",
        "job": {"id": "j-42", "poll_after": "2030-01-01T00:00:10+00:00"},
        "acceptors": [
            {"state": "failure", "matcher": "path", "argument": "state", "comparator": "equals", "expected": "FAILED"},
            {"state": "success", "matcher": "path", "argument": "state", "comparator": "equals", "expected": "DONE"},
        ],
        "result": {"endpoint": "v1/jobs/{id}/rows", "items_path": "rows", "cursor_path": "next", "cursor_param": "p"},
        "cancel": {"method": "POST", "endpoint": "v1/jobs/{id}/cancel"},
    },
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


#: Event triggers: their own parameters, without a deadline or a task to end.
EVENT_EXAMPLES: dict[str, dict[str, Any]] = {
    "ConditionEventTrigger": {
        "wait_classpath": "airflow_deferrable_kit.triggers.temporal.DateTimeTrigger",
        "wait_params": {"target_time": "2030-01-01T00:00:00+00:00"},
    },
    "S3KeyEventTrigger": {"bucket_key": "s3://bucket-a/in/*.csv", "wildcard_match": True, "lookback": 600},
    "HttpBatchReadyEventTrigger": {
        "http_conn_id": "batch_api",
        "endpoint": "v1/batches/latest/status",
        "success": [{"path": "state", "equals": "ready"}],
    },
    "PostgresRowEventTrigger": {
        "postgres_conn_id": "warehouse",
        "table": "etl.loads",
        "match": {"dataset": "orders"},
        "order_column": "loaded_at",
        "key_column": "id",
        "success": [{"column": "status", "equals": "done"}],
    },
    "KafkaMessageEventTrigger": {
        "kafka_conn_id": "events",
        "topics": ["orders", "refunds"],
        "acceptors": [{"state": "success", "matcher": "key", "comparator": "equals", "expected": "eu"}],
    },
}


def registered_triggers() -> list[type[PollingTrigger]]:
    found = []
    for group in get_provider_info()["triggers"]:
        for module_name in group["python-modules"]:
            module = importlib.import_module(module_name)
            # Python 3.10 counts aliases such as ``list[str]`` as classes; they are not triggers.
            for _, cls in inspect.getmembers(module, lambda m: inspect.isclass(m) and not isinstance(m, GenericAlias)):
                if issubclass(cls, PollingTrigger) and cls not in BASES and cls.__module__ == module_name:
                    found.append(cls)
    return found


def waits() -> list[type[PollingTrigger]]:
    return [cls for cls in registered_triggers() if not issubclass(cls, EventTrigger)]


def event_triggers() -> list[type[PollingTrigger]]:
    return [cls for cls in registered_triggers() if issubclass(cls, EventTrigger)]


def test_every_registered_trigger_has_an_example() -> None:
    assert sorted(cls.__name__ for cls in waits()) == sorted(EXAMPLES)
    assert sorted(cls.__name__ for cls in event_triggers()) == sorted(EVENT_EXAMPLES)


@pytest.mark.parametrize("cls", waits(), ids=lambda cls: cls.__name__)
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


@pytest.mark.parametrize("cls", waits(), ids=lambda cls: cls.__name__)
def test_a_waiting_trigger_keeps_its_parameters_in_a_shared_key_dict(cls: type[PollingTrigger]) -> None:
    """Ten thousand waiting triggers: each instance dict shares its class's key table (~0.3 KB),
    as long as it holds fewer than about 27 names (CPython 3.11 to 3.13); past that each one
    carries a table of its own (1.5 KB). State that is not a parameter lives in slots, and so do
    the attributes Airflow's BaseTrigger and trigger runner set."""
    triggers = [cls(**EXAMPLES[cls.__name__], deadline=deadline_after(60)) for _ in range(3)]
    trigger = triggers[-1]
    trigger.trigger_id = 7  # what TriggerRunner.create_triggers sets on every trigger
    trigger.triggerer_job_id = 1  # type: ignore[attr-defined]
    trigger.timeout_after = None  # type: ignore[attr-defined]
    trigger.task_instance = None  # type: ignore[assignment]
    parameters = {f.name for f in dataclasses.fields(cls)}
    assert set(trigger.__dict__) <= parameters | {"_unbuilt"}, sorted(set(trigger.__dict__) - parameters)
    assert sys.getsizeof(trigger.__dict__) < 1000, (len(trigger.__dict__), sys.getsizeof(trigger.__dict__))


@pytest.mark.parametrize("cls", event_triggers(), ids=lambda cls: cls.__name__)
@settings(max_examples=25, deadline=None)
@given(
    poll_interval=st.floats(min_value=0.01, max_value=86_400, allow_nan=False),
    max_backoff=st.floats(min_value=0.01, max_value=86_400, allow_nan=False),
    backfill=st.booleans(),
)
def test_event_trigger_kwargs_are_json_and_rebuild_an_equal_trigger(
    cls: type[PollingTrigger], poll_interval: float, max_backoff: float, backfill: bool
) -> None:
    from airflow.triggers.base import BaseEventTrigger

    trigger = cls(
        **EVENT_EXAMPLES[cls.__name__], poll_interval=poll_interval, max_backoff=max_backoff, backfill=backfill
    )
    assert isinstance(trigger, BaseEventTrigger)
    classpath, kwargs = trigger.serialize()
    assert classpath == f"{cls.__module__}.{cls.__qualname__}"
    assert "deadline" not in kwargs and "end_from_trigger" not in kwargs
    through_json = json.loads(json.dumps(kwargs, allow_nan=False))
    rebuilt = cls(**through_json)
    assert rebuilt == trigger
    assert rebuilt.serialize() == (classpath, kwargs)
    assert BaseEventTrigger.hash(*rebuilt.serialize()) == BaseEventTrigger.hash(classpath, kwargs)
    assert rebuilt.shared_stream_key() == trigger.shared_stream_key()
    assert rebuilt.watermark_key() == trigger.watermark_key()  # type: ignore[attr-defined]
    assert_airflow_attaches_it_to_its_asset(trigger)


def assert_airflow_attaches_it_to_its_asset(trigger: Any) -> None:
    """The check ``add_asset_trigger_references`` makes at each DAG parse (Airflow 3.3.2).

    It hashes the watcher's trigger as the DAG encodes it and as the stored ``trigger`` row
    gives it back; when they differ the watcher is silently never attached to its asset.
    """
    from airflow.models.trigger import Trigger
    from airflow.serialization.encoders import encode_trigger
    from airflow.triggers.base import BaseEventTrigger

    encoded = encode_trigger(trigger)
    row = Trigger(classpath=encoded["classpath"], kwargs=encoded["kwargs"])
    assert BaseEventTrigger.hash(encoded["classpath"], encoded["kwargs"]) == BaseEventTrigger.hash(
        row.classpath, row.kwargs
    )
