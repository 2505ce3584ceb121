"""The worker-slot benchmark's DAGs: M sensors waiting for the same wall-clock moment, five ways.

``adk_worker_slots`` holds ``M`` DateTimeSensors per mode, all in one run so every mode shares
the same machine conditions: ``poke`` (a worker slot for the whole wait), ``reschedule`` (a slot
per poke), ``deferrable`` (a slot before deferring and after resuming) and ``end_from_trigger``
(a slot before deferring only) and ``start_from_trigger`` (with ``end_from_trigger``: no slot at
all, the scheduler defers the task and the triggerer ends it). Every sensor waits for
``dag_run.conf['target']`` and checks every ``poke_interval`` seconds, the same in every mode
(the trigger polls at that interval too).

``adk_worker_slots_warmup`` has the same sensors with a short wait and is run first: the first
tasks after Airflow starts wait seconds on a cold API server and triggerer, and the first task
each LocalExecutor worker process runs imports the task SDK's supervisor (seconds of CPU). All
4 x M warm-up tasks that run on a worker are queued at once, so every one of the 4 x M worker
processes takes one: a
deployment that has been up for a while does not pay these costs.

A worker parsing this file for a task builds only that task's DAG (``get_parsing_context``), so
the measured tasks do not pay for the warm-up DAG. The size comes from the environment, set by
``benchmarks/worker_slots.py`` for every Airflow component.
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

from airflow.sdk import DAG, get_parsing_context

from airflow_deferrable_kit.sensors.temporal import DateTimeSensor

DAG_ID = "adk_worker_slots"
WARMUP_DAG_ID = "adk_worker_slots_warmup"
MODES = ("poke", "reschedule", "deferrable", "end_from_trigger", "start_from_trigger")
SENSORS = int(os.environ.get("ADK_WORKER_SLOTS_SENSORS", "4"))
POKE_INTERVAL = float(os.environ.get("ADK_WORKER_SLOTS_POKE_INTERVAL", "30"))
TIMEOUT = float(os.environ.get("ADK_WORKER_SLOTS_TIMEOUT", "900"))
TARGET = "{{ dag_run.conf['target'] }}"
START = dt.datetime(2024, 1, 1)
TASKS = len(MODES) * SENSORS

MODE_ARGS: dict[str, dict[str, Any]] = {
    "poke": {"deferrable": False, "mode": "poke"},
    "reschedule": {"deferrable": False, "mode": "reschedule"},
    "deferrable": {"deferrable": True},
    "end_from_trigger": {"deferrable": True, "end_from_trigger": True},
    # Airflow 3.3+: the scheduler defers it and the triggerer renders the target and ends it.
    "start_from_trigger": {"start_from_trigger": True, "end_from_trigger": True},
}


def sensors(count: int, poke_interval: float) -> None:
    """``count`` sensors per mode, named ``<mode>_<n>``, in the DAG being defined."""
    for mode in MODES:
        for number in range(count):
            DateTimeSensor(
                task_id=f"{mode}_{number}",
                target_time=TARGET,
                poke_interval=poke_interval,
                timeout=TIMEOUT,
                **MODE_ARGS[mode],
            )


# None when the DAG processor parses the file: then both DAGs are built.
PARSING = get_parsing_context().dag_id

if PARSING in (None, DAG_ID):
    with DAG(dag_id=DAG_ID, schedule=None, start_date=START, catchup=False, max_active_tasks=TASKS):
        sensors(SENSORS, POKE_INTERVAL)

# Checks 15 s apart: a reschedule poke due sooner than the executor reports the previous one
# can make Airflow fail the task ("finished with state success, but the task instance's state
# attribute is queued"), and the executor's report can come up to [workers] min_heartbeat_interval
# (5 s) after the poke.
if PARSING in (None, WARMUP_DAG_ID):
    with DAG(dag_id=WARMUP_DAG_ID, schedule=None, start_date=START, catchup=False, max_active_tasks=TASKS):
        sensors(SENSORS, 15)
