"""Wait for a Postgres batch-marker row without holding a worker slot."""

from __future__ import annotations

from typing import Any

from airflow_deferrable_kit.sensors.base import DeferrableSensor, is_unresolved
from airflow_deferrable_kit.triggers.postgres import PostgresBatchMarkerTrigger, validate_identifiers


def _as_list(value: Any) -> Any:
    """``None`` -> ``[]`` and tuples -> lists: trigger kwargs are JSON, which has no tuples."""
    if value is None:
        return []
    return list(value) if isinstance(value, tuple) else value


class PostgresBatchMarkerSensor(DeferrableSensor):
    """Succeed when a marker row appears (or a query's first row says "ready").

    Declarative: ``table`` + ``match`` (+ ``status_column`` with ``ready_values`` /
    ``failed_values``). Custom: ``sql`` with ``$1..$n`` bound to ``parameters``, judged by
    ``success`` / ``failure`` / ``retry`` acceptors on the row's columns. The success payload
    (the task's XCom) carries the matched row as JSON. See docs/sensors/postgres.md.

    Identifiers are checked when the DAG is parsed, even when other arguments are templates.
    """

    trigger_class = PostgresBatchMarkerTrigger
    template_fields = (
        "table",
        "match",
        "ready_values",
        "failed_values",
        "sql",
        "parameters",
        "acceptors",
        "success",
        "failure",
        "retry",
    )
    template_ext = (".sql",)
    file_template_fields = ("sql",)
    template_fields_renderers = {"sql": "sql", "match": "json", "parameters": "json"}
    ui_color = "#dce9f5"

    def __init__(
        self,
        *,
        postgres_conn_id: str = "postgres_default",
        table: str | None = None,
        match: dict[str, Any] | None = None,
        status_column: str | None = None,
        ready_values: list[Any] | None = None,
        failed_values: list[Any] | None = None,
        order_by: list[str] | None = None,
        sql: str | None = None,
        parameters: list[Any] | None = None,
        acceptors: list[dict[str, Any]] | None = None,
        success: list[dict[str, Any]] | None = None,
        failure: list[dict[str, Any]] | None = None,
        retry: list[dict[str, Any]] | None = None,
        predicate: str | None = None,
        notify_channel: str | None = None,
        statement_timeout: float = 30.0,
        **kwargs: Any,
    ) -> None:
        validate_identifiers(
            table=table,
            match=match,
            status_column=status_column,
            order_by=order_by,
            notify_channel=notify_channel,
            skip=is_unresolved,
        )
        super().__init__(
            postgres_conn_id=postgres_conn_id,
            table=table,
            match={} if match is None else match,
            status_column=status_column,
            ready_values=_as_list(ready_values),
            failed_values=_as_list(failed_values),
            order_by=_as_list(order_by),
            sql=sql,
            parameters=_as_list(parameters),
            acceptors=_as_list(acceptors),
            success=_as_list(success),
            failure=_as_list(failure),
            retry=_as_list(retry),
            predicate=predicate,
            notify_channel=notify_channel,
            statement_timeout=statement_timeout,
            **kwargs,
        )
