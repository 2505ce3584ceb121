"""The shared Kafka reader: one fetch consumer per connection per triggerer process.

A :class:`ConnectionReader` serves every wait on one Airflow connection, whatever its topics:
one consumer fetches the partitions of every topic waited on (re-assigned as waits come and
go), one more answers metadata and offset lookups for all of them (batched), and one more runs
the catch-up passes of late waits on any topic (:class:`~airflow_deferrable_kit._kafka.catchup.CatchUps`).
Each topic waited on has a :class:`TopicReader`: its hand-out (a
:class:`~airflow_deferrable_kit._kafka.fanout.FanOut`) with its positions and waiters, and no
consumer of its own. So the sockets, the memory and the metadata follow the brokers and the
topics waited on, not the number of waits or topics; every client asks the broker about the
topics waited on only (see :func:`~airflow_deferrable_kit._kafka.consumers.scope_client`).
Broker outages are absorbed by the consumers, which reconnect through the connection's gate;
fatal errors reach the waiters of the topics they concern, and no other: a batch that cannot be
decoded or a topic we may not read ends the waits of that topic, and a loop that fails for any
other reason is restarted on a fresh consumer (see :meth:`ConnectionReader._fetch_loop`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from airflow_deferrable_kit._backoff import MIN_RETRY_DELAY, full_jitter
from airflow_deferrable_kit._kafka import settings
from airflow_deferrable_kit._kafka.catchup import CatchUps
from airflow_deferrable_kit._kafka.consumers import (
    TopicsAnswer,
    blames_connection,
    classify_kafka_error,
    describe_topics,
    import_aiokafka,
    out_of_range_offsets,
    quiet_aiokafka,
    refresh_topics,
    start_consumer,
)
from airflow_deferrable_kit._kafka.fanout import TopicReader, Waiter, hand_out
from airflow_deferrable_kit._kafka.gate import ConnectGates, gates_for
from airflow_deferrable_kit._kafka.lookups import BatchedLookups
from airflow_deferrable_kit._kafka.offsets import CommittedOffsets
from airflow_deferrable_kit._kafka.settings import KafkaOptions
from airflow_deferrable_kit._redact import redact
from airflow_deferrable_kit.errors import ErrorType, FatalError, TransientError, WaitError, describe_exception

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer, TopicPartition

log = logging.getLogger(__name__)


class ConnectionReader:
    """Every wait on one Airflow connection in this process: one fetch consumer for all topics.

    Topics are joined and left by the waits (:meth:`join`, :meth:`leave`, reference-counted).
    A new topic is looked up together with every other topic joined at the same time (one
    metadata request, one end-offsets lookup) and its partitions are added to the fetch
    consumer's assignment; the partitions of a topic nobody waits on any more are dropped from
    it at the next turn of the fetch loop. Every ``settings.PARTITION_REFRESH_SECONDS`` one metadata
    request for all topics finds new partitions, topics that appeared and logs cut back.
    """

    def __init__(self, conn_id: str, options: KafkaOptions) -> None:
        self.conn_id = conn_id
        self.options = options
        self.gates: ConnectGates = gates_for(conn_id)
        self.topics: dict[str, TopicReader] = {}
        self.fetch: AIOKafkaConsumer | None = None
        self.lookup: AIOKafkaConsumer | None = None
        self.lookups = BatchedLookups(conn_id, self._lookup_consumer, self.retry_delay, lambda: self.gates.down)
        self._committed = CommittedOffsets(options, self.gates)
        self.catch_ups = CatchUps(self)
        self.fetches = 0
        #: Metadata requests made by this reader's own loop (admissions and refreshes).
        self.metadata_requests = 0
        self._pending: dict[str, TopicReader] = {}
        self._assigned: set[TopicPartition] = set()
        self._reassign = False
        #: Seek every assigned partition to the hand-out's position at the next assignment.
        self._reseek = False
        #: Fetch consumers replaced, and loops restarted, after errors no topic could be blamed for.
        self.fetch_restarts = 0
        self.loop_restarts = 0
        self._fetch_wake: asyncio.Future[None] | None = None
        self._metadata_wake = asyncio.Event()
        self._lookup_lock = asyncio.Lock()
        self._fresh_metadata: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False

    # ------------------------------------------------------------------ lifecycle
    async def close(self) -> None:
        self._closed = True
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.lookups.close()
        await self.catch_ups.close()
        consumers = [c for c in (self.fetch, self.lookup) if c is not None]
        self.fetch = self.lookup = None
        await asyncio.gather(*(c.stop() for c in consumers), self._committed.close(), return_exceptions=True)
        if tasks:
            log.info("Kafka reader for %s closed", self.conn_id)

    def _start_tasks(self) -> None:
        if not self._tasks and not self._closed:
            loop = asyncio.get_running_loop()
            self._tasks = [
                loop.create_task(self._keep_running(self._metadata_loop), name=f"kafka-metadata:{self.conn_id}"),
                loop.create_task(self._keep_running(self._fetch_loop), name=f"kafka-fetch:{self.conn_id}"),
            ]

    async def _keep_running(self, run: Callable[[], Awaitable[None]]) -> None:
        """Run one of the reader's loops for the reader's life: if it ever ends (an error that
        escaped it, a bug), it is started again after a backoff, on a fresh fetch consumer, and
        every wait goes on from the hand-out's positions. Never left dead while waits use it."""
        restarts = 0
        while not self._closed:
            fetches = self.fetches
            try:
                await run()
                what = "ended"
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                what = f"failed ({redact(describe_exception(exc))})"
            restarts = 1 if self.fetches > fetches else restarts + 1  # progress made: start the backoff over
            self.loop_restarts += 1
            if run == self._fetch_loop:
                await self._drop_fetch()
            delay = full_jitter(restarts, base=0.5, cap=self.gates.cap)
            log.error(
                "Kafka reader for %s: its %s loop %s; restarting it in %.2fs",
                self.conn_id,
                run.__name__.strip("_"),
                what,
                delay,
            )
            await asyncio.sleep(delay)

    # -------------------------------------------------------------------- topics
    def join(self, topic: str) -> TopicReader:
        """The topic's reader, with one more wait on it (looked up in the next batch if new)."""
        reader = self.topics.get(topic)
        if reader is None:
            reader = self.topics[topic] = TopicReader(self, topic)
            self._pending[topic] = reader
            self._metadata_wake.set()
            self._start_tasks()
        reader.refs += 1
        return reader

    def leave(self, reader: TopicReader) -> None:
        """One wait fewer on the topic; the last one drops it (from the fetch at the next turn)."""
        reader.refs -= 1
        if reader.refs > 0 or self.topics.get(reader.topic) is not reader:
            return
        del self.topics[reader.topic]
        self._pending.pop(reader.topic, None)
        self.catch_ups.drop(reader)
        if reader.positions:
            self._reassign = True  # no wake: dropping partitions can wait for the next turn

    def catch_up(self, reader: TopicReader, waiter: Waiter) -> None:
        """Have the connection's shared catch-up passes bring ``waiter`` up to ``reader``."""
        self.catch_ups.add(reader, waiter)

    async def committed(self, group_id: str, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """The group's committed offsets (read-only: no join, no commit); -1 where none."""
        return await self._committed(group_id, tps)

    def retry_delay(self, failures: int) -> float:
        """How long to wait after a transient failure: until a broker may be tried again when
        the gate holds the connections back, else the usual backoff."""
        if self.gates.down:
            waits = [gate.seconds_to_wait() for gate in self.gates.gates.values() if gate.down]
            return max(min(waits, default=0.0), MIN_RETRY_DELAY)
        return full_jitter(failures, base=0.5, cap=self.gates.cap)

    async def _lookup_consumer(self) -> AIOKafkaConsumer:
        """The consumer answering metadata and offset lookups, started on first use.

        Separate from the fetch consumer: a broker answers a connection's requests in order,
        so lookups queued behind a long-poll fetch would wait for it.
        """
        async with self._lookup_lock:
            if self.lookup is None:
                topics = set(self.topics)
                self.lookup = await start_consumer(
                    self.options, topics=topics, gates=self.gates, metadata_max_age_ms=settings.METADATA_MAX_AGE_MS
                )
                self._fresh_metadata = topics  # its bootstrap just described these
            return self.lookup

    async def _describe(self, consumer: AIOKafkaConsumer) -> TopicsAnswer:
        """What the broker says about every topic waited on (one metadata request, or none if
        the lookup consumer's bootstrap just answered for exactly these)."""
        fresh, self._fresh_metadata = self._fresh_metadata, set()
        if set(self.topics) <= fresh:
            return describe_topics(consumer, self.topics)
        self.metadata_requests += 1
        return await refresh_topics(consumer, self.topics)

    # --------------------------------------------------------------- metadata loop
    async def _metadata_loop(self) -> None:
        """Look up topics as they are joined; refresh every topic's partitions periodically."""
        quiet_aiokafka()
        await import_aiokafka()
        failures = 0
        broken = 0
        next_refresh = time.monotonic() + settings.PARTITION_REFRESH_SECONDS
        while True:
            self._metadata_wake.clear()
            if not self._pending and time.monotonic() < next_refresh:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._metadata_wake.wait(), next_refresh - time.monotonic())
                continue
            admitting = bool(self._pending)
            try:
                if admitting:
                    await self._admit()
                else:
                    next_refresh = time.monotonic() + settings.PARTITION_REFRESH_SECONDS
                    await self._refresh()
                if failures or broken:
                    log.info("Kafka reader for %s recovered after %d error(s)", self.conn_id, failures + broken)
                failures = broken = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                error = classify_kafka_error(exc) or FatalError(
                    f"unexpected {describe_exception(exc)}", error_type=ErrorType.INTERNAL
                )
                if isinstance(error, TransientError):
                    failures += 1
                    await self._pause(error, failures, "looking up topics" if admitting else "refreshing topics")
                    continue
                named = self.topics.get(error.details.get("topic", ""))
                broken = 0 if named is not None else broken + 1
                if named is None and broken <= settings.FETCH_RESTARTS and not blames_connection(error):
                    # Nothing says which topic it is about: ask again after a backoff.
                    await self._pause(error, broken, "looking up topics" if admitting else "refreshing topics")
                    continue
                broken = 0
                if named is not None:
                    failed = [named]
                else:
                    failed = list(self._pending.values()) if admitting else list(self.topics.values())
                log.error(
                    "Kafka reader for %s: %d topic(s) failed: %s", self.conn_id, len(failed), redact(error.message)
                )
                for reader in failed:
                    self._pending.pop(reader.topic, None)
                    self._fail_topic(reader, error)

    async def _pause(self, error: WaitError, failures: int, what: str) -> None:
        delay = self.retry_delay(failures)
        log.log(
            logging.DEBUG if self.gates.down else logging.WARNING,  # the gate already said why
            "Kafka reader for %s: %s failed (%s); retrying in %.2fs",
            self.conn_id,
            what,
            redact(error.message),
            delay,
        )
        await asyncio.sleep(delay)

    async def _admit(self) -> None:
        """Look up every topic joined since the last call: one metadata request, one end-offsets
        lookup; each existing one starts at its log end."""
        from aiokafka import TopicPartition

        consumer = await self._lookup_consumer()
        batch = list(self._pending.values())
        answer = await self._describe(consumer)
        new: list[TopicPartition] = []
        for reader in batch:
            if reader.topic in answer.unauthorized:
                reader.fail(_not_authorized(reader.topic))
            elif reader.topic in answer.partitions:
                new.extend(TopicPartition(reader.topic, p) for p in sorted(answer.partitions[reader.topic]))
        ends = await consumer.end_offsets(new) if new else {}
        for reader in batch:
            if self._pending.get(reader.topic) is not reader:
                continue  # left meanwhile
            del self._pending[reader.topic]
            if reader.fatal is None and reader.topic in answer.partitions:
                reader.known = True
                for partition in sorted(answer.partitions[reader.topic]):
                    tp = TopicPartition(reader.topic, partition)
                    reader.origins[tp] = reader.positions[tp] = int(ends[tp])
            reader.resolved.set()
        if new:
            self._wake_fetch()

    async def _refresh(self) -> None:
        """Pick up topics that appeared, partitions that were added, and logs that were cut back."""
        from aiokafka import TopicPartition

        if not self.topics:
            return
        consumer = await self._lookup_consumer()
        readers = list(self.topics.values())
        answer = await self._describe(consumer)
        new: list[TopicPartition] = []
        for reader in readers:
            if reader.topic in answer.unauthorized:
                reader.fail(_not_authorized(reader.topic))
                continue
            partitions = answer.partitions.get(reader.topic)
            if partitions is None:
                if reader.known:
                    log.warning("Kafka topic %s is not visible on %s; still waiting for it", reader.topic, self.conn_id)
                reader.known = False
                continue
            reader.known = True
            tps = (TopicPartition(reader.topic, p) for p in sorted(partitions))
            new.extend(tp for tp in tps if tp not in reader.positions)
        if new:
            # Partitions (or a whole topic) that appear later hold only messages newer than the
            # reader: read them from their beginning.
            begins = await consumer.beginning_offsets(new)
            for tp in new:
                grown = self.topics.get(tp.topic)
                if grown is not None:
                    grown.origins[tp] = grown.positions[tp] = int(begins[tp])
            added = sorted(f"{tp.topic}[{tp.partition}]" for tp in new)
            log.info("Kafka on %s: new partitions %s", self.conn_id, added)
            self._wake_fetch()
        known = [tp for reader in self.topics.values() if reader.known for tp in reader.positions]
        ends = await consumer.end_offsets(known) if known else {}
        for tp, end in ends.items():
            cut = self.topics.get(tp.topic)
            if cut is not None and cut.positions.get(tp, 0) > end:
                await self._reset_beyond_end(cut, tp, int(end))

    # ------------------------------------------------------------------ fetching
    def _wake_fetch(self) -> None:
        self._reassign = True
        if self._fetch_wake is not None and not self._fetch_wake.done():
            self._fetch_wake.set_result(None)

    async def _fetch_loop(self) -> None:
        """Fetch for every topic waited on and hand the records out, for the reader's life.

        A fatal error that concerns one topic (a batch that cannot be decoded, a topic we may
        not read) ends that topic's waits only. Any other fatal error restarts the fetch on a
        fresh consumer after a backoff, at the hand-out's positions; only when that keeps
        failing ``settings.FETCH_RESTARTS`` times in a row is it the connection's error, and
        every wait on it ends with it (at once for credentials, TLS and access errors, which are
        the connection's by nature). The loop itself never ends but by :meth:`close`.
        """
        quiet_aiokafka()
        await import_aiokafka()
        from aiokafka.errors import OffsetOutOfRangeError

        failures = 0
        broken = 0
        last_sync = time.monotonic()
        while True:
            try:
                if self._reassign:
                    await self._apply_assignment()
                    continue
                if not self._assigned:
                    self._fetch_wake = asyncio.get_running_loop().create_future()
                    await self._fetch_wake
                    continue
                batch = await self._fetch_once()
                if batch:
                    await self._dispatch(batch)
                if not batch or time.monotonic() - last_sync >= settings.POSITION_SYNC_SECONDS:
                    self._sync_positions(None)
                    last_sync = time.monotonic()
                else:
                    self._sync_positions({tp.topic for tp in batch})
                if failures or broken:
                    log.info("Kafka reader for %s recovered after %d error(s)", self.conn_id, failures + broken)
                failures = broken = 0
            except asyncio.CancelledError:
                raise
            except OffsetOutOfRangeError as exc:
                await self._out_of_range(exc)
            except Exception as exc:
                error = classify_kafka_error(exc) or FatalError(
                    f"unexpected {describe_exception(exc)}", error_type=ErrorType.INTERNAL
                )
                if isinstance(error, TransientError):
                    failures += 1
                    await self._pause(error, failures, "fetching")
                    continue
                # aiokafka drops what it drained for other partitions in the call that raised:
                # read every partition again from the hand-out's positions.
                self._reseek = self._reassign = True
                reader = self.topics.get(error.details.get("topic", ""))
                if reader is not None:
                    log.error("Kafka reader for %s: %s failed: %s", self.conn_id, reader.topic, redact(error.message))
                    self._fail_topic(reader, error)
                    continue
                broken = await self._restart_fetch(error, broken + 1)

    def _fail_topic(self, reader: TopicReader, error: WaitError) -> None:
        """End the waits of one topic; the fetch goes on for every other one."""
        reader.fail(error)
        reader.positions.clear()
        self._reassign = True

    async def _restart_fetch(self, error: WaitError, broken: int) -> int:
        """A fetch failed with an error no topic can be blamed for: a fresh consumer after a backoff.

        Returns the failures in a row to count from (0 once they ended every wait).
        """
        if broken > settings.FETCH_RESTARTS or blames_connection(error):
            log.error(
                "Kafka reader for %s: fetching failed %d time(s) in a row (%s); ending the %d topic(s) waited on",
                self.conn_id,
                broken,
                redact(error.message),
                len(self.topics),
            )
            for reader in list(self.topics.values()):
                self._fail_topic(reader, error)
            return 0
        await self._drop_fetch()
        self.fetch_restarts += 1
        delay = full_jitter(broken, base=0.5, cap=self.gates.cap)
        log.error(
            "Kafka reader for %s: fetching failed (%s); restarting it on a fresh consumer in %.2fs",
            self.conn_id,
            redact(error.message),
            delay,
        )
        await asyncio.sleep(delay)
        return broken

    async def _drop_fetch(self) -> None:
        """Stop the fetch consumer; the next turn starts a new one at the hand-out's positions."""
        fetch, self.fetch = self.fetch, None
        self._assigned = set()
        self._reassign = True
        if fetch is not None:
            with contextlib.suppress(Exception):
                await fetch.stop()

    async def _apply_assignment(self) -> None:
        """Assign the fetch consumer the partitions of every topic waited on, at our positions."""
        readers = [r for r in self.topics.values() if r.known and r.fatal is None]
        wanted = {tp: position for r in readers for tp, position in r.positions.items()}
        if self.fetch is None:
            if not wanted:
                self._reassign = False
                self._assigned = set()
                return
            self.fetch = await start_consumer(
                self.options,
                topics={tp.topic for tp in wanted},
                gates=self.gates,
                metadata_max_age_ms=settings.METADATA_MAX_AGE_MS,
            )
            return  # topics may have come or gone while it started: the loop looks again
        self._reassign = False
        if set(wanted) != self._assigned or self._reseek:
            self.fetch.assign(list(wanted))
            for tp, position in wanted.items():
                self.fetch.seek(tp, position)
        self._reseek = False
        self._assigned = set(wanted)

    async def _fetch_once(self) -> dict[TopicPartition, list[Any]]:
        """One fetch, cut short when partitions are added (so a new topic is read at once)."""
        assert self.fetch is not None
        self._fetch_wake = wake = asyncio.get_running_loop().create_future()
        fetch = self.fetch.getmany(timeout_ms=settings.FETCH_WAIT_MS, max_records=settings.MAX_RECORDS_PER_FETCH)
        fetching = asyncio.ensure_future(fetch)
        try:
            await asyncio.wait({fetching, wake}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not fetching.done():
                fetching.cancel()
                await asyncio.gather(fetching, return_exceptions=True)
        self.fetches += 1
        if fetching.cancelled():
            return {}
        return fetching.result()

    async def _dispatch(self, batch: Mapping[TopicPartition, list[Any]]) -> None:
        await hand_out(batch, self._known)

    def _known(self, topic: str) -> TopicReader | None:
        reader = self.topics.get(topic)
        return reader if reader is not None and reader.known else None

    def _sync_positions(self, topics: set[str] | None) -> None:
        """Move past offsets the consumer skipped without returning records (gaps, control batches)."""
        if self.fetch is None:
            return
        for reader in self.topics.values() if topics is None else (self.topics[t] for t in topics if t in self.topics):
            if reader.known:
                reader.sync_positions(self.fetch)

    async def _out_of_range(self, exc: Exception) -> None:
        """The broker no longer has our position: retention deleted it, or the log was cut back."""
        positions = out_of_range_offsets(exc)
        begins = await self.lookups.beginning_offsets(list(positions))
        ends = await self.lookups.end_offsets(list(positions))
        for tp, offset in positions.items():
            reader = self.topics.get(tp.topic)
            if reader is None:
                continue
            if offset < begins[tp]:
                log.warning(
                    "Kafka %s[%d]: offsets %d..%d were deleted before they were read",
                    tp.topic,
                    tp.partition,
                    offset,
                    begins[tp],
                )
                self._move(reader, tp, int(begins[tp]))
            else:
                await self._reset_beyond_end(reader, tp, int(ends[tp]))

    async def _reset_beyond_end(self, reader: TopicReader, tp: TopicPartition, end: int) -> None:
        """Our position is past the log end (topic recreated, unclean leader change): resume at the
        first message stamped at or after the last one we saw, so the new messages are not skipped."""
        target = end
        last = reader.last_timestamp.get(tp)
        if last is not None:
            found = (await self.lookups.offsets_for_times({tp: last})).get(tp)
            if found is not None and found.timestamp is not None and found.timestamp >= 0 and 0 <= found.offset <= end:
                target = int(found.offset)
        log.warning(
            "Kafka %s[%d]: position %d is past the log end %d; resuming at %d",
            tp.topic,
            tp.partition,
            reader.positions[tp],
            end,
            target,
        )
        self._move(reader, tp, target)

    def _move(self, reader: TopicReader, tp: TopicPartition, offset: int) -> None:
        reader.rewind(tp, offset)
        if self.fetch is not None and tp in self._assigned:
            self.fetch.seek(tp, offset)


def _not_authorized(topic: str) -> FatalError:
    return FatalError(f"not authorized to describe topic {topic!r}", error_type=ErrorType.AUTHORIZATION)


__all__ = [
    "ConnectionReader",
]
