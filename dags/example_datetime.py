"""Wall-clock waits without holding a worker slot: the run's moments, a time of day, a cool-down.

* ``wait_for_cutoff``: an absolute moment, templated from the run (``DateTimeSensor``).
* ``an_hour_after_the_interval``: one hour after the run's ``data_interval_end`` (``TimeDeltaSensor``).
* ``at_half_past_six``: 18:30 in the DAG's timezone (Europe/Amsterdam) on the run's date (``TimeSensor``).
* ``cool_down``: fifteen minutes after the task starts (``WaitSensor``), ended by the triggerer.

Each XCom is ``{"status": "success", "target_time": <UTC ISO 8601>}``. Nothing here needs a
connection, and parsing the file makes no network call.
"""

from __future__ import annotations

import datetime as dt

import pendulum
from airflow.sdk import DAG

from airflow_deferrable_kit.sensors.temporal import DateTimeSensor, TimeDeltaSensor, TimeSensor, WaitSensor

with DAG(
    dag_id="example_datetime_waits",
    schedule="@daily",
    start_date=pendulum.datetime(2024, 1, 1, tz="Europe/Amsterdam"),
    catchup=False,
    tags=["deferrable-kit", "datetime", "example"],
    doc_md=__doc__,
) as dag:
    wait_for_cutoff = DateTimeSensor(
        task_id="wait_for_cutoff",
        target_time="{{ data_interval_end.replace(hour=6) }}",
        deferrable=True,
        timeout=12 * 3600,  # one budget for the whole wait
    )
    an_hour_after_the_interval = TimeDeltaSensor(
        task_id="an_hour_after_the_interval",
        delta=dt.timedelta(hours=1),
        deferrable=True,
        soft_fail=True,  # skip, not fail, if the moment is beyond the timeout; errors still fail
    )
    at_half_past_six = TimeSensor(task_id="at_half_past_six", target_time=dt.time(18, 30), deferrable=True)
    cool_down = WaitSensor(
        task_id="cool_down",
        time_to_wait=dt.timedelta(minutes=15),
        deferrable=True,
        end_from_trigger=True,  # the triggerer finishes the task: no worker slot on resume
    )

    wait_for_cutoff >> an_hour_after_the_interval >> at_half_past_six >> cool_down
