"""One wait's view of its connection's shared Kafka reader: the door the Kafka trigger asks by verbs.

A :class:`Subscription` holds everything one wait has in the shared engine (its
:class:`~airflow_deferrable_kit._kafka.fanout.Waiter`, the topic readers it joined, its own-pace
consumers, its hold on the connection's backoff cap) and is asked only by verbs:

* :meth:`~Subscription.join` the topics' readers on the connection's shared reader;
* :meth:`~Subscription.start`: where the wait starts in each topic, then attach to the reader
  (or note that it is behind it);
* :meth:`~Subscription.next_match`: the next message its condition cares about, settled by the
  wait, within one alarm; a wait behind the reader :meth:`~Subscription.catch_up` s meanwhile;
* :meth:`~Subscription.scan`: the poke path's bounded scan, from the start to the log end now;
* :meth:`~Subscription.leave` the readers, closing what is its own.

The trigger keeps what belongs to one wait's parameters (conditions, the predicate, the
payload) and hands :meth:`~Subscription.next_match` and :meth:`~Subscription.scan` its
``settle`` step, which turns a message into the wait's outcome.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from airflow_deferrable_kit._kafka.catchup import OwnPace, read_on_own
from airflow_deferrable_kit._kafka.consumers import describe_topics, quiet_aiokafka, start_consumer
from airflow_deferrable_kit._kafka.fanout import TopicReader, Waiter
from airflow_deferrable_kit._kafka.gate import CapHold, gates_for
from airflow_deferrable_kit._kafka.messages import KafkaMessage, MatchSpec
from airflow_deferrable_kit._kafka.offsets import CommittedOffsets, StartOffsets, resolve_start
from airflow_deferrable_kit._kafka.reader import ConnectionReader
from airflow_deferrable_kit._kafka.settings import load_options
from airflow_deferrable_kit.conditions import Decision
from airflow_deferrable_kit.errors import ErrorType, FatalError

T = TypeVar("T")
#: The wait's step from a message its condition cares about to its outcome (``None``: go on).
Settle = Callable[[KafkaMessage, str, Decision | None], Awaitable[T | None]]


class Subscription:
    """One wait on some topics of one Kafka connection, from its start position on.

    :param spec: the wait's condition (what the shared reader hands it).
    :param log: where the wait's own lines go (the trigger's logger).
    :param cap: the wait's ``max_backoff``: the connection's reconnect backoff is capped at it
        while the wait uses the connection.
    """

    __slots__ = (
        "_cap",
        "_conn_id",
        "_fixed",
        "_group_id",
        "_log",
        "_own_pace",
        "_pending",
        "_readers",
        "_start_after_ms",
        "_start_from",
        "_topics",
        "_wait_for_topic",
        "waiter",
    )

    def __init__(
        self,
        spec: MatchSpec,
        *,
        conn_id: str,
        topics: list[str],
        start_from: str,
        start_after_ms: int | None,
        start_offsets: StartOffsets | None,
        group_id: str | None,
        wait_for_topic: bool,
        cap: float,
        log: Any,
    ) -> None:
        self._conn_id = conn_id
        self._topics = list(topics)
        self._start_from = start_from
        self._start_after_ms = start_after_ms
        self._fixed = start_offsets
        self._group_id = group_id
        self._wait_for_topic = wait_for_topic
        self._log = log
        self._cap = CapHold(cap)
        #: Where the wait is in each partition, what was handed to it, what it counted.
        self.waiter = Waiter(spec, start_from=start_from, start_after_ms=start_after_ms)
        #: The topic readers it joined: each is left once when it ends.
        self._readers: dict[str, TopicReader] = {}
        #: Topics not started yet (joined and started in order; a failed start is tried again).
        self._pending = list(topics)
        #: Consumers of its own, for catching up when its predicate fell behind the shared reader
        #: (made when that first happens: most waits never need them).
        self._own_pace: OwnPace | None = None

    # ------------------------------------------------------------------ join, start
    def started(self) -> bool:
        """Whether every topic is joined and its start resolved."""
        return not self._pending

    def join(self, connection: ConnectionReader) -> None:
        """Join the shared reader's topic readers of every topic not started yet.

        Every topic is joined before any answer is awaited (:meth:`start`), so the connection
        looks them all up in one batch (with every other wait's topics joined meanwhile).
        """
        quiet_aiokafka()  # this task's aiokafka lines (own-pace reads) are reported by the kit
        self._cap.hold(connection.gates)
        for topic in self._pending:
            if topic not in self._readers:
                self._readers[topic] = self.waiter.readers[topic] = connection.join(topic)

    async def start(self) -> None:
        """Resolve where the wait starts in each joined topic, then attach (or fall behind)."""
        while self._pending:
            await self._start(self._pending[0])
            self._pending.pop(0)

    async def _start(self, topic: str) -> None:
        waiter = self.waiter
        reader = self._readers[topic]
        await reader.resolved.wait()
        if reader.fatal is not None:
            raise reader.fatal
        if not reader.known:
            if not self._wait_for_topic:
                raise unknown_topic(topic, self._conn_id)
            self._log.info("Topic %s does not exist yet; waiting for it", topic)
        else:
            start = await reader.start_offsets(
                sorted(reader.positions),
                start_from=self._start_from,
                start_after_ms=self._start_after_ms,
                group_id=self._group_id,
                fixed=self._fixed,
            )
            for tp, offset in start.items():
                waiter.cursor.setdefault(tp, offset)
        if not waiter.try_attach(topic):
            self._log.info("Catching up on %s from %s", topic, {tp.partition: o for tp, o in waiter.cursor.items()})

    # ------------------------------------------------------------------ matches
    async def next_match(self, alarm: asyncio.Future[None], settle: Settle[T]) -> T | None:
        """The wait's outcome from the next messages handed to it, or ``None`` once ``alarm`` rings.

        Returns as soon as ``settle`` turns a message into an outcome; ``None`` too once the
        wait has finished (a data decision was handed over and settled). A fatal error of a
        topic it reads is raised.
        """
        quiet_aiokafka()
        waiter = self.waiter
        while True:
            waiter.wake.clear()
            if waiter.queue:
                message, kind, decision = waiter.queue.popleft()
                waiter.queued_bytes -= message.size
                found = await settle(message, kind, decision)
                if found is not None:
                    return found
                continue
            if waiter.finished:
                return None
            self._raise_failure()
            if waiter.behind:
                found = await self.catch_up(next(iter(sorted(waiter.behind))), settle)
                if found is not None:
                    return found
                continue
            if not await waiter.wake.wait_until(alarm):
                return None

    def _raise_failure(self) -> None:
        for reader in self._readers.values():
            if reader.fatal is not None:
                raise reader.fatal

    async def catch_up(self, topic: str, settle: Settle[T]) -> T | None:
        """Get level with the topic's shared reader and join it.

        Normally the reader's shared catch-up pass reads the gap (this returns at once and the
        pass attaches the wait when it is level). A wait that fell behind because its predicate
        could not keep up reads the gap at its own pace, with a short-lived consumer of its own.
        """
        waiter = self.waiter
        reader = self._readers[topic]
        if reader.fatal is not None:
            raise reader.fatal
        if not waiter.own_pace:
            if not waiter.try_attach(topic):
                reader.catch_up(waiter)
            return None
        while True:
            if not reader.behind(waiter) and waiter.try_attach(topic):
                # Level with the reader, and attached in the same step (no await in between).
                await self.own_pace.close(topic)
                self._log.info("Caught up on %s; joined the shared reader", topic)
                return None
            behind = reader.behind(waiter)
            consumer = self.own_pace.consumers.get(topic)
            if consumer is None:
                await self.own_pace.open(reader)
                continue
            found = await read_on_own(consumer, waiter, behind, settle)
            if found is not None:
                await self.own_pace.close(topic)
                return found
            if waiter.queue:
                return None

    @property
    def own_pace(self) -> OwnPace:
        """The wait's own-pace consumers (made on first use)."""
        if self._own_pace is None:
            self._own_pace = OwnPace(self._conn_id)
        return self._own_pace

    def stats(self) -> dict[str, Any]:
        """How much the wait looked at: messages examined and skipped (by reason)."""
        return self.waiter.stats()

    # ------------------------------------------------------------------ bounded scan
    async def scan(
        self,
        settle: Settle[T],
        *,
        resume: Mapping[tuple[str, int], int],
        reached: dict[tuple[str, int], int],
    ) -> T | None:
        """The poke path: one bounded scan from the start to the log end at this moment.

        On a consumer of its own, started and stopped here (a worker has no shared reader).
        Partitions in ``resume`` start where an earlier scan stopped; ``reached`` is given, per
        partition of each topic scanned to its end, the next offset to look at.
        """
        from aiokafka import TopicPartition

        quiet_aiokafka()
        options = await load_options(self._conn_id)
        gates = gates_for(self._conn_id)
        self._cap.hold(gates)
        try:
            consumer = await start_consumer(options, topics=self._topics, gates=gates, metadata_max_age_ms=300_000)
        except BaseException:
            self._cap.drop()
            raise
        committed = CommittedOffsets(options, gates)
        waiter = self.waiter
        try:
            answer = describe_topics(consumer, self._topics)
            answer.raise_unauthorized()
            for topic in self._topics:
                partitions = answer.partitions.get(topic)
                if partitions is None:
                    if self._wait_for_topic:
                        continue
                    raise unknown_topic(topic, self._conn_id)
                tps = [TopicPartition(topic, p) for p in sorted(partitions)]
                fresh = [tp for tp in tps if (tp.topic, tp.partition) not in resume]
                for tp in tps:
                    if (tp.topic, tp.partition) in resume:
                        waiter.cursor[tp] = resume[(tp.topic, tp.partition)]
                waiter.cursor.update(
                    await resolve_start(
                        consumer,
                        fresh,
                        start_from=self._start_from,
                        start_after_ms=self._start_after_ms,
                        committed=functools.partial(committed, self._group_id) if self._group_id else None,
                        start_offsets=self._fixed,
                    )
                )
                ends = {tp: int(offset) for tp, offset in (await consumer.end_offsets(tps)).items()}
                while True:
                    behind = {tp: end for tp, end in ends.items() if waiter.cursor[tp] < end}
                    if not behind:
                        break
                    found = await read_on_own(consumer, waiter, behind, settle)
                    if found is not None:
                        return found
                reached.update({(tp.topic, tp.partition): waiter.cursor[tp] for tp in tps})
            return None
        finally:
            self._cap.drop()
            await consumer.stop()
            await committed.close()

    # ------------------------------------------------------------------ leave
    async def leave(self) -> None:
        """Stop receiving, leave every topic reader joined (once), close what is the wait's own."""
        waiter = self.waiter
        waiter.finished = True
        for topic in list(waiter.attached):
            waiter.detach(topic)
        for reader in self._readers.values():
            reader.forget(waiter)
        joined, self._readers = self._readers, {}
        waiter.readers = {}
        for reader in joined.values():
            reader.connection.leave(reader)
        if self._own_pace is not None:
            await self._own_pace.close_all()
        self._cap.drop()


def unknown_topic(topic: str, conn_id: str) -> FatalError:
    """The wait's error for a topic that does not exist (and is not waited for)."""
    return FatalError(
        f"topic {topic!r} does not exist on kafka_conn_id={conn_id!r} (set wait_for_topic=True to wait for it)",
        error_type=ErrorType.NOT_FOUND,
    )


__all__ = ["Settle", "Subscription", "unknown_topic"]
