"""Connection types for hosts that run the kit without the official providers.

The kit reads ``aws``, ``http``, ``postgres`` and ``kafka`` connections itself (in the triggerer,
asynchronously); it needs no hook to use them. But Airflow's UI offers a connection type only if
an installed provider declares it with a hook class, so on an Airflow without the official
amazon, http, postgres or apache-kafka provider a user could not create the connection a wait
needs. These classes fill that gap and nothing more: ``get_provider_info`` declares one only
where its official provider is absent, so they never shadow the official forms (it names them
without importing this module, which imports Airflow's hook machinery).
"""

from __future__ import annotations

from typing import Any, ClassVar

from airflow.sdk import BaseHook


class KitConnectionHook(BaseHook):
    """A connection type the kit's waits read; it has no client of its own (``get_conn``)."""

    conn_name_attr: ClassVar[str]
    default_conn_name: ClassVar[str]
    conn_type: ClassVar[str]
    hook_name: ClassVar[str]
    #: The official provider whose own hook declares this connection type.
    official_module: ClassVar[str]
    #: Field labels and placeholders for the UI form (``get_ui_field_behaviour``).
    relabeling: ClassVar[dict[str, str]] = {}
    placeholders: ClassVar[dict[str, str]] = {}
    hidden_fields: ClassVar[list[str]] = []

    def __init__(self, conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.conn_id = conn_id or self.default_conn_name

    def get_conn(self) -> Any:
        raise NotImplementedError(
            f"{type(self).__name__} only declares the {self.conn_type!r} connection type for the UI; the kit's "
            "waits read the connection themselves"
        )

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": list(cls.hidden_fields),
            "relabeling": dict(cls.relabeling),
            "placeholders": dict(cls.placeholders),
        }


class AwsConnectionHook(KitConnectionHook):
    conn_name_attr = "aws_conn_id"
    default_conn_name = "aws_default"
    conn_type = "aws"
    hook_name = "Amazon Web Services"
    official_module = "airflow.providers.amazon"
    hidden_fields = ["host", "schema", "port"]
    relabeling = {"login": "AWS Access Key ID", "password": "AWS Secret Access Key"}
    placeholders = {"extra": '{"region_name": "eu-west-1", "endpoint_url": "https://s3.example.com"}'}


class HttpConnectionHook(KitConnectionHook):
    conn_name_attr = "http_conn_id"
    default_conn_name = "http_default"
    conn_type = "http"
    hook_name = "HTTP"
    official_module = "airflow.providers.http"
    placeholders = {"host": "https://api.example.com", "extra": '{"Accept": "application/json"}'}


class PostgresConnectionHook(KitConnectionHook):
    conn_name_attr = "postgres_conn_id"
    default_conn_name = "postgres_default"
    conn_type = "postgres"
    hook_name = "Postgres"
    official_module = "airflow.providers.postgres"
    relabeling = {"schema": "Database"}


class KafkaConnectionHook(KitConnectionHook):
    conn_name_attr = "kafka_config_id"
    default_conn_name = "kafka_default"
    conn_type = "kafka"
    hook_name = "Apache Kafka"
    official_module = "airflow.providers.apache.kafka"
    hidden_fields = ["schema"]
    relabeling = {"host": "Bootstrap servers"}
    placeholders = {"host": "broker-1:9092,broker-2:9092", "extra": '{"security.protocol": "SASL_SSL"}'}
