"""The read behind a Kafka event trigger's shared stream: every message from a position, in batches.

Watchers of the same topics (``KafkaMessageEventTrigger``) share one Airflow shared stream, and
its producer reads through the connection's shared
:class:`~airflow_deferrable_kit._kafka.reader.ConnectionReader` (the very fetch consumer the
waits use) as one :class:`StreamWaiter`: a waiter that never finishes and keeps every message
handed to it. :class:`TopicsStream` cuts what it was handed into :class:`Batch` es, each saying
per partition which offsets it covers (``start`` to ``through``, every message in between that
can be read in the value format, in order), so a watcher can tell a batch that continues from
its own position from one that leaves a gap (it joined later, or restarted from an older
watermark) and ask the stream to read again from there (:meth:`TopicsStream.rewind`).

Behind the shared reader (at the start, after a rewind, or when its queue overflowed) the stream
reads at its own pace, one fetch per batch, on a consumer of its own
(:class:`~airflow_deferrable_kit._kafka.catchup.OwnPace`), and joins the shared reader again as
soon as it is level, so catching up on a backlog is pulled batch by batch and never buffered.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_deferrable_kit._kafka import settings
from airflow_deferrable_kit._kafka.catchup import OwnPace, read_on_own
from airflow_deferrable_kit._kafka.fanout import FanOut, Waiter
from airflow_deferrable_kit._kafka.gate import CapHold
from airflow_deferrable_kit._kafka.messages import MATCHERS, SUCCESS, KafkaMessage, MatchSpec
from airflow_deferrable_kit.conditions import ConditionSet, Decision
from airflow_deferrable_kit.errors import ErrorType, FatalError, WaitError

if TYPE_CHECKING:
    from aiokafka import TopicPartition

    from airflow_deferrable_kit._kafka.fanout import TopicReader
    from airflow_deferrable_kit._kafka.reader import ConnectionReader

log = logging.getLogger(__name__)


def every_message(value_format: str) -> MatchSpec:
    """The condition of a stream: every message that can be read in ``value_format``."""
    return MatchSpec(ConditionSet.load([], None, matchers=MATCHERS), value_format)


class StreamWaiter(Waiter):
    """A waiter that never finishes: it queues every message from its cursor on, up to a bound."""

    __slots__ = ()

    def offer(self, message: KafkaMessage, tp: TopicPartition, feed: FanOut) -> bool:
        if not self.admit(message, tp):
            return False
        if (
            len(self.queue) >= settings.STREAM_QUEUE_MESSAGES
            or self.queued_bytes + message.size > settings.STREAM_QUEUE_BYTES
        ):
            self._fall_behind(feed, tp, message.offset)  # read again from this message, at our pace
            return True
        self.enqueue((message, SUCCESS, None), message.size)
        self.wake.set()
        return True


@dataclasses.dataclass
class Batch:
    """What the stream read since the last batch.

    ``messages`` are in offset order per partition; for each partition they are every message
    readable in the value format with ``start[tp] <= offset < through[tp]``.
    """

    messages: list[KafkaMessage]
    start: dict[TopicPartition, int]
    through: dict[TopicPartition, int]
    #: The log end offsets when the batch was cut, if asked for (a watcher's first starting point).
    ends: dict[TopicPartition, int] | None = None


class TopicsStream:
    """One shared stream's read of its topics through the connection's shared reader."""

    def __init__(self, connection: ConnectionReader, topics: list[str], value_format: str, *, cap: float) -> None:
        self.connection = connection
        #: The watcher's ``max_backoff``, the connection's reconnect cap while the stream reads.
        self._cap = CapHold(cap)
        self.topics = list(topics)
        self.waiter = StreamWaiter(every_message(value_format), start_from="earliest", start_after_ms=None)
        self.waiter.own_pace = True  # behind the reader it always reads on a consumer of its own
        self.own_pace = OwnPace(connection.conn_id)
        self.readers: dict[str, TopicReader] = {}
        #: Per partition, where the batch being gathered starts (the previous batch's ``through``).
        self._start: dict[TopicPartition, int] = {}
        #: Topics placed: known to the broker and given a position.
        self._placed: set[str] = set()
        #: Positions asked for before the topics were placed (applied when they are).
        self._requested: dict[TopicPartition, int] = {}
        self._everywhere: int | None = None
        #: Set by a rewind: the consumers of our own stand at the old positions.
        self._reseek = False
        self._cut_back: set[TopicPartition] = set()
        self.rewinds = 0

    # ------------------------------------------------------------------ lifecycle
    def join(self) -> None:
        """Join the shared reader's topic readers (each once)."""
        self._cap.hold(self.connection.gates)
        for topic in self.topics:
            if topic not in self.readers:
                self.readers[topic] = self.waiter.readers[topic] = self.connection.join(topic)

    async def close(self) -> None:
        """Leave the shared reader (each topic once) and close the consumers of its own."""
        self._cap.drop()
        self.waiter.finished = True
        for topic in list(self.waiter.attached):
            self.waiter.detach(topic)
        readers, self.readers = self.readers, {}
        for reader in readers.values():
            reader.forget(self.waiter)
            reader.connection.leave(reader)
        self.waiter.readers.clear()
        await self.own_pace.close_all()

    def failed(self) -> WaitError | None:
        """A fatal error of one of the topics' readers (the stream has to be opened afresh)."""
        return next((reader.fatal for reader in self.readers.values() if reader.fatal is not None), None)

    # -------------------------------------------------------------------- positions
    def rewind(self, offsets: Mapping[tuple[str, int], int], *, elsewhere: int | None = 0) -> bool:
        """Read again from ``offsets`` where they lie before the batch being gathered.

        ``elsewhere``: the position asked for in every other partition of the topics (``0``: from
        its beginning; ``None``: nothing asked). Returns whether the stream moved back.
        """
        from aiokafka import TopicPartition

        asked = {TopicPartition(*tp): offset for tp, offset in offsets.items()}
        for tp, offset in asked.items():  # topics not placed yet: applied when they are
            if tp.topic not in self._placed:
                self._requested[tp] = min(offset, self._requested.get(tp, offset))
        if elsewhere is not None and any(topic not in self._placed for topic in self.readers):
            self._everywhere = min(elsewhere, self._everywhere if self._everywhere is not None else elsewhere)
        targets: dict[TopicPartition, int] = {}
        for tp in self._positions() | {tp for tp in asked if tp.topic in self._placed}:
            start = self._start.get(tp, 0)
            wanted = asked.get(tp, elsewhere)
            targets[tp] = start if wanted is None else min(wanted, start)
        if all(target >= self._start.get(tp, 0) for tp, target in targets.items()):
            return False  # (nothing placed yet: targets is empty)
        self._reset(targets)
        self.rewinds += 1
        return True

    def _reset(self, targets: dict[TopicPartition, int]) -> None:
        """Drop what was queued, stand at ``targets``, and read on from there at our own pace."""
        waiter = self.waiter
        for topic in list(waiter.attached):
            waiter.detach(topic)
        waiter.queue.clear()
        waiter.queued_bytes = 0
        for tp, offset in targets.items():
            waiter.cursor[tp] = self._start[tp] = offset
        self._reseek = True

    def _place(self) -> None:
        """Give each topic the broker now knows a position: asked for, else the reader's (the log end)."""
        for topic, reader in self.readers.items():
            if topic in self._placed or not reader.known or not reader.resolved.is_set():
                continue
            for tp, position in reader.positions.items():
                wanted = self._requested.pop(tp, self._everywhere)
                offset = position if wanted is None else min(wanted, position)
                self.waiter.cursor[tp] = self._start[tp] = offset
            self._placed.add(topic)
            self.waiter.try_attach(topic)  # or behind: read at our own pace until level (take)

    # ---------------------------------------------------------------------- a batch
    async def take(self, *, timeout: float, interrupt: asyncio.Event, wants_ends: bool) -> Batch:
        """Everything read since the last batch; waits up to ``timeout`` for a first message.

        Returns at once when behind (one fetch of our own), when ``interrupt`` is set, or when
        ``wants_ends`` (the log end offsets are looked up and returned with the batch).
        """
        await self.resolve()
        self._place()
        if self._reseek:
            self._reseek = False
            await self.own_pace.close_all()
        try:
            messages = self._drain()
            read_own = await self._catch_up(messages)
            if not messages and not read_own and not wants_ends:
                await self._wait(timeout, interrupt)
                self._place()
            ends = await self._ends() if wants_ends else None
        except BaseException:
            # What was taken for this batch is dropped with it: read it again next time.
            self._reset({tp: self._start.get(tp, 0) for tp in self._positions()})
            raise
        messages.extend(self._drain())
        return self._cut(messages, ends)

    def _positions(self) -> set[TopicPartition]:
        """Every partition of the placed topics the stream has a position in."""
        tps = set(self._start) | set(self.waiter.cursor)
        tps.update(tp for topic in self._placed for tp in self.readers[topic].positions)
        return {tp for tp in tps if tp.topic in self._placed}

    async def resolve(self) -> None:
        """Wait until the broker said whether each topic exists; raise a topic's fatal error."""
        for reader in list(self.readers.values()):
            await reader.resolved.wait()
            if reader.fatal is not None:
                raise reader.fatal

    def unknown_topics(self) -> list[str]:
        return [topic for topic, reader in self.readers.items() if not reader.known]

    def _drain(self) -> list[KafkaMessage]:
        queue = self.waiter.queue
        messages = [message for message, _, _ in queue]
        queue.clear()
        self.waiter.queued_bytes = 0
        return messages

    async def _catch_up(self, messages: list[KafkaMessage]) -> bool:
        """One fetch of our own per topic we are behind on; join the shared reader once level."""
        waiter = self.waiter
        read = False
        for topic in sorted(t for t in self.readers if t in self._placed and t not in waiter.attached):
            reader = self.readers[topic]
            if not reader.behind(waiter) and waiter.try_attach(topic):
                await self.own_pace.close(topic)
                continue
            consumer = self.own_pace.consumers.get(topic)
            if consumer is None:
                consumer = await self.own_pace.open(reader)

            async def keep(message: KafkaMessage, kind: str, decision: Decision | None) -> None:
                messages.append(message)

            await read_on_own(consumer, waiter, reader.behind(waiter), keep)
            read = True
            if not reader.behind(waiter) and waiter.try_attach(topic):
                await self.own_pace.close(topic)
        return read

    async def _wait(self, timeout: float, interrupt: asyncio.Event) -> None:
        waiter = self.waiter
        waiter.wake.clear()
        if waiter.queue or interrupt.is_set() or self.failed() is not None:
            return
        woken = asyncio.ensure_future(waiter.wake.wait(timeout))
        poked = asyncio.ensure_future(interrupt.wait())
        try:
            await asyncio.wait({woken, poked}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (woken, poked):
                task.cancel()
            await asyncio.gather(woken, poked, return_exceptions=True)
        error = self.failed()
        if error is not None:
            raise error

    def _cut(self, messages: list[KafkaMessage], ends: dict[TopicPartition, int] | None) -> Batch:
        """Close the batch: per partition, how far it covers (no await since the last drain)."""
        waiter = self.waiter
        through: dict[TopicPartition, int] = {}
        for topic in self._placed:
            feed = waiter.attached.get(topic)
            reader = self.readers[topic]
            for tp in {tp for tp in waiter.cursor if tp.topic == topic} | set(reader.positions):
                position = waiter.cursor.get(tp)
                if feed is not None and tp in feed.positions:
                    position = max(position if position is not None else 0, feed.positions[tp])
                if position is not None:
                    through[tp] = position
        # A partition first seen in this batch appeared after the stream started: from its beginning.
        start = {tp: self._start.get(tp, 0) for tp in through}
        for tp, position in through.items():
            if position < start[tp] and tp not in self._cut_back:
                # The shared reader found the log end below it and moved back (a leader change,
                # a broker misreport, a topic created again). The watchers go on from their own
                # watermarks: what they fired never fires again, and a topic created again fires
                # only the messages past them.
                self._cut_back.add(tp)
                log.warning(
                    "Kafka %s[%d]: the log end went below the watched position %d; each watcher goes on from its "
                    "own watermark (if the topic was created again, its messages below the watermark do not fire)",
                    tp.topic, tp.partition, start[tp],
                )  # fmt: skip
            elif position >= start[tp]:
                self._cut_back.discard(tp)
        self._start.update(through)
        return Batch(messages, start, through, ends)

    async def _ends(self) -> dict[TopicPartition, int]:
        tps = [tp for topic in self._placed for tp in self.readers[topic].positions]
        return dict(await self.connection.lookups.end_offsets(tps)) if tps else {}


def unknown_topic(topic: str, conn_id: str) -> FatalError:
    return FatalError(
        f"topic {topic!r} does not exist on kafka_conn_id={conn_id!r} (set wait_for_topic=True to wait for it quietly)",
        error_type=ErrorType.NOT_FOUND,
    )


def portable_offsets(offsets: Mapping[tuple[str, int], int]) -> dict[str, dict[str, int]]:
    """``{topic: {"<partition>": offset}}``: offsets as JSON (the watermark's shape)."""
    portable: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        portable.setdefault(topic, {})[str(partition)] = int(offset)
    return portable


def native_offsets(portable: Mapping[str, Mapping[str, Any]]) -> dict[TopicPartition, int]:
    from aiokafka import TopicPartition

    return {
        TopicPartition(topic, int(partition)): int(offset)
        for topic, partitions in portable.items()
        for partition, offset in partitions.items()
    }


__all__ = [
    "Batch",
    "StreamWaiter",
    "TopicsStream",
    "native_offsets",
    "portable_offsets",
    "unknown_topic",
]
