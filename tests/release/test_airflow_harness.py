"""The end-to-end harness explains a failure: what each Airflow component logged meanwhile."""

from __future__ import annotations

from pathlib import Path

from scripts.airflow_local import LocalAirflow

SCHEDULER_BEFORE = "[info] Loaded executor\n[error] an error from before the test\n"
SCHEDULER_DURING = (
    "[info] Received executor event with state success\n"
    "[error] Executor LocalExecutor reported that the task instance finished with state failed\n"
    "[warning] 12 triggers currently running\n"
    "Traceback (most recent call last):\n"
    '  File "supervisor.py", line 1, in supervise\n'
    "TimeoutError: the api-server did not answer\n"
)


def test_only_what_was_logged_since_the_test_began_and_only_the_problems(tmp_path: Path) -> None:
    airflow = LocalAirflow(dags_folder=tmp_path, home=tmp_path / "home")
    airflow.home.mkdir()
    (airflow.home / "scheduler.log").write_text(SCHEDULER_BEFORE)
    offsets = airflow.log_offsets()
    with (airflow.home / "scheduler.log").open("a") as log:
        log.write(SCHEDULER_DURING)
    (airflow.home / "triggerer.log").write_text("[info] trigger fired\n")  # a log begun meanwhile

    problems = airflow.problems_since(offsets).splitlines()

    assert problems == [
        "--- scheduler.log: 4 line(s), the last 60 ---",
        "[error] Executor LocalExecutor reported that the task instance finished with state failed",
        "Traceback (most recent call last):",
        '  File "supervisor.py", line 1, in supervise',
        "TimeoutError: the api-server did not answer",
    ]
    assert "before the test" in airflow.problems_since()


def executor_event(state: str, task_id: str, run_id: str = "manual__1") -> str:
    return (
        f"[info] Received executor event with state {state} for task instance TaskInstanceKey("
        f"dag_id='d', task_id='{task_id}', run_id='{run_id}', try_number=1, map_index=-1)\n"
    )


def test_a_worker_exit_is_its_success_or_failure_not_the_start_the_local_executor_also_reports(
    tmp_path: Path,
) -> None:
    airflow = LocalAirflow(dags_folder=tmp_path, home=tmp_path / "home")
    airflow.home.mkdir()
    (airflow.home / "scheduler.log").write_text(
        executor_event("running", "started")
        + executor_event("running", "deferred")
        + executor_event("success", "deferred")
        + executor_event("failed", "crashed")
        + executor_event("success", "other_run", run_id="manual__2")
    )

    assert airflow.worker_exits("d", "manual__1") == {"deferred", "crashed"}
