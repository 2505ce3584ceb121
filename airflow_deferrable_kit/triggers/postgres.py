"""Wait for a Postgres "batch marker": a row that says a batch is ready (or failed).

Two ways to say what to wait for, both compiled into one read-only query plus acceptors, so
the trigger and the sensor's poke path run the very same check:

* declarative: ``table`` (optionally ``schema.table``), ``match`` (column -> value), and an
  optional ``status_column`` with ``ready_values`` / ``failed_values``. Identifiers are
  validated and quoted; values are always bound parameters.
* custom SQL: ``sql`` with ``$1, $2, ...`` bound to ``parameters``. The first row decides.

Acceptors (``success`` / ``failure`` / ``retry`` or canonical ``acceptors``) look at the row as a
JSON document: ``{"column": "state", "equals": "done"}`` or ``{"path": "meta.state", ...}`` for a
json/jsonb column. Without any condition, a marker row means success, and a custom query
means success once the first cell of its first row is truthy (Airflow's ``SqlSensor`` rule: a
``count(*)`` of 0, ``NULL`` or ``false`` is "not yet").
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import field
from typing import TYPE_CHECKING, Any

from airflow_deferrable_kit._arguments import require_conn_id, require_seconds
from airflow_deferrable_kit._postgres.batches import PostgresBatches, close_batches, open_batches
from airflow_deferrable_kit._postgres.client import (
    PostgresOptions,
    classify_postgres_error,
    close_pool,
    load_options,
    open_pool,
    pooled,
)
from airflow_deferrable_kit._postgres.listener import close_listener, start_listener
from airflow_deferrable_kit._postgres.values import coerce_arguments, row_document
from airflow_deferrable_kit._shared_polls import reuse_window
from airflow_deferrable_kit.conditions import (
    DEFAULT,
    MISSING,
    Acceptor,
    ConditionSet,
    Verdict,
    capped_decision,
    explain,
    lookup,
    settle,
)
from airflow_deferrable_kit.errors import WaitError
from airflow_deferrable_kit.payload import Found, cap_value, truncate_text
from airflow_deferrable_kit.triggers.base import PollingTrigger

if TYPE_CHECKING:
    import asyncpg

#: What acceptors may look at: a column by name, or a JSON path into the row (json columns decoded).
MATCHERS = {"column": True, "path": True}
#: The matched row's share of the payload; long values are cut, then trailing columns dropped.
ROW_LIMIT_BYTES = 32 * 1024
VALUE_LIMIT_CHARS = 2048
#: After a notification woke a waiter, the next wake-up waits at least this long (a NOTIFY
#: storm must not become a query storm).
WAKE_MIN_GAP = 0.25

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
_ORDER = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_$]*)(?:\s+(asc|desc))?\s*", re.IGNORECASE)
_SCALARS = (str, int, float, bool)


# ---------------------------------------------------------------------------- identifiers
def check_identifier(value: Any, *, argument: str) -> str:
    """A plain SQL identifier (letters, digits, ``_``, ``$``; at most 63 bytes) or ValueError."""
    if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value) or len(value.encode()) > 63:
        raise ValueError(
            f"{argument} must be a plain identifier (letters, digits, _ or $, not starting with a digit, "
            f"at most 63 characters), got {value!r}"
        )
    return value


def quote_identifier(name: str) -> str:
    """Quote a validated identifier; quoting keeps its case and makes keywords usable as names."""
    return '"' + name.replace('"', '""') + '"'


def parse_table(table: Any) -> tuple[str, ...]:
    """``"table"`` or ``"schema.table"``, each part a plain identifier."""
    if not isinstance(table, str):
        raise ValueError(f"table must be a string such as 'public.batch_markers', got {type(table).__name__}")
    parts = table.split(".")
    if len(parts) > 2:
        raise ValueError(f"table must be 'table' or 'schema.table', got {table!r}")
    return tuple(check_identifier(part, argument="table") for part in parts)


def parse_order_by(order_by: Any) -> list[tuple[str, str]]:
    """``["created_at desc", "id"]`` -> ``[("created_at", "DESC"), ("id", "ASC")]``."""
    if not isinstance(order_by, list):
        raise ValueError(f"order_by must be a list such as ['created_at desc'], got {order_by!r}")
    out = []
    for i, item in enumerate(order_by):
        found = _ORDER.fullmatch(item) if isinstance(item, str) else None
        if found is None:
            raise ValueError(f"order_by[{i}] must be 'column' or 'column asc|desc', got {item!r}")
        out.append((check_identifier(found.group(1), argument=f"order_by[{i}]"), (found.group(2) or "asc").upper()))
    return out


def validate_identifiers(
    *,
    table: Any = None,
    match: Any = None,
    status_column: Any = None,
    order_by: Any = None,
    notify_channel: Any = None,
    skip: Callable[[Any], bool] = lambda value: False,
) -> None:
    """Check every identifier that is known now; ``skip(value)`` marks values still templated.

    The sensor calls this at DAG parse even when some other argument is a template, so an
    injection attempt in an identifier never reaches a worker. Match keys are never templated.
    """
    if table is not None and not skip(table):
        parse_table(table)
    if isinstance(match, dict):
        for key in match:
            check_identifier(key, argument=f"match key {key!r}")
    if status_column is not None and not skip(status_column):
        check_identifier(status_column, argument="status_column")
    if order_by is not None and not skip(order_by):
        parse_order_by(order_by)
    if notify_channel is not None and not skip(notify_channel):
        check_identifier(notify_channel, argument="notify_channel")


def _check_scalar(value: Any, *, argument: str, allow_none: bool) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, _SCALARS):
        raise ValueError(f"{argument} must be a string, number or boolean, got {value!r}")


def _check_values(values: Any, *, argument: str) -> None:
    if not isinstance(values, list):
        raise ValueError(f"{argument} must be a list of values, got {values!r}")
    for i, value in enumerate(values):
        _check_scalar(value, argument=f"{argument}[{i}]", allow_none=False)


# ------------------------------------------------------------------------------- compiling
def compile_marker_query(
    *,
    table: str,
    match: dict[str, Any],
    status_column: str | None = None,
    ready_values: Sequence[Any] = (),
    failed_values: Sequence[Any] = (),
    order_by: Sequence[str] = (),
) -> tuple[str, list[Any], list[str]]:
    """Compile the declarative form into ``(sql, args, labels)``; labels name each argument.

    Without ``order_by`` and with a status column, decisive rows come first (ready before
    failed), so a running attempt next to a finished one never hides the finished one. With
    ``order_by`` the first row in that order decides (e.g. the newest attempt).
    """
    bound = Bindings()
    bind = bound.bind
    sql = compile_selection(table, match, bind)
    if order_by:
        sql += " ORDER BY " + ", ".join(f"{quote_identifier(c)} {d}" for c, d in parse_order_by(list(order_by)))
    elif status_column is not None and (ready_values or failed_values):
        status = quote_identifier(status_column)
        ranks = []
        for rank, (name, values) in enumerate((("ready_values", ready_values), ("failed_values", failed_values))):
            if values:
                options = ", ".join(bind(v, f"{name}[{i}]") for i, v in enumerate(values))
                ranks.append(f"WHEN {status} IN ({options}) THEN {rank}")
        sql += f" ORDER BY CASE {' '.join(ranks)} ELSE 2 END"
    return sql + " LIMIT 1", bound.args, bound.labels


class Bindings:
    """Values bound to ``$1..$n`` in the order they are bound, each with the argument it came from."""

    def __init__(self) -> None:
        self.args: list[Any] = []
        self.labels: list[str] = []

    def bind(self, value: Any, label: str) -> str:
        """Bind ``value``; the placeholder to write in its place."""
        self.args.append(value)
        self.labels.append(label)
        return f"${len(self.args)}"


def compile_selection(table: str, match: dict[str, Any], bind: Callable[[Any, str], str]) -> str:
    """``SELECT * FROM table WHERE <match>``: quoted identifiers, every value through ``bind``."""
    conditions = []
    for column, value in match.items():
        name = quote_identifier(column)
        if value is None:
            conditions.append(f"{name} IS NULL")
        elif isinstance(value, list):
            options = ", ".join(bind(item, f"match[{column!r}][{i}]") for i, item in enumerate(value))
            conditions.append(f"{name} IN ({options})")
        else:
            conditions.append(f"{name} = {bind(value, f'match[{column!r}]')}")
    sql = "SELECT * FROM " + ".".join(quote_identifier(part) for part in parse_table(table))
    if conditions:
        sql += " WHERE " + " AND ".join(conditions)
    return sql


# ------------------------------------------------------------------------------ the row
def cap_row(row: dict[str, Any], *, limit: int = ROW_LIMIT_BYTES) -> tuple[dict[str, Any], list[str], list[str]]:
    """Fit the row into ``limit`` bytes of JSON: cut long values, then drop trailing columns."""

    def size(value: Any) -> int:
        return len(json.dumps(value, separators=(",", ":")))

    if size(row) <= limit:
        return row, [], []
    capped: dict[str, Any] = {}
    truncated: list[str] = []
    for key, value in row.items():
        if size(value) > VALUE_LIMIT_CHARS:
            capped[key] = cap_value(value, VALUE_LIMIT_CHARS)
            truncated.append(key)
        else:
            capped[key] = value
    omitted: list[str] = []
    while capped and size(capped) > limit:
        key = next(reversed(capped))
        del capped[key]
        omitted.insert(0, key)
    return capped, truncated, omitted


def value_in_row(row: dict[str, Any], acceptor: Acceptor) -> Any:
    """What an acceptor looks at: a column by name, or a JSON path into the row."""
    if acceptor.matcher == "column":
        return row.get(acceptor.argument or "", MISSING)
    return lookup(row, acceptor.parts)


# ------------------------------------------------------------------------------ trigger
class PostgresBatchMarkerTrigger(PollingTrigger):
    """Poll one read-only query until its first row satisfies the acceptors.

    :param postgres_conn_id: Airflow connection (type ``postgres``); credentials stay there.
    :param table: ``"table"`` or ``"schema.table"`` (declarative form).
    :param match: column -> value (``None`` means IS NULL, a list means IN); always bound.
    :param status_column: column holding the marker's state; needs ``ready_values``.
    :param ready_values: states meaning the batch is ready (success).
    :param failed_values: states meaning the batch failed (error event, no retry).
    :param order_by: which matching row decides, e.g. ``["created_at desc"]``.
    :param sql: custom query (instead of ``table``) with ``$1..$n`` placeholders.
    :param parameters: values bound to ``$1..$n`` of ``sql``.
    :param acceptors: canonical acceptors; ``success`` / ``failure`` / ``retry`` are sugar.
    :param predicate: ``"pkg.module:function"`` judging the row, by the one rule of
        :mod:`airflow_deferrable_kit.conditions` (truthy means ready).

    With no condition at all, a marker row (``table=``) is ready once it exists, and a query
    (``sql=``) once the first cell of its first row is truthy, as Airflow's ``SqlSensor`` decides.
    :param notify_channel: a LISTEN channel whose notifications trigger an immediate re-check.
    :param statement_timeout: seconds a poll may wait for a pooled connection and for its query.
    """

    __slots__ = (
        "_args",
        "_batches",
        "_batching",
        "_bound",
        "_conditions",
        "_connect_options",
        "_labels",
        "_sql",
    )  # its state: see PollingTrigger.__slots__

    postgres_conn_id: str = "postgres_default"
    table: str | None = None
    match: dict[str, Any] = field(default_factory=dict)
    status_column: str | None = None
    ready_values: list[Any] = field(default_factory=list)
    failed_values: list[Any] = field(default_factory=list)
    order_by: list[str] = field(default_factory=list)
    sql: str | None = None
    parameters: list[Any] = field(default_factory=list)
    acceptors: list[dict[str, Any]] = field(default_factory=list)
    success: list[dict[str, Any]] = field(default_factory=list)
    failure: list[dict[str, Any]] = field(default_factory=list)
    retry: list[dict[str, Any]] = field(default_factory=list)
    predicate: str | None = None
    notify_channel: str | None = None
    statement_timeout: float = 30.0

    extra = "postgres"
    extra_modules = ("asyncpg",)

    # -------------------------------------------------------------------- validation
    def validate(self) -> None:
        require_conn_id(self.postgres_conn_id, argument="postgres_conn_id")
        if (self.table is None) == (self.sql is None):
            raise ValueError("give exactly one of table=... (declarative) or sql=... (custom query)")
        require_seconds(self.statement_timeout, argument="statement_timeout")
        validate_identifiers(
            table=self.table,
            match=self.match,
            status_column=self.status_column,
            order_by=self.order_by,
            notify_channel=self.notify_channel,
        )
        for name in ("acceptors", "success", "failure", "retry"):
            if not isinstance(getattr(self, name), list):
                raise ValueError(f"{name} must be a list of conditions, got {getattr(self, name)!r}")
        if self.table is not None:
            self._validate_declarative()
            self._sql, self._args, self._labels = compile_marker_query(
                table=self.table,
                match=self.match,
                status_column=self.status_column,
                ready_values=self.ready_values,
                failed_values=self.failed_values,
                order_by=self.order_by,
            )
        else:
            self._validate_custom()
        self._conditions = ConditionSet.load(self._canonical_conditions(), self.predicate, matchers=MATCHERS)
        self._bound: list[Any] | None = None
        self._batching = False
        self._batches: PostgresBatches | None = None
        self._connect_options: PostgresOptions | None = None  # the connection, read once per run

    def _canonical_conditions(self) -> list[dict[str, Any]]:
        """Every acceptor in order: the user's groups, with the status column's rules first in theirs.

        Each group is checked on its own, so an error names the entry the user wrote
        (``success[0]``), not its place after the rules derived from ``status_column``.
        """
        derived: dict[str, list[dict[str, Any]]] = {"failure": [], "success": []}
        if self.table is not None and self.status_column is not None:
            column = {"matcher": "column", "argument": self.status_column, "comparator": "in"}
            if self.failed_values:
                derived["failure"].append({**column, "state": "failure", "expected": self.failed_values})
            derived["success"].append({**column, "state": "success", "expected": self.ready_values})
        canonical: list[dict[str, Any]] = []
        for name in ("acceptors", "failure", "retry", "success"):
            group = ConditionSet.canonicalise(matchers=MATCHERS, **{name: getattr(self, name)})
            canonical += derived.get(name, []) + group
        return canonical

    def _validate_declarative(self) -> None:
        if self.parameters:
            raise ValueError("parameters is only used with sql=...; with table=... use match")
        if not isinstance(self.match, dict):
            raise ValueError(f"match must be an object of column -> value, got {self.match!r}")
        for column, value in self.match.items():
            if isinstance(value, list):
                if not value:
                    raise ValueError(f"match[{column!r}] is an empty list, which can never match")
                _check_values(value, argument=f"match[{column!r}]")
            else:
                _check_scalar(value, argument=f"match[{column!r}]", allow_none=True)
        _check_values(self.ready_values, argument="ready_values")
        _check_values(self.failed_values, argument="failed_values")
        if self.status_column is None:
            for name in ("ready_values", "failed_values"):
                if getattr(self, name):
                    raise ValueError(f"{name} needs status_column, the column that holds the state")
        elif not self.ready_values:
            raise ValueError("status_column needs ready_values, the states that mean the batch is ready")

    def _validate_custom(self) -> None:
        for name in ("match", "status_column", "ready_values", "failed_values", "order_by"):
            if getattr(self, name):
                raise ValueError(f"{name} is only used with table=...; with sql=... write it in the query")
        if not isinstance(self.sql, str) or not self.sql.strip().rstrip(";").strip():
            raise ValueError(f"sql must be a non-empty query string, got {self.sql!r}")
        if not isinstance(self.parameters, list):
            raise ValueError(f"parameters must be a list bound to $1, $2, ..., got {self.parameters!r}")
        self._sql = self.sql.strip().rstrip(";").rstrip()
        self._args = list(self.parameters)
        self._labels = [f"parameters[{i}]" for i in range(len(self._args))]

    def describe(self) -> str:
        if self.table is not None:
            where = " AND ".join(f"{column}={value!r}" for column, value in self.match.items())
            what = f"{self.table}" + (f" where {where}" if where else "")
            if self.status_column is not None:
                what += f" with {self.status_column} in {self.ready_values!r}"
            return f"Postgres marker row in {what} ({self.postgres_conn_id})"
        return f"Postgres query {truncate_text(' '.join(self._sql.split()), 120)!r} ({self.postgres_conn_id})"

    # ----------------------------------------------------------------------- the check
    async def _options(self) -> PostgresOptions:
        if self._connect_options is None:
            self._connect_options = await load_options(self.postgres_conn_id)
        return self._connect_options

    async def _pool(self) -> asyncpg.Pool:
        options = await self._options()
        pool: asyncpg.Pool = await self.lease(options.lease_key, lambda: open_pool(options), close_pool)
        return pool

    async def fetch_row(self) -> Any:
        """The first row of the query, or ``None``.

        In the trigger loop the poll joins the batch of its shape and window
        (:mod:`airflow_deferrable_kit._postgres.batches`): one statement answers every wait of
        the same connection and query text that polls within the window. A lone check (the
        sensor's poke path, a test) runs its own query on a pooled connection.
        """
        if not self._batching:
            return await self._fetch_alone()
        timeout = float(self.statement_timeout)
        batches = self._batches
        if batches is None:  # leased once, held until the wait ends
            options = await self._options()
            batches = self._batches = await self.lease(
                ("postgres-batches", options.conn_id), lambda: open_batches(options), close_batches
            )
        if self._bound is None:
            types = await batches.parameter_types(self._sql, timeout)
            self._bound = coerce_arguments(self._args, types, self._labels)
        window = reuse_window(float(self.poll_interval))
        row = await batches.fetch_row(
            self._sql,
            self._bound,
            timeout=timeout,
            window=window,
            backoff_base=float(self.poll_interval),
            backoff_cap=float(self.max_backoff),
        )
        if row is not None:
            # The waits of a batch are answered in the same instant: those with a row to judge
            # and a payload to build take turns, so 10,000 markers appearing together do not
            # build 10,000 payloads in one iteration of the loop.
            await self.clock.sleep(0)
        return row

    def next_poll_delay(self) -> float:
        """The poll interval, shortened to the beat of the wait's shape when it polls in batches."""
        interval = float(self.poll_interval)
        if not self._batching or self._batches is None:
            return interval
        return self._batches.until_next_beat(
            self._sql,
            timeout=float(self.statement_timeout),
            interval=interval,
            window=reuse_window(interval),
        )

    def phase(self, delay: float) -> float:
        """No random phase for a wait that polls in batches: its shape's beat is its phase."""
        if self._batching and self._batches is not None and self._batches.keeps_beat(self._sql):
            return delay
        return super().phase(delay)

    async def _fetch_alone(self) -> Any:
        """Run the query once on a pooled connection, held only for this query."""
        pool = await self._pool()
        timeout = float(self.statement_timeout)
        async with pooled(pool, timeout) as connection:
            if self._bound is None:
                statement = await connection.prepare(self._sql, timeout=timeout)
                self._bound = coerce_arguments(self._args, statement.get_parameters(), self._labels)
                return await statement.fetchrow(*self._bound, timeout=timeout)
            return await connection.fetchrow(self._sql, *self._bound, timeout=timeout)

    async def check(self) -> Found | None:
        record = await self.fetch_row()
        if record is None:
            return None
        row = row_document(record)
        verdict = await self.judge_row(row)
        state = verdict.state
        if state == DEFAULT:
            state = self._default_state(record)
        if state == "retry":
            if verdict.observed:
                self.log.debug("Row found but no condition decided yet: %s", verdict.observed)
            return None
        data = self.row_data(row, verdict)
        return settle(
            state, data, lambda: f"{self.describe()}: the batch marker reports failure ({explain(data.get('matched'))})"
        )

    async def judge_row(self, row: dict[str, Any]) -> Verdict:
        """The conditions' verdict on one row (a JSON document), by the one rule."""
        return await self._conditions.evaluate(lambda acceptor: value_in_row(row, acceptor), lambda: row)

    def row_data(self, row: dict[str, Any], verdict: Verdict) -> dict[str, Any]:
        """What a payload says about a matched row: the row (capped), where it came from, why."""
        capped, truncated, omitted = cap_row(row)
        data: dict[str, Any] = {"row": capped, "postgres_conn_id": self.postgres_conn_id}
        if self.table is not None:
            data["table"] = self.table
        else:
            data["sql"] = truncate_text(self._sql, 1000)
        if verdict.decided_by is not None and verdict.state != DEFAULT:
            data["matched"] = capped_decision(verdict.decided_by, VALUE_LIMIT_CHARS)
        elif self.sql is not None:
            data["matched"] = {"state": "success", "matcher": "default", "comparator": "first cell is truthy"}
        if truncated:
            data["truncated_columns"] = truncated
        if omitted:
            data["omitted_columns"] = omitted
        return data

    def _default_state(self, record: Any) -> str:
        """No condition given: a marker row is ready; a query is ready when its first cell is truthy.

        The query rule is Airflow's ``SqlSensor``'s, so ``SELECT count(*) FROM ... WHERE ...``
        waits until the count is above zero instead of succeeding at once with ``count: 0``.
        """
        if self.table is not None:
            return "success"
        # The value as the driver returned it: Decimal("0") is falsy, its JSON form "0" is not.
        return "success" if len(record) and record[0] else "retry"

    def classify_error(self, exc: Exception) -> WaitError:
        return classify_postgres_error(exc) or super().classify_error(exc)

    # ------------------------------------------------------------- LISTEN/NOTIFY wake-ups
    async def wait(self) -> dict[str, Any]:
        """Poll in batches with the other waits of the shape; a notification cuts a sleep short."""
        self._batching = True
        try:
            return await self._wait_listening()
        finally:
            self._batching, self._batches = False, None

    async def _wait_listening(self) -> dict[str, Any]:
        if self.notify_channel is None:
            return await super().wait()
        conn_id, channel = self.postgres_conn_id, self.notify_channel
        listener = await self.lease(
            ("postgres-listener", conn_id, channel), lambda: start_listener(conn_id, channel), close_listener
        )
        wake = asyncio.Event()
        self._wake: asyncio.Event | None = wake
        self._last_wake: float | None = None
        listener.subscribe(wake)
        try:
            return await super().wait()
        finally:
            listener.unsubscribe(wake)
            self._wake = None

    async def pause(self, delay: float) -> None:
        """Sleep, unless a notification on the channel cuts it short (at most one per 0.25 s)."""
        wake = getattr(self, "_wake", None)
        if wake is None:
            await self.clock.sleep(delay)
            return
        loop = asyncio.get_running_loop()
        started = loop.time()
        if not wake.is_set():
            sleeper = asyncio.ensure_future(self.clock.sleep(delay))
            waker = asyncio.ensure_future(wake.wait())
            try:
                await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (sleeper, waker):
                    task.cancel()
                await asyncio.gather(sleeper, waker, return_exceptions=True)
            if not wake.is_set():
                return
        if self._last_wake is not None:
            # Rate-limit wake-ups: one inside the gap after the previous one waits for its end.
            gap = self._last_wake + WAKE_MIN_GAP - loop.time()
            remaining = delay - (loop.time() - started)
            if gap > 0 and remaining > 0:
                await self.clock.sleep(min(gap, remaining))
        wake.clear()
        self._last_wake = loop.time()


__all__ = [
    "MATCHERS",
    "PostgresBatchMarkerTrigger",
    "compile_marker_query",
    "quote_identifier",
    "validate_identifiers",
]
