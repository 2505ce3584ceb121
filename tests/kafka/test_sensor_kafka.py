"""KafkaMessageSensor: deferral with a fixed start, the poke path, committing, and the example DAG."""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib.util
import time
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowRescheduleException

from airflow_deferrable_kit.sensors.base import WaitFailedError
from airflow_deferrable_kit.sensors.kafka import KafkaMessageSensor, to_epoch_ms
from airflow_deferrable_kit.testing import assert_defers, make_context, run_trigger
from airflow_deferrable_kit.triggers.kafka import KafkaMessageTrigger
from tests.kafka.conftest import Message, commit, committed, produce, unique

ROOT = Path(__file__).resolve().parents[2]


def sensor(topic: str, conn: str, **kwargs: Any) -> KafkaMessageSensor:
    kwargs.setdefault("task_id", unique("wait"))
    kwargs.setdefault("poke_interval", 0.1)
    return KafkaMessageSensor(topics=topic, kafka_conn_id=conn, deferrable=kwargs.pop("deferrable", True), **kwargs)


def test_a_message_produced_between_execute_and_the_trigger_start_is_found(
    bootstrap: str, kafka_conn: str, topic: str
) -> None:
    task = sensor(topic, kafka_conn, success=[{"key": "batch-42"}])
    before = int(time.time() * 1000)
    trigger = assert_defers(task, KafkaMessageTrigger)
    after = int(time.time() * 1000)
    assert trigger.start_after_ms is not None and before <= trigger.start_after_ms <= after
    assert trigger.deadline is not None
    # The task is deferred; the triggerer has not picked the trigger up yet.
    placed = asyncio.run(produce(bootstrap, topic, Message({"batch": 42}, key="batch-42")))
    payload = asyncio.run(run_trigger(KafkaMessageTrigger(**trigger.serialize()[1]), timeout=20)).payload
    assert (payload["partition"], payload["offset"]) == placed[0]
    assert task.execute_complete(make_context(task), payload) == payload


def test_templated_start_after_is_converted_when_rendered(kafka_conn: str, topic: str) -> None:
    task = sensor(topic, kafka_conn, start_after="{{ data_interval_end }}", success=[{"key": "k"}])
    task.start_after_ms = "2024-05-01T00:00:00+00:00"  # as Jinja would render it
    assert task.build_trigger(None).start_after_ms == 1_714_521_600_000


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1_700_000_000_000, 1_700_000_000_000),
        ("1700000000000", 1_700_000_000_000),
        (dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc), 1_714_521_600_000),
        ("2024-05-01T02:00:00+02:00", 1_714_521_600_000),
        (None, None),
    ],
)
def test_start_after_accepts_moments(value: Any, expected: int | None) -> None:
    assert to_epoch_ms(value) == expected


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"commit_on_match": True}, "group_id"),
        ({"commit_on_match": True, "group_id": "g", "end_from_trigger": True}, "end_from_trigger"),
        ({"success": [{"offset": 3}]}, r"success\[0\]"),
        ({"start_from": "committed"}, "group_id"),
        ({"start_after": -5}, "negative"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs: dict[str, Any], error: str) -> None:
    with pytest.raises((ValueError, TypeError), match=error):
        sensor("t", "kafka_default", **kwargs)


def test_poke_mode_scans_a_bounded_range_and_resumes_where_it_stopped(
    bootstrap: str, kafka_conn: str, topic: str
) -> None:
    task = sensor(
        topic, kafka_conn, deferrable=False, start_from="earliest", success=[{"path": "done", "equals": True}]
    )
    context = make_context(task)
    asyncio.run(produce(bootstrap, topic, *[Message({"n": n}, partition=n % 3) for n in range(9)]))
    assert task.poke(context) is False
    placed = asyncio.run(produce(bootstrap, topic, Message({"done": True}, partition=1)))
    result = task.poke(context)
    assert not isinstance(result, bool) and result.is_done
    payload = result.xcom_value
    assert (payload["partition"], payload["offset"]) == placed[0]
    assert payload["examined"] == 1  # the second poke started where the first one stopped


def test_check_before_defer_finds_an_existing_message_without_deferring(
    bootstrap: str, kafka_conn: str, topic: str
) -> None:
    asyncio.run(produce(bootstrap, topic, Message({"state": "done"}, key="x")))
    task = sensor(topic, kafka_conn, start_from="earliest", success=[{"path": "state", "equals": "done"}])
    payload = task.execute(make_context(task))
    assert payload["status"] == "success" and payload["key"] == "x"


def test_a_failure_condition_fails_the_task_even_with_soft_fail(bootstrap: str, kafka_conn: str, topic: str) -> None:
    asyncio.run(produce(bootstrap, topic, Message({"state": "failed"})))
    task = sensor(
        topic,
        kafka_conn,
        start_from="earliest",
        soft_fail=True,
        success=[{"path": "state", "equals": "done"}],
        failure=[{"path": "state", "equals": "failed"}],
    )
    with pytest.raises(WaitFailedError, match="condition_failed"):
        task.execute(make_context(task))


def test_commit_on_match_commits_after_the_event_and_committed_start_moves_on(
    bootstrap: str, kafka_conn: str, topic: str
) -> None:
    group = unique("group")
    asyncio.run(produce(bootstrap, topic, *[Message({"n": n}, key="k", partition=0) for n in range(3)]))
    asyncio.run(commit(bootstrap, group, topic, {0: 1}))

    def run_once() -> dict[str, Any]:
        task = sensor(
            topic,
            kafka_conn,
            start_from="committed",
            group_id=group,
            commit_on_match=True,
            success=[{"key": "k"}],
            check_before_defer=False,
        )
        trigger = assert_defers(task, KafkaMessageTrigger)
        payload = asyncio.run(run_trigger(trigger, timeout=20)).payload
        # Nothing is committed by the trigger itself: only once the task resumes with the event.
        assert asyncio.run(committed(bootstrap, group, topic, 3))[0] == payload["offset"]
        return task.execute_complete(make_context(task), payload)

    assert run_once()["offset"] == 1
    assert asyncio.run(committed(bootstrap, group, topic, 3))[0] == 2
    assert run_once()["offset"] == 2
    assert asyncio.run(committed(bootstrap, group, topic, 3))[0] == 3


def test_reschedule_mode_starts_at_the_first_poke(bootstrap: str, kafka_conn: str, topic: str) -> None:
    first = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    task = sensor(topic, kafka_conn, deferrable=False, mode="reschedule", success=[{"key": "nope"}])
    context = make_context(task)
    context["ti"].first_reschedule_date = first
    with pytest.raises(AirflowRescheduleException):
        task.execute(context)
    assert task.start_after_ms == int(first.timestamp() * 1000)


def test_example_dag_parses_without_network() -> None:
    spec = importlib.util.spec_from_file_location("example_kafka", ROOT / "dags" / "example_kafka.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = module.dag
    sensors = [t for t in dag.tasks if isinstance(t, KafkaMessageSensor)]
    assert len(sensors) >= 3
    assert {t.start_from for t in sensors} >= {"timestamp", "committed"}
