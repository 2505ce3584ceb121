"""The shared Kafka topic reader: one consumer per (connection, topic) per triggerer process.

A :class:`TopicReader` reads its topic from the log end on and hands every message to the
waiters on it through its :class:`~airflow_deferrable_kit._kafka_fanout.FanOut`. Waiters that
start behind it are read up to it by shared catch-up passes on one more consumer; a waiter whose
predicate cannot keep up reads at its own pace on a consumer of its own (:class:`OwnPace`, via
:func:`read_on_own`) and joins again. Broker outages are absorbed by the consumers; fatal errors
reach every waiter.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from airflow_deferrable_kit._backoff import full_jitter
from airflow_deferrable_kit._kafka_client import (
    CommittedOffsets,
    StartOffsets,
    clamp_to_log,
    classify_kafka_error,
    known_position,
    load_client_options,
    out_of_range_offsets,
    resolve_start,
    start_consumer,
    topic_partitions,
    track_topic,
)
from airflow_deferrable_kit._kafka_fanout import CatchUpPass, FanOut, Waiter
from airflow_deferrable_kit._kafka_messages import KafkaMessage
from airflow_deferrable_kit._per_loop import PerLoop
from airflow_deferrable_kit._redact import redact
from airflow_deferrable_kit.conditions import Decision
from airflow_deferrable_kit.payload import FatalError, TransientError, WaitError

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer, TopicPartition

log = logging.getLogger(__name__)

# Tunables. Module constants rather than kwargs: the reader is shared, so they are per process.
#: How often a reader looks for new partitions (and for a topic that does not exist yet); also
#: how stale any consumer's view of partitions and leaders may get.
PARTITION_REFRESH_SECONDS = 30.0
#: How long one fetch waits for data before the reader loop turns over.
FETCH_WAIT_MS = 1000
#: Records taken from the consumer per fetch.
MAX_RECORDS_PER_FETCH = 500
#: Own-pace catch-up consumers (waits whose predicate fell behind) at once per connection.
MAX_CATCHUPS_PER_CONNECTION = 8
#: How long a reader keeps its catch-up consumer after the last pass, for the next late wait.
CATCH_UP_LINGER_SECONDS = 30.0

T = TypeVar("T")


async def open_consumer(options: Mapping[str, Any]) -> AIOKafkaConsumer:
    """A started group-less consumer whose metadata is refreshed as often as readers look for partitions."""
    return await start_consumer(options, metadata_max_age_ms=int(PARTITION_REFRESH_SECONDS * 1000))


class TopicReader(FanOut):
    """One consumer per (connection, topic) per process, fanning each message out to waiters.

    Starts at the log end of every partition when created; ``positions[tp]`` is the next offset
    it will hand out. Waiters behind that are brought up to it by a :class:`CatchUpPass` (one at
    a time, on one more consumer of its own). Broker outages are absorbed by the consumers (they
    reconnect and resume from their positions); other transient errors back off here; fatal ones
    are handed to every waiter.
    """

    def __init__(self, conn_id: str, topic: str, options: dict[str, Any]) -> None:
        super().__init__(topic, {})
        self.conn_id = conn_id
        self.options = options
        self.consumer: AIOKafkaConsumer | None = None
        #: A second, never-fetching consumer for metadata and offset lookups: a broker answers a
        #: connection's requests in order, so lookups queued behind a long-poll fetch would wait.
        self.lookup: AIOKafkaConsumer | None = None
        #: Read-only lookups of a group's committed offsets (``start_from="committed"``).
        self._committed = CommittedOffsets(options)
        self.known = False
        self.fatal: WaitError | None = None
        self.fetches = 0
        #: Catch-up passes run so far, and the one running now.
        self.passes = 0
        self.catching_up: CatchUpPass | None = None
        self._late: dict[Waiter, None] = {}
        self._late_arrived = asyncio.Event()
        self._passes: asyncio.Task[None] | None = None
        self._start_lookups: dict[tuple[Any, ...], asyncio.Future[dict[TopicPartition, int]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._refresh_lock = asyncio.Lock()

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    async def open(cls, conn_id: str, topic: str) -> TopicReader:
        reader = cls(conn_id, topic, await load_client_options(conn_id))
        await reader.start()
        return reader

    async def start(self) -> None:
        self.consumer = await open_consumer(self.options)
        try:
            self.lookup = await open_consumer(self.options)
            await self.refresh(initial=True)
        except BaseException:
            await self.consumer.stop()
            if self.lookup is not None:
                await self.lookup.stop()
            raise
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"kafka-reader:{self.topic}")
        log.info("Kafka reader for %s on %s started at %s", self.topic, self.conn_id, self._describe_positions())

    @staticmethod
    async def close_reader(reader: TopicReader) -> None:
        await reader.close()

    async def close(self) -> None:
        for task in (self._task, self._passes):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._task = self._passes = None
        if self.consumer is not None:
            await self.consumer.stop()
        if self.lookup is not None:
            await self.lookup.stop()
        await self._committed.close()
        log.info("Kafka reader for %s on %s closed", self.topic, self.conn_id)

    def _describe_positions(self) -> str:
        return ", ".join(f"{tp.partition}:{offset}" for tp, offset in sorted(self.positions.items())) or "no partitions"

    # ------------------------------------------------------------------- waiters
    def everyone(self) -> list[Waiter]:
        """Every waiter this reader serves: attached, in a catch-up pass, or waiting for one."""
        everyone = set(self.waiters()) | set(self._late)
        if self.catching_up is not None:
            everyone.update(self.catching_up.waiters())
        return list(everyone)

    def forget(self, waiter: Waiter) -> None:
        self._late.pop(waiter, None)

    async def committed(self, group_id: str, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """The group's committed offsets (read-only: no join, no commit); -1 where none."""
        return await self._committed(group_id, tps)

    async def start_offsets(
        self,
        tps: list[TopicPartition],
        *,
        start_from: str,
        start_after_ms: int | None,
        group_id: str | None,
        fixed: StartOffsets | None = None,
    ) -> dict[TopicPartition, int]:
        """Where a wait starts in ``tps`` (see :func:`resolve_start`); ``fixed`` are the offsets
        fixed when its task first deferred, if it carries them.

        Waits that ask the same question while it is being answered (a mass deferral, a
        triggerer restart) share one lookup instead of queueing thousands on one connection.
        """
        assert self.lookup is not None
        mine = None if fixed is None else tuple(sorted(fixed.get(self.topic, {}).items()))
        key = (start_from, start_after_ms, group_id, mine, tuple(tps))
        lookup = self._start_lookups.get(key)
        if lookup is None:
            lookup = self._start_lookups[key] = asyncio.ensure_future(
                resolve_start(
                    self.lookup,
                    list(tps),
                    start_from=start_from,
                    start_after_ms=start_after_ms,
                    committed=functools.partial(self.committed, group_id) if group_id else None,
                    start_offsets=None if fixed is None else {self.topic: dict(mine or ())},
                )
            )

            def answered(done: asyncio.Future[dict[TopicPartition, int]]) -> None:
                if self._start_lookups.get(key) is done:
                    del self._start_lookups[key]
                if not done.cancelled():
                    done.exception()  # retrieved here: every asker may have been cancelled

            lookup.add_done_callback(answered)
        return dict(await asyncio.shield(lookup))

    # ------------------------------------------------------------------ catch-up
    def catch_up(self, waiter: Waiter) -> None:
        """Have a shared pass bring ``waiter`` (behind this reader) up to it, then attach it.

        Joins the running pass if that has not yet gone past the waiter's position; otherwise
        the waiter is in the next pass, which starts when the running one is done.
        """
        running = self.catching_up
        if running is not None and waiter.join(running):
            return
        waiter.behind.discard(self.topic)
        self._late[waiter] = None
        self._late_arrived.set()
        if self._passes is None:
            self._passes = asyncio.get_running_loop().create_task(
                self._run_passes(), name=f"kafka-catch-up:{self.topic}"
            )

    async def _run_passes(self) -> None:
        """Run passes while late waiters arrive; keep the consumer a little while, then close it."""
        consumer: AIOKafkaConsumer | None = None
        failures = 0
        try:
            while True:
                if not self._late:
                    self._late_arrived.clear()
                    if consumer is not None and consumer.assignment():
                        consumer.unsubscribe()  # stop prefetching while idle
                    try:
                        await asyncio.wait_for(self._late_arrived.wait(), CATCH_UP_LINGER_SECONDS)
                    except asyncio.TimeoutError:
                        if not self._late:
                            return
                    continue
                if consumer is None:
                    try:
                        consumer = await open_consumer(self.options)
                    except asyncio.CancelledError:
                        raise
                    except Exception as exc:
                        failures += 1
                        await self._back_off(exc, failures, "catch-up")
                        continue
                    failures = 0
                # Everyone who arrived while the consumer started goes in this pass.
                self.catching_up = run = CatchUpPass(self, list(self._late))
                self.passes += 1
                await run.take(self._late)
                await self._read_pass(run, consumer)
                self.catching_up = None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # fatal: every waiter, the pass's included, ends with it
            self._fail(exc if isinstance(exc, WaitError) else FatalError(f"unexpected {type(exc).__name__}: {exc}"))
        finally:
            self.catching_up = self._passes = None
            if consumer is not None:
                await consumer.stop()

    async def _read_pass(self, run: CatchUpPass, consumer: AIOKafkaConsumer) -> None:
        """Read until the pass is level with the reader (then hand over) or has nobody left."""
        from aiokafka.errors import OffsetOutOfRangeError

        assigned: set[TopicPartition] = set()
        failures = 0
        while True:
            run.extend()
            if not run.groups:
                return
            if run.level():
                if run.hand_over():
                    return
                await asyncio.sleep(0)
                continue
            if assigned != set(run.positions):
                assigned = set(run.positions)
                consumer.assign(sorted(assigned))
                for tp, offset in run.positions.items():
                    consumer.seek(tp, offset)
            try:
                batch = await consumer.getmany(timeout_ms=FETCH_WAIT_MS, max_records=MAX_RECORDS_PER_FETCH)
            except asyncio.CancelledError:
                raise
            except OffsetOutOfRangeError as exc:
                assert self.lookup is not None
                for tp, target in (await clamp_to_log(self.lookup, exc)).items():
                    run.rewind(tp, target)
                    consumer.seek(tp, target)
                continue
            except Exception as exc:
                failures += 1
                await self._back_off(exc, failures, "catch-up")
                continue
            failures = 0
            if batch:
                await run._dispatch(batch)
            run.sync_positions(consumer)

    async def _back_off(self, exc: Exception, failures: int, what: str) -> None:
        """Sleep after a transient error (capped, full jitter); raise a fatal one."""
        error = classify_kafka_error(exc) or TransientError(f"{type(exc).__name__}: {exc}")
        if not isinstance(error, TransientError):
            raise error from exc
        delay = full_jitter(failures, base=0.5, cap=30.0)
        log.warning("Kafka %s for %s: %s; retrying in %.2fs", what, self.topic, redact(error.message), delay)
        await asyncio.sleep(delay)

    def _fail(self, error: WaitError) -> None:
        log.error("Kafka reader for %s failed: %s", self.topic, redact(error.message))
        self.fatal = error
        for waiter in self.everyone():
            waiter.wake.set()

    # ------------------------------------------------------------------ the loop
    async def _run(self) -> None:
        from aiokafka.errors import OffsetOutOfRangeError

        assert self.consumer is not None
        failures = 0
        next_refresh = time.monotonic() + PARTITION_REFRESH_SECONDS
        while True:
            try:
                if self.positions:
                    batch = await self.consumer.getmany(timeout_ms=FETCH_WAIT_MS, max_records=MAX_RECORDS_PER_FETCH)
                    self.fetches += 1
                    if batch:
                        await self._dispatch(batch)
                    self.sync_positions(self.consumer)
                else:
                    await asyncio.sleep(max(0.0, next_refresh - time.monotonic()))
                if time.monotonic() >= next_refresh:
                    next_refresh = time.monotonic() + PARTITION_REFRESH_SECONDS
                    await self.refresh()
                if failures:
                    log.info("Kafka reader for %s recovered after %d error(s)", self.topic, failures)
                failures = 0
            except asyncio.CancelledError:
                raise
            except OffsetOutOfRangeError as exc:
                await self._out_of_range(exc)
            except Exception as exc:
                failures += 1
                try:
                    await self._back_off(exc, failures, "reader")
                except WaitError as error:
                    self._fail(error)
                    return

    async def refresh(self, *, initial: bool = False) -> None:
        """Pick up a topic that appeared, partitions that were added, and logs that were cut back."""
        async with self._refresh_lock:
            await self._refresh(initial)

    async def _refresh(self, initial: bool) -> None:
        from aiokafka import TopicPartition

        assert self.consumer is not None and self.lookup is not None
        partitions = await topic_partitions(self.lookup, self.topic)
        if partitions is None:
            if self.known:
                log.warning("Kafka topic %s is not visible on %s; still waiting for it", self.topic, self.conn_id)
            self.known = False
            return
        if not self.known:
            await track_topic(self.lookup, self.topic)
        self.known = True
        new = [tp for tp in (TopicPartition(self.topic, p) for p in sorted(partitions)) if tp not in self.positions]
        if new:
            # The reader starts at the log end. Partitions (or a whole topic) that appear later
            # hold only messages newer than the reader: read them from their beginning (a wait
            # started from offsets keeps them all; one started from a moment keeps what was
            # stamped at or after it).
            if initial:
                starts = await self.lookup.end_offsets(new)
            else:
                starts = await self.lookup.beginning_offsets(new)
            for tp in new:
                self.origins[tp] = self.positions[tp] = int(starts[tp])
            self.consumer.assign(list(self.positions))
            for tp, offset in self.positions.items():
                self.consumer.seek(tp, offset)
            if len(new) != len(self.positions):
                log.info("Kafka topic %s gained partitions %s", self.topic, [tp.partition for tp in new])
            return
        ends = await self.lookup.end_offsets(list(self.positions))
        for tp, end in ends.items():
            if self.positions.get(tp, 0) > end:
                await self._reset_beyond_end(tp, int(end))

    async def _out_of_range(self, exc: Exception) -> None:
        """The broker no longer has our position: retention deleted it, or the log was cut back."""
        assert self.lookup is not None
        for tp, offset in out_of_range_offsets(exc).items():
            begin = (await self.lookup.beginning_offsets([tp]))[tp]
            end = (await self.lookup.end_offsets([tp]))[tp]
            if offset < begin:
                log.warning(
                    "Kafka %s[%d]: offsets %d..%d were deleted before they were read",
                    tp.topic,
                    tp.partition,
                    offset,
                    begin,
                )
                self._move(tp, int(begin))
            else:
                await self._reset_beyond_end(tp, int(end))

    async def _reset_beyond_end(self, tp: TopicPartition, end: int) -> None:
        """Our position is past the log end (topic recreated, unclean leader change): resume at the
        first message stamped at or after the last one we saw, so the new messages are not skipped."""
        assert self.lookup is not None
        target = end
        last = self.last_timestamp.get(tp)
        if last is not None:
            found = (await self.lookup.offsets_for_times({tp: last})).get(tp)
            if found is not None and found.timestamp is not None and found.timestamp >= 0 and 0 <= found.offset <= end:
                target = int(found.offset)
        log.warning(
            "Kafka %s[%d]: position %d is past the log end %d; resuming at %d",
            tp.topic,
            tp.partition,
            self.positions[tp],
            end,
            target,
        )
        self._move(tp, target)

    def _move(self, tp: TopicPartition, offset: int) -> None:
        assert self.consumer is not None
        self.rewind(tp, offset)
        self.consumer.seek(tp, offset)


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

    wanted = set(targets)
    if consumer.assignment() != wanted:
        consumer.assign(sorted(wanted))
        for tp in wanted:
            consumer.seek(tp, waiter.cursor[tp])
    try:
        batch = await consumer.getmany(timeout_ms=FETCH_WAIT_MS, max_records=MAX_RECORDS_PER_FETCH)
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

    One per topic, taken from a per-connection allowance of :data:`MAX_CATCHUPS_PER_CONNECTION`
    so that many slow waits cannot open many consumers; closed as soon as the wait rejoins.
    """

    def __init__(self, conn_id: str) -> None:
        self.conn_id = conn_id
        self.consumers: dict[str, AIOKafkaConsumer] = {}
        self._slots_held: dict[str, asyncio.Semaphore] = {}

    async def open(self, topic: str, options: Mapping[str, Any]) -> AIOKafkaConsumer:
        slot = _catchup_slot(self.conn_id)
        await slot.acquire()
        self._slots_held[topic] = slot
        try:
            consumer = await open_consumer(options)
        except BaseException:
            self._slots_held.pop(topic).release()
            raise
        self.consumers[topic] = consumer
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
        slots[conn_id] = asyncio.Semaphore(MAX_CATCHUPS_PER_CONNECTION)
    return slots[conn_id]


__all__ = ["OwnPace", "TopicReader", "open_consumer", "read_on_own"]
