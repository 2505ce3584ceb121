"""Every parameter of every official sensor docs/migration.md names is covered, in code and in the doc.

The official signatures are read with ``ast`` from the providers' sensor modules shipped under
tests/fixtures/official (verbatim, never imported), so a new provider release dropped in there
shows at once which parameters a ported DAG could pass that this kit does not know.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

import pytest

from airflow_deferrable_kit.sensors.base import DeferrableSensor
from airflow_deferrable_kit.sensors.http import HttpBatchReadySensor
from airflow_deferrable_kit.sensors.kafka import KafkaMessageSensor
from airflow_deferrable_kit.sensors.postgres import PostgresBatchMarkerSensor
from airflow_deferrable_kit.sensors.s3 import S3KeySensor, S3KeysUnchangedSensor
from airflow_deferrable_kit.sensors.temporal import DateTimeSensor, TimeDeltaSensor, TimeSensor, WaitSensor
from tests import REPO

ROOT = REPO
OFFICIAL = ROOT / "tests" / "fixtures" / "official"
MIGRATION = ROOT / "docs" / "migration.md"


@dataclass(frozen=True)
class Official:
    """One official sensor: where its source is, and the kit's sensor that replaces it (if any)."""

    module: str
    name: str
    replacement: type[DeferrableSensor] | None


OFFICIAL_SENSORS = [
    Official("amazon/s3.py", "S3KeySensor", S3KeySensor),
    Official("amazon/s3.py", "S3KeysUnchangedSensor", S3KeysUnchangedSensor),
    Official("http/http.py", "HttpSensor", HttpBatchReadySensor),
    Official("common_sql/sql.py", "SqlSensor", PostgresBatchMarkerSensor),
    Official("apache_kafka/kafka.py", "AwaitMessageSensor", KafkaMessageSensor),
    Official("apache_kafka/kafka.py", "AwaitMessageTriggerFunctionSensor", KafkaMessageSensor),
    Official("standard/date_time.py", "DateTimeSensor", DateTimeSensor),
    Official("standard/date_time.py", "DateTimeSensorAsync", DateTimeSensor),
    Official("standard/time_delta.py", "TimeDeltaSensor", TimeDeltaSensor),
    Official("standard/time_delta.py", "WaitSensor", WaitSensor),
    Official("standard/time.py", "TimeSensor", TimeSensor),
]


def _classes() -> dict[str, ast.ClassDef]:
    """Every class of the fixture modules by name (the bases a sensor inherits parameters from)."""
    found: dict[str, ast.ClassDef] = {}
    for path in sorted(OFFICIAL.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, node)
    return found


def _base_names(node: ast.ClassDef) -> list[str]:
    names = []
    for base in node.bases:
        target = base.value if isinstance(base, ast.Subscript) else base
        if isinstance(target, ast.Name):
            names.append(target.id)
    return names


def official_parameters(name: str) -> list[str]:
    """The keyword parameters of ``name.__init__`` and of its bases found in the fixtures, in order."""
    classes = _classes()
    parameters: list[str] = []
    pending = [name]
    while pending:
        node = classes[pending.pop(0)]
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                arguments = item.args
                for argument in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
                    if argument.arg != "self" and argument.arg not in parameters:
                        parameters.append(argument.arg)
        pending.extend(base for base in _base_names(node) if base in classes)
    return parameters


def documented_parameters(name: str) -> set[str]:
    """The names in the ``official`` column of the migration.md section headed by ``name``."""
    sections = re.split(r"^## ", MIGRATION.read_text(), flags=re.MULTILINE)
    heading = re.compile(rf"[.`/ ]{re.escape(name)}(?:`| |$)")
    matching = [section for section in sections if heading.search(section.splitlines()[0])]
    assert matching, f"docs/migration.md has no section headed by {name}"
    names: set[str] = set()
    for section in matching:
        for line in section.splitlines():
            if line.startswith("| ") and not line.startswith("|---"):
                first_cell = line.split("|")[1]
                names.update(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", first_cell))
    return names


def test_the_fixtures_hold_every_official_sensor() -> None:
    for official in OFFICIAL_SENSORS:
        assert official_parameters(official.name), official


@pytest.mark.parametrize("official", OFFICIAL_SENSORS, ids=lambda official: official.name)
def test_every_official_parameter_is_in_migration_md(official: Official) -> None:
    missing = [name for name in official_parameters(official.name) if name not in documented_parameters(official.name)]
    assert missing == [], f"docs/migration.md does not say what becomes of {official.name}'s {missing}"


@pytest.mark.parametrize(
    "official", [o for o in OFFICIAL_SENSORS if o.replacement is not None], ids=lambda official: official.name
)
def test_every_official_parameter_is_accepted_aliased_or_refused(official: Official) -> None:
    sensor = official.replacement
    assert sensor is not None
    handled = sensor.accepted_parameter_names() | set(sensor.official_aliases) | set(sensor.official_refusals)
    unhandled = [name for name in official_parameters(official.name) if name not in handled]
    assert unhandled == [], (
        f"{sensor.__name__} would answer {official.name}'s {unhandled} with Airflow's generic 'Invalid arguments'"
    )


@pytest.mark.parametrize(
    "sensor", sorted({o.replacement for o in OFFICIAL_SENSORS if o.replacement}, key=lambda s: s.__name__)
)
def test_aliases_and_refusals_name_real_official_parameters(sensor: type[DeferrableSensor]) -> None:
    official = {name for o in OFFICIAL_SENSORS if o.replacement is sensor for name in official_parameters(o.name)}
    unknown = sorted((set(sensor.official_aliases) | set(sensor.official_refusals)) - official)
    assert unknown == []
    assert set(sensor.official_aliases.values()) <= sensor.accepted_parameter_names()
