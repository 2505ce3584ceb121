"""Start a DAG run for each matching Kafka message: ``KafkaMessageEventTrigger``, for an ``AssetWatcher``.

It is :class:`~airflow_deferrable_kit.triggers.kafka.KafkaMessageTrigger` (the same connection,
shared reader, message model, conditions and error rules) that never stops: every message on
its topics that its conditions accept fires one event, in offset order per partition.

* **One read per topic.** Watchers of the same topics (and value format) share one Airflow
  shared stream, and its producer reads through the connection's shared reader, the fetch
  consumer the waits use too (:mod:`airflow_deferrable_kit._kafka.stream`): a hundred assets
  watching one topic cost one fetch, and each watcher judges every message with its own
  conditions. No consumer group is joined, nothing is committed.
* **Watermarks behind storage.** The watermark in the asset state store is, per partition, the
  next offset to judge. It is saved only after the events it covers are stored in the
  metadata database (Airflow's ack mode), so a triggerer that stops or dies never loses a
  message; one that dies between an event being stored and its watermark being saved fires
  that message again after the restart (``event_id`` is ``topic[partition]@offset``).
* **A watcher behind the stream asks it to read again.** Each batch says which offsets it covers
  per partition; a watcher whose watermark lies before that (it restarted, or subscribed after
  the others) takes nothing from those partitions and asks the stream to rewind to it. The
  watchers already past it skip what is read again.

On the first ever start the log end of every partition is the starting point (the official
Kafka triggers start at the latest offset too, with a new consumer group); ``backfill=True``
starts at the beginning of the retained log. Partitions added later, and topics created
later with ``wait_for_topic=True``, are read from their beginning.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Mapping
from typing import Any, ClassVar, Final

from airflow_deferrable_kit._arguments import take_official_name
from airflow_deferrable_kit._event_streams import Board
from airflow_deferrable_kit._kafka.consumers import quiet_aiokafka
from airflow_deferrable_kit._kafka.messages import KafkaMessage
from airflow_deferrable_kit._kafka.stream import (
    Batch,
    TopicsStream,
    native_offsets,
    portable_offsets,
    unknown_topic,
)
from airflow_deferrable_kit._redact import redact
from airflow_deferrable_kit.errors import ConditionFailed, FatalError, WaitError
from airflow_deferrable_kit.triggers.events import EventTrigger, event_payload
from airflow_deferrable_kit.triggers.kafka import KafkaMessageTrigger

#: Parameters of the wait that say where *one* wait starts; a watcher starts from its watermark.
START_PARAMETERS: Final = ("start_from", "start_offsets", "start_after_ms", "group_id")
#: The official provider's names (``AwaitMessageTrigger``, ``KafkaMessageQueueTrigger``), as the
#: sensor takes them: moved onto the kit's own names when built, never in the kwargs.
OFFICIAL_NAMES: Final = ("kafka_config_id", "apply_function", "apply_function_args", "apply_function_kwargs")

#: How long a watcher whose messages fire nothing keeps its newer position in memory only: its
#: watermark is saved with every batch that fired, and otherwise at most this often, so a busy
#: topic that a thousand watchers mostly skip is not a thousand state-store writes per batch.
#: (A restart reads again what was not saved: skipped messages are judged again, and skipped.)
IDLE_SAVE_SECONDS: Final = 10.0

#: Positions the watchers of a stream asked it to read again from: (offsets, every other partition).
_rewinds: weakref.WeakKeyDictionary[Board, list[tuple[dict[tuple[str, int], int], int]]] = weakref.WeakKeyDictionary()


class KafkaMessageEventTrigger(EventTrigger, KafkaMessageTrigger):
    """Fire one asset event for each Kafka message on ``topics`` that the conditions accept.

    Takes the parameters of ``KafkaMessageTrigger`` (``topics``, ``kafka_conn_id``,
    ``acceptors``, ``predicate``, ``value_format``, ``wait_for_topic``) except the start ones
    (``start_from``, ``start_offsets``, ``start_after_ms``, ``group_id``: a watcher starts from
    its watermark), plus:

    :param backfill: on the first ever start, fire for the whole retained log (default: start
        at the log end; only messages produced afterwards fire).
    :param poll_interval: the longest one look waits for a message before it reports none
        (messages are handed over as they arrive, not once per interval).

    The official names are taken as the sensor takes them: ``kafka_config_id`` for
    ``kafka_conn_id``; ``apply_function`` (a dotted path) for ``predicate``, called with the
    message as confluent-kafka's ``Message`` shows it, so an official function runs unchanged;
    ``apply_function_args`` / ``apply_function_kwargs`` for ``predicate_args`` /
    ``predicate_kwargs``. They are stored under the kit's names.

    With no condition every message fires. A failure condition, or a predicate answering
    "failure" or "retry", means "not an event". A message the predicate cannot judge (it
    raises) is logged with its coordinates and does not fire. Tombstones, and values that are
    not text (``text``) or JSON (``json``), never fire.

    Each event's payload: ``topic``, ``partition``, ``offset``, ``timestamp``, ``key``,
    ``headers``, ``value`` (cut to fit, with ``value_truncated``), ``value_format``, ``size``,
    ``matched`` (the deciding condition), ``returned`` (when a predicate decided: its answer as
    JSON data, what the official triggers fire), ``kafka_conn_id`` and ``event_id``
    (``topic[partition]@offset``, the message's identity to deduplicate on).
    """

    fires_items: ClassVar[bool] = True

    poll_interval: float = 5.0
    kafka_config_id: str | None = None
    apply_function: str | None = None
    apply_function_args: list[Any] | None = None
    apply_function_kwargs: dict[str, Any] | None = None

    tuning_parameters: ClassVar[tuple[str, ...]] = ("wait_for_topic",)

    @classmethod
    def parameter_names(cls) -> tuple[str, ...]:
        skip = (*START_PARAMETERS, *OFFICIAL_NAMES)
        return tuple(name for name in super().parameter_names() if name not in skip)

    def _take_official_names(self) -> None:
        """``kafka_config_id`` and ``apply_function*`` onto the kit's names, as the sensor maps them."""
        take_official_name(self, "kafka_config_id", "kafka_conn_id", default="kafka_default")
        if self.apply_function is not None:
            if not isinstance(self.apply_function, str):
                raise ValueError(
                    "apply_function must be a dotted path string ('my_dags.checks.is_match'), as the official "
                    f"trigger takes it: a {type(self.apply_function).__name__} cannot be stored for the triggerer"
                )
            if self.predicate is not None:
                raise ValueError(
                    "give predicate= (it receives a dict) or the official apply_function= (it receives a "
                    "confluent-style Message), not both"
                )
            self.predicate, self.predicate_receives, self.apply_function = self.apply_function, "message", None
        if isinstance(self.apply_function_args, tuple):
            self.apply_function_args = list(self.apply_function_args)
        take_official_name(self, "apply_function_args", "predicate_args", default=[])
        take_official_name(self, "apply_function_kwargs", "predicate_kwargs", default={})

    def validate(self) -> None:
        self._take_official_names()
        for name in START_PARAMETERS:
            default = next(f.default for f in self.__dataclass_fields__.values() if f.name == name)
            if getattr(self, name) != default:
                raise ValueError(
                    f"{type(self).__name__} takes no {name}: a watcher starts from its watermark in the asset "
                    "state store (on its first ever start at the log end, or with backfill=True at the "
                    "beginning of the retained log)"
                )
        super().validate()
        self.start_after_ms = None  # the wait's "now"; a watcher has no start moment
        self.topics = sorted(self.topics)  # the same topics in any order: the same watcher and watermark
        self._stream: TopicsStream | None = None
        self._predicate_ready = self.predicate is None
        self._awaiting_baseline = False
        self._asked_rewind = False
        self._looked = asyncio.Event()
        self._board: Board | None = None
        #: Where this watcher is (it may be ahead of the watermark last handed on to be saved).
        self._position: dict[tuple[str, int], int] | None = None
        self._handed_on = 0.0

    def describe(self) -> str:
        condition = f"{len(self.acceptors)} condition(s)" if self.acceptors else "every message"
        if self.predicate:
            condition += f" + predicate {self.predicate}"
        return f"Kafka messages on {', '.join(self.topics)} via {self.kafka_conn_id} ({condition}), as events"

    def stream_identity(self) -> Any:
        """The connection, topics and value format: watchers of them share one read, whatever they accept."""
        return {"kafka_conn_id": self.kafka_conn_id, "topics": self.topics, "value_format": self.value_format}

    # ---------------------------------------------------------------------- the shared look
    async def poll(self, board: Board) -> Batch:
        quiet_aiokafka()
        stream = await self._open_stream()
        for offsets, elsewhere in _rewinds.pop(board, []):
            if stream.rewind(offsets, elsewhere=elsewhere):
                self.log.info("%s: reading again from a watcher's watermark", self.describe())
        try:
            await stream.resolve()
            unknown = stream.unknown_topics()
            if unknown and not self.wait_for_topic:
                raise unknown_topic(unknown[0], self.kafka_conn_id)
            batch = await stream.take(
                timeout=float(self.poll_interval), interrupt=board.poke, wants_ends=board.wants_baseline
            )
        except WaitError as error:
            if isinstance(error, FatalError) and stream.failed() is not None:
                await self._close_stream()  # a topic's reader failed for good: join afresh next time
            raise
        self._looked.set()
        return batch

    async def _open_stream(self) -> TopicsStream:
        if self._stream is None:
            connection = await self._shared_reader()
            self._stream = TopicsStream(connection, self.topics, self.value_format, cap=float(self.max_backoff))
            self._stream.join()
        return self._stream

    async def _close_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.close()

    def wake_events(self) -> list[asyncio.Event]:
        # The look itself waits for messages (take): after one, the loop goes straight back into
        # it (after a failure it still backs off: the event is set by healthy looks only).
        return [self._looked]

    def judging_units(self, data: Any) -> int:
        return len(data.messages)

    async def release(self) -> None:
        await self._close_stream()
        await super().release()

    # -------------------------------------------------------------------- this watcher's view
    def follow(self, board: Board, state: Any) -> None:
        self._board = board
        awaiting = state is None and not self.backfill
        if awaiting != self._awaiting_baseline:
            board.want_baseline(awaiting)
            self._awaiting_baseline = awaiting
        if awaiting:
            return
        offsets = native_offsets(state["offsets"]) if state is not None else {}
        if not self._asked_rewind:
            self._asked_rewind = True  # a restart or a late subscriber: the stream may be past it
            self._ask_rewind(board, offsets)
        board.set_cursor(self, portable_offsets(offsets))

    def unfollow(self, board: Board) -> None:
        if self._awaiting_baseline:
            board.want_baseline(False)
            self._awaiting_baseline = False
        board.drop(self)

    def _ask_rewind(self, board: Board, offsets: Mapping[tuple[str, int], int]) -> None:
        _rewinds.setdefault(board, []).append((dict(offsets), 0))
        board.poke.set()

    async def derive(self, data: Any, state: Any) -> tuple[list[dict[str, Any]], Any]:
        batch: Batch = data
        if not self._predicate_ready:
            await self._import_predicate()
            self._predicate_ready = True
        first = state is None
        if state is None:
            if self.backfill:
                state = {"offsets": {}}
            elif batch.ends is None:
                return [], None  # waiting for the stream to say where the logs end now
            else:
                state = {"offsets": portable_offsets(batch.ends)}  # the starting point
        own = self._position if self._position is not None else dict(native_offsets(state["offsets"]))
        # Partitions where the batch continues from this watcher's position; elsewhere it left a gap.
        covered = {tp for tp, start in batch.start.items() if start <= own.get(tp, 0)}
        payloads = []
        moved = dict(own)
        for message in batch.messages:
            tp = (message.topic, message.partition)  # a TopicPartition is this tuple
            # Judged already (also within this batch: the shared reader may have moved back and
            # handed the same messages out again).
            if tp not in covered or message.offset < moved.get(tp, 0):
                continue
            moved[tp] = message.offset + 1
            payload = await self._judge(message)
            if payload is not None:
                payloads.append(payload)
        for tp in covered:
            moved[tp] = max(moved.get(tp, 0), batch.through[tp])
        if len(covered) < len(batch.start) and self._board is not None:
            self._ask_rewind(self._board, own)
        self._position = moved
        now = time.monotonic()
        if first or payloads or now - self._handed_on >= IDLE_SAVE_SECONDS:
            self._handed_on = now
            return payloads, {"offsets": portable_offsets(moved)}
        return payloads, state  # nothing fired: the position moves on in memory (saved later)

    async def _judge(self, message: KafkaMessage) -> dict[str, Any] | None:
        """The event of ``message`` if the conditions accept it (the wait's rule, message by message)."""
        outcome = self._spec.evaluate(message)
        if outcome is None:
            return None
        try:
            found = await self._settle(message, *outcome)
        except ConditionFailed:
            return None  # a failure condition matched: not an event
        except FatalError as error:  # the predicate raised
            self.log.error("%s: %s; the message does not fire", self.describe(), redact(error.message))
            return None
        return None if found is None else event_payload(found.data)

    def _payload(self, message: KafkaMessage, matched: dict[str, Any] | None) -> dict[str, Any]:
        data = message.payload(self.value_format)
        data["matched"] = matched or {"state": "success", "matcher": "default", "comparator": "every message"}
        data["kafka_conn_id"] = self.kafka_conn_id
        data["event_id"] = f"{message.topic}[{message.partition}]@{message.offset}"
        return data


__all__ = ["KafkaMessageEventTrigger"]
