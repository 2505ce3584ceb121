"""The hand-out at the heart of the shared Kafka reader: waiters, their index, and the topics they read.

A :class:`FanOut` is handed batches of records (by the shared reader, or by a catch-up pass,
:class:`~airflow_deferrable_kit._kafka.catchup.CatchUpPass`, that brings late waiters up to it)
and gives each message to the :class:`Waiter` objects whose conditions can match it, found
through an index on the values the conditions compare, so the cost follows the message rate
rather than the number of waits. Each waiter keeps its own cursor per partition, so it sees
every message from its start once, whichever fan-out hands it over. A :class:`TopicReader` is
the fan-out of one topic on a connection's shared reader, with its state; it asks the
connection (:class:`Connection`) for lookups, and nothing here fetches from a broker.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

from airflow_deferrable_kit._kafka import settings
from airflow_deferrable_kit._kafka.consumers import known_position
from airflow_deferrable_kit._kafka.gate import ConnectGates
from airflow_deferrable_kit._kafka.messages import (
    PREDICATE,
    PROBLEMS,
    KafkaMessage,
    MatchSpec,
    Point,
    canonical_value,
)
from airflow_deferrable_kit._kafka.offsets import OffsetsSource, StartOffsets, resolve_start
from airflow_deferrable_kit._kafka.settings import KafkaOptions
from airflow_deferrable_kit._redact import redact
from airflow_deferrable_kit.conditions import MISSING, Decision
from airflow_deferrable_kit.errors import WaitError

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer, TopicPartition


log = logging.getLogger(__name__)


# ================================================================================ waiter
#: What a fan-out counts per value format and partition: messages examined, then skipped by reason.
COUNTED: Final = ("examined", *PROBLEMS)
_SLOT: Final = {name: i for i, name in enumerate(COUNTED)}
_ZERO: Final = (0,) * len(COUNTED)


class _Wake:
    """What a waiter sleeps on: an ``asyncio.Event`` with a timeout, without a task per sleep.

    ``asyncio.wait_for(event.wait(), t)`` starts a task each time; ten thousand waits sleeping a
    poll interval at a time would start thousands a second. :meth:`wait` costs a future and a
    timer; :meth:`wait_until` only a future, the time being up told by an alarm the caller
    shares between its sleeps. Only the waiter's own task sleeps on it.
    """

    __slots__ = ("_alarm", "_set", "_sleeper")

    def __init__(self) -> None:
        self._set = False
        self._sleeper: asyncio.Future[None] | None = None
        self._alarm: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._set = True
        if self._sleeper is not None and not self._sleeper.done():
            self._sleeper.set_result(None)

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set

    async def wait(self, timeout: float) -> bool:
        """Sleep until set or until ``timeout`` seconds pass; True if it was set."""
        if self._set:
            return True
        loop = asyncio.get_running_loop()
        sleeper = self._sleeper = loop.create_future()
        timer = loop.call_later(timeout, _resolve, sleeper)
        try:
            await sleeper
        finally:
            timer.cancel()
            self._sleeper = None
        return self._set

    async def wait_until(self, alarm: asyncio.Future[None]) -> bool:
        """Sleep until set or until ``alarm`` is done; True if it was set.

        One alarm serves every sleep of one span (a Kafka check's poll interval, on the
        triggerer's shared paced timers), however often messages wake the waiter within it: it
        rings once, and no timer is made or cancelled per sleep.
        """
        if self._set:
            return True
        if alarm.done():
            return False
        if self._alarm is not alarm:
            self._alarm = alarm
            alarm.add_done_callback(self._rang)
        sleeper = self._sleeper = asyncio.get_running_loop().create_future()
        try:
            await sleeper
        finally:
            self._sleeper = None
        return self._set

    def _rang(self, alarm: asyncio.Future[None]) -> None:
        if alarm is self._alarm:
            self._alarm = None
            if self._sleeper is not None and not self._sleeper.done():
                self._sleeper.set_result(None)


#: The set of every waiter that has put nothing in one yet (``ts_filter``, ``behind``): each is
#: made on its first add (most waiters never need these two, and an empty set is not free).
_NOTHING: Final[frozenset[Any]] = frozenset()

#: The queue of every waiter that has held nothing yet. ``maxlen=0``: it can never hold anything,
#: and every append goes through :meth:`Waiter.enqueue`, which gives the waiter its own first.
_NOTHING_QUEUED: Final[collections.deque[Any]] = collections.deque(maxlen=0)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Waiter:
    """One trigger's side of the shared readers: where it is in each partition and what it found.

    ``cursor[tp]`` is the next offset this waiter has not looked at. While it is attached to a
    fan-out only the messages handed to it move the cursor (the fan-out's position says how far
    it has really got). Partitions it has no cursor for (added after it started) are read from
    where the reader found them (their beginning), keeping every message, except for a wait that
    starts from a moment (``start_after_ms``): it keeps only messages stamped at or after it.
    """

    __slots__ = (
        "attached",
        "behind",
        "counts",
        "cursor",
        "finished",
        "index_keys",
        "marks",
        "own_pace",
        "queue",
        "queued_bytes",
        "readers",
        "spec",
        "start_after_ms",
        "start_from",
        "ts_filter",
        "wake",
    )

    def __init__(self, spec: MatchSpec, *, start_from: str, start_after_ms: int | None) -> None:
        self.spec = spec
        self.start_from = start_from
        self.start_after_ms = start_after_ms
        self.cursor: dict[TopicPartition, int] = {}
        self.ts_filter: set[TopicPartition] | frozenset[TopicPartition] = _NOTHING
        #: What was handed to it and not yet settled. Most waiters never hold anything, so they
        #: share one empty, bounded-to-nothing deque until the first :meth:`enqueue`.
        self.queue: collections.deque[tuple[KafkaMessage, str, Decision | None]] = _NOTHING_QUEUED
        self.queued_bytes = 0
        self.wake = _Wake()
        self.readers: dict[str, TopicReader] = {}
        #: The fan-out feeding this waiter on each topic: the shared reader, or a catch-up pass.
        self.attached: dict[str, FanOut] = {}
        #: Per partition, the fan-out's counts when it reached this waiter's cursor (None: not yet).
        self.marks: dict[TopicPartition, tuple[int, ...] | None] = {}
        #: Topics where it is behind its reader and has to catch up before it can join it.
        self.behind: set[str] | frozenset[str] = _NOTHING
        #: Set once its predicate could not keep up: from then on it catches up at its own pace.
        self.own_pace = False
        self.finished = False
        #: What it counted itself (made on the first count; see :meth:`stats`).
        self.counts: collections.Counter[str] | None = None
        self.index_keys = spec.index_keys()

    def filter_by_time(self, tp: TopicPartition) -> None:
        """Keep only messages stamped at or after the start in ``tp`` (a partition it did not resolve)."""
        if not isinstance(self.ts_filter, set):
            self.ts_filter = set()
        self.ts_filter.add(tp)

    def note_behind(self, topic: str) -> None:
        """It has to catch up on ``topic`` before it can join the topic's reader."""
        if not isinstance(self.behind, set):
            self.behind = set()
        self.behind.add(topic)

    def caught_up(self, topic: str) -> None:
        if isinstance(self.behind, set):
            self.behind.discard(topic)

    def tally(self, counted: Mapping[str, int]) -> None:
        """Add ``counted`` to what it counted itself."""
        if counted:
            if self.counts is None:
                self.counts = collections.Counter()
            self.counts.update(counted)

    def enqueue(self, item: tuple[KafkaMessage, str, Decision | None], size: int) -> None:
        """Queue ``item`` for the waiter's task (its own deque made on the first one)."""
        if self.queue is _NOTHING_QUEUED:
            self.queue = collections.deque()
        self.queue.append(item)
        self.queued_bytes += size

    # ------------------------------------------------------------------- windows
    def admit(self, message: KafkaMessage, tp: TopicPartition) -> bool:
        """Advance past ``message``; True if it is new to this waiter and not before its start."""
        cursor = self.cursor.get(tp)
        if cursor is not None and message.offset < cursor:
            return False
        if cursor is None and self.start_from != "earliest":
            self.filter_by_time(tp)
        self.cursor[tp] = message.offset + 1
        if tp in self.ts_filter and self.start_after_ms is not None:
            # A partition this waiter did not resolve: keep what was stamped at or after the start.
            return not 0 <= message.timestamp < self.start_after_ms
        return True

    def position_in(self, tp: TopicPartition, feed: FanOut) -> int:
        """The cursor for ``tp``; a partition first seen now starts where the reader found it."""
        cursor = self.cursor.get(tp)
        if cursor is None:
            cursor = self.cursor[tp] = feed.origins.get(tp, 0)
            if self.start_from != "earliest":
                self.filter_by_time(tp)
        return cursor

    # --------------------------------------------------------------- from a feed
    def offer(self, message: KafkaMessage, tp: TopicPartition, feed: FanOut) -> bool:
        """Called by a fan-out (synchronously) with every message this waiter may care about.

        Returns True when the waiter was woken (it has something to act on).
        """
        if self.finished or not self.admit(message, tp):
            return False
        outcome = self.spec.evaluate(message)
        if outcome is None:
            return False
        kind, decision = outcome
        if kind == PREDICATE and (
            len(self.queue) >= settings.WAITER_QUEUE_MESSAGES
            or self.queued_bytes + message.size > settings.WAITER_QUEUE_BYTES
        ):
            self._fall_behind(feed, tp, message.offset)
            return True
        self.enqueue((message, kind, decision), message.size)
        if kind != PREDICATE:
            # Nothing after a data decision matters: stop receiving from every feed.
            self.finished = True
            for topic in list(self.attached):
                self.detach(topic)
        self.wake.set()
        return True

    def _fall_behind(self, feed: FanOut, tp: TopicPartition, offset: int) -> None:
        """Too much is waiting for the predicate: leave the stream and catch up on our own later."""
        self.detach(feed.topic)
        for other, position in feed.positions.items():
            if other == tp:
                continue
            if other not in self.cursor and self.start_from != "earliest":
                self.filter_by_time(other)
            self.cursor[other] = max(self.cursor.get(other, position), position)
        self.cursor[tp] = offset
        self.note_behind(feed.topic)
        self.own_pace = True
        self.tally({"fell_behind": 1})
        self.wake.set()

    # ---------------------------------------------------------------- attachment
    def join(self, feed: FanOut) -> bool:
        """Start receiving from ``feed`` if level with (or ahead of) it; atomic on the loop."""
        if not feed.attach(self):
            return False
        self.attached[feed.topic] = feed
        self.caught_up(feed.topic)
        return True

    def try_attach(self, topic: str) -> bool:
        """Join the topic's shared reader, or note that this waiter has to catch up first."""
        if self.join(self.readers[topic]):
            return True
        self.note_behind(topic)
        return False

    def detach(self, topic: str) -> None:
        feed = self.attached.pop(topic, None)
        if feed is None:
            return
        feed.detach(self)
        self.tally(self._counted_by(feed))
        for tp in [tp for tp in self.marks if tp.topic == topic]:
            del self.marks[tp]

    def _counted_by(self, feed: FanOut) -> dict[str, int]:
        """What ``feed`` counted for this waiter: per partition, its counts now minus the mark."""
        totals = _ZERO
        for tp, tally in feed.tallies.get(self.spec.value_format, {}).items():
            mark = self.marks.get(tp, _ZERO)  # no mark: the partition appeared after the attach
            if mark is not None:
                totals = tuple(total + now - then for total, now, then in zip(totals, tally, mark, strict=True))
        return {name: total for name, total in zip(COUNTED, totals, strict=True) if total}

    def stats(self) -> dict[str, Any]:
        """How much this wait looked at: messages examined and skipped (by reason)."""
        counts = collections.Counter(self.counts or ())
        for feed in self.attached.values():
            counts.update(self._counted_by(feed))
        skipped = {name: counts.get(name, 0) for name in (*PROBLEMS, "predicate_error")}
        return {"examined": counts.get("examined", 0), "skipped": skipped}

    def count(self, message: KafkaMessage) -> str | None:
        """Count a message this waiter read itself; return its problem, if any."""
        problem = message.problem(self.spec.value_format)
        self.tally({"examined": 1} if problem is None else {"examined": 1, problem: 1})
        return problem


# ============================================================================== fan-out
class Pace:
    """The budget of one hand-out: yield to the loop after a slice of work or of wake-ups.

    One fetch may span a thousand topics with a few records each; the fan-outs of all of them
    share one pace, or none would ever reach its budget and the whole fetch (and every wait it
    woke) would run in one loop iteration.
    """

    __slots__ = ("started", "woken")

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.woken = 0

    def due(self) -> bool:
        return (
            self.woken >= settings.WAKES_PER_SLICE or time.monotonic() - self.started > settings.DISPATCH_SLICE_SECONDS
        )

    async def pause(self) -> None:
        await asyncio.sleep(0)
        self.started = time.monotonic()
        self.woken = 0


async def hand_out(batch: Mapping[TopicPartition, list[Any]], feed_for: Callable[[str], FanOut | None]) -> None:
    """Hand a fetch that spans topics to each topic's fan-out (``feed_for``), with one pace."""
    by_topic: dict[str, dict[TopicPartition, list[Any]]] = collections.defaultdict(dict)
    for tp, records in batch.items():
        by_topic[tp.topic][tp] = records
    pace = Pace()
    for topic, part in by_topic.items():
        feed = feed_for(topic)
        if feed is not None:
            await feed._dispatch(part, pace)


class _Group:
    """The waiters of one value format on a fan-out, indexed by the values they compare.

    A value most often has one waiter (each wait looks for its own id): its bucket is then that
    waiter itself, and becomes a set when a second one joins (a set per value would cost more than
    the waiter's own state).
    """

    def __init__(self) -> None:
        self.index: dict[tuple[Point, tuple[str, Any]], Waiter | set[Waiter]] = {}
        self.points: collections.Counter[Point] = collections.Counter()
        self.scan_all: set[Waiter] = set()
        self.size = 0

    def add(self, waiter: Waiter) -> None:
        self.size += 1
        if waiter.index_keys is None:
            self.scan_all.add(waiter)
            return
        for point, value in waiter.index_keys:
            key = (point, value)
            bucket = self.index.get(key)
            if bucket is None:
                self.index[key] = waiter
            elif bucket is waiter or (isinstance(bucket, set) and waiter in bucket):
                continue
            elif isinstance(bucket, set):
                bucket.add(waiter)
            else:
                self.index[key] = {bucket, waiter}
            self.points[point] += 1

    def remove(self, waiter: Waiter) -> None:
        self.size -= 1
        if waiter.index_keys is None:
            self.scan_all.discard(waiter)
            return
        for point, value in waiter.index_keys:
            key = (point, value)
            bucket = self.index.get(key)
            if bucket is waiter:
                del self.index[key]
            elif isinstance(bucket, set) and waiter in bucket:
                bucket.discard(waiter)
                if len(bucket) == 1:
                    self.index[key] = next(iter(bucket))
            else:
                continue
            self.points[point] -= 1
            if self.points[point] <= 0:
                del self.points[point]

    def candidates(self, message: KafkaMessage, value_format: str) -> list[Waiter]:
        found: set[Waiter] = set(self.scan_all)
        for point in self.points:
            value = message.lookup(value_format, point[0], point[1])
            canonical = canonical_value(value) if value is not MISSING else None
            if canonical is not None:
                bucket = self.index.get((point, canonical))
                if bucket is None:
                    continue
                if isinstance(bucket, set):
                    found.update(bucket)
                else:
                    found.add(bucket)
        return list(found)

    def members(self) -> set[Waiter]:
        everyone = set(self.scan_all)
        for bucket in self.index.values():
            if isinstance(bucket, set):
                everyone.update(bucket)
            else:
                everyone.add(bucket)
        return everyone


class FanOut:
    """Waiters on one topic, indexed by the values they compare, and the hand-out of messages.

    The shared :class:`TopicReader` is one; a catch-up pass that brings late waiters up to the
    reader is another. ``positions[tp]`` is the next offset handed out. Counts are kept per
    value format and partition, and each waiter marks the counts at the moment the hand-out
    reaches its cursor, so what each wait examined is exact without counting per wait.
    """

    def __init__(self, topic: str, origins: dict[TopicPartition, int]) -> None:
        self.topic = topic
        #: Where the reader first found each partition (a waiter new to a partition starts there).
        self.origins = origins
        self.positions: dict[TopicPartition, int] = {}
        self.last_timestamp: dict[TopicPartition, int] = {}
        self.groups: dict[str, _Group] = {}
        self.tallies: dict[str, dict[TopicPartition, list[int]]] = collections.defaultdict(dict)
        self.evaluations = 0
        #: Per partition, waiters attached ahead of the hand-out: (cursor, order, waiter), a heap.
        self._crossings: dict[TopicPartition, list[tuple[int, int, Waiter]]] = collections.defaultdict(list)
        self._order = itertools.count()

    # ------------------------------------------------------------------- waiters
    def behind(self, waiter: Waiter) -> dict[TopicPartition, int]:
        """Partitions where ``waiter`` has not yet reached this fan-out, with its position."""
        return {tp: position for tp, position in self.positions.items() if waiter.position_in(tp, self) < position}

    def attach(self, waiter: Waiter) -> bool:
        """Add the waiter if it is level with (or ahead of) the hand-out; atomic on the loop."""
        if self.behind(waiter):
            return False
        group = self.groups.get(waiter.spec.value_format)
        if group is None:
            group = self.groups[waiter.spec.value_format] = _Group()
        group.add(waiter)
        for tp in self.positions:
            self.mark(waiter, tp)
        return True

    def mark(self, waiter: Waiter, tp: TopicPartition) -> None:
        """Note where counting starts for ``waiter`` in ``tp``: now, or when the hand-out gets to its cursor."""
        cursor = waiter.position_in(tp, self)
        if cursor <= self.positions[tp]:
            waiter.marks[tp] = tuple(self._tally(waiter.spec.value_format, tp))
        else:
            waiter.marks[tp] = None
            heapq.heappush(self._crossings[tp], (cursor, next(self._order), waiter))

    def detach(self, waiter: Waiter) -> None:
        group = self.groups.get(waiter.spec.value_format)
        if group is not None:
            group.remove(waiter)
            if group.size <= 0:
                del self.groups[waiter.spec.value_format]

    def waiters(self) -> list[Waiter]:
        everyone: set[Waiter] = set()
        for group in self.groups.values():
            everyone.update(group.members())
        return list(everyone)

    def _tally(self, value_format: str, tp: TopicPartition) -> list[int]:
        tallies = self.tallies[value_format]
        tally = tallies.get(tp)
        if tally is None:
            tally = tallies[tp] = [0] * len(COUNTED)
        return tally

    def _cross(self, tp: TopicPartition, offset: int) -> None:
        """The hand-out reached ``offset``: start counting for the waiters whose cursor it passed."""
        crossings = self._crossings[tp]
        while crossings and crossings[0][0] <= offset:
            waiter = heapq.heappop(crossings)[2]
            if waiter.attached.get(self.topic) is self and waiter.marks.get(tp, _ZERO) is None:
                waiter.marks[tp] = tuple(self._tally(waiter.spec.value_format, tp))

    # ------------------------------------------------------------------ hand-out
    async def _dispatch(self, batch: Mapping[TopicPartition, list[Any]], pace: Pace | None = None) -> None:
        """Hand each record to the waiters that may care about it.

        Yields to the event loop after a slice of work or a batch of wake-ups, so neither a long
        fan-out nor a burst of matches (each waking a wait that then builds its event) holds the
        loop for long. A fetch that spans many topics hands its ``pace`` to each topic's fan-out.
        """
        pace = pace or Pace()
        for tp, records in batch.items():
            if not self.groups:
                if records:
                    self.positions[tp] = max(self.positions.get(tp, 0), records[-1].offset + 1)
                    self.last_timestamp[tp] = records[-1].timestamp
                continue
            crossings = self._crossings[tp]
            for record in records:
                if record.offset < self.positions.get(tp, 0):
                    continue
                if crossings and crossings[0][0] <= record.offset:
                    self._cross(tp, record.offset)
                message = KafkaMessage(record)
                for value_format, group in list(self.groups.items()):
                    tally = self._tally(value_format, tp)
                    tally[0] += 1
                    problem = message.problem(value_format)
                    if problem is not None:
                        tally[_SLOT[problem]] += 1
                        continue
                    for waiter in group.candidates(message, value_format):
                        self.evaluations += 1
                        pace.woken += waiter.offer(message, tp, self)
                self.positions[tp] = record.offset + 1
                if message.timestamp >= 0:
                    self.last_timestamp[tp] = message.timestamp
                if pace.due():
                    await pace.pause()

    def sync_positions(self, consumer: AIOKafkaConsumer) -> None:
        """Move past offsets the consumer skipped without returning records (gaps, control batches)."""
        for tp in list(self.positions):
            position = known_position(consumer, tp)
            if position is not None and position > self.positions[tp]:
                self.positions[tp] = position

    def rewind(self, tp: TopicPartition, offset: int) -> None:
        """Hand out ``tp`` from ``offset`` on, moving back the cursors of waiters that were past it."""
        self.positions[tp] = offset
        for waiter in self.waiters():
            if waiter.cursor.get(tp, 0) > offset:
                waiter.cursor[tp] = offset
                if waiter.start_from != "earliest":
                    waiter.filter_by_time(tp)


# ================================================================================ topics
class Connection(Protocol):
    """What a topic and its catch-up passes ask of the connection reader that holds them.

    :class:`~airflow_deferrable_kit._kafka.reader.ConnectionReader` is the one implementation;
    naming only what is used here keeps the hand-out below the reader that drives it.
    """

    conn_id: str
    options: KafkaOptions
    gates: ConnectGates
    topics: dict[str, TopicReader]

    @property
    def lookups(self) -> OffsetsSource: ...

    def retry_delay(self, failures: int) -> float: ...

    def leave(self, reader: TopicReader) -> None: ...

    def catch_up(self, reader: TopicReader, waiter: Waiter) -> None: ...

    async def committed(self, group_id: str, tps: list[TopicPartition]) -> dict[TopicPartition, int]: ...


class TopicReader(FanOut):
    """One topic waited on through a :class:`ConnectionReader`: its hand-out and its state.

    ``positions[tp]`` is the next offset it hands out; it starts at the log end of every
    partition when the topic is first waited on. ``resolved`` is set once the broker has said
    whether the topic exists (or a fatal error ended it). Waiters behind it are brought up to
    it by the connection's catch-up passes.
    """

    def __init__(self, connection: Connection, topic: str) -> None:
        super().__init__(topic, {})
        self.connection = connection
        self.refs = 0
        self.known = False
        self.fatal: WaitError | None = None
        self.resolved = asyncio.Event()
        #: Catch-up passes run so far for this topic, the one running now, and who waits for one.
        self.passes = 0
        self.catching_up: Any = None
        self.late: dict[Waiter, None] = {}

    @property
    def conn_id(self) -> str:
        return self.connection.conn_id

    @property
    def options(self) -> KafkaOptions:
        return self.connection.options

    def everyone(self) -> list[Waiter]:
        """Every waiter this topic serves: attached, in a catch-up pass, or waiting for one."""
        everyone = set(self.waiters()) | set(self.late)
        if self.catching_up is not None:
            everyone.update(self.catching_up.waiters())
        return list(everyone)

    def forget(self, waiter: Waiter) -> None:
        self.late.pop(waiter, None)

    def catch_up(self, waiter: Waiter) -> None:
        """Have a shared pass bring ``waiter`` (behind this topic's hand-out) up to it."""
        self.connection.catch_up(self, waiter)

    def fail(self, error: WaitError) -> None:
        """End every wait on this topic with ``error`` (each wait logs its own outcome)."""
        if self.fatal is None:
            log.debug("Kafka topic %s on %s failed: %s", self.topic, self.conn_id, redact(error.message))
        self.fatal = error
        self.resolved.set()
        for waiter in self.everyone():
            waiter.wake.set()

    async def start_offsets(
        self,
        tps: list[TopicPartition],
        *,
        start_from: str,
        start_after_ms: int | None,
        group_id: str | None,
        fixed: StartOffsets | None = None,
    ) -> dict[TopicPartition, int]:
        """Where a wait starts in ``tps`` (see :func:`resolve_start`), through the shared lookups."""
        committed = None
        if group_id is not None:

            async def committed(todo: list[TopicPartition]) -> dict[TopicPartition, int]:
                return await self.connection.committed(group_id, todo)

        return await resolve_start(
            self.connection.lookups,
            list(tps),
            start_from=start_from,
            start_after_ms=start_after_ms,
            committed=committed,
            start_offsets=None if fixed is None else {self.topic: dict(fixed.get(self.topic, {}))},
        )


__all__ = ["COUNTED", "Connection", "FanOut", "Pace", "TopicReader", "Waiter", "hand_out"]
