"""With listener plugins loaded, ``end_from_trigger=True`` never makes a DAG file unparsable.

Airflow's DagBag refuses every task with ``end_from_trigger=True`` while a listener is registered
(``dag_processing/dagbag.py``): Airflow's own example listener plugin with ``load_examples=True``,
every OpenLineage deployment (tested with the OpenLineage provider configured). The kit's sensors
then resume on a worker instead, and say so once. Each case parses in a fresh Airflow process,
as the DAG processor would, since plugins are loaded once per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scripts.airflow_local import without_airflow_settings
from tests import REPO

ROOT = REPO
EXAMPLE_DAGS = ROOT / "dags"

PARSE = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
from airflow.listeners.listener import get_listener_manager

bag = DagBag(dag_folder=sys.argv[1])
print("ADK-RESULT " + json.dumps({
    "listeners": get_listener_manager().has_listeners,
    "errors": {path: str(error)[-400:] for path, error in bag.import_errors.items()},
    "end_from_trigger": {
        f"{dag.dag_id}.{task.task_id}": getattr(task, "end_from_trigger", None)
        for dag in bag.dags.values() for task in dag.tasks
    },
    "start_from_trigger": {
        f"{dag.dag_id}.{task.task_id}": [
            getattr(task, "start_from_trigger", None),
            (getattr(task, "start_trigger_args", None) and task.start_trigger_args.trigger_kwargs or {}).get(
                "end_from_trigger"
            ),
        ]
        for dag in bag.dags.values() for task in dag.tasks
    },
}))
"""

#: Airflow refuses a task that keeps end_from_trigger=True with a listener (the rule is real).
CONTROL_DAG = """
import datetime as dt
from airflow.sdk import DAG, BaseOperator

class Ends(BaseOperator):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.end_from_trigger = True

with DAG(dag_id="adk_control", schedule=None, start_date=dt.datetime(2024, 1, 1)):
    Ends(task_id="ends")
"""


def parse(folder: Path, tmp_path: Path, **settings: str) -> dict[str, Any]:
    env = without_airflow_settings(os.environ)
    env.update({"AIRFLOW_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT), **settings})
    done = subprocess.run(
        [sys.executable, "-c", PARSE, str(folder)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("ADK-RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("ADK-RESULT "))
    result["output"] = done.stderr + done.stdout
    return result


@pytest.fixture(scope="module")
def with_example_listener(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return parse(EXAMPLE_DAGS, tmp_path_factory.mktemp("listener"), AIRFLOW__CORE__LOAD_EXAMPLES="True")


def test_the_example_dags_import_with_airflows_example_listener_loaded(with_example_listener: dict[str, Any]) -> None:
    assert with_example_listener["listeners"] is True
    assert with_example_listener["errors"] == {}
    asked = [task for task, value in with_example_listener["end_from_trigger"].items() if value is not None]
    assert asked and not any(with_example_listener["end_from_trigger"][task] for task in asked)


def test_the_sensor_says_once_that_end_from_trigger_is_off(with_example_listener: dict[str, Any]) -> None:
    said = with_example_listener["output"].count("end_from_trigger=True is turned off")
    assert said == 1, with_example_listener["output"][-3000:]


def test_without_listeners_end_from_trigger_stays_on(tmp_path: Path) -> None:
    result = parse(EXAMPLE_DAGS, tmp_path, AIRFLOW__CORE__LOAD_EXAMPLES="False")
    assert result["listeners"] is False and result["errors"] == {}
    assert any(result["end_from_trigger"].values())
    assert "end_from_trigger=True is turned off" not in result["output"]


def test_the_example_dags_import_with_openlineage_configured(tmp_path: Path) -> None:
    """The deployment most users have: the OpenLineage provider installed and given a transport,
    which registers its listener in every Airflow process."""
    result = parse(
        EXAMPLE_DAGS,
        tmp_path,
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__OPENLINEAGE__TRANSPORT='{"type": "console"}',
        AIRFLOW__OPENLINEAGE__NAMESPACE="adk-test",
    )
    assert result["listeners"] is True, "the OpenLineage listener was not registered"
    assert result["errors"] == {}
    asked = [task for task, value in result["end_from_trigger"].items() if value is not None]
    assert asked and not any(result["end_from_trigger"][task] for task in asked)
    assert result["output"].count("end_from_trigger=True is turned off") == 1


def test_airflow_refuses_end_from_trigger_with_a_listener_loaded(tmp_path: Path) -> None:
    """The control: the rule the sensors step around is Airflow's, and it still holds."""
    folder = tmp_path / "control"
    folder.mkdir()
    (folder / "control.py").write_text(CONTROL_DAG)
    result = parse(folder, tmp_path, AIRFLOW__CORE__LOAD_EXAMPLES="True")
    assert result["listeners"] is True
    assert any("Listeners are not supported with end_from_trigger=True" in e for e in result["errors"].values())
