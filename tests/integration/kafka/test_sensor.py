"""KafkaMessageSensor: deferral with a fixed start, retries that keep it, the poke path,
committing, and the example DAG."""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib.util
import json
import time
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowRescheduleException

from airflow_deferrable_kit._moments import to_epoch_ms
from airflow_deferrable_kit.sensors.base import WaitFailedError
from airflow_deferrable_kit.sensors.kafka import NEVER_EXPIRE, START_KEY, KafkaMessageSensor
from airflow_deferrable_kit.testing import assert_defers, make_context, run_trigger
from airflow_deferrable_kit.triggers.kafka import KafkaMessageTrigger
from scripts.services import free_port
from tests import REPO
from tests.integration.kafka.conftest import (
    Message,
    TaskStateStore,
    commit,
    committed,
    create_topic,
    eventually,
    hours_ago,
    produce,
    set_connection,
    task_context,
    unique,
)

ROOT = REPO


def sensor(topic: str, conn: str, **kwargs: Any) -> KafkaMessageSensor:
    kwargs.setdefault("task_id", unique("wait"))
    kwargs.setdefault("poke_interval", 0.1)
    return KafkaMessageSensor(topics=topic, kafka_conn_id=conn, deferrable=kwargs.pop("deferrable", True), **kwargs)


def rebuilt(trigger: KafkaMessageTrigger) -> KafkaMessageTrigger:
    """The trigger as the triggerer rebuilds it from the stored kwargs."""
    return KafkaMessageTrigger(**json.loads(json.dumps(trigger.serialize()[1])))


def coordinates(payload: dict[str, Any]) -> tuple[int, int]:
    return payload["partition"], payload["offset"]


def test_a_message_produced_between_execute_and_the_trigger_start_is_found(
    bootstrap: str, kafka_conn: str, topic: str
) -> None:
    task = sensor(topic, kafka_conn, success=[{"key": "batch-42"}])
    trigger = assert_defers(task, KafkaMessageTrigger)
    assert trigger.start_offsets == {topic: {"0": 0, "1": 0, "2": 0}} and trigger.start_after_ms is None
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


@pytest.mark.parametrize(
    ("topics", "conn_id", "argument"),
    [(7, "k", "topics"), (None, "k", "topics"), ({"orders": 1}, "k", "topics"), ("t", " ", "kafka_conn_id")],
)
def test_bad_topics_or_connection_are_refused_at_construction_naming_the_argument(
    topics: Any, conn_id: str, argument: str
) -> None:
    with pytest.raises(ValueError, match=f"^{argument}"):
        KafkaMessageSensor(task_id="wait", topics=topics, kafka_conn_id=conn_id)


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


def test_deferred_the_worker_never_scans_the_backlog_the_trigger_reads(
    bootstrap: str, kafka_conn: str, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From ``earliest`` a first look would read the whole backlog in the worker slot, and the
    trigger all of it again: the sensor defers at once and the trigger finds the message."""
    asyncio.run(produce(bootstrap, topic, *[Message({"state": "pending"}, key="x") for _ in range(50)]))
    asyncio.run(produce(bootstrap, topic, Message({"state": "done"}, key="x")))
    scans: list[str] = []
    real_poll_once = KafkaMessageTrigger.poll_once

    async def counted(self: KafkaMessageTrigger) -> Any:
        scans.append(self.topics[0])
        return await real_poll_once(self)

    monkeypatch.setattr(KafkaMessageTrigger, "poll_once", counted)
    task = sensor(topic, kafka_conn, start_from="earliest", success=[{"path": "state", "equals": "done"}])
    trigger = assert_defers(task, KafkaMessageTrigger)
    assert scans == []  # nothing read in the worker
    payload = asyncio.run(run_trigger(rebuilt(trigger), timeout=20)).payload
    assert payload["status"] == "success" and payload["key"] == "x" and payload["value"] == {"state": "done"}
    assert task.execute_complete(make_context(task), payload) == payload


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
    trigger = assert_defers(task, KafkaMessageTrigger)
    payload = asyncio.run(run_trigger(rebuilt(trigger), timeout=20)).payload
    with pytest.raises(WaitFailedError, match="condition_failed"):
        task.execute_complete(make_context(task), payload)


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


def test_without_a_task_state_store_a_later_reschedule_starts_at_the_first_poke(
    bootstrap: str, kafka_conn: str, topic: str
) -> None:
    """Airflow < 3.3 has no task state store: a later poke falls back to the first poke's moment."""
    first = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    task = sensor(topic, kafka_conn, deferrable=False, mode="reschedule", success=[{"key": "nope"}])
    context = make_context(task)
    context["ti"].first_reschedule_date = first
    with pytest.raises(AirflowRescheduleException):
        task.execute(context)
    assert task.start_after_ms == int(first.timestamp() * 1000) and task.start_offsets is None


# ------------------------------------------------------- the start: offsets, kept across tries
def test_the_default_start_is_the_log_end_offsets_so_backdated_messages_are_found(
    bootstrap: str, kafka_conn: str, topic: str
) -> None:
    """Produced after the deferral but stamped hours earlier (a producer clock behind, Kafka
    Streams, Connect, an explicit timestamp): found, because the start is offsets, not a moment.

    tansu answers ``offsets_for_times`` by append time, so for partitions that exist at the start
    the earlier moment rule found these on tansu too (not on Apache Kafka, which answers by the
    records' timestamps); the topic-created-later and partition tests in test_trigger_kafka.py
    tell the two rules apart on tansu as well.
    """
    asyncio.run(
        produce(bootstrap, topic, Message({"n": 0}, key="k", partition=0), Message({"n": 1}, key="k", partition=1))
    )
    store = TaskStateStore()
    task = sensor(topic, kafka_conn, success=[{"key": "k"}])
    trigger = assert_defers(task, KafkaMessageTrigger, context=task_context(task, store))
    assert trigger.start_offsets == {topic: {"0": 1, "1": 1, "2": 0}} and trigger.start_after_ms is None
    assert store.get(START_KEY) == {"offsets": trigger.start_offsets, "topics": [topic]}
    assert store.retention[START_KEY] is NEVER_EXPIRE
    stamped = hours_ago(6)
    placed = asyncio.run(produce(bootstrap, topic, Message({"n": 2}, key="k", partition=2, timestamp_ms=stamped)))
    payload = asyncio.run(run_trigger(rebuilt(trigger), timeout=20)).payload
    assert coordinates(payload) == placed[0] == (2, 0)
    assert payload["timestamp"] == stamped and payload["examined"] == 1  # the older two were never looked at
    assert payload["start"] == {
        "from": "timestamp",
        "after_ms": None,
        "offsets": {"0": 1, "1": 1, "2": 0},
        "group_id": None,
    }


def test_a_message_produced_between_a_failed_try_and_its_retry_is_found(
    bootstrap: str, kafka_conn: str, topic: str
) -> None:
    store, task_id = TaskStateStore(), unique("wait")

    def attempt() -> KafkaMessageSensor:  # each try runs in a fresh process: a fresh sensor
        return sensor(topic, kafka_conn, task_id=task_id, success=[{"key": "k"}], check_before_defer=False)

    first = attempt()
    first_trigger = assert_defers(first, KafkaMessageTrigger, context=task_context(first, store))
    # Try 1 fails before the message arrives (its trigger never reports; the worker was lost).
    placed = asyncio.run(produce(bootstrap, topic, Message({"n": 1}, key="k", timestamp_ms=hours_ago(3))))
    time.sleep(0.01)
    retry = attempt()
    trigger = assert_defers(retry, KafkaMessageTrigger, context=task_context(retry, store, try_number=2))
    assert trigger.start_offsets == first_trigger.start_offsets and trigger.start_after_ms is None
    payload = asyncio.run(run_trigger(trigger, timeout=20)).payload
    assert coordinates(payload) == placed[0]


def test_a_triggerer_restart_keeps_the_offsets_of_the_first_deferral(
    bootstrap: str, kafka_conn: str, topic: str
) -> None:
    task = sensor(topic, kafka_conn, success=[{"key": "k"}], check_before_defer=False)
    trigger = assert_defers(task, KafkaMessageTrigger, context=task_context(task, TaskStateStore()))

    async def until_the_triggerer_stops(running: KafkaMessageTrigger) -> None:
        wait = asyncio.ensure_future(run_trigger(running, timeout=20))
        await eventually(lambda: running._subscription is not None and topic in running._subscription.waiter.attached)
        wait.cancel()
        await asyncio.gather(wait, return_exceptions=True)

    asyncio.run(until_the_triggerer_stops(rebuilt(trigger)))
    placed = asyncio.run(produce(bootstrap, topic, Message({"n": 1}, key="k", timestamp_ms=hours_ago(2))))
    again = rebuilt(trigger)  # the next triggerer, from the stored kwargs
    assert again.start_offsets == trigger.start_offsets
    payload = asyncio.run(run_trigger(again, timeout=20)).payload
    assert coordinates(payload) == placed[0]


def test_commit_on_match_is_at_least_once_across_a_retry(bootstrap: str, kafka_conn: str, topic: str) -> None:
    """The trigger commits nothing; a try that dies after Airflow stored the event but before
    the worker committed leaves the message to be found again by the retry, which commits it."""
    group, store, task_id = unique("group"), TaskStateStore(), unique("wait")

    def attempt(**kwargs: Any) -> KafkaMessageSensor:
        return sensor(
            topic, kafka_conn, task_id=task_id, group_id=group, commit_on_match=True, success=[{"key": "k"}], **kwargs
        )

    first = attempt(check_before_defer=False)
    trigger = assert_defers(first, KafkaMessageTrigger, context=task_context(first, store))
    placed = asyncio.run(produce(bootstrap, topic, Message({"n": 1}, key="k", timestamp_ms=hours_ago(1))))
    event = asyncio.run(run_trigger(rebuilt(trigger), timeout=20)).payload
    assert coordinates(event) == placed[0]
    # Airflow stored the event; the try fails before resuming, so before the commit.
    assert set(asyncio.run(committed(bootstrap, group, topic, 3)).values()) == {-1}
    retry = attempt()  # the retry's trigger reads from the first try's offsets
    retry_context = task_context(retry, store, try_number=2)
    again = assert_defers(retry, KafkaMessageTrigger, context=retry_context)
    assert again.start_offsets == trigger.start_offsets
    result = retry.execute_complete(retry_context, asyncio.run(run_trigger(rebuilt(again), timeout=20)).payload)
    assert result["status"] == "success" and coordinates(result) == placed[0]
    assert asyncio.run(committed(bootstrap, group, topic, 3))[placed[0][0]] == placed[0][1] + 1


def test_reschedule_mode_fixes_the_offsets_at_the_first_poke_and_keeps_them(
    bootstrap: str, kafka_conn: str, topic: str
) -> None:
    store, task_id = TaskStateStore(), unique("wait")

    def poke_run(first_poke: dt.datetime | None) -> tuple[KafkaMessageSensor, dict[str, Any]]:
        task = sensor(topic, kafka_conn, task_id=task_id, deferrable=False, mode="reschedule", success=[{"key": "k"}])
        context = task_context(task, store)
        context["ti"].first_reschedule_date = first_poke
        return task, context

    asyncio.run(produce(bootstrap, topic, Message({"n": 0}, key="k", partition=0)))
    task, context = poke_run(None)
    with pytest.raises(AirflowRescheduleException):
        task.execute(context)
    assert store.get(START_KEY)["offsets"] == {topic: {"0": 1, "1": 0, "2": 0}}
    placed = asyncio.run(produce(bootstrap, topic, Message({"n": 1}, key="k", partition=0, timestamp_ms=hours_ago(4))))
    task, context = poke_run(dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=1))
    result = task.execute(context)
    assert coordinates(result) == placed[0] == (0, 1)


def test_a_topic_added_to_the_task_between_tries_starts_at_its_log_end_then(
    bootstrap: str, kafka_conn: str, topic: str
) -> None:
    other = asyncio.run(create_topic(bootstrap, unique("other"), partitions=1))
    asyncio.run(produce(bootstrap, other, Message({"n": 0}, key="k")))
    store, task_id = TaskStateStore(), unique("wait")
    first = sensor(topic, kafka_conn, task_id=task_id, check_before_defer=False)
    assert_defers(first, KafkaMessageTrigger, context=task_context(first, store))
    retry = sensor([topic, other], kafka_conn, task_id=task_id, check_before_defer=False)
    trigger = assert_defers(retry, KafkaMessageTrigger, context=task_context(retry, store, try_number=2))
    assert trigger.start_offsets == {topic: {"0": 0, "1": 0, "2": 0}, other: {"0": 1}}
    assert store.get(START_KEY)["topics"] == [topic, other]


def test_without_a_task_state_store_a_retry_starts_from_the_dag_run_start(kafka_conn: str, topic: str) -> None:
    started = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=10)
    task = sensor(topic, kafka_conn, check_before_defer=False)
    context = task_context(task, None, try_number=2, dag_run=SimpleNamespace(start_date=started))
    trigger = assert_defers(task, KafkaMessageTrigger, context=context)
    assert trigger.start_offsets is None and trigger.start_after_ms == int(started.timestamp() * 1000)


def test_a_worker_that_cannot_reach_the_broker_falls_back_to_the_moment_and_keeps_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conn = set_connection(monkeypatch, "kafka_down", f"127.0.0.1:{free_port()}")
    store, task_id = TaskStateStore(), unique("wait")
    first = sensor("events", conn, task_id=task_id, check_before_defer=False)
    before = int(time.time() * 1000)
    trigger = assert_defers(first, KafkaMessageTrigger, context=task_context(first, store))
    assert trigger.start_offsets is None and before <= trigger.start_after_ms <= int(time.time() * 1000)
    assert store.get(START_KEY) == {"after_ms": trigger.start_after_ms}
    retry = sensor("events", conn, task_id=task_id, check_before_defer=False)
    again = assert_defers(retry, KafkaMessageTrigger, context=task_context(retry, store, try_number=2))
    assert again.start_after_ms == trigger.start_after_ms


def test_an_explicit_start_after_keeps_the_timestamp_rule(kafka_conn: str, topic: str) -> None:
    store = TaskStateStore()
    task = sensor(topic, kafka_conn, start_after=1_700_000_000_000, check_before_defer=False)
    trigger = assert_defers(task, KafkaMessageTrigger, context=task_context(task, store))
    assert trigger.start_after_ms == 1_700_000_000_000 and trigger.start_offsets is None
    assert store.rows == {}


def test_example_dag_parses_without_network() -> None:
    spec = importlib.util.spec_from_file_location("example_kafka", ROOT / "dags" / "example_kafka.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = module.dag
    sensors = [t for t in dag.tasks if isinstance(t, KafkaMessageSensor)]
    assert len(sensors) >= 3
    assert {t.start_from for t in sensors} >= {"timestamp", "committed"}
