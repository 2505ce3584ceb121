"""``trigger_queue``: the trigger alone goes to its queue, as Airflow's own deferral reads it.

What Airflow does with the queue is decided in the worker, by ``_defer_task`` reading the running
task's ``queue`` when ``[triggerer] queues_enabled`` is on; these tests pass the sensor's real
``TaskDeferred`` through that very function and read the queue off the message it sends.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import structlog
from airflow.sdk.exceptions import TaskDeferred
from airflow.sdk.execution_time.task_runner import _defer_task

from airflow_deferrable_kit._trigger_queues import MAX_QUEUE_CHARS
from airflow_deferrable_kit.operators.http import HttpJobOperator
from airflow_deferrable_kit.testing import make_context
from tests.unit.sample import ScriptedSensor, script


def sensor(name: str, **kwargs: Any) -> ScriptedSensor:
    kwargs.setdefault("deferrable", True)
    return ScriptedSensor(task_id=f"wait_{name}", script=script(name, "none"), **kwargs)


def deferral_queue(task: Any) -> str | None:
    """The queue Airflow's worker sends with the deferral of ``task``'s first try."""
    with pytest.raises(TaskDeferred) as info:
        task.execute(make_context(task))
    ti = SimpleNamespace(task=task, dag_id="d", task_id=task.task_id, run_id="r")
    message, _ = _defer_task(info.value, ti, structlog.get_logger())  # type: ignore[arg-type]
    return message.queue  # type: ignore[no-any-return,union-attr]


@pytest.fixture
def queues_enabled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__TRIGGERER__QUEUES_ENABLED", "True")


def test_the_trigger_goes_to_its_queue_and_the_tasks_own_queue_stays_for_its_workers(queues_enabled: None) -> None:
    s = sensor("tq1", queue="etl-workers", trigger_queue="trg-s3-raw")
    assert s.queue == "etl-workers"  # what the scheduler routes the worker by, from the parsed DAG
    assert deferral_queue(s) == "trg-s3-raw"


def test_without_trigger_queue_airflow_routes_the_trigger_by_the_tasks_queue_as_before(queues_enabled: None) -> None:
    assert deferral_queue(sensor("tq2", queue="etl-workers")) == "etl-workers"
    assert deferral_queue(sensor("tq3")) == "default"  # [operators] default_queue


def test_with_queues_off_the_trigger_gets_no_queue_and_the_log_says_trigger_queue_is_not_applied(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AIRFLOW__TRIGGERER__QUEUES_ENABLED", "False")
    s = sensor("tq4", trigger_queue="trg-s3-raw")
    assert deferral_queue(s) is None
    # the task's own log (Airflow's structured logger writes it to the task log; here, stdout)
    assert "trigger_queue='trg-s3-raw' is not applied: [triggerer] queues_enabled is off" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["", " trg", "trg ", "a,b", "q" * (MAX_QUEUE_CHARS + 1), 5, ["trg"]])
def test_a_name_no_triggerer_could_list_is_refused_at_dag_parse_naming_the_argument(value: object) -> None:
    with pytest.raises(ValueError, match=r"ScriptedSensor \(task_id='wait_tq5'\): trigger_queue must be a queue name"):
        sensor("tq5", trigger_queue=value)


def test_the_longest_name_airflow_stores_is_taken() -> None:
    assert sensor("tq6", trigger_queue="q" * MAX_QUEUE_CHARS).trigger_queue == "q" * MAX_QUEUE_CHARS


def test_with_start_from_trigger_it_is_refused_as_airflow_gives_those_triggers_no_queue() -> None:
    with pytest.raises(ValueError, match="cannot be combined with start_from_trigger=True: Airflow gives"):
        sensor("tq7", trigger_queue="trg", start_from_trigger=True, timeout=60)


def test_on_a_wait_that_does_not_defer_it_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"trigger_queue='trg' routes the wait's trigger, and this wait does not defer"
    ):
        sensor("tq8", trigger_queue="trg", deferrable=False)


def test_the_http_job_operator_checks_it_at_dag_parse_too() -> None:
    with pytest.raises(ValueError, match=r"HttpJobOperator \(task_id='job'\): trigger_queue must be a queue name"):
        HttpJobOperator(task_id="job", http_conn_id="api", endpoint="jobs", deferrable=True, trigger_queue="a,b")
    with pytest.raises(ValueError, match="this wait does not defer"):
        HttpJobOperator(task_id="job", http_conn_id="api", endpoint="jobs", deferrable=False, trigger_queue="trg")
    assert HttpJobOperator(task_id="job", http_conn_id="api", endpoint="jobs", deferrable=True).trigger_queue is None
