"""Wait for a Postgres batch-marker row without holding a worker slot."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

from airflow_deferrable_kit.sensors.base import (
    DeferrableSensor,
    OfficialRefusal,
    if_callable,
    is_unresolved,
    unless_default,
    unless_empty,
)
from airflow_deferrable_kit.triggers.postgres import PostgresBatchMarkerTrigger, validate_identifiers


def _as_list(value: Any) -> Any:
    """``None`` -> ``[]`` and tuples -> lists: trigger kwargs are JSON, which has no tuples."""
    if value is None:
        return []
    return list(value) if isinstance(value, tuple) else value


#: psycopg's placeholders, ``%s`` and ``%(name)s`` (not ``%%s``, an escaped percent sign).
_PSYCOPG_PLACEHOLDER = re.compile(r"(?<!%)%(?:\((?P<name>[A-Za-z_][A-Za-z0-9_]*)\))?s")
#: What is not SQL code: string literals, quoted identifiers and comments, where ``%s`` is text
#: (``LIKE '%sales%'``), kept as the odd pieces of ``re.split``.
_NOT_CODE = re.compile(r"('(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|/\*.*?\*/)", re.DOTALL)


def _numbered(sql: str) -> str | None:
    """``sql`` with psycopg placeholders as ``$1, $2, ...`` in order (a named one reused); ``None`` if none."""
    numbers: dict[str, int] = {}
    found = False

    def number(match: re.Match[str]) -> str:
        nonlocal found
        found = True
        name = match.group("name")
        if name is None or name not in numbers:
            numbers[name if name is not None else f"#{len(numbers)}"] = len(numbers) + 1
            return f"${len(numbers)}"
        return f"${numbers[name]}"

    pieces = _NOT_CODE.split(sql)
    rewritten = "".join(piece if i % 2 else _PSYCOPG_PLACEHOLDER.sub(number, piece) for i, piece in enumerate(pieces))
    return rewritten if found else None


def _refuse_psycopg_sql(value: Any, arguments: Mapping[str, Any]) -> str | None:
    fixed = _numbered(value) if isinstance(value, str) else None
    if fixed is None:
        return None
    return (
        "asyncpg binds $1, $2, ... in order, not psycopg's %s or %(name)s; write the statement as "
        f"{fixed!r} with parameters as a list in that order"
    )


def _refuse_named_parameters(value: Any, arguments: Mapping[str, Any]) -> str | None:
    if not isinstance(value, Mapping):
        return None
    names = ", ".join(repr(name) for name in value)
    return (
        f"parameters is a list bound to $1, $2, ... of sql, not a dict of named %(name)s values ({names}); "
        "number the placeholders in sql and pass the values as a list in that order"
    )


class PostgresBatchMarkerSensor(DeferrableSensor):
    """Succeed when a marker row appears (or a query's first row says "ready").

    Declarative: ``table`` + ``match`` (+ ``status_column`` with ``ready_values`` /
    ``failed_values``). Custom: ``sql`` with ``$1..$n`` bound to ``parameters``, judged by
    ``success`` / ``failure`` / ``retry`` acceptors on the row's columns. The success payload
    (the task's XCom) carries the matched row as JSON. See docs/sensors/postgres.md.

    Identifiers are checked when the DAG is parsed, even when other arguments are templates.
    """

    trigger_class = PostgresBatchMarkerTrigger
    official_sensor = "SqlSensor"
    official_aliases = {"conn_id": "postgres_conn_id"}
    official_refusals: ClassVar[Mapping[str, OfficialRefusal]] = {
        "sql": _refuse_psycopg_sql,
        "parameters": _refuse_named_parameters,
        "success": if_callable(
            "a callable cannot cross to the triggerer; declare readiness as data, success=[{'column': ..., "
            "'equals': ...}] (or acceptors=[...]), or name a function with predicate='pkg.module:function' "
            "(it receives the first row as a dict)"
        ),
        "failure": if_callable(
            "a callable cannot cross to the triggerer; declare it as data, failure=[{'column': ..., "
            "'equals': ...}] (or acceptors=[...] with state 'failure'), or use predicate='pkg.module:function'"
        ),
        "selector": (
            "with no condition the first cell of the first row is judged; to judge another column use "
            "success=[{'column': 'name', ...}], or predicate='pkg.module:function', which receives the whole row"
        ),
        "fail_on_empty": unless_default(
            "no row means 'not yet' here, and the wait goes on until its timeout; to end at once, select a row "
            "that says so and declare it with failure=[...]",
            False,
        ),
        "hook_params": unless_empty(
            "the triggerer builds its own asyncpg connection from postgres_conn_id: set the database, TLS and "
            "session settings on the connection (schema, extras 'sslmode', 'options')"
        ),
    }
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
