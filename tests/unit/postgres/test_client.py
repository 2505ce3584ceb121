"""The asyncpg client module: connection -> asyncpg arguments, and asyncpg's errors -> ours (no server)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import asyncpg
import pytest

from airflow_deferrable_kit._postgres.client import classify_postgres_error, options_from_connection, parse_options
from airflow_deferrable_kit.errors import FatalError, TransientError
from airflow_deferrable_kit.triggers.postgres import PostgresBatchMarkerTrigger


def test_parse_options_reads_libpq_style_settings() -> None:
    assert parse_options("-c search_path=etl,public -cstatement_timeout=5000 --lock-timeout=2s", conn_id="c") == {
        "search_path": "etl,public",
        "statement_timeout": "5000",
        "lock_timeout": "2s",
    }
    with pytest.raises(FatalError, match="options"):
        parse_options("-x nonsense", conn_id="c")


def _conn(**fields: Any) -> Any:
    base = {"host": "db.internal", "port": 6432, "login": "etl", "password": "pw-123456", "schema": "warehouse"}
    return SimpleNamespace(**{**base, **fields})


def test_connection_maps_to_asyncpg_arguments() -> None:
    options = options_from_connection(
        "wh",
        _conn(),
        {
            "sslmode": "verify-full",
            "sslrootcert": "/etc/ssl/root.crt",
            "options": "-c search_path=etl",
            "application_name": "my-triggerer",
            "pool_max_size": "2",
            "connect_timeout": 3,
        },
    )
    assert options.pool_max_size == 2
    kwargs = options.kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["user"], kwargs["database"]) == (
        "db.internal",
        6432,
        "etl",
        "warehouse",
    )
    assert kwargs["password"] == "pw-123456"
    assert kwargs["ssl"] == "verify-full"
    assert kwargs["dsn"] == "postgresql://?sslrootcert=%2Fetc%2Fssl%2Froot.crt"
    assert kwargs["timeout"] == 3.0
    assert kwargs["server_settings"] == {
        "application_name": "my-triggerer",
        "default_transaction_read_only": "on",
        "search_path": "etl",
    }
    assert "pw-123456" not in repr(options)
    assert options_from_connection("wh", _conn(), {}).pool_max_size == 4


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"sslmode": "sometimes"}, "sslmode"),
        ({"pool_max_size": 0}, "pool_max_size"),
        ({"pool_max_size": "many"}, "pool_max_size"),
        ({"iam": True}, "IAM"),
        ({"connect_timeout": "soon"}, "connect_timeout"),
    ],
)
def test_bad_connection_extras_are_fatal_and_named(extra: dict[str, Any], named: str) -> None:
    with pytest.raises(FatalError, match=named) as raised:
        options_from_connection("wh", _conn(), extra)
    assert raised.value.error_type == "bad_connection"


@pytest.mark.parametrize(
    ("error", "kind", "error_type", "condition"),
    [
        (
            asyncpg.exceptions.SerializationError("could not serialize"),
            TransientError,
            "unavailable",
            "serialization_failure",
        ),
        (asyncpg.exceptions.DeadlockDetectedError("deadlock"), TransientError, "unavailable", "deadlock"),
        (asyncpg.exceptions.TooManyConnectionsError("too many"), TransientError, "unavailable", "too_many_connections"),
        (asyncpg.exceptions.AdminShutdownError("terminating"), TransientError, "unavailable", "server_restarting"),
        (asyncpg.exceptions.CannotConnectNowError("starting up"), TransientError, "unavailable", "server_restarting"),
        (
            asyncpg.exceptions.ConnectionDoesNotExistError("closed mid-query"),
            TransientError,
            "network",
            "connection_exception",
        ),
        (asyncpg.exceptions.DiskFullError("disk full"), TransientError, "unavailable", "insufficient_resources"),
        (
            asyncpg.exceptions.InterfaceError("cannot call fetch(): connection is closed"),
            TransientError,
            "network",
            None,
        ),
        (
            asyncpg.exceptions.InternalClientError("cannot switch to state 12; another operation (2) is in progress"),
            TransientError,
            "network",
            None,
        ),
        (asyncpg.exceptions.PostgresSyntaxError("syntax"), FatalError, "bad_request", "syntax_error"),
        (asyncpg.exceptions.UndefinedTableError("no table"), FatalError, "not_found", "undefined_table"),
        (asyncpg.exceptions.UndefinedColumnError("no column"), FatalError, "bad_request", "undefined_column"),
        (asyncpg.exceptions.InsufficientPrivilegeError("denied"), FatalError, "authorization", "permission_denied"),
        (
            asyncpg.exceptions.InvalidPasswordError("bad password"),
            FatalError,
            "authentication",
            "authentication_failed",
        ),
        (asyncpg.exceptions.InvalidCatalogNameError("no db"), FatalError, "not_found", "unknown_database"),
        (asyncpg.exceptions.DivisionByZeroError("1/0"), FatalError, "bad_request", "data_error"),
        (asyncpg.exceptions.ProtocolError("garbage"), FatalError, "protocol", None),
        (asyncpg.exceptions.ClientConfigurationError("bad sslmode"), FatalError, "bad_connection", None),
        (ConnectionRefusedError(111, "refused"), TransientError, "network", None),
    ],
)
def test_errors_are_classified(error: Exception, kind: type, error_type: str, condition: str | None) -> None:
    classified = PostgresBatchMarkerTrigger(table="m").classify_error(error)
    assert type(classified) is kind and classified.error_type == error_type
    # The SQLSTATE's own condition refines the type in the details; errors with no SQLSTATE have none.
    assert classified.details.get("condition") == condition
    assert classified.details.get("sqlstate") == (getattr(error, "sqlstate", None) if condition else None)


def test_our_own_errors_and_other_exceptions_are_left_to_the_base_trigger() -> None:
    assert classify_postgres_error(ValueError("not asyncpg's")) is None
    ours = TransientError("no pooled connection", error_type="unavailable")
    assert PostgresBatchMarkerTrigger(table="m").classify_error(ours) is ours
