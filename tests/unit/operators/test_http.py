"""HttpJobOperator's parse-time rules: bad input is refused when the DAG is parsed, naming the argument.

Nothing runs here: no server, no Airflow. The job API itself is in tests/integration/http/test_jobs.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_deferrable_kit.operators.http import HttpJobOperator, idempotency_key
from airflow_deferrable_kit.testing import make_context
from airflow_deferrable_kit.triggers.http_jobs import HttpJobTrigger

GOOD: dict[str, Any] = {
    "task_id": "run_job",
    "http_conn_id": "jobs_api",
    "endpoint": "jobs",
    "success": [{"path": "state", "equals": "DONE"}],
    "failure": [{"path": "state", "equals": "FAILED"}],
}


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"method": "FETCH"}, "method must be one of"),
        ({"endpoint": "https://elsewhere.example/jobs"}, "endpoint must be a path under the connection's base URL"),
        ({"status_endpoint": "jobs/{id}"}, "status_endpoint names {id}: set job_id_path"),
        ({"status_endpoint": "https://x/jobs/1"}, "status_endpoint must be a path"),
        ({"result_endpoint": "jobs/{id}/rows"}, "result_endpoint names {id}: set job_id_path"),
        ({"success": [{"path": "a..b", "equals": 1}]}, "success[0]: argument 'a..b' is not a valid JSON path"),
        ({"success": None, "running": [{"path": "state", "equals": "RUNNING"}]}, "could never succeed"),
        ({"running": [{"status": "two hundred"}]}, "running[0]"),
        ({"headers": {"Authorization": "Bearer x"}}, "headers['Authorization'] looks like a credential"),
        ({"headers": {"X-Api-Key": "x"}}, "headers['X-Api-Key'] looks like a credential"),
        ({"headers": {"X-Team": 7}}, "headers['X-Team'] must be text"),
        ({"idempotency_header": "Idem: potent"}, "idempotency_header must be a header name"),
        ({"max_pages": 0}, "result['max_pages'] must be an integer from 1"),
        ({"cursor_path": "next_cursor"}, "cursor_path and cursor_param go together"),
        ({"result_endpoint": "rows", "result_link_path": "links.result"}, "give endpoint or link_path, not both"),
        ({"result_path": "output", "items_path": "rows"}, "path picks one value"),
        ({"cancel_method": "KILL"}, "cancel['method'] must be one of"),
        ({"cancel_on_timeout": "yes"}, "cancel_on_timeout expects True or False"),
        ({"resubmit_on_retry": 1}, "resubmit_on_retry expects True or False"),
        ({"poll_interval": 0}, "poll_interval must be a positive number of seconds"),
        ({"timeout": float("inf")}, "timeout must be a number of seconds"),
        ({"not_yet_codes": [202, "soon"]}, "not_yet_codes must be HTTP status integers"),
        ({"data": {"when": object()}}, "data must be a JSON value or text"),
        ({"job_id_path": "$..id"}, "job_id_path"),
    ],
)
def test_bad_input_is_refused_at_parse_naming_the_argument(change: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError) as raised:
        HttpJobOperator(**{**GOOD, **change})
    assert named in str(raised.value), str(raised.value)
    assert "run_job" in str(raised.value) or "expects" in str(raised.value) or "seconds" in str(raised.value)


def test_templated_values_are_left_for_the_worker_to_check() -> None:
    op = HttpJobOperator(**{**GOOD, "endpoint": "{{ params.base }}/jobs", "result_endpoint": "{{ params.rows }}"})
    assert op.endpoint == "{{ params.base }}/jobs"


class StatementApi(HttpJobOperator):
    """A platform team's API in a few lines of data (the docs' example)."""

    http_conn_id = "warehouse_api"
    endpoint = "api/2.0/sql/statements"
    status_endpoint = "api/2.0/sql/statements/{id}"
    job_id_path = "statement_id"
    success = [{"path": "status.state", "equals": "SUCCEEDED"}]
    failure = [{"path": "status.state", "in": ["FAILED", "CANCELED", "CLOSED"]}]
    running = [{"path": "status.state", "in": ["PENDING", "RUNNING"]}]
    select = ["status.error.message"]
    result_path = "result"
    cancel_endpoint = "api/2.0/sql/statements/{id}/cancel"
    cancel_method = "POST"


def test_a_subclass_declares_its_api_as_data_and_a_dag_overrides_it() -> None:
    op = StatementApi(task_id="q", data={"statement": "select 1"}, poll_interval=5)
    trigger = op.build_trigger({"status_url": "api/2.0/sql/statements/s-1", "id": "s-1"}, None)
    _, kwargs = trigger.serialize()
    assert kwargs["http_conn_id"] == "warehouse_api" and kwargs["poll_interval"] == 5
    assert kwargs["cancel"] == {"method": "POST", "on_timeout": True, "on_kill": True,
                                "endpoint": "api/2.0/sql/statements/{id}/cancel"}  # fmt: skip
    assert kwargs["result"]["path"] == "result"
    assert HttpJobTrigger(**json.loads(json.dumps(kwargs))) == trigger
    assert trigger.cancel_request() == ("POST", "api/2.0/sql/statements/s-1/cancel")


def test_the_idempotency_key_is_stable_per_task_instance_and_fresh_only_when_asked() -> None:
    class Ti:
        dag_id, run_id, task_id, map_index, try_number = "d", "r", "t", 3, 1

    context = make_context(None, ti=Ti())
    assert idempotency_key(context) == idempotency_key(context)
    other = Ti()
    other.map_index = 4
    assert idempotency_key(make_context(None, ti=other)) != idempotency_key(context)
    assert idempotency_key(context, fresh=True) != idempotency_key(context)
