"""The Waits plugin as Airflow loads it: found through the entry point, its nav entry declared,
and nothing of the page built in a component that is not the api-server."""

from __future__ import annotations

import json
import subprocess
import sys

from airflow_deferrable_kit.audit._triggers import kind_of
from airflow_deferrable_kit.plugins._describe import describe

# Run in a fresh interpreter: what a scheduler, worker or triggerer does when it loads plugins.
LOAD_PLUGINS = """
import json, sys
from airflow import plugins_manager
plugins_manager.ensure_plugins_loaded()
plugins = {p.name: p for p in plugins_manager._get_plugins()[0]}
waits = plugins.get("deferrable_kit_waits")
print(json.dumps({
    "found": waits is not None,
    "views": list(getattr(waits, "external_views", [])),
    "built": bool(waits is not None and waits.fastapi_apps.built),
    "app_imported": "airflow_deferrable_kit.plugins._app" in sys.modules,
}))
"""


def test_every_component_finds_the_plugin_and_builds_nothing_of_the_page() -> None:
    out = subprocess.run([sys.executable, "-c", LOAD_PLUGINS], capture_output=True, text=True, check=True).stdout
    loaded = json.loads(out.strip().splitlines()[-1])

    assert loaded["found"] is True
    assert loaded["views"] == [
        {
            "name": "Waits",
            "href": "/deferrable-kit/waits",
            "url_route": "waits",
            "destination": "nav",
            "category": "browse",
        }
    ]
    assert loaded["built"] is False and loaded["app_imported"] is False


def test_only_the_kits_triggers_are_described_and_never_with_secrets() -> None:
    http = describe(
        "airflow_deferrable_kit.triggers.http.HttpBatchReadyTrigger",
        json.dumps({"http_conn_id": "api", "endpoint": "v1/x?token=s3cret", "json_body": {"password": "p"}}),
    )
    other = describe("airflow.providers.http.triggers.http.HttpTrigger", json.dumps({"endpoint": "v1/x"}))

    assert (http.kind, http.target) == ("http", "api: GET v1/x?token=…")
    assert (other.kind, other.target) == ("", "")
    assert kind_of("airflow_deferrable_kit.triggers.temporal.DateTimeTrigger") == "datetime"
