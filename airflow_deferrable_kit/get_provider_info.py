"""Provider metadata for Airflow's providers manager (``apache_airflow_provider`` entry point)."""

from __future__ import annotations

from typing import Any

from airflow_deferrable_kit import __version__

_WAITS = ("temporal", "s3", "http", "postgres", "kafka")


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-deferrable-kit",
        "name": "Deferrable Kit",
        "description": "Deferrable sensors and natively async triggers for S3, HTTP, Postgres, Kafka "
        "and wall-clock waits, plus a base trigger for writing your own.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "Deferrable Kit",
                "external-doc-url": "https://pypi.org/project/airflow-deferrable-kit/",
            }
        ],
        "sensors": [
            {
                "integration-name": "Deferrable Kit",
                "python-modules": [f"airflow_deferrable_kit.sensors.{wait}" for wait in _WAITS],
            }
        ],
        "triggers": [
            {
                "integration-name": "Deferrable Kit",
                "python-modules": [
                    "airflow_deferrable_kit.triggers.base",
                    *(f"airflow_deferrable_kit.triggers.{wait}" for wait in _WAITS),
                ],
            }
        ],
    }
