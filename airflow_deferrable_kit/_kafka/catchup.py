"""Bringing late Kafka waits up to the shared reader: catch-up passes and own-pace reads.

A wait whose start lies behind its topic's hand-out (it starts from its deferral and messages
arrived since, the triggerer restarted, or it reads from ``earliest``/``committed``) must read
that gap first. :class:`CatchUps` runs the passes of one connection (a :class:`CatchUpPass` per
topic with late waits, all on *one* consumer), so N late waits on M topics cost one consumer
and one read of each gap. A wait whose predicate cannot keep up reads at its own pace
(:func:`read_on_own`, on a consumer of its own from :class:`OwnPace`, a few per connection at
most) and joins again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, TypeVar

from airflow_deferrable_kit._kafka import settings
from airflow_deferrable_kit._kafka.consumers import (
    blames_connection,
    classify_kafka_error,
    import_aiokafka,
    known_position,
    quiet_aiokafka,
    start_consumer,
)
from airflow_deferrable_kit._kafka.fanout import Connection, FanOut, TopicReader, Waiter, hand_out
from airflow_deferrable_kit._kafka.messages import KafkaMessage
from airflow_deferrable_kit._kafka.offsets import clamp_to_log
from airflow_deferrable_kit._per_loop import PerLoop
from airflow_deferrable_kit._redact import redact
from airflow_deferrable_kit.conditions import Decision
from airflow_deferrable_kit.errors import ErrorType, FatalError, TransientError, WaitError, describe_exception

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer, TopicPartition

log = logging.getLogger(__name__)


T = TypeVar("T")


class CatchUpPass(FanOut):
    """One shared read of the gap between late waiters and their reader, then a hand-over.

    A wait whose start lies behind the reader (it starts from its deferral moment and messages
    arrived since, the triggerer restarted, or it reads from ``earliest``/``committed``) has to
    read that gap before it can join the reader. A pass reads it once for all such waits, from
    the earliest of their positions, through the same index as the reader; when it is level
    with the reader it moves them onto the reader, each in one step, so nothing falls between
    the two. N late waits cost one read of the gap, not N.
    """

    def __init__(self, reader: TopicReader, waiters: Iterable[Waiter]) -> None:
        super().__init__(reader.topic, reader.origins)
        self.reader = reader
        for waiter in waiters:  # start at the earliest position of any of them
            for tp in reader.positions:
                cursor = waiter.position_in(tp, self)
                if cursor < self.positions.get(tp, cursor + 1):
                    self.positions[tp] = cursor
        self._leaving: list[Waiter] = []

    async def take(self, late: dict[Waiter, None]) -> None:
        """Move the ``late`` waiters into the pass, yielding to the loop between slices.

        Waiters released while this yields are no longer in ``late`` and are left out.
        """
        slice_start = time.monotonic()
        for waiter in list(late):
            if waiter in late:  # not released meanwhile
                del late[waiter]
                waiter.join(self)  # never behind: the pass starts at the earliest position
            if time.monotonic() - slice_start > settings.DISPATCH_SLICE_SECONDS:
                await asyncio.sleep(0)
                slice_start = time.monotonic()

    def extend(self) -> None:
        """Cover partitions the reader gained since the pass started."""
        new = [tp for tp in self.reader.positions if tp not in self.positions]
        if not new:
            return
        waiters = self.waiters()
        for tp in new:
            self.positions[tp] = min(
                (waiter.position_in(tp, self) for waiter in waiters), default=self.reader.positions[tp]
            )
            for waiter in waiters:
                self.mark(waiter, tp)

    def level(self) -> bool:
        """Whether the pass has handed out everything the reader has (so its waiters can move)."""
        return all(self.positions.get(tp, -1) >= position for tp, position in self.reader.positions.items())

    def hand_over(self) -> bool:
        """Move waiters onto the reader, for one slice of time; True once nobody is left.

        Call it only while the pass is level with the reader: each move happens in one step, so
        no message can slip in between, and the caller checks the level again after a yield.
        """
        if not self._leaving:
            self._leaving = self.waiters()
        slice_start = time.monotonic()
        while self._leaving:
            waiter = self._leaving.pop()
            if waiter.attached.get(self.topic) is not self:
                continue  # found its message or fell behind meanwhile
            waiter.detach(self.topic)
            for tp, position in self.positions.items():
                if waiter.cursor.get(tp, 0) < position:
                    waiter.cursor[tp] = position
            if not waiter.try_attach(self.topic):
                waiter.wake.set()  # cannot happen while level; if it did, the waiter catches up again
            if time.monotonic() - slice_start > settings.DISPATCH_SLICE_SECONDS:
                break
        return not self.groups


class CatchUps:
    """The catch-up passes of one connection: at most one pass per topic, all on one consumer.

    A late waiter joins its topic's running pass if that has not yet gone past its position;
    otherwise it is in the topic's next pass, which starts when the running one is done. The
    consumer is assigned the partitions of every running pass and is kept
    ``settings.CATCH_UP_LINGER_SECONDS`` after the last one, then closed.
    """

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.passes: dict[str, CatchUpPass] = {}
        self.consumer: AIOKafkaConsumer | None = None
        #: Consumers started so far (one, unless it failed or lingered out and was reopened).
        self.consumers_started = 0
        self._assigned: set[TopicPartition] = set()
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def add(self, reader: TopicReader, waiter: Waiter) -> None:
        running = reader.catching_up
        if running is not None and waiter.join(running):
            return
        waiter.caught_up(reader.topic)
        reader.late[waiter] = None
        self._arrived.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"kafka-catch-up:{self.connection.conn_id}"
            )

    def drop(self, reader: TopicReader) -> None:
        """Nobody waits on the topic any more: forget its pass and its late waiters."""
        run = self.passes.get(reader.topic)
        if run is not None and run.reader is reader:
            del self.passes[reader.topic]
        reader.catching_up = None
        reader.late.clear()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._stop_consumer()

    async def _stop_consumer(self) -> None:
        consumer, self.consumer = self.consumer, None
        self._assigned = set()
        if consumer is not None:
            await consumer.stop()

    # ------------------------------------------------------------------ the loop
    async def _run(self) -> None:
        quiet_aiokafka()
        await import_aiokafka()
        failures = 0
        try:
            while True:
                await self._start_passes()
                self._settle()
                if not self.passes:
                    if not await self._linger():
                        return
                    continue
                if any(run.level() for run in self.passes.values()):
                    await asyncio.sleep(0)  # a hand-over in slices: let the loop breathe, then go on
                    continue
                try:
                    await self._read()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    failures += 1
                    await self._recover(exc, failures)
                    continue
                failures = 0
        except asyncio.CancelledError:
            raise
        except WaitError as error:  # fatal: every waiter of every pass, and the late ones, end with it
            for run in list(self.passes.values()):
                run.reader.fail(error)
        finally:
            for run in self.passes.values():
                run.reader.catching_up = None
            self.passes.clear()
            if self._task is asyncio.current_task():
                self._task = None
            await self._stop_consumer()

    async def _start_passes(self) -> None:
        """A pass for every topic with late waiters and none running; everyone late goes in it."""
        for reader in list(self.connection.topics.values()):
            if reader.late and reader.catching_up is None and reader.fatal is None:
                run = CatchUpPass(reader, list(reader.late))
                reader.catching_up = self.passes[reader.topic] = run
                reader.passes += 1
                await run.take(reader.late)

    def _settle(self) -> None:
        """Cover new partitions, and hand over (or drop) the passes that are done."""
        for topic, run in list(self.passes.items()):
            reader = run.reader
            if self.connection.topics.get(topic) is not reader or reader.fatal is not None:
                del self.passes[topic]
                reader.catching_up = None
                continue
            run.extend()
            if not run.groups or (run.level() and run.hand_over()):
                del self.passes[topic]
                reader.catching_up = None

    async def _linger(self) -> bool:
        """Nothing to do: stop prefetching, wait a while for late waiters; False to stop."""
        if self.consumer is not None and self._assigned:
            self.consumer.assign([])
            self._assigned = set()
        self._arrived.clear()
        if any(reader.late for reader in self.connection.topics.values()):
            return True
        try:
            await asyncio.wait_for(self._arrived.wait(), settings.CATCH_UP_LINGER_SECONDS)
        except asyncio.TimeoutError:
            return any(reader.late for reader in self.connection.topics.values())
        return True

    async def _read(self) -> None:
        """One fetch for every running pass, each record handed to its topic's pass."""
        fetch_wait_ms, max_records = settings.FETCH_WAIT_MS, settings.MAX_RECORDS_PER_FETCH
        if self.consumer is None:
            self.consumer = await start_consumer(
                self.connection.options,
                topics=set(self.passes),
                gates=self.connection.gates,
                metadata_max_age_ms=300_000,
            )
            self.consumers_started += 1
            self._assigned = set()
        wanted = {tp: position for run in self.passes.values() for tp, position in run.positions.items()}
        if set(wanted) != self._assigned:
            self.consumer.assign(list(wanted))
            for tp, position in wanted.items():
                self.consumer.seek(tp, position)
            self._assigned = set(wanted)
        batch = await self.consumer.getmany(timeout_ms=fetch_wait_ms, max_records=max_records)
        await hand_out(batch, self.passes.get)
        for run in self.passes.values():
            run.sync_positions(self.consumer)

    async def _recover(self, exc: Exception, failures: int) -> None:
        """After a failed read: move reads that fell outside the log, fail the topic a fatal
        error names (and only it), back off after a transient error or a fatal one that names no
        topic (on a fresh consumer); raise that one when it keeps coming back."""
        from aiokafka.errors import OffsetOutOfRangeError

        if isinstance(exc, OffsetOutOfRangeError):
            for tp, target in (await clamp_to_log(self.connection.lookups, exc)).items():
                run = self.passes.get(tp.topic)
                if run is not None:
                    run.rewind(tp, target)
                    if self.consumer is not None and tp in self._assigned:
                        self.consumer.seek(tp, target)
            return
        error = classify_kafka_error(exc) or FatalError(
            f"unexpected {describe_exception(exc)}", error_type=ErrorType.INTERNAL
        )
        if not isinstance(error, TransientError):
            # aiokafka drops what it drained for other partitions in the call that raised: the
            # next read seeks every pass to its position again.
            self._assigned = set()
            run = self.passes.get(error.details.get("topic", ""))
            if run is not None:  # a batch that cannot be decoded, a topic we may not read: that topic alone
                run.reader.fail(error)
                return
            if failures > settings.FETCH_RESTARTS or blames_connection(error):
                raise error from exc
            await self._stop_consumer()  # no topic to blame: a fresh consumer after the backoff
        delay = self.connection.retry_delay(failures)
        log.log(
            logging.DEBUG if self.connection.gates.down and isinstance(error, TransientError) else logging.WARNING,
            "Kafka catch-up on %s: %s; retrying in %.2fs",
            self.connection.conn_id,
            redact(error.message),
            delay,
        )
        await asyncio.sleep(delay)


# ============================================================================ own pace
async def read_on_own(
    consumer: AIOKafkaConsumer,
    waiter: Waiter,
    targets: Mapping[TopicPartition, int],
    settle: Callable[[KafkaMessage, str, Decision | None], Awaitable[T | None]],
) -> T | None:
    """One fetch on a private consumer: examine what came back, advance the waiter's cursors.

    ``settle`` turns a message the waiter's condition cares about into the wait's outcome (or
    ``None`` to go on); the first outcome ends the read, leaving later messages unexamined.
    """
    from aiokafka.errors import OffsetOutOfRangeError

    fetch_wait_ms, max_records = settings.FETCH_WAIT_MS, settings.MAX_RECORDS_PER_FETCH
    wanted = set(targets)
    if consumer.assignment() != wanted:
        consumer.assign(sorted(wanted))
        for tp in wanted:
            consumer.seek(tp, waiter.cursor[tp])
    try:
        batch = await consumer.getmany(timeout_ms=fetch_wait_ms, max_records=max_records)
    except OffsetOutOfRangeError as exc:
        # The read fell outside the log (deleted by retention, or cut back): move into it.
        for tp, target in (await clamp_to_log(consumer, exc)).items():
            waiter.cursor[tp] = target
            consumer.seek(tp, target)
        return None
    for tp, records in batch.items():
        for record in records:
            message = KafkaMessage(record)
            if not waiter.admit(message, tp):
                continue
            if waiter.count(message) is not None:
                continue
            outcome = waiter.spec.evaluate(message)
            if outcome is not None:
                found = await settle(message, *outcome)
                if found is not None:
                    return found
    for tp in wanted:
        position = known_position(consumer, tp)
        if position is not None and position > waiter.cursor.get(tp, 0):
            waiter.cursor[tp] = position
    return None


class OwnPace:
    """The private consumers of one wait that reads at its own pace (its predicate fell behind).

    One per topic, taken from a per-connection allowance of :data:`settings.MAX_CATCHUPS_PER_CONNECTION`
    so that many slow waits cannot open many consumers; closed as soon as the wait rejoins.
    """

    def __init__(self, conn_id: str) -> None:
        self.conn_id = conn_id
        self.consumers: dict[str, AIOKafkaConsumer] = {}
        self._slots_held: dict[str, asyncio.Semaphore] = {}

    async def open(self, reader: TopicReader) -> AIOKafkaConsumer:
        slot = _catchup_slot(self.conn_id)
        await slot.acquire()
        self._slots_held[reader.topic] = slot
        try:
            consumer = await start_consumer(
                reader.options, topics=[reader.topic], gates=reader.connection.gates, metadata_max_age_ms=300_000
            )
        except BaseException:
            self._slots_held.pop(reader.topic).release()
            raise
        self.consumers[reader.topic] = consumer
        return consumer

    async def close(self, topic: str) -> None:
        consumer = self.consumers.pop(topic, None)
        if consumer is not None:
            await consumer.stop()
        slot = self._slots_held.pop(topic, None)
        if slot is not None:
            slot.release()

    async def close_all(self) -> None:
        for topic in list(self.consumers):
            await self.close(topic)
        for topic, slot in list(self._slots_held.items()):
            slot.release()
            del self._slots_held[topic]


_catchup_slots: PerLoop[dict[str, asyncio.Semaphore]] = PerLoop(dict)


def _catchup_slot(conn_id: str) -> asyncio.Semaphore:
    slots = _catchup_slots.get()
    if conn_id not in slots:
        slots[conn_id] = asyncio.Semaphore(settings.MAX_CATCHUPS_PER_CONNECTION)
    return slots[conn_id]


__all__ = [
    "CatchUpPass",
    "CatchUps",
    "OwnPace",
    "read_on_own",
]
