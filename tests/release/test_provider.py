"""Packaging: Airflow's providers manager finds the package with its sensors and triggers, and the
provider metadata is what Airflow's own schemas accept."""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys
from importlib.resources import files
from typing import Any

import jsonschema
import pytest
from airflow.providers_manager import ProvidersManager

import airflow_deferrable_kit.sensors
import airflow_deferrable_kit.triggers
from airflow_deferrable_kit.get_provider_info import DOCS_URL, REPOSITORY_URL, get_provider_info
from tests import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest brings tomli on Python 3.10
    import tomli as tomllib

ROOT = REPO


def _airflow_schema(name: str) -> dict[str, Any]:
    """One of the JSON schemas that ship inside the installed apache-airflow."""
    schema: dict[str, Any] = json.loads(files("airflow").joinpath(name).read_text())
    return schema


def _listed_modules(key: str) -> set[str]:
    return {m for group in get_provider_info()[key] for m in group["python-modules"]}


def test_providers_manager_lists_the_package_with_its_triggers_and_sensors() -> None:
    manager = ProvidersManager()
    assert "airflow-deferrable-kit" in manager.providers
    trigger_modules = {t.trigger_class_name for t in manager.trigger if t.package_name == "airflow-deferrable-kit"}
    assert "airflow_deferrable_kit.triggers.temporal" in trigger_modules
    info = manager.providers["airflow-deferrable-kit"].data
    sensor_modules = {m for group in info["sensors"] for m in group["python-modules"]}
    assert "airflow_deferrable_kit.sensors.temporal" in sensor_modules


def test_providers_manager_links_the_repository_docs() -> None:
    """Airflow shows ``[project.urls] Documentation`` of the installed package as the provider's docs."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["urls"]["Documentation"] == DOCS_URL
    assert pyproject["project"]["urls"]["Source"] == REPOSITORY_URL
    info = ProvidersManager().providers["airflow-deferrable-kit"].data
    # Airflow 3.2.0 keeps the blank after the comma of "Documentation, <url>"; later versions strip it.
    assert info["documentation-url"].strip() == DOCS_URL, "installed metadata is stale: reinstall with `make venv`"


def test_provider_info_is_valid_against_airflows_own_schema() -> None:
    jsonschema.validate(get_provider_info(), _airflow_schema("provider_info.schema.json"))


def test_integrations_follow_the_provider_yaml_schema() -> None:
    """The stricter provider.yaml schema official providers are held to: required keys, known tags."""
    integration_schema = _airflow_schema("provider.yaml.schema.json")["properties"]["integrations"]
    integrations = get_provider_info()["integrations"]
    jsonschema.validate(integrations, integration_schema)
    assert len({i["integration-name"] for i in integrations}) == len(integrations)


def test_there_is_one_integration_per_wait() -> None:
    names = {i["integration-name"] for i in get_provider_info()["integrations"]}
    assert {
        "Amazon Simple Storage Service (S3)",
        "Hypertext Transfer Protocol (HTTP)",
        "PostgreSQL",
        "Apache Kafka",
        "Date and time",
    } <= names


@pytest.mark.parametrize("key", ["sensors", "triggers"])
def test_every_group_names_an_integration_the_provider_declares(key: str) -> None:
    info = get_provider_info()
    declared = {i["integration-name"] for i in info["integrations"]}
    assert {group["integration-name"] for group in info[key]} <= declared


@pytest.mark.parametrize(
    ("key", "package"), [("sensors", airflow_deferrable_kit.sensors), ("triggers", airflow_deferrable_kit.triggers)]
)
def test_every_sensor_and_trigger_module_is_listed(key: str, package: Any) -> None:
    shipped = {f"{package.__name__}.{m.name}" for m in pkgutil.iter_modules(package.__path__)}
    assert _listed_modules(key) == shipped


def test_every_integration_links_a_docs_page_that_exists() -> None:
    prefix = f"{REPOSITORY_URL}/blob/main/"
    for integration in get_provider_info()["integrations"]:
        url = integration["external-doc-url"]
        assert url.startswith(prefix), url
        assert (ROOT / url.removeprefix(prefix)).is_file(), url


def test_every_listed_module_imports() -> None:
    modules = _listed_modules("sensors") | _listed_modules("triggers")
    assert modules
    for module in modules:
        importlib.import_module(module)


def test_trigger_modules_import_nothing_from_the_sensor_side() -> None:
    import subprocess

    modules = sorted(_listed_modules("triggers"))
    code = (
        f"import sys, {', '.join(modules)}; "
        "bad = [m for m in sys.modules if m.startswith('airflow_deferrable_kit.sensors')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"trigger modules pull in sensor code: {result.stdout}{result.stderr[-500:]}"


def test_the_connection_types_the_waits_read_are_offered_where_no_official_provider_declares_them() -> None:
    """Without the official amazon, http, postgres and apache-kafka providers (as in this test
    environment) Airflow's UI still offers every connection type a wait reads, through the kit."""
    from airflow_deferrable_kit import get_provider_info as info_module
    from airflow_deferrable_kit import hooks

    declared = {entry["connection-type"]: entry["hook-class-name"] for entry in info_module.connection_types()}
    absent = {row[0] for row in info_module.CONNECTION_TYPES if not info_module.installed(row[3])}
    assert absent == {"aws", "http", "postgres", "kafka"}  # the premise of this test
    assert set(declared) == absent
    for conn_type, hook_name, ui_name, official in info_module.CONNECTION_TYPES:  # the table matches the classes
        hook = getattr(hooks, hook_name)
        assert (hook.conn_type, hook.hook_name, hook.official_module) == (conn_type, ui_name, official)
    registered = ProvidersManager().hooks
    for conn_type in absent:
        info = registered[conn_type]
        assert info is not None and info.package_name == "airflow-deferrable-kit", conn_type
        assert info.connection_id_attribute_name.endswith("_id")
    behaviour = hooks.AwsConnectionHook.get_ui_field_behaviour()
    assert behaviour["relabeling"]["login"] == "AWS Access Key ID" and "port" in behaviour["hidden_fields"]


def test_a_connection_type_is_never_declared_beside_its_official_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the official provider installed its own hook and form are the ones Airflow shows."""
    from airflow_deferrable_kit import get_provider_info as info_module

    monkeypatch.setattr(info_module, "installed", lambda module: module == "airflow.providers.amazon")
    assert {entry["connection-type"] for entry in info_module.connection_types()} == {"http", "postgres", "kafka"}
