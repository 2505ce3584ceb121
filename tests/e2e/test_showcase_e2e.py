"""The showcase through a real Airflow, as `make demo` runs it, plus semantics only a real
scheduler shows: timeout -> skipped with soft_fail, error -> failed despite soft_fail, and
deferrable=False in reschedule mode.

The demo's figures must be the audit's on the same run, its table must have the waited column
and a total, ``--keep`` must leave an Airflow its printed login opens, and the demo's Airflow
must not see the caller's own Airflow settings. The tests without the e2e mark check the parts
that need no running Airflow.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from scripts.airflow_local import (
    AIRFLOW_PREFIXES,
    PASSWORDS_FILE,
    LocalAirflow,
    WatchedRun,
    without_airflow_settings,
)
from scripts.demo import (
    DAG_ID,
    TASKS,
    Showcase,
    finish,
    kept_message,
    parse_args,
    run_demo,
    saving_sentence,
    up_message,
)

#: What a user's shell may export for their own Airflow; none of it may reach the demo's.
LEAKED = {
    "AIRFLOW_HOME": "/srv/my-airflow",
    "AIRFLOW_CONFIG": "/srv/my-airflow/airflow.cfg",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql+psycopg2://me:secret@127.0.0.1:1/production",
    "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
    "AIRFLOW__SECRETS__BACKEND": "my.secrets.Backend",
    "AIRFLOW_CONN_WAREHOUSE": "postgresql://me:secret@prod-db/warehouse",
    "AIRFLOW_VAR_ENV": "production",
}


@dataclass
class DemoSeen:
    """What ``run_demo(keep=True)`` did: its result, what it printed, and what was checked while
    it kept Airflow up."""

    watched: WatchedRun
    rows: list[dict[str, Any]]
    code: int
    printed: list[str] = field(default_factory=list)
    while_kept: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return "\n".join(self.printed)


def kept_login(text: str) -> tuple[str, str, str]:
    """The URL, user and password the ``--keep`` message printed."""
    found = re.search(r"Airflow keeps running at (\S+) - log in as '([^']+)', password '([^']+)'", text)
    assert found, text
    return found.group(1), found.group(2), found.group(3)


def token(url: str, user: str, password: str) -> str:
    request = urllib.request.Request(
        f"{url}/auth/token",
        data=json.dumps({"username": user, "password": password}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return str(json.loads(response.read())["access_token"])


@pytest.fixture(scope="module")
def showcase_run(showcase: Showcase) -> DemoSeen:
    printed: list[str] = []
    while_kept: dict[str, Any] = {}

    def check_kept() -> None:
        # Called where the demo would wait for Ctrl-C: log in with what it printed.
        url, user, password = kept_login("\n".join(printed))
        while_kept["url"] = url
        while_kept["token"] = token(url, user, password)

    def out(line: str) -> None:
        print(line, flush=True)
        printed.append(line)

    result = run_demo(
        showcase, keep=True, delay=1.0, log=lambda line: print(line, flush=True), out=out, until_stopped=check_kept
    )
    return DemoSeen(result.watched, result.rows, result.code, printed, while_kept)


@pytest.mark.e2e
def test_every_wait_deferred_and_succeeded(showcase: Showcase, showcase_run: DemoSeen) -> None:
    watched = showcase_run.watched
    failed_logs = {
        task_id: showcase.airflow.task_log(DAG_ID, watched.run_id, task_id)[-3000:]
        for task_id in TASKS
        if watched.states[task_id][-1] != "success"
    }
    assert watched.run_state == "success", (watched.states, failed_logs)
    assert showcase_run.code == 0
    for task_id in TASKS:
        states = watched.states[task_id]
        assert "deferred" in states, (task_id, states)
        assert states[-1] == "success", (task_id, states)


@pytest.mark.e2e
def test_each_payload_says_what_was_found(showcase: Showcase, showcase_run: DemoSeen) -> None:
    payloads = {row["task_id"]: row["payload"] for row in showcase_run.rows}
    print(json.dumps(payloads, indent=1, default=str))
    assert all(p["status"] == "success" for p in payloads.values()), payloads
    s3 = payloads["wait_s3_object"]
    assert [k["key"] for k in s3["keys"]] == [f"exports/{showcase.batch}/_SUCCESS"]
    assert s3["keys"][0]["size"] == len(b"42 files\n")
    http = payloads["wait_http_batch_ready"]
    assert http["status_code"] == 200
    assert http["decision"]["actual"] == "ready"
    marker = payloads["wait_postgres_marker"]
    assert marker["row"]["batch_id"] == showcase.batch
    assert marker["row"]["status"] == "done"
    message = payloads["wait_kafka_message"]
    assert (message["topic"], message["key"]) == ("batch-events", f"batch-{showcase.batch}")
    assert message["value"] == {"batch": showcase.batch, "rows": 1234}
    assert payloads["wait_moment"]["target_time"].endswith("+00:00")


@pytest.mark.e2e
def test_end_from_trigger_tasks_never_went_back_to_a_worker(showcase: Showcase, showcase_run: DemoSeen) -> None:
    watched = showcase_run.watched
    runs = {row["task_id"]: row["worker_runs"] for row in showcase_run.rows}
    # wait_kafka_message started on a worker; wait_moment started in the triggerer (start_from_trigger).
    for task_id, worker_starts in (("wait_kafka_message", 1), ("wait_moment", 0)):
        assert watched.states[task_id][-2:] == ["deferred", "success"], watched.states[task_id]
        log = showcase.airflow.task_log(DAG_ID, watched.run_id, task_id)
        assert log.count("Worker startup parse complete") == worker_starts, log[-2000:]
        assert runs[task_id] == worker_starts, runs
    assert [runs[task] for task in ("wait_s3_object", "wait_http_batch_ready", "wait_postgres_marker")] == [2, 2, 2]


@pytest.mark.e2e
def test_worker_time_is_a_small_part_of_the_wait(showcase_run: DemoSeen) -> None:
    for row in showcase_run.rows:
        assert row["waited_seconds"] is not None and row["worker_seconds"] is not None, row
        assert row["worker_seconds"] < row["waited_seconds"], row
        # wait_moment, the one started in the triggerer, held none.
        assert (row["worker_seconds"] == 0) == (row["task_id"] == "wait_moment"), row
    assert "wait_moment never took a worker slot (start_from_trigger=True)" in showcase_run.text
    saving = next(line for line in showcase_run.printed if line.startswith("Saving: "))
    held = sum(row["worker_seconds"] for row in showcase_run.rows)
    assert f"held a worker slot for {held:.1f} s in all" in saving, saving


@pytest.mark.e2e
def test_the_demos_figures_are_the_audits_on_the_same_run(showcase: Showcase, showcase_run: DemoSeen) -> None:
    """The demo reports what ``airflow-deferrable-kit audit`` reports for its run, to the digit,
    and never less worker time than polling the REST API saw (which misses a cold start)."""
    run_id = showcase_run.watched.run_id
    command = [sys.executable, "-m", "airflow_deferrable_kit.cli", "audit", "--format", "json", "--days", "1"]
    command += ["--sql-alchemy-conn", showcase.airflow.metadata_url, "--dag-id", DAG_ID, "--run-id", run_id]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    audited = {row["task_id"]: row for row in json.loads(done.stdout)["rows"]}
    assert set(audited) == set(TASKS)
    for row in showcase_run.rows:
        audit = audited[row["task_id"]]
        assert row["worker_seconds"] == pytest.approx(audit["worker_held_hours"] * 3600, abs=1e-6), row
        assert row["waited_seconds"] == pytest.approx(audit["wall_hours"] * 3600, abs=1e-6), row
        assert row["worker_runs"] == audit["worker_runs"], row
        polled = showcase_run.watched.seconds_in(row["task_id"], "running")
        assert row["worker_seconds"] >= polled - 1.0 * audit["worker_runs"], (row, polled)
    measured = {
        row["task_id"]: (round(row["worker_seconds"], 2), round(row["waited_seconds"], 2)) for row in showcase_run.rows
    }
    print("worker s, waited s:", measured)


@pytest.mark.e2e
def test_the_table_has_a_waited_column_and_a_total(showcase_run: DemoSeen) -> None:
    lines = showcase_run.printed
    header = next(line for line in lines if line.startswith("task "))
    assert header.split() == ["task", "state", "deferred", "resumed", "worker", "s", "waited", "s", "worker", "runs"]
    total = next(line for line in lines if line.startswith("TOTAL")).split()
    rows = showcase_run.rows
    assert float(total[1]) == pytest.approx(sum(row["worker_seconds"] for row in rows), abs=0.051)
    assert float(total[2]) == pytest.approx(sum(row["waited_seconds"] for row in rows), abs=0.051)
    assert int(total[3]) == sum(row["worker_runs"] for row in rows) == 7  # 2 + 2 + 2 + 1 + 0


@pytest.mark.e2e
def test_keep_leaves_an_airflow_that_the_printed_login_opens(showcase: Showcase, showcase_run: DemoSeen) -> None:
    assert showcase_run.while_kept["url"] == showcase.airflow.base_url
    assert showcase_run.while_kept["token"]
    assert "Stop it: press Ctrl-C" in showcase_run.text
    assert f"--sql-alchemy-conn {showcase.airflow.metadata_url} --dag-id {DAG_ID}" in showcase_run.text


@pytest.mark.e2e
def test_the_demos_airflow_ignores_the_callers_airflow_settings(
    showcase: Showcase, showcase_run: DemoSeen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real Airflow command with the demo's environment, while the caller exports another
    metadata DB: it reads the demo's own DB and finds the run the demo made there."""
    for name, value in LEAKED.items():
        monkeypatch.setenv(name, value)
    airflow = showcase.airflow
    command = [str(Path(sys.executable).with_name("airflow")), "dags", "list-runs", DAG_ID, "-o", "json"]
    done = subprocess.run(command, env=airflow.env, capture_output=True, text=True, check=False, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(done.stdout.strip().splitlines()[-1])  # after any warning Airflow logs on stdout
    assert showcase_run.watched.run_id in {run["run_id"] for run in runs}
    # And the components running since the start hold no Airflow variable but their own.
    own = {name for name in airflow.env if name.startswith(AIRFLOW_PREFIXES)}
    environ = Path(f"/proc/{airflow.processes['scheduler'].pid}/environ").read_bytes().decode()
    live = {entry.split("=", 1)[0] for entry in environ.split("\0") if entry}
    assert {name for name in live if name.startswith(AIRFLOW_PREFIXES)} <= own


def test_the_demos_airflow_environment_drops_every_airflow_setting_of_the_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in LEAKED.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", "theirs")
    monkeypatch.setenv("ADK_UNRELATED", "kept")
    airflow = LocalAirflow(dags_folder=tmp_path, home=tmp_path / "home", extra_env={"AIRFLOW_CONN_OURS": "{}"})
    env = airflow.env
    assert env["AIRFLOW_HOME"] == str(tmp_path / "home")
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == f"sqlite:///{tmp_path / 'home' / 'airflow.db'}"
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == airflow.metadata_url
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    for name in ("AIRFLOW_CONFIG", "AIRFLOW__SECRETS__BACKEND", "AIRFLOW_CONN_WAREHOUSE", "AIRFLOW_VAR_ENV"):
        assert name not in env, name
    assert "_AIRFLOW_PARSING_CONTEXT_DAG_ID" not in env
    assert env["AIRFLOW_CONN_OURS"] == "{}"  # the demo's own connections still arrive
    assert (env["PATH"], env["ADK_UNRELATED"]) == (os.environ["PATH"], "kept")
    assert without_airflow_settings({"PATH": "/bin", "AIRFLOW__A__B": "1", "AIRFLOW_HOME": "/x"}) == {"PATH": "/bin"}


def test_keep_prints_the_url_the_login_and_how_to_stop_and_then_waits(tmp_path: Path) -> None:
    airflow = LocalAirflow(dags_folder=tmp_path, home=tmp_path)
    (tmp_path / PASSWORDS_FILE).write_text(json.dumps({"admin": "s3cret-Demo"}))
    printed: list[str] = []
    waits: list[bool] = []
    finish(airflow, keep=True, out=printed.append, until_stopped=lambda: waits.append(True))
    text = "\n".join(printed)
    assert kept_login(text) == (airflow.base_url, "admin", "s3cret-Demo")
    assert f"kill {os.getpid()}" in text and "Ctrl-C" in text
    assert f"audit --sql-alchemy-conn {airflow.metadata_url} --dag-id {DAG_ID}" in text
    assert f"what waiting cost): {airflow.base_url}/plugin/waits" in text
    assert waits == [True]
    assert kept_message(airflow) in text
    assert parse_args(["--keep"]).keep is True


def test_without_keep_no_url_is_printed_as_if_it_stayed_up(tmp_path: Path) -> None:
    airflow = LocalAirflow(dags_folder=tmp_path, home=tmp_path)
    printed: list[str] = []
    finish(airflow, keep=False, out=printed.append, until_stopped=lambda: pytest.fail("must not wait"))
    assert airflow.base_url not in "\n".join(printed)
    assert "stops with the demo" in printed[-1] and "--keep" in printed[-1]
    assert up_message(airflow).startswith(f"Airflow is up at {airflow.base_url} while the demo runs")
    assert parse_args([]).keep is False


@pytest.mark.e2e
def test_timeout_skips_with_soft_fail_errors_fail_anyway_and_reschedule_mode_works(showcase: Showcase) -> None:
    airflow = showcase.airflow
    failed_batch = "broken-batch"
    body = json.dumps({"state": "failed", "message": "upstream gave up"}).encode()
    request = urllib.request.Request(
        f"{showcase.batch_api_url}/v1/batches/{failed_batch}",
        data=body,
        method="PUT",
        headers={"Content-Type": "application/json", "Authorization": "Bearer demo-token"},
    )
    with urllib.request.urlopen(request, timeout=10):
        pass
    soon = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=20)).replace(microsecond=0)
    airflow.wait_for_dag("adk_e2e_semantics")
    run_id = airflow.trigger("adk_e2e_semantics", {"soon": soon.isoformat(), "failed_batch": failed_batch})
    watched = airflow.watch_run("adk_e2e_semantics", run_id, timeout=300)
    states = watched.states
    assert states["timeout_soft_fail"][-1] == "skipped", states
    assert "deferred" in states["timeout_soft_fail"]
    assert states["error_despite_soft_fail"][-1] == "failed", states
    assert "deferred" in states["error_despite_soft_fail"]
    log = airflow.task_log("adk_e2e_semantics", run_id, "error_despite_soft_fail")
    assert "condition_failed" in log, log[-2000:]
    why = ""
    if states["reschedule_mode"][-1] != "success":  # the task's log, and the scheduler's word on it
        query = urllib.parse.urlencode({"dag_id": "adk_e2e_semantics", "run_id": run_id, "limit": 100})
        events = airflow.api("GET", f"/api/v2/eventLogs?{query}")
        mine = [e for e in events.get("event_logs", []) if e.get("task_id") == "reschedule_mode"]
        why = json.dumps(mine)[-3000:] + airflow.task_log("adk_e2e_semantics", run_id, "reschedule_mode")[-3000:]
    assert states["reschedule_mode"][-1] == "success", (states, why)
    assert "up_for_reschedule" in states["reschedule_mode"]
    assert "deferred" not in states["reschedule_mode"]
    assert airflow.xcom("adk_e2e_semantics", run_id, "reschedule_mode") == {
        "status": "success",
        "target_time": soon.isoformat(),
    }


def test_the_saving_sentence_sums_the_rows_and_names_the_waits_with_no_worker() -> None:
    rows = [
        {"task_id": "a", "worker_seconds": 3.0, "waited_seconds": 60.0, "worker_runs": 2},
        {"task_id": "b", "worker_seconds": 0.0, "waited_seconds": 30.0, "worker_runs": 0},
    ]
    assert saving_sentence(rows) == (
        "Saving: these 2 waits held a worker slot for 3.0 s in all; in poke mode each would have held one for its "
        "whole wait, 90.0 s (30 times as long). b never took a worker slot (start_from_trigger=True)."
    )
    rows[0]["worker_runs"], rows[1]["worker_runs"] = 1, 1
    assert "never took" not in saving_sentence(rows)
