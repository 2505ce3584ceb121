"""Provider metadata for Airflow's providers manager (``apache_airflow_provider`` entry point).

It follows the shape of an official provider's ``get_provider_info()``: one integration per
external system the kit waits on, and ``sensors`` / ``triggers`` groups that name their
integration, so Airflow's providers listing shows each wait where a user would look for it.
Airflow takes the provider's documentation link from ``[project.urls] Documentation`` in
pyproject.toml; the integration links below point at the page of each wait in the same docs.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from airflow_deferrable_kit import __version__

REPOSITORY_URL = "https://github.com/airflow-deferrable-kit/airflow-deferrable-kit"
DOCS_URL = f"{REPOSITORY_URL}/tree/main/docs"

# (module name under sensors/ and triggers/, integration name, docs page under docs/, tags).
# Names and tags follow the official providers' integrations for the same systems; tags come
# from the closed list in Airflow's provider.yaml schema.
_WAITS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("s3", "Amazon Simple Storage Service (S3)", "sensors/s3.md", ("aws",)),
    ("http", "Hypertext Transfer Protocol (HTTP)", "sensors/http.md", ("protocol",)),
    ("postgres", "PostgreSQL", "sensors/postgres.md", ("software",)),
    ("kafka", "Apache Kafka", "sensors/kafka.md", ("apache",)),
    ("temporal", "Date and time", "sensors/datetime.md", ("apache",)),
)
# The base trigger and sensor are for writing your own waits; they get an integration of their own.
_OWN_WAITS = ("Deferrable Kit: your own waits", "writing-your-own-wait.md", ("apache",))
# More trigger modules of an integration, listed with its wait: module under triggers/ -> theirs.
# Its other waits (S3: the inactivity wait) and its event triggers (for AssetWatcher).
_MORE_TRIGGER_MODULES: dict[str, tuple[str, ...]] = {
    "s3": ("s3_unchanged", "s3_events"),
    "postgres": ("postgres_events",),
    "http": ("http_events", "http_jobs"),
    "kafka": ("kafka_events",),
    "base": ("events", "official_events", "subclassing", "timing"),
}

# Integrations that also have an operator module under operators/ (one that starts remote work).
_OPERATOR_MODULES = ("http",)

# The connection types the waits read: (type, hook class in airflow_deferrable_kit.hooks, its UI
# name, the official provider that declares the type itself). Named, not imported: the hooks
# import Airflow's hook machinery, which may itself be reading this provider's info.
CONNECTION_TYPES: tuple[tuple[str, str, str, str], ...] = (
    ("aws", "AwsConnectionHook", "Amazon Web Services", "airflow.providers.amazon"),
    ("http", "HttpConnectionHook", "HTTP", "airflow.providers.http"),
    ("postgres", "PostgresConnectionHook", "Postgres", "airflow.providers.postgres"),
    ("kafka", "KafkaConnectionHook", "Apache Kafka", "airflow.providers.apache.kafka"),
)


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (a missing parent package counts as not installed)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def connection_types() -> list[dict[str, str]]:
    """Each connection type the waits read whose official provider is not installed (where it
    is, its own hook and form are the ones Airflow shows: Airflow keeps the first provider to
    register a type, and this package's name sorts before the official ones)."""
    return [
        {"connection-type": conn_type, "hook-class-name": f"airflow_deferrable_kit.hooks.{hook}", "hook-name": name}
        for conn_type, hook, name, official in CONNECTION_TYPES
        if not installed(official)
    ]


def _trigger_modules(module: str) -> list[str]:
    """The wait's trigger module and the other trigger modules of its integration."""
    return [f"airflow_deferrable_kit.triggers.{name}" for name in (module, *_MORE_TRIGGER_MODULES.get(module, ()))]


def _doc_url(page: str) -> str:
    """The web address of one page under docs/ in the repository."""
    return f"{REPOSITORY_URL}/blob/main/docs/{page}"


def get_provider_info() -> dict[str, Any]:
    own_name, own_page, own_tags = _OWN_WAITS
    return {
        "package-name": "airflow-deferrable-kit",
        "name": "Deferrable Kit",
        "description": "Deferrable sensors and natively async triggers for S3, HTTP, Postgres, Kafka "
        "and wall-clock waits, a deferrable HTTP job operator that submits once, plus a base trigger for "
        "writing your own.",
        "versions": [__version__],
        "integrations": [
            *(
                {"integration-name": name, "external-doc-url": _doc_url(page), "tags": list(tags)}
                for _, name, page, tags in _WAITS
            ),
            {"integration-name": own_name, "external-doc-url": _doc_url(own_page), "tags": list(own_tags)},
        ],
        "sensors": [
            *(
                {"integration-name": name, "python-modules": [f"airflow_deferrable_kit.sensors.{module}"]}
                for module, name, _, _ in _WAITS
            ),
            {"integration-name": own_name, "python-modules": ["airflow_deferrable_kit.sensors.base"]},
        ],
        # Operators that start remote work and defer only its wait (HTTP jobs), under their integration.
        "operators": [
            {"integration-name": name, "python-modules": [f"airflow_deferrable_kit.operators.{module}"]}
            for module, name, _, _ in _WAITS
            if module in _OPERATOR_MODULES
        ],
        "triggers": [
            *({"integration-name": name, "python-modules": _trigger_modules(module)} for module, name, _, _ in _WAITS),
            {"integration-name": own_name, "python-modules": _trigger_modules("base")},
        ],
        # Only the types whose official provider is absent: never in place of the official forms.
        "connection-types": connection_types(),
        "config": {
            "deferrable_kit": {
                "description": "Settings of airflow-deferrable-kit in the triggerer.",
                "options": {
                    "triggerer_gc_thresholds": {
                        "description": "Garbage-collector thresholds (three whole numbers, as gc.set_threshold "
                        "takes them) that the kit applies in a triggerer process when the first of its triggers "
                        "starts there. Empty, the default, leaves the collector as it is. With thousands of "
                        "waits in one triggerer, 50000,5,1000 made full collections, its longest loop stalls, "
                        "rare (docs/operations.md, Large triggerers).",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "50000,5,1000",
                        "default": "",
                    },
                },
            },
        },
    }
