"""The batching engine of the Postgres wait: one statement per round for every wait of a shape.

A thousand waits on one marker table each ask the same query with their own values
(``SELECT * FROM markers WHERE id = $1 ... LIMIT 1``). Sent one by one, that is a thousand round
trips, a thousand encoded statements and a thousand pool hand-outs per round. Here the waits of
one *shape* (the same connection id, the same SQL text, the same statement timeout) whose polls
fall in the same short window (:func:`~airflow_deferrable_kit._shared_polls.reuse_window`,
the window of every shared poll) are answered by one statement::

    SELECT "adk$row".*, "adk$args"."adk$wait"
    FROM unnest($1::int4[], ..., $k::int4[]) AS "adk$args"(a1, ..., "adk$wait")
    CROSS JOIN LATERAL (SELECT * FROM (<the wait's query, $n -> "adk$args".an>) AS "adk$first"
                        LIMIT 1) AS "adk$row"

Each wait's values are one element of the arrays, the lateral subquery is the wait's own query
with its placeholders pointing at those elements, so every wait gets exactly the first row its
own query would have returned (or none), and judges it on its own, as before. The array types
are the parameter types the server inferred for the wait's own query, so values are read as they
would be alone. Declarative waits (``table=``) and custom queries (``sql=``) with the same text
and different parameters batch alike; waits with identical values share one element.

The waits of a shape keep one beat (:meth:`PostgresBatches.until_next_beat`), so after their
first poll they fall in the same window every round: one statement per shape per round. The
batches due at the same moment (one per shape: a hundred tables, a hundred batches) go out over
a few lanes, each one pooled connection taken once for its batches in turn.

What is not batched, and runs one query per wait as before: a shape whose parameters include an
array, a composite or a JSON value, and a query the server refuses inside the lateral form (the
batched statement is prepared once per shape to find out).

One wait's fault stays that wait's (the design's isolation contract):

* A statement's time budget is what the shape's batches have taken (:data:`BUDGET_HEADROOM`
  times it, at least :data:`BUDGET_FLOOR`), never more than the waits' ``statement_timeout``
  times the waits it carries, at most :data:`BUDGET_SCALE_MAX` times (the only bound before a
  batch of the shape has answered): a hung query holds the others for about a second, not for
  up to four statement timeouts (two minutes at the default).
* A batch that runs past its budget is re-asked one wait at a time over a few connections at
  once (:data:`RE_ASK_LANES`), each with its own ``statement_timeout``, so every wait gets what
  it would have got alone and the slow one holds one connection, not the others: they get their
  rows in the same round. The wait that timed out alone is then asked alone (on a pooled
  connection of its own, beside the batch) until it answers in time again, so it does not
  stretch its shape's later batches. When :data:`SYSTEMIC_TIMEOUTS` waits time out alone before
  any answers, the slowness is the server's, not one wait's: the rest share the error. When
  none times out alone, the batch was just slow: the shape's budget grows.
* A batch that fails for a reason that is not transient (one wait's value does not fit its
  type, a row of one wait divides by zero) is re-asked one wait at a time, so only the wait at
  fault gets the error.
* A transient failure of the batch as a whole (the server restarting, no connection) is shared
  as the answer would have been: every wait of the batch gets the error, with one backoff for
  the shape (:class:`_Outage`). Until it ends, the shape's polls join the one retry statement at
  its end instead of each sending its own, so an outage costs one statement per shape per
  backoff step, not one per wait.

asyncpg is imported inside functions only, so this module imports without the ``postgres`` extra.

Why one module past 700 lines: the rules above are one engine's. Gathering, budgets, re-asking
one wait at a time, lanes and outages each act on the same batches and shapes, and each rule is
only right given the others (a re-ask is bounded by the budget, an outage replaces the gathering
of its shape); read apart they would be a reader's puzzle, not a shorter module.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import math
import re
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

from airflow_deferrable_kit import leases
from airflow_deferrable_kit._backoff import full_jitter
from airflow_deferrable_kit._postgres.client import (
    PostgresOptions,
    classify_postgres_error,
    close_pool,
    connection_lost,
    is_lost,
    open_pool,
    pool_key,
    pooled,
    query_timed_out,
)
from airflow_deferrable_kit.errors import ErrorType, TransientError

if TYPE_CHECKING:
    import asyncpg

log = logging.getLogger(__name__)

#: Parameter kinds (asyncpg's ``Type.kind``) an ``unnest`` of arrays carries one value each of.
#: Arrays would be flattened and composites expanded into columns, so those shapes are not batched.
BATCHABLE_KINDS = frozenset({"scalar", "range"})
#: Parameter types whose values (dicts and lists) cannot be told apart by hashing.
UNBATCHABLE_TYPES = frozenset({"json", "jsonb"})
#: Names the batched statement gives its parts (``$`` keeps them apart from users' own names).
ARGS, ROW, FIRST, WAIT = '"adk$args"', '"adk$row"', '"adk$first"', '"adk$wait"'

#: Waits a batch answers per loop iteration: each then finishes its poll (a few tens of
#: microseconds when there is no row yet), so 10,000 answers never run in one iteration.
SETTLE_PER_TURN = 512
#: Query texts one engine remembers (types, batched form, beat); the least recently used go first.
MAX_SHAPES = 512
#: A batch's statement may run ``statement_timeout`` seconds per wait it carries, up to this many.
BUDGET_SCALE_MAX = 4
#: Once the shape's batches have answered, a batch may run this many times what they took
#: (smoothed), and at least :data:`BUDGET_FLOOR` seconds, within the bound above.
BUDGET_HEADROOM, BUDGET_FLOOR = 8.0, 1.0
#: Connections a timed-out batch's waits are re-asked over at once (the lane's and pooled ones).
RE_ASK_LANES = 3
#: Waits in a row that time out when a timed-out batch is re-asked one by one before the rest
#: are given the timeout too (the server is slow for everyone, not for one wait).
SYSTEMIC_TIMEOUTS = 3
#: Values (per engine) remembered as too slow to batch; the oldest are forgotten first.
MAX_ALONE = 4096
#: Backoff of a shape whose batch failed as a whole, when its waits do not say theirs.
DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP = 1.0, 300.0

_STATEMENTS = [0]


def statement_count() -> int:
    """Statements the Postgres waits of this process have sent so far (batched, single, prepares)."""
    return _STATEMENTS[0]


def _count(statements: int = 1) -> None:
    _STATEMENTS[0] += statements


# ------------------------------------------------------------------------- the statement
_WORD = re.compile(r"[A-Za-z_\u0080-\uffff][A-Za-z0-9_$\u0080-\uffff]*")
_NUMBER = re.compile(r"[0-9][0-9A-Za-z_.]*")
_PLACEHOLDER = re.compile(r"\$([0-9]+)")
_DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_\u0080-\uffff][A-Za-z0-9_\u0080-\uffff]*)?\$")


def _quoted_end(sql: str, start: int, quote: str, *, backslashes: bool) -> int:
    """Index after the literal (or quoted identifier) opening at ``start``; doubled quotes escape."""
    i = start + 1
    while i < len(sql):
        char = sql[i]
        if backslashes and char == "\\":
            i += 2
            continue
        if char == quote:
            if i + 1 < len(sql) and sql[i + 1] == quote:
                i += 2
                continue
            return i + 1
        i += 1
    return len(sql)


def _block_comment_end(sql: str, start: int) -> int:
    depth, i = 0, start
    while i < len(sql):
        pair = sql[i : i + 2]
        if pair == "/*":
            depth, i = depth + 1, i + 2
        elif pair == "*/":
            depth, i = depth - 1, i + 2
            if depth == 0:
                return i
        else:
            i += 1
    return len(sql)


def rewrite_placeholders(sql: str, replace: Callable[[int], str]) -> str:
    """``sql`` with every ``$n`` placeholder replaced by ``replace(n)``, and nothing else touched.

    Placeholders inside string literals (``'...'``, ``E'...'`` with backslash escapes,
    ``$tag$...$tag$``), quoted identifiers, comments and names (``a$1``) are not placeholders
    and stay as they are. Literals follow ``standard_conforming_strings = on`` (PostgreSQL's
    default since 9.1).
    """
    out: list[str] = []
    i, size = 0, len(sql)
    while i < size:
        char = sql[i]
        end = i + 1
        if char == "'":
            end = _quoted_end(sql, i, "'", backslashes=False)
        elif char == '"':
            end = _quoted_end(sql, i, '"', backslashes=False)
        elif sql.startswith("--", i):
            newline = sql.find("\n", i)
            end = size if newline < 0 else newline
        elif sql.startswith("/*", i):
            end = _block_comment_end(sql, i)
        elif char == "$":
            placeholder = _PLACEHOLDER.match(sql, i)
            tag = None if placeholder else _DOLLAR_TAG.match(sql, i)
            if placeholder:
                out.append(replace(int(placeholder.group(1))))
                i = placeholder.end()
                continue
            if tag:
                closing = sql.find(tag.group(0), tag.end())
                end = size if closing < 0 else closing + len(tag.group(0))
        elif (word := _WORD.match(sql, i)) is not None:
            end = word.end()
            if word.group(0) in ("E", "e") and end < size and sql[end] == "'":
                end = _quoted_end(sql, end, "'", backslashes=True)
        elif (number := _NUMBER.match(sql, i)) is not None:
            end = number.end()
        out.append(sql[i:end])
        i = end
    return "".join(out)


def _type_name(typ: Any) -> str:
    """The schema-qualified, quoted name of an asyncpg ``Type``."""
    name = '"' + str(typ.name).replace('"', '""') + '"'
    return f'"{str(typ.schema).replace(chr(34), chr(34) * 2)}".{name}' if typ.schema else name


def batched_statement(sql: str, types: Sequence[Any]) -> str | None:
    """The one statement answering many waits of ``sql``, or ``None`` if its parameters cannot batch.

    ``types`` are the parameter types the server inferred for ``sql`` alone (``$1..$n``); the
    statement takes one array per parameter, then the wait numbers (``int4[]``).
    """
    if not types or any(t.kind not in BATCHABLE_KINDS or t.name in UNBATCHABLE_TYPES for t in types):
        return None
    columns = [f"a{n}" for n in range(1, len(types) + 1)]
    arrays = [f"${n}::{_type_name(t)}[]" for n, t in enumerate(types, start=1)]
    inner = rewrite_placeholders(sql, lambda n: f"({ARGS}.a{n})" if 1 <= n <= len(types) else f"${n}")
    return (
        f"SELECT {ROW}.*, {ARGS}.{WAIT} "
        f"FROM unnest({', '.join(arrays)}, ${len(types) + 1}::int4[]) AS {ARGS}({', '.join(columns)}, {WAIT}) "
        f"CROSS JOIN LATERAL (SELECT * FROM ({inner}) AS {FIRST} LIMIT 1) AS {ROW}"
    )


class BatchRow:
    """One row of a batched answer as the wait's own query would have returned it.

    The batched statement adds the wait number as its last column; this view hides it and offers
    what the trigger reads of an asyncpg ``Record``: ``len``, ``row[i]``, ``row["name"]``,
    ``items()``, ``keys()``, ``values()``.
    """

    __slots__ = ("_record", "_size")

    def __init__(self, record: Any) -> None:
        self._record = record
        self._size = len(record) - 1

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, key: int | str) -> Any:
        if isinstance(key, int):
            if not -self._size <= key < self._size:
                raise IndexError(key)
            return self._record[key % self._size]
        return self._record[key]

    def items(self) -> list[tuple[str, Any]]:
        return list(self._record.items())[: self._size]

    def keys(self) -> list[str]:
        return list(self._record.keys())[: self._size]

    def values(self) -> list[Any]:
        return list(self._record.values())[: self._size]

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self.items()).get(key, default)


# --------------------------------------------------------------------------------- batches
@dataclasses.dataclass(eq=False)
class _Ask:
    """One set of bound values in a batch, and the futures of the waits that asked with exactly it."""

    args: tuple[Any, ...]
    futures: list[asyncio.Future[Any]] = dataclasses.field(default_factory=list)

    def pending(self) -> bool:
        return any(not future.done() for future in self.futures)


def ask_key(args: tuple[Any, ...]) -> Hashable:
    """What tells two waits' values apart: equal keys mean the same query, row for row.

    Text and integers compare exactly; other values are told apart by type and ``repr`` too,
    since ``Decimal("1.0") == Decimal("1")`` and ``True == 1`` yet a query may show the difference.
    Raises ``TypeError`` for values that cannot be hashed.
    """
    for value in args:
        if type(value) is not str and type(value) is not int:
            break
    else:
        return args
    key = tuple((type(value), repr(value), value) for value in args)
    hash(key)
    return key


@dataclasses.dataclass(eq=False)
class _Batch:
    """The waits of one shape whose polls fall in one window, answered together when it ends."""

    sql: str
    timeout: float
    asks: dict[Hashable, _Ask] = dataclasses.field(default_factory=dict)
    waiters: int = 0
    #: The shortest poll interval and backoff cap among the waits: the shape's shared backoff.
    backoff_base: float = math.inf
    backoff_cap: float = math.inf
    timer: asyncio.TimerHandle | None = None
    task: asyncio.Task[None] | None = None
    #: Gathered for the retry at the end of its shape's backoff (sent at once if the shape recovers).
    parked: bool = False


@dataclasses.dataclass
class _Outage:
    """A shape whose last batch failed as a whole: its waits retry together at ``retry_at``."""

    failures: int
    retry_at: float  # loop time


def batch_budget(timeout: float, members: int, typical: float | None = None) -> float:
    """Seconds one statement carrying ``members`` waits may run: what the shape's batches take
    (``typical``) with headroom, within their share of statement timeouts."""
    ceiling = float(timeout) * max(1, min(members, BUDGET_SCALE_MAX))
    if typical is None:
        return ceiling
    return min(ceiling, max(BUDGET_FLOOR, BUDGET_HEADROOM * typical))


@dataclasses.dataclass
class _Shape:
    """What is known of one SQL text: its parameter types and its batched statement, if any."""

    types: list[Any]
    batched: str | None


class PostgresBatches:
    """Every Postgres wait of one connection id polls through this: one per connection per process.

    :meth:`parameter_types` prepares a shape once for all its waits (a thousand waits deferred
    together prepare it once); :meth:`fetch_row` answers one wait's poll from the batch of its
    window. It holds a lease on the connection id's pool and gives it back on :meth:`close`.
    """

    def __init__(self, conn_id: str, pool: asyncpg.Pool) -> None:
        self.conn_id = conn_id
        self.pool = pool
        self._shapes: dict[str, asyncio.Task[_Shape]] = {}
        self._gathering: dict[tuple[str, float, float], _Batch] = {}
        self._due: list[_Batch] = []
        self._flush_scheduled = False
        self._lanes: set[asyncio.Task[None]] = set()
        self._beats: dict[tuple[str, float, float, float], float] = {}
        self._outages: dict[tuple[str, float], _Outage] = {}
        #: (sql, timeout, values) of waits that timed out alone: asked alone until they answer in time.
        self._alone_asks: collections.OrderedDict[tuple[str, float, Hashable], None] = collections.OrderedDict()
        #: Seconds the batches of each shape (sql, timeout) take, smoothed: their budget's base.
        self._typical: dict[tuple[str, float], float] = {}

    # ------------------------------------------------------------------------- shapes
    async def parameter_types(self, sql: str, timeout: float) -> list[Any]:
        """The types the server inferred for ``$1..$n`` of ``sql`` (prepared once per shape)."""
        return (await self._shape(sql, timeout)).types

    async def _shape(self, sql: str, timeout: float) -> _Shape:
        task = self._shapes.pop(sql, None)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = asyncio.get_running_loop().create_task(self._prepare(sql, timeout))
        self._shapes[sql] = task  # the most recently used last
        while len(self._shapes) > MAX_SHAPES:
            self._forget_shape(next(iter(self._shapes)))
        return await asyncio.shield(task)

    def _forget_shape(self, sql: str) -> None:
        """Drop what is known of a query text nobody asked for in a long while (it is re-learnt if needed)."""
        self._shapes.pop(sql, None)
        for beat in [beat for beat in self._beats if beat[0] == sql]:
            del self._beats[beat]
        for shape in [shape for shape in self._outages if shape[0] == sql]:
            del self._outages[shape]
        for slow in [slow for slow in self._alone_asks if slow[0] == sql]:
            del self._alone_asks[slow]

    async def _prepare(self, sql: str, timeout: float) -> _Shape:
        import asyncpg

        async with pooled(self.pool, timeout) as connection:
            _count()
            statement = await connection.prepare(sql, timeout=timeout)
            types = list(statement.get_parameters())
            batched = batched_statement(sql, types)
            if batched is not None:
                try:
                    _count()
                    await connection.prepare(batched, timeout=timeout)
                except asyncpg.PostgresError as exc:  # the query does not fit the lateral form
                    log.debug("Postgres waits on %r poll one by one: %s", sql[:200], exc)
                    batched = None
        return _Shape(types, batched)

    def keeps_beat(self, sql: str) -> bool:
        """Whether the waits of ``sql`` poll on a common beat: known to batch (else each its own phase)."""
        prepared = self._shapes.get(sql)
        if prepared is None or not prepared.done() or prepared.cancelled() or prepared.exception() is not None:
            return False
        return prepared.result().batched is not None

    def until_next_beat(self, sql: str, *, timeout: float, interval: float, window: float) -> float:
        """Seconds until this wait's next poll, on the beat of its shape: at most ``interval``.

        Waits start at different moments, so each window of a round would hold a few of them
        and a shape spread thin (10 waits on each of 100 tables) would cost one statement per
        wait after all. Each shape and interval has a beat instead, one per ``interval``, in
        the middle of a window: every wait polls at the last beat before its own poll would be
        due, never later, so from their second poll on the waits of a shape poll in the same
        window. Shapes that cannot batch keep their own (random) phase.
        """
        if interval <= 0 or window <= 0 or not self.keeps_beat(sql):
            return interval
        now = asyncio.get_running_loop().time()
        key = (sql, timeout, interval, window)
        beat = self._beats.get(key)
        if beat is None:  # the first wait to ask sets the beat: the middle of a window, an interval away
            beat = self._beats[key] = (math.floor((now + interval) / window - 0.5) + 0.5) * window
        return (beat - now) % interval or interval

    # ------------------------------------------------------------------------- polls
    async def fetch_row(
        self,
        sql: str,
        args: Sequence[Any],
        *,
        timeout: float,
        window: float,
        backoff_base: float | None = None,
        backoff_cap: float | None = None,
    ) -> Any:
        """The first row of ``sql`` with ``args`` (or ``None``), from the batch of this window.

        The batch is sent at the next multiple of ``window`` (loop time), so every wait whose
        poll falls in the same window of the same shape shares it. Cancelling one wait leaves the
        batch to the others; the batch is only called off when every wait in it is gone.
        ``backoff_base`` and ``backoff_cap`` (the wait's poll interval and ``max_backoff``) shape
        the one backoff its shape takes when a batch fails as a whole; a poll during that backoff
        joins the retry at its end.
        """
        values = tuple(args)
        try:
            key = ask_key(values)
        except TypeError:  # values that cannot be told apart by hashing: asked alone
            return await self._alone(sql, values, timeout)
        slow = (sql, float(timeout), key)
        if slow in self._alone_asks:  # timed out alone before: not in the batch until it answers in time
            self._alone_asks.move_to_end(slow)
            row = await self._alone(sql, values, timeout)
            self._alone_asks.pop(slow, None)
            return row
        loop = asyncio.get_running_loop()
        default_base = window * 10 if window > 0 else DEFAULT_BACKOFF_BASE
        base = float(backoff_base if backoff_base is not None else default_base)
        cap = float(backoff_cap if backoff_cap is not None else DEFAULT_BACKOFF_CAP)
        fire_at = math.ceil(loop.time() / window) * window if window > 0 else loop.time()
        outage = self._outages.get((sql, float(timeout)))
        if outage is not None and outage.retry_at > fire_at:
            # The shape backs off as one: join its retry, but never wait past this wait's own cap.
            fire_at = max(fire_at, min(outage.retry_at, loop.time() + cap))
        slot = (sql, float(timeout), fire_at)
        batch = self._gathering.get(slot)
        if batch is None:
            batch = self._gathering[slot] = _Batch(sql, float(timeout), parked=outage is not None)
            batch.timer = loop.call_at(fire_at, self._send, slot, batch)
        batch.backoff_base = min(batch.backoff_base, base)
        batch.backoff_cap = min(batch.backoff_cap, cap)
        future: asyncio.Future[Any] = loop.create_future()
        ask = batch.asks.get(key)
        if ask is None:
            ask = batch.asks[key] = _Ask(values)
        ask.futures.append(future)
        batch.waiters += 1
        try:
            return await future
        finally:
            batch.waiters -= 1
            if not batch.waiters:
                self._call_off(slot, batch)

    def _call_off(self, slot: tuple[str, float, float], batch: _Batch) -> None:
        """Every wait of the batch is gone (cancelled): do not send it, or stop it in flight."""
        if batch.timer is not None:
            batch.timer.cancel()
        if self._gathering.get(slot) is batch:
            del self._gathering[slot]
        if batch.task is not None and not batch.task.done():
            batch.task.cancel()

    def _send(self, slot: tuple[str, float, float], batch: _Batch) -> None:
        if self._gathering.get(slot) is batch:
            del self._gathering[slot]
        batch.timer = None
        self._due.append(batch)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Send the batches due now (every shape's of this window) over a few pooled connections.

        Each lane takes one connection for all its batches, one after another: the waits on a
        hundred tables cost a hundred statements per round but only a few hand-outs (and
        resets) of pooled connections, not a hundred.
        """
        self._flush_scheduled = False
        due, self._due = self._due, []
        lanes = max(1, min(len(due), int(self.pool.get_max_size())))
        loop = asyncio.get_running_loop()
        for lane in range(lanes):
            task = loop.create_task(self._lane(due[lane::lanes]))
            self._lanes.add(task)
            task.add_done_callback(self._lanes.discard)

    async def _lane(self, batches: list[_Batch]) -> None:
        """Answer ``batches`` in turn on one pooled connection (a fresh one after a called-off batch)."""
        waiting = collections.deque(batches)
        while waiting:
            try:
                async with pooled(self.pool, min(batch.timeout for batch in waiting)) as connection:
                    while waiting:
                        batch = waiting[0]
                        if any(ask.pending() for ask in batch.asks.values()):
                            batch.task = asyncio.get_running_loop().create_task(self._answer(batch, connection))
                            try:
                                await asyncio.wait({batch.task})
                            except asyncio.CancelledError:  # the engine is closing
                                batch.task.cancel()
                                raise
                        waiting.popleft()
                        if batch.task is not None and batch.task.cancelled():  # called off in flight
                            raise _CalledOff  # the connection may still be busy with it
                        if batch.task is not None and batch.task.exception() is not None:  # a bug: say so
                            for ask in batch.asks.values():
                                _settle(ask, error=batch.task.exception())
                        if waiting and is_lost(connection):  # closed under the batch: the next needs another
                            raise _Lost
            except (_CalledOff, _Lost):
                continue  # pooled() dropped or released the connection as for any cancelled query
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # no connection: every batch still waiting gets the error
                for batch in waiting:
                    error = self._shared_failure(batch, exc) if _is_transient(exc) else exc
                    for ask in batch.asks.values():
                        _settle(ask, error=error)
                return

    async def _answer(self, batch: _Batch, connection: Any) -> None:
        """Ask the server once for the whole batch, and hand every wait its own row or error."""
        asks = [ask for ask in batch.asks.values() if ask.pending()]
        if not asks:
            return
        try:
            shape = await self._shape(batch.sql, batch.timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            for ask in asks:
                _settle(ask, error=exc)
            return
        if shape.batched is None:
            await self._one_by_one(batch, asks, connection)
            return
        if len(asks) == 1:  # the shape's statement all the same: its transient failure is the shape's
            await self._lone_ask(batch, asks[0], connection)
            return
        columns = [list(column) for column in zip(*(ask.args for ask in asks), strict=True)]
        key = (batch.sql, batch.timeout)
        budget = batch_budget(batch.timeout, len(asks), self._typical.get(key))
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            _count()
            records = await connection.fetch(shape.batched, *columns, list(range(len(asks))), timeout=budget)
        except asyncio.CancelledError:
            raise
        except asyncio.TimeoutError:  # maybe one wait's slow query: each is asked alone, in its own time
            log.debug("A batch of %d Postgres waits ran past %.1fs; asking each alone", len(asks), budget)
            if not await self._re_ask(batch, asks, connection) and key in self._typical:
                self._typical[key] = max(self._typical[key], budget)  # just slow: a larger budget
            return
        except Exception as exc:
            if not _is_transient(exc):  # maybe one wait's fault: only that wait gets the error
                log.debug("A batch of %d Postgres waits failed (%s); asking each alone", len(asks), exc)
                await self._one_by_one(batch, asks, connection)
                return
            error = self._shared_failure(batch, exc)
            for ask in asks:
                _settle(ask, error=error)
            return
        took = loop.time() - started
        self._typical[key] = took if key not in self._typical else 0.7 * self._typical[key] + 0.3 * took
        self._recovered(batch)
        rows = {record[len(record) - 1]: BatchRow(record) for record in records}
        for number, ask in enumerate(asks):
            if number and not number % SETTLE_PER_TURN:
                await asyncio.sleep(0)  # the waits answered so far run before the next ones are
            _settle(ask, rows.get(number))

    async def _lone_ask(self, batch: _Batch, ask: _Ask, connection: Any) -> None:
        """The one wait of a batch, asked with its own query (the batched form would add nothing)."""
        if is_lost(connection):  # closed under an earlier batch of the lane: never sent
            _settle(ask, error=self._shared_failure(batch, connection_lost()))
            return
        try:
            _count()
            row = await connection.fetchrow(batch.sql, *ask.args, timeout=batch.timeout)
        except asyncio.CancelledError:
            raise
        except asyncio.TimeoutError:
            _settle(ask, error=query_timed_out(batch.timeout))
        except Exception as exc:
            _settle(ask, error=self._shared_failure(batch, exc) if _is_transient(exc) else exc)
        else:
            self._recovered(batch)
            _settle(ask, row)

    def _recovered(self, batch: _Batch) -> None:
        """A statement of the shape succeeded: its backoff is over, and polls parked for it go now."""
        if self._outages.pop((batch.sql, batch.timeout), None) is None:
            return
        for slot, parked in list(self._gathering.items()):
            if parked.parked and slot[:2] == (batch.sql, batch.timeout):
                if parked.timer is not None:
                    parked.timer.cancel()
                self._send(slot, parked)

    def _shared_failure(self, batch: _Batch, exc: BaseException) -> TransientError:
        """The error every wait of a batch that failed as a whole shares, and the shape's one backoff.

        The shape's next statement goes out when the backoff ends, carrying every poll made in
        the meantime (:meth:`fetch_row`); each wait's own backoff is at least as long
        (``retry_after``), so none of them sends a statement of its own in between.
        """
        loop = asyncio.get_running_loop()
        shape = (batch.sql, batch.timeout)
        outage = self._outages.get(shape)
        failures = 1 if outage is None else outage.failures + 1
        base = batch.backoff_base if math.isfinite(batch.backoff_base) else DEFAULT_BACKOFF_BASE
        cap = batch.backoff_cap if math.isfinite(batch.backoff_cap) else DEFAULT_BACKOFF_CAP
        delay = full_jitter(failures, base=base, cap=cap)
        retry_at = loop.time() + delay
        self._outages[shape] = _Outage(failures, retry_at)
        error = _transient(exc, batch.timeout)
        shared = TransientError(
            f"{error.message} (shared by the {len(batch.asks)} wait(s) of one batched statement; "
            f"their next statement in {retry_at - loop.time():.1f}s)",
            error_type=error.error_type,
            details=error.details,
            retry_after=max(retry_at - loop.time(), error.retry_after or 0.0),
        )
        shared.__cause__ = exc
        return shared

    async def _alone(self, sql: str, args: Sequence[Any], timeout: float) -> Any:
        """One wait's own query on a connection of its own, exactly as it runs unbatched."""
        async with pooled(self.pool, timeout) as connection:
            _count()
            return await connection.fetchrow(sql, *args, timeout=timeout)

    async def _one_by_one(self, batch: _Batch, asks: list[_Ask], connection: Any) -> None:
        """Ask each wait's query alone (a shape that cannot batch, a batch one wait's value broke)."""
        for ask in asks:
            if ask.pending():
                await self._ask_on(connection, batch, ask)

    async def _ask_on(self, lane: Any, batch: _Batch, ask: _Ask) -> bool | None:
        """Ask one wait's query alone on ``lane`` and settle it with its row or its error.

        Returns whether it was answered: ``False`` when it ran past the statement's timeout,
        ``None`` when it was never sent (an earlier ask's query lost the connection).
        """
        if is_lost(lane):
            _settle(ask, error=connection_lost())
            return None
        try:
            _count()
            row = await lane.fetchrow(batch.sql, *ask.args, timeout=batch.timeout)
        except asyncio.CancelledError:
            raise
        except asyncio.TimeoutError:
            _settle(ask, error=query_timed_out(batch.timeout))
            return False
        except Exception as exc:
            _settle(ask, error=exc)
        else:
            _settle(ask, row)
        return True

    async def _re_ask(self, batch: _Batch, asks: list[_Ask], connection: Any) -> bool:
        """Ask each wait of a batch that ran past its budget alone, over a few connections at once.

        A slow wait holds one connection for its ``statement_timeout`` while the others are asked
        on the rest, so its neighbours are answered in this round, not after it. Returns whether
        a wait timed out alone (remembered as too slow to batch, see :meth:`_ask_alone`).
        """
        queue = collections.deque(ask for ask in asks if ask.pending())
        answered: list[int] = [0]
        timed_out: list[_Ask] = []

        async def ask_each(lane: Any) -> None:
            while queue:
                if len(timed_out) >= SYSTEMIC_TIMEOUTS and not answered[0]:
                    for slow in timed_out:  # not these waits' own slowness: they may batch again
                        self._alone_asks.pop((batch.sql, batch.timeout, ask_key(slow.args)), None)
                    error = self._shared_failure(batch, asyncio.TimeoutError())
                    while queue:
                        _settle(queue.popleft(), error=error)
                    return
                ask = queue.popleft()
                if not ask.pending():
                    continue
                answer = await self._ask_on(lane, batch, ask)
                if answer:
                    answered[0] += 1
                elif answer is False:
                    timed_out.append(ask)
                    self._ask_alone(batch, ask)

        async def pooled_lane() -> None:
            try:
                async with pooled(self.pool, batch.timeout) as lane:
                    await ask_each(lane)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # no spare connection: the other lanes go on
                log.debug("A spare connection to re-ask a batch was not had: %s", exc)

        extra = [asyncio.ensure_future(pooled_lane()) for _ in range(min(RE_ASK_LANES - 1, len(queue) - 1))]
        try:
            await ask_each(connection)
            await asyncio.gather(*extra)
        finally:
            for task in extra:
                task.cancel()
            await asyncio.gather(*extra, return_exceptions=True)
        return bool(timed_out)

    def _ask_alone(self, batch: _Batch, ask: _Ask) -> None:
        """Remember ``ask``'s values as too slow to batch: they are asked alone from now on."""
        slow = (batch.sql, batch.timeout, ask_key(ask.args))
        self._alone_asks[slow] = None
        self._alone_asks.move_to_end(slow)
        while len(self._alone_asks) > MAX_ALONE:
            self._alone_asks.popitem(last=False)

    async def close(self) -> None:
        """Stop every batch (nobody waits for one any more) and give back the pool."""
        for batch in [*self._gathering.values(), *self._due]:
            if batch.timer is not None:
                batch.timer.cancel()
        for lane in list(self._lanes):
            lane.cancel()
        self._gathering.clear()
        self._due.clear()
        self._outages.clear()
        self._alone_asks.clear()
        for task in self._shapes.values():
            task.cancel()
        self._shapes.clear()
        await leases.release(pool_key(self.conn_id))


class _CalledOff(asyncio.CancelledError):
    """A lane's batch was called off in flight: its connection is given back as a cancelled query's."""


class _Lost(Exception):
    """A lane's connection was closed under its batch: the batches after it take a fresh one."""


def _is_transient(exc: Exception) -> bool:
    if isinstance(exc, TransientError):
        return True
    if isinstance(exc, (OSError, asyncio.TimeoutError)):
        return True
    return isinstance(classify_postgres_error(exc), TransientError)


def _transient(exc: BaseException, timeout: float) -> TransientError:
    """``exc`` (transient by :func:`_is_transient`) as the package's transient error."""
    if isinstance(exc, TransientError):
        return exc
    if isinstance(exc, asyncio.TimeoutError):
        return query_timed_out(timeout)
    classified = classify_postgres_error(exc)
    if isinstance(classified, TransientError):
        return classified
    return TransientError(f"{type(exc).__name__}: {exc}", error_type=ErrorType.NETWORK)


def _settle(ask: _Ask, row: Any = None, *, error: BaseException | None = None) -> None:
    for future in ask.futures:
        if future.done():
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(row)


async def open_batches(options: PostgresOptions) -> PostgresBatches:
    """The batching engine of one connection, on the connection's shared pool."""
    pool = await leases.acquire(options.lease_key, lambda: open_pool(options), close_pool)
    return PostgresBatches(options.conn_id, pool)


async def close_batches(batches: PostgresBatches) -> None:
    await batches.close()
