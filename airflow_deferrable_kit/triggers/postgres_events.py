"""Start a DAG run for each new Postgres row: ``PostgresRowEventTrigger``, for an ``AssetWatcher``.

It is :class:`~airflow_deferrable_kit.triggers.postgres.PostgresBatchMarkerTrigger` (the same
declarative ``table``/``match`` or custom ``sql``, the same pool, conditions, LISTEN engine and
error rules) that never stops, reading the rows *after* a cursor instead of the first row:

    SELECT * FROM (<the wait's query>) AS adk_rows
    WHERE (order_column, key_column) > (<cursor>) ORDER BY order_column, key_column LIMIT batch_size

Every row past the cursor is judged once by the wait's conditions (acceptors, ``status_column``
/ ``ready_values``, a predicate; none: every row); each one they accept fires one event, in
order. The watermark in the asset state store is the cursor: the order (and key) values of the
last row judged. Watchers of one query share it, whatever their conditions: the query starts at
the lowest cursor among them, and each skips the rows it has judged already.

A watcher never holds the others back, nor is it skipped ahead: it judges a shared page only
when the page starts at or below its own cursor, and otherwise reads its own rows from its
cursor (a watcher that was behind catches up on its own). A watcher that cannot judge a row (its
predicate raises) stays on that row, un-lost, and *leaves* the shared cursor: the shared query
starts at the lowest cursor of the watchers that can move, while the stuck one re-reads its own
rows at each look until the row can be judged, catches up on its own, and joins again.

The order column must grow as rows become visible: an identity or serial id written by one
transaction at a time, or a timestamp set when the row is written, with ``key_column`` (a unique
column) to order rows with equal timestamps. A row that becomes visible *below* the cursor (a
transaction that took a lower id but committed after a higher one was judged) is never seen.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Final

from airflow_deferrable_kit._event_streams import Board
from airflow_deferrable_kit._postgres.client import pooled
from airflow_deferrable_kit._postgres.listener import close_listener, start_listener
from airflow_deferrable_kit._postgres.values import coerce_arguments, row_document
from airflow_deferrable_kit._redact import redact
from airflow_deferrable_kit.conditions import DEFAULT
from airflow_deferrable_kit.errors import ErrorType, FatalError, WaitError
from airflow_deferrable_kit.payload import json_safe, truncate_text
from airflow_deferrable_kit.triggers.events import EventTrigger, event_payload
from airflow_deferrable_kit.triggers.postgres import (
    Bindings,
    PostgresBatchMarkerTrigger,
    check_identifier,
    compile_selection,
    quote_identifier,
)

if TYPE_CHECKING:
    import asyncpg

#: The most rows one poll reads; a full page is followed at once by the next.
MAX_BATCH_SIZE: Final = 10_000
#: Column types whose order Python compares the way Postgres does (text sorts by collation).
ORDERABLE_TYPES: Final = frozenset(
    {"int2", "int4", "int8", "numeric", "float4", "float8", "date", "timestamp", "timestamptz", "uuid"}
)
#: What a poll says when nobody asked where the rows end now.
_NOT_ASKED: Final = object()
#: Pages a watcher reading on its own reads at most per look (the rest at the next look).
OWN_PAGES_PER_LOOK: Final = 10


class PostgresRowEventTrigger(EventTrigger, PostgresBatchMarkerTrigger):
    """Fire one asset event for each new row the conditions accept, in ``order_column`` order.

    Takes the parameters of ``PostgresBatchMarkerTrigger`` (``postgres_conn_id``, ``table`` and
    ``match`` or ``sql`` and ``parameters``, the conditions, ``notify_channel``,
    ``statement_timeout``) except ``order_by``, plus:

    :param order_column: the column rows are read in: it must grow as rows are written (an id,
        a created-at timestamp). Rows with a NULL in it are ignored.
    :param key_column: a unique column ordering rows with the same ``order_column`` value (needed
        for timestamps, which can repeat); left out, ``order_column`` must be unique.
    :param batch_size: rows read at most per poll; a full page is followed by the next at once.
    :param notify_channel: a channel whose ``NOTIFY`` makes the watchers look at once.
    :param backfill: fire for the rows already there when the watcher first runs (default: they
        are the starting point).

    Each event's payload: ``row`` (JSON-safe, capped), ``table`` or ``sql``, ``postgres_conn_id``,
    ``matched`` (the deciding condition), ``cursor`` (its order and key values) and ``event_id``.
    """

    fires_items: ClassVar[bool] = True

    order_column: str = ""
    key_column: str | None = None
    batch_size: int = 500
    poll_interval: float = 30.0

    tuning_parameters: ClassVar[tuple[str, ...]] = ("batch_size", "statement_timeout", "notify_channel")

    # -------------------------------------------------------------------- validation
    def validate(self) -> None:
        if self.order_by:
            raise ValueError(
                "order_by says which row decides a wait; an event trigger reads every new row in "
                "order_column (and key_column) order"
            )
        super().validate()
        check_identifier(self.order_column, argument="order_column")
        columns = [self.order_column]
        if self.key_column is not None:
            check_identifier(self.key_column, argument="key_column")
            if self.key_column == self.order_column:
                raise ValueError("key_column must differ from order_column (leave it out if order_column is unique)")
            columns.append(self.key_column)
        size = self.batch_size
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_BATCH_SIZE:
            raise ValueError(f"batch_size must be an integer from 1 to {MAX_BATCH_SIZE}, got {size!r}")
        self._compile(columns)
        self._awaiting_baseline = False
        self._notified: asyncio.Event | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._cursor_types: list[Any] | None = None
        self._base_types: list[Any] | None = None
        self._board: Board | None = None
        #: Stuck on a row it cannot judge: off the shared cursor, reading its own rows.
        self._reading_alone = False

    def _compile(self, columns: list[str]) -> None:
        """The three queries: rows after a cursor, rows from the start, and where the rows end."""
        if self.table is not None:
            bound = Bindings()
            base = compile_selection(self.table, self.match, bound.bind)
            self._base_args, self._base_labels = bound.args, bound.labels
        else:
            base = self._sql
            self._base_args, self._base_labels = list(self._args), list(self._labels)
        qualified = [f"adk_rows.{quote_identifier(column)}" for column in columns]
        n = len(self._base_args)
        placeholders = [f"${n + 1 + i}" for i in range(len(columns))]
        after = (
            f"{qualified[0]} > {placeholders[0]}"
            if len(columns) == 1
            else f"({', '.join(qualified)}) > ({', '.join(placeholders)})"
        )
        present = " AND ".join(f"{column} IS NOT NULL" for column in qualified)
        ascending, descending = ", ".join(qualified), ", ".join(f"{column} DESC" for column in qualified)
        source = f"SELECT * FROM ({base}) AS adk_rows WHERE {present}"
        self._rows_after = f"{source} AND {after} ORDER BY {ascending} LIMIT {int(self.batch_size)}"
        self._rows_all = f"{source} ORDER BY {ascending} LIMIT {int(self.batch_size)}"
        self._end = f"SELECT {ascending} FROM ({base}) AS adk_rows WHERE {present} ORDER BY {descending} LIMIT 1"
        self._columns = columns

    def describe(self) -> str:
        if self.table is not None:
            where = " AND ".join(f"{column}={value!r}" for column, value in self.match.items())
            what = self.table + (f" where {where}" if where else "")
        else:
            what = f"query {truncate_text(' '.join(self._sql.split()), 120)!r}"
        return f"new Postgres rows of {what} by {self.order_column} ({self.postgres_conn_id})"

    def stream_identity(self) -> Any:
        """The query: watchers of one table, match (or SQL) and order share it, whatever they accept."""
        return {
            "postgres_conn_id": self.postgres_conn_id,
            "query": self._rows_after,
            "args": self._base_args,
            "batch_size": self.batch_size,
            "notify_channel": self.notify_channel,
        }

    # ---------------------------------------------------------------------- the shared look
    async def poll(self, board: Board) -> dict[str, Any]:
        if self.notify_channel is not None and self._notified is None:
            await self._listen()
        pool = await self._pool()
        timeout = float(self.statement_timeout)
        end: Any = _NOT_ASKED
        start: Any = _NOT_ASKED  # where the page starts: a cursor (native), None (the first row)
        rows: list[tuple[tuple[Any, ...], list[Any], dict[str, Any]]] = []
        records: list[Any] = []
        async with pooled(pool, timeout) as connection:
            base = await self._prepare(connection, timeout)
            if board.wants_baseline:
                record = await connection.fetchrow(self._end, *base, timeout=timeout)
                end = None if record is None else self._cursor_of(record)[1]
            cursors = board.cursors()
            if cursors:
                start = self._lowest(cursors)
                records = await self._page(connection, base, start, timeout)
        for record in records:
            native, portable = self._cursor_of(record)
            rows.append((native, portable, row_document(record)))
        full = len(records) >= int(self.batch_size)
        return {"rows": rows, "end": end, "full": full, "native": self._native, "start": start}

    async def _page(self, connection: Any, base: list[Any], after: tuple[Any, ...] | None, timeout: float) -> Any:
        """Up to ``batch_size`` rows after the cursor ``after`` (``None``: from the first row)."""
        if after is None:
            return await connection.fetch(self._rows_all, *base, timeout=timeout)
        return await connection.fetch(self._rows_after, *base, *after, timeout=timeout)

    async def _prepare(self, connection: asyncpg.Connection, timeout: float) -> list[Any]:
        """The wait's own bound values, and the cursor columns' types (read once, checked once)."""
        if self._base_types is None or self._cursor_types is None:
            statement = await connection.prepare(self._rows_after, timeout=timeout)
            types = list(statement.get_parameters())
            n = len(self._base_args)
            for column, typ in zip(self._columns, types[n:], strict=True):
                if typ.name not in ORDERABLE_TYPES:
                    raise FatalError(
                        f"{column} is of type {typ.name}; order_column and key_column must be integers, numerics, "
                        "dates, timestamps or uuids (text sorts by collation, which the watcher cannot follow)",
                        error_type=ErrorType.BAD_CONFIGURATION,
                    )
            self._base_types, self._cursor_types = types[:n], types[n:]
        return coerce_arguments(self._base_args, self._base_types, self._base_labels)

    def _cursor_of(self, record: Any) -> tuple[tuple[Any, ...], list[Any]]:
        """A row's cursor: its values as asyncpg gave them, and as JSON for the watermark."""
        native = tuple(record[column] for column in self._columns)
        return native, [json_safe(value) for value in native]

    def _native(self, portable: list[Any]) -> tuple[Any, ...]:
        """A watermark's cursor (JSON) as the column values it stands for."""
        assert self._cursor_types is not None
        labels = [f"cursor[{column}]" for column in self._columns]
        return tuple(coerce_arguments(portable, self._cursor_types, labels))

    def _lowest(self, cursors: list[Any]) -> tuple[Any, ...] | None:
        """Where the shared query starts: the lowest watcher's cursor (``None``: from the first row)."""
        if any(cursor is None for cursor in cursors):
            return None
        return min(self._native(cursor) for cursor in cursors)

    def needs_catch_up(self, data: Any) -> bool:
        return bool(data["full"])

    def judging_units(self, data: Any) -> int:
        return len(data["rows"])

    async def _listen(self) -> None:
        conn_id, channel = self.postgres_conn_id, str(self.notify_channel)
        listener = await self.lease(
            ("postgres-listener", conn_id, channel), lambda: start_listener(conn_id, channel), close_listener
        )
        self._notified = asyncio.Event()
        listener.subscribe(self._notified)
        self._unsubscribe = functools.partial(listener.unsubscribe, self._notified)

    async def release(self) -> None:
        # The listener outlives this watcher while others of its channel hold it: stop being woken.
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()
        self._notified = None
        await super().release()

    def wake_events(self) -> list[asyncio.Event]:
        return [self._notified] if self._notified is not None else []

    # -------------------------------------------------------------------- this watcher's view
    def follow(self, board: Board, state: Any) -> None:
        self._board = board
        awaiting = state is None and not self.backfill
        if awaiting != self._awaiting_baseline:
            board.want_baseline(awaiting)
            self._awaiting_baseline = awaiting
        if self._reading_alone:
            return  # stuck: its cursor must not hold the shared query back
        if state is not None:
            board.set_cursor(self, state["cursor"])
        elif self.backfill:
            board.set_cursor(self, None)

    def unfollow(self, board: Board) -> None:
        if self._awaiting_baseline:
            board.want_baseline(False)
            self._awaiting_baseline = False
        board.drop(self)
        self._board = None

    async def derive(self, data: Any, state: Any) -> tuple[list[dict[str, Any]], Any]:
        baseline = False
        if state is None:
            if self.backfill:
                state = {"cursor": None}
            elif data["end"] is _NOT_ASKED:
                return [], None  # waiting for the producer to say where the rows end now
            else:
                state, baseline = {"cursor": data["end"]}, True  # the starting point (None: no row yet)
        own = state["cursor"]
        if not baseline and (self._reading_alone or not self._covers(data, own)):
            return await self._derive_alone(own)
        after = data["native"](own) if own is not None else None
        payloads, cursor, stuck = await self._judge(data["rows"], after, own)
        if stuck:
            self._leave_shared_cursor()
        return payloads, {"cursor": cursor}

    def _covers(self, data: Any, own: Any) -> bool:
        """Whether the shared page starts at or below this watcher's cursor (then it misses no row)."""
        start = data.get("start", _NOT_ASKED)
        if start is _NOT_ASKED:
            return False  # nobody's rows were read (no cursor on the board when it polled)
        if start is None:
            return True  # from the first row
        return own is not None and bool(start <= data["native"](own))

    async def _judge(
        self, rows: list[tuple[tuple[Any, ...], list[Any], dict[str, Any]]], after: Any, own: Any
    ) -> tuple[list[dict[str, Any]], Any, bool]:
        """Judge the rows past ``after``: the events, the new cursor, and whether a row stopped it."""
        cursor, payloads = own, list[dict[str, Any]]()
        for native, portable, row in rows:
            if after is not None and native <= after:
                continue  # judged already (the shared query starts at the lowest watcher)
            try:
                verdict = await self.judge_row(row)
            except WaitError as error:
                self.log.error(
                    "%s: cannot judge the row at %s (%s); it and the rows after it wait until it can be judged "
                    "(the other watchers of the query go on)",
                    self.describe(), json.dumps(portable), redact(error.message),
                )  # fmt: skip
                return payloads, cursor, True
            if verdict.state in ("success", DEFAULT):
                payloads.append(self._event(row, verdict, portable))
            cursor = portable
        return payloads, cursor, False

    async def _derive_alone(self, own: Any) -> tuple[list[dict[str, Any]], Any]:
        """Read and judge this watcher's own rows from its cursor (stuck, or behind the shared page).

        Once a page comes back short with every row judged, the watcher is at the end of the
        rows and, if it had left the shared cursor, takes its place on it again.
        """
        pool = await self._pool()
        timeout = float(self.statement_timeout)
        cursor, payloads = own, list[dict[str, Any]]()
        for _ in range(OWN_PAGES_PER_LOOK):
            async with pooled(pool, timeout) as connection:
                base = await self._prepare(connection, timeout)
                after = self._native(cursor) if cursor is not None else None
                records = await self._page(connection, base, after, timeout)
            rows = []
            for record in records:
                native, portable = self._cursor_of(record)
                rows.append((native, portable, row_document(record)))
            events, cursor, stuck = await self._judge(rows, after, cursor)
            payloads += events
            if stuck:
                self._leave_shared_cursor()
                break
            if len(records) < int(self.batch_size):  # caught up
                self._join_shared_cursor(cursor)
                break
        return payloads, {"cursor": cursor}

    def _leave_shared_cursor(self) -> None:
        if not self._reading_alone:
            self._reading_alone = True
            if self._board is not None:
                self._board.drop(self)

    def _join_shared_cursor(self, cursor: Any) -> None:
        if self._reading_alone:
            self._reading_alone = False
            if self._board is not None:
                self._board.set_cursor(self, cursor)

    def _event(self, row: dict[str, Any], verdict: Any, cursor: list[Any]) -> dict[str, Any]:
        data = {**self.row_data(row, verdict), "cursor": cursor}
        if verdict.state == DEFAULT:  # no condition: every new row is an event
            data["matched"] = {"state": "success", "matcher": "default", "comparator": "every new row"}
        where = self.table if self.table is not None else "sql"
        return event_payload({**data, "event_id": f"{where}@{json.dumps(cursor)}"})


__all__ = ["PostgresRowEventTrigger"]
