"""The triggerer's garbage-collector opt-in: applied by the first kit trigger that runs, once.

Collector thresholds are process-wide, so each case runs in a fresh Python process, as a
triggerer is one: a trigger built there (as a worker or the DAG processor builds one) changes
nothing, the first one run applies the setting, later ones do not apply it again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from airflow_deferrable_kit._collector import EXAMPLE, OPTION, SECTION, parse_thresholds
from airflow_deferrable_kit.get_provider_info import get_provider_info
from tests import REPO

ENV = "AIRFLOW__DEFERRABLE_KIT__TRIGGERER_GC_THRESHOLDS"

PROCESS = """
import asyncio, gc, json, os
from airflow_deferrable_kit.testing import run_trigger_payload
from airflow_deferrable_kit.triggers.temporal import DateTimeTrigger

seen = {"start": gc.get_threshold()}
trigger = DateTimeTrigger(target_time="2020-01-01T00:00:00+00:00")
seen["built"] = gc.get_threshold()
asyncio.run(run_trigger_payload(trigger))
seen["ran"] = gc.get_threshold()
# The setting changed after the first trigger ran: not applied again.
os.environ["AIRFLOW__DEFERRABLE_KIT__TRIGGERER_GC_THRESHOLDS"] = "1234,5,6"
asyncio.run(run_trigger_payload(DateTimeTrigger(target_time="2020-01-01T00:00:00+00:00")))
seen["again"] = gc.get_threshold()
print(json.dumps(seen))
"""


def run_process(value: str | None) -> tuple[dict[str, list[int]], str]:
    env = {key: val for key, val in os.environ.items() if key != ENV}
    if value is not None:
        env[ENV] = value
    done = subprocess.run(
        [sys.executable, "-c", PROCESS], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stdout + done.stderr


def test_the_first_trigger_run_in_a_process_applies_the_thresholds_once() -> None:
    seen, _ = run_process(EXAMPLE)
    assert seen["built"] == seen["start"]  # building a trigger (a worker, the DAG processor) changes nothing
    assert seen["ran"] == [50000, 5, 1000]
    assert seen["again"] == [50000, 5, 1000]


def test_by_default_the_collector_is_left_as_it_is() -> None:
    seen, _ = run_process(None)
    assert seen["start"] == seen["built"] == seen["ran"] == seen["again"]


def test_a_bad_value_is_logged_naming_the_option_and_changes_nothing() -> None:
    seen, output = run_process("50000,5")
    assert seen["start"] == seen["ran"] == seen["again"]
    assert f"[{SECTION}] {OPTION} must be three whole numbers" in output, output[-2000:]


@pytest.mark.parametrize(
    ("value", "expected"),
    [("", None), ("  ", None), ("50000,5,1000", (50000, 5, 1000)), (" 700 , 10, 10 ", (700, 10, 10))],
)
def test_the_value_is_three_whole_numbers_or_empty(value: str, expected: tuple[int, int, int] | None) -> None:
    assert parse_thresholds(value) == expected


@pytest.mark.parametrize("value", ["50000,5", "a,b,c", "0,5,1000", "50000,-1,10", "1.5,2,3", "1,2,3,4"])
def test_anything_else_is_refused_naming_the_option_and_the_form(value: str) -> None:
    with pytest.raises(ValueError, match=rf"\[{SECTION}\] {OPTION} must be three whole numbers.*{EXAMPLE}"):
        parse_thresholds(value)


def test_the_option_is_declared_to_airflow_off_by_default() -> None:
    option = get_provider_info()["config"][SECTION]["options"][OPTION]
    assert option["default"] == "" and option["example"] == EXAMPLE and option["type"] == "string"
