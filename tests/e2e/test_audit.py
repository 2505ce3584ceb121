"""The audit against a metadata DB filled by a real Airflow: one ~30 s wait held four ways.

One Airflow (api-server, scheduler, triggerer, dag-processor; SQLite + LocalExecutor) runs
``adk_audit_modes`` once; the command line then audits its SQLite file while it runs. The
worker-held time each mode reports must match what happened: poke holds the slot for the whole
wait, reschedule only per poke, deferred only around the deferral. The number of worker runs the
audit finds is checked against the worker starts in each task's own log.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from airflow_deferrable_kit.audit import dag_shape, open_engine
from scripts.airflow_local import LocalAirflow, WatchedRun

pytestmark = pytest.mark.e2e

DAG_ID = "adk_audit_modes"
WAIT = 30  # seconds from triggering the run to the sensors' target time
TASKS = ("poke", "reschedule", "deferred", "end_from_trigger", "start_from_trigger")


@dataclass
class Audited:
    airflow: LocalAirflow
    watched: WatchedRun
    report: dict[str, Any]
    html: str

    def row(self, task_id: str) -> dict[str, Any]:
        return next(row for row in self.report["rows"] if row["task_id"] == task_id)

    def seconds(self, task_id: str, column: str) -> float:
        return float(self.row(task_id)[f"{column}_hours"]) * 3600

    def worker_starts(self, task_id: str) -> int:
        try:
            log = self.airflow.task_log(DAG_ID, self.watched.run_id, task_id)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:  # no log at all: no worker ever ran it
                return 0
            raise
        return log.count("Worker startup parse complete")


@pytest.fixture(scope="module")
def audited(airflow: LocalAirflow) -> Iterator[Audited]:
    # The first tasks after a start wait seconds on the cold API server: warm it up first.
    airflow.wait_for_dag("adk_audit_warmup")
    warmup = airflow.watch_run("adk_audit_warmup", airflow.trigger("adk_audit_warmup"), timeout=240)
    assert warmup.run_state == "success", warmup.states
    airflow.wait_for_dag(DAG_ID)
    target = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=WAIT)
    run_id = airflow.trigger(DAG_ID, {"target": target.isoformat()})
    watched = airflow.watch_run(DAG_ID, run_id, timeout=240)
    assert watched.run_state == "success", watched.states
    command = [
        sys.executable,
        "-m",
        "airflow_deferrable_kit.cli",
        "audit",
        "--sql-alchemy-conn",
        f"sqlite:///{airflow.home / 'airflow.db'}",
        "--dag-id",
        DAG_ID,
        "--days",
        "1",
        "--format",
        "json",
        "--html",
        str(airflow.home / "audit.html"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    yield Audited(airflow, watched, json.loads(done.stdout), (airflow.home / "audit.html").read_text())


def test_every_mode_really_ran_as_intended(audited: Audited) -> None:
    states = audited.watched.states
    assert "up_for_reschedule" in states["reschedule"], states
    assert "deferred" in states["deferred"] and "deferred" in states["end_from_trigger"], states
    assert not {"deferred", "up_for_reschedule"} & set(states["poke"]), states
    assert {row["task_id"]: row["modes"] for row in audited.report["rows"]} == {
        "poke": ["poke"],
        "reschedule": ["reschedule"],
        "deferred": ["deferred"],
        "end_from_trigger": ["deferred"],
        "start_from_trigger": ["deferred"],
    }
    assert all(audited.row(task)["estimated_runs"] == 0 for task in TASKS)


def test_the_audit_finds_every_worker_start_the_task_logs_show(audited: Audited) -> None:
    starts = {task: audited.worker_starts(task) for task in TASKS}
    assert starts["poke"] == 1 and starts["end_from_trigger"] == 1 and starts["deferred"] == 2
    assert starts["start_from_trigger"] == 0
    assert starts["reschedule"] >= 2
    assert {task: audited.row(task)["worker_runs"] for task in TASKS} == starts


def test_each_mode_waited_about_as_long(audited: Audited) -> None:
    for task in TASKS:
        wall = audited.seconds(task, "wall")
        assert WAIT * 0.5 < wall < WAIT * 3, (task, wall)
        if task != "reschedule":  # Airflow's duration of a rescheduled try covers its last poke only
            assert wall == pytest.approx(audited.watched.last[task]["duration"], rel=0.2, abs=2), task


def test_poke_mode_holds_a_worker_for_the_whole_wait(audited: Audited) -> None:
    wall, worker = audited.seconds("poke", "wall"), audited.seconds("poke", "worker_held")
    assert worker >= 0.9 * wall
    assert audited.seconds("poke", "idle_held") >= 0.5 * wall


def test_reschedule_mode_holds_a_worker_only_while_poking(audited: Audited) -> None:
    wall, worker = audited.seconds("reschedule", "wall"), audited.seconds("reschedule", "worker_held")
    assert 0 < worker <= 0.5 * wall
    assert worker * 2 < audited.seconds("poke", "worker_held")


@pytest.mark.parametrize("task", ["deferred", "end_from_trigger"])
def test_deferred_holds_a_worker_only_around_the_deferral(audited: Audited, task: str) -> None:
    wall, worker = audited.seconds(task, "wall"), audited.seconds(task, "worker_held")
    assert 0 < worker <= 0.3 * wall
    assert worker * 4 < audited.seconds("poke", "worker_held")


def test_a_wait_that_starts_and_ends_in_the_triggerer_holds_no_worker_at_all(audited: Audited) -> None:
    row = audited.row("start_from_trigger")
    assert row["worker_held_hours"] == 0 and row["worker_runs"] == 0 and row["runs"] == 1
    assert WAIT * 0.5 < audited.seconds("start_from_trigger", "wall") < WAIT * 3


def test_the_poke_sensor_is_the_first_to_migrate(audited: Audited) -> None:
    candidates = audited.report["candidates"]
    assert candidates[0]["task_id"] == "poke"
    # Already this kit's sensor (the serialized DAG's module says so): told to defer, not to migrate to itself.
    assert candidates[0]["advice"].startswith("deferrable=True, if not set (it is this kit's DateTimeSensor,")
    assert not {"deferred", "end_from_trigger", "start_from_trigger"} & {c["task_id"] for c in candidates}
    measured = {
        task: (
            round(audited.seconds(task, "wall"), 1),
            round(audited.seconds(task, "worker_held"), 1),
            audited.row(task)["worker_runs"],
        )
        for task in TASKS
    }
    print("wall s, worker-held s, worker runs:", measured)


def test_the_dag_shape_is_read_from_the_dag_airflow_serialized(audited: Audited) -> None:
    """The five waits run side by side: five first tasks, so none only starts its DAG."""
    url = f"sqlite:///{audited.airflow.home / 'airflow.db'}"
    engine = open_engine(url)
    try:
        with engine.connect() as connection:
            shape = dag_shape(connection, DAG_ID)
    finally:
        engine.dispose()
    assert shape is not None and shape.roots == set(TASKS) and shape.tasks == len(TASKS)
    assert not any(shape.starts_with(task) for task in TASKS)


def test_the_saving_in_words_and_the_html_page_use_the_measured_times(audited: Audited) -> None:
    held = {(h["operator"], h["mode"]): h for h in audited.report["held_by_sensor"]}
    kit = "DateTimeSensor (kit)"  # charted by module: the kit's sensor, not the official namesake
    assert set(held) == {(kit, "poke"), (kit, "reschedule"), (kit, "deferred")}
    poke, deferred = held[(kit, "poke")], held[(kit, "deferred")]
    assert poke["worker_held_hours"] >= 0.9 * poke["poke_would_hold_hours"]
    assert deferred["runs"] == 3 and deferred["worker_held_hours"] <= 0.3 * deferred["poke_would_hold_hours"]
    total = audited.report["sensors_total"]
    assert total["sentence"].startswith("All sensors (5 runs): a poke-mode sensor would have held ")
    # Airflow here loads no examples and no OpenLineage; the DB cannot prove it, so it is a condition.
    assert audited.report["listeners"]["registered"] is None
    # Both deferred sensors started on a worker: start in the triggerer, and the resumed one end there too.
    starting = {r["task_id"]: r for r in audited.report["recommendations"] if r["change"] == "start_from_trigger"}
    assert set(starting) == {"deferred", "end_from_trigger"}, audited.report["recommendations"]
    assert starting["deferred"]["condition"] == "Airflow 3.3 or later; no listener plugins"
    assert starting["deferred"]["advice"].startswith("no worker at all: start_from_trigger=True")
    assert starting["end_from_trigger"]["condition"] == "Airflow 3.3 or later"
    assert starting["deferred"]["saves_seconds"] == pytest.approx(audited.seconds("deferred", "worker_held"))
    # Started and ended in the triggerer already: nothing left to advise.
    assert "start_from_trigger" not in {r["task_id"] for r in audited.report["recommendations"]}
    assert audited.html.count('class="held"') == 3 and total["sentence"] in audited.html
