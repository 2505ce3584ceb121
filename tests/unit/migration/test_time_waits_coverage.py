"""The official TimeDeltaSensor / WaitSensor / TimeSensor parameters: handled by the kit's sensors, documented.

The same checks as test_migration_coverage.py, for the sensors that replace these three.
"""

from __future__ import annotations

import pytest

from airflow_deferrable_kit.sensors.base import DeferrableSensor
from airflow_deferrable_kit.sensors.temporal import TimeDeltaSensor, TimeSensor, WaitSensor
from tests.unit.migration.test_migration_coverage import documented_parameters, official_parameters

REPLACEMENTS: list[tuple[str, type[DeferrableSensor]]] = [
    ("TimeDeltaSensor", TimeDeltaSensor),
    ("TimeDeltaSensorAsync", TimeDeltaSensor),
    ("WaitSensor", WaitSensor),
    ("TimeSensor", TimeSensor),
    ("TimeSensorAsync", TimeSensor),
]


@pytest.mark.parametrize(("official", "sensor"), REPLACEMENTS, ids=[name for name, _ in REPLACEMENTS])
def test_every_official_parameter_is_handled_and_documented(official: str, sensor: type[DeferrableSensor]) -> None:
    parameters = official_parameters(official)
    handled = sensor.accepted_parameter_names() | set(sensor.official_aliases) | set(sensor.official_refusals)
    assert [name for name in parameters if name not in handled] == []
    assert [name for name in parameters if name not in documented_parameters(official)] == []


@pytest.mark.parametrize("sensor", [TimeDeltaSensor, WaitSensor, TimeSensor], ids=lambda s: s.__name__)
def test_aliases_and_refusals_name_real_official_parameters(sensor: type[DeferrableSensor]) -> None:
    official = {name for o, s in REPLACEMENTS if s is sensor for name in official_parameters(o)}
    assert sorted((set(sensor.official_aliases) | set(sensor.official_refusals)) - official) == []


@pytest.mark.parametrize("official", ["TimeDeltaSensor", "WaitSensor", "TimeSensor"])
def test_the_section_says_which_sensor_to_use(official: str) -> None:
    from tests.unit.migration.test_migration_coverage import MIGRATION

    section = next(
        s
        for s in MIGRATION.read_text().split("\n## ")
        if s.splitlines()[0].endswith(f".{official}`") or f".{official}` /" in s.splitlines()[0]
    )
    assert f"Use `airflow_deferrable_kit.sensors.temporal.{official}`" in section
