"""Packaging: Airflow's providers manager finds the package with its sensors and triggers."""

from __future__ import annotations

import importlib

from airflow.providers_manager import ProvidersManager

from airflow_deferrable_kit.get_provider_info import get_provider_info


def test_providers_manager_lists_the_package_with_its_triggers_and_sensors() -> None:
    manager = ProvidersManager()
    assert "airflow-deferrable-kit" in manager.providers
    trigger_modules = {t.trigger_class_name for t in manager.trigger if t.package_name == "airflow-deferrable-kit"}
    assert "airflow_deferrable_kit.triggers.temporal" in trigger_modules
    info = manager.providers["airflow-deferrable-kit"].data
    sensor_modules = {m for group in info["sensors"] for m in group["python-modules"]}
    assert "airflow_deferrable_kit.sensors.temporal" in sensor_modules


def test_every_listed_module_imports() -> None:
    info = get_provider_info()
    modules = [m for key in ("sensors", "triggers") for group in info[key] for m in group["python-modules"]]
    assert modules
    for module in modules:
        importlib.import_module(module)


def test_trigger_modules_import_nothing_from_the_sensor_side() -> None:
    import subprocess
    import sys

    info = get_provider_info()
    modules = [m for group in info["triggers"] for m in group["python-modules"]]
    code = (
        f"import sys, {', '.join(modules)}; "
        "bad = [m for m in sys.modules if m.startswith('airflow_deferrable_kit.sensors')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"trigger modules pull in sensor code: {result.stdout}{result.stderr[-500:]}"
