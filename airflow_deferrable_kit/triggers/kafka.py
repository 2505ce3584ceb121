"""Wait for a Kafka message that matches a condition, on aiokafka, without joining a group.

What makes this wait cheap and safe at scale:

* **No group membership.** Partitions are assigned explicitly and positions are sought, so
  there is no rebalance, no offset commit and no side effect when two triggerers run the same
  trigger (Airflow HA). Reading a group's committed offsets is read-only; committing is opt-in
  and done by the sensor after Airflow has stored the event (at-least-once).
* **One reader per connection per triggerer process, whatever the topics.** Every waiter on a
  connection joins the same shared reader (:func:`~airflow_deferrable_kit._kafka.client.open_reader`):
  one fetch consumer assigned the partitions of every topic waited on, one lookup consumer, one
  catch-up consumer, whose metadata requests name the topics waited on only. Each message is
  decoded once and handed to the waiters whose conditions can match it (an index on the values
  the conditions compare), so however many waits and topics there are, the consumers follow
  the connections and the CPU follows the message rate. Waiters whose start lies behind their topic's hand-out are
  brought up to it together by shared catch-up passes; a waiter too slow to keep up (a slow
  predicate) leaves, catches up at its own pace and joins again, so buffers stay bounded.
* **Nothing missed.** The default start is "every message produced after the task first
  deferred": the sensor fixes the log end offset of every partition then (``start_offsets``),
  once, and they travel in the kwargs, so a triggerer restart or a re-deferral starts from the
  very same offsets, whatever the messages' timestamps or the producers' clocks say.
* **Never blocks, never sleeps per message.** The reader scans as fast as the broker serves,
  yields to the loop during long fan-outs and after every batch of wake-ups, and wakes a waiter
  the moment a match arrives.

This module is the trigger alone. It asks the Kafka client package through two doors:
:mod:`airflow_deferrable_kit._kafka.client` (connection -> options, the shared reader, aiokafka's
errors -> ours) and :mod:`airflow_deferrable_kit._kafka.subscription` (this wait's view of the
shared reader, asked by verbs, on the deferred path and the poke path alike); the message and
condition model is :mod:`airflow_deferrable_kit._kafka.messages`. The package's docstring
(:mod:`airflow_deferrable_kit._kafka`) maps the rest of the engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from airflow_deferrable_kit._kafka.client import (
    classify_kafka_error,
    close_reader,
    load_options,
    open_reader,
    reader_key,
)
from airflow_deferrable_kit._kafka.messages import (
    FAILURE,
    MATCHERS,
    MAX_ACTUAL_CHARS,
    PREDICATE,
    SUCCESS,
    ConfluentStyleMessage,
    KafkaMessage,
    MatchSpec,
    canonical_acceptors,
)
from airflow_deferrable_kit._kafka.offsets import commit_offset, log_end_offsets
from airflow_deferrable_kit._kafka.subscription import Subscription
from airflow_deferrable_kit._moments import to_epoch_ms
from airflow_deferrable_kit.conditions import (
    MISSING,
    ConditionSet,
    Decision,
    answer_as_data,
    capped_decision,
    import_predicate,
    settle,
)
from airflow_deferrable_kit.errors import ErrorType, FatalError, WaitError
from airflow_deferrable_kit.payload import Found
from airflow_deferrable_kit.triggers.base import PollingTrigger, paced_alarm

START_FROM: Final = ("timestamp", "earliest", "committed")
VALUE_FORMATS: Final = ("json", "text", "bytes")
#: What a predicate receives: the message as a dict, or with confluent-kafka ``Message``'s methods.
PREDICATE_RECEIVES: Final = ("dict", "message")
LEGAL_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")


class KafkaMessageTrigger(PollingTrigger):
    """Fire on the first Kafka message (on any of ``topics``) that matches the condition.

    :param topics: topic names (a single string is accepted).
    :param kafka_conn_id: an Airflow ``kafka`` connection: bootstrap servers and security
        settings (SASL/SSL) come from it, inside the triggerer.
    :param acceptors: conditions as data (canonical form, see :mod:`~airflow_deferrable_kit.conditions`)
        with matchers ``key``, ``value``, ``path`` (a JSON path into the value) and ``header``.
    :param predicate: dotted path of a callable ``f(message) -> bool | "success" | "failure"``;
        it receives ``{"topic", "partition", "offset", "timestamp", "key", "headers", "value"}``.
    :param predicate_receives: ``"dict"`` (the default, as above) or ``"message"``: an object with
        confluent-kafka ``Message``'s methods (``value()`` and ``key()`` as raw bytes), what the
        official sensors' ``apply_function`` receives.
    :param predicate_args: positional values bound before the message, ``f(*args, message, **kwargs)``.
    :param predicate_kwargs: keyword values bound after it (the official ``apply_function_kwargs``).
    :param start_from: ``timestamp`` (from ``start_offsets``, else messages stamped at or after
        ``start_after_ms``), ``earliest`` (the whole retained log) or ``committed``
        (``group_id``'s committed offsets, read-only; partitions without one use the timestamp rule).
    :param start_offsets: ``{topic: {"<partition>": offset}}``, the log end offsets when the task
        first deferred: each listed partition starts there, every other one (added since, or a
        topic that appeared since) at its beginning. Record timestamps play no part. Only with
        ``start_from="timestamp"``, and not with ``start_after_ms``.
    :param start_after_ms: the start moment in epoch milliseconds; without it and without
        ``start_offsets`` it is filled with "now" (a trigger stored by an earlier version), and
        carried in the kwargs so a restart never moves it.
    :param group_id: the consumer group whose offsets ``start_from="committed"`` reads.
    :param value_format: ``json`` (non-JSON values are skipped as malformed), ``text`` or ``bytes``.
    :param wait_for_topic: wait for a topic that does not exist yet instead of failing.
    """

    __slots__ = (
        "_conditions",
        "_phased",
        "_resume",
        "_scanning",
        "_spec",
        "_subscription",
        "scan_cursor",
    )  # its state: see PollingTrigger.__slots__

    topics: list[str]
    kafka_conn_id: str = "kafka_default"
    acceptors: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    predicate: str | None = None
    predicate_receives: str = "dict"
    predicate_args: list[Any] = dataclasses.field(default_factory=list)
    predicate_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    start_from: str = "timestamp"
    start_offsets: dict[str, dict[str, int]] | None = None
    start_after_ms: int | None = None
    group_id: str | None = None
    value_format: str = "json"
    wait_for_topic: bool = False

    extra = "kafka"
    extra_modules = ("aiokafka",)

    def __post_init__(self) -> None:
        super().__post_init__()
        #: This wait's view of the shared reader (made at its first check; a scan makes its own).
        self._subscription: Subscription | None = None
        self._scanning = False
        self._phased = False
        self._resume: dict[tuple[str, int], int] = {}
        #: After a bounded scan (the poke path): the next offset to look at per (topic, partition).
        self.scan_cursor: dict[tuple[str, int], int] = {}

    # ---------------------------------------------------------------- validation
    def validate(self) -> None:
        if isinstance(self.topics, str):
            self.topics = [self.topics]
        elif isinstance(self.topics, tuple):
            self.topics = list(self.topics)
        if (
            not isinstance(self.topics, list)
            or not self.topics
            or not all(isinstance(t, str) and t.strip() and t == t.strip() for t in self.topics)
        ):
            raise ValueError(f"topics must be a non-empty list of topic names, got {self.topics!r}")
        if len(set(self.topics)) != len(self.topics):
            raise ValueError(f"topics must not repeat a topic, got {self.topics!r}")
        for topic in self.topics:
            if not LEGAL_TOPIC.fullmatch(topic) or topic in (".", ".."):
                raise ValueError(
                    f"topics: {topic!r} is not a legal Kafka topic name "
                    "(1-249 characters of letters, digits, '.', '_' and '-')"
                )
        if not isinstance(self.kafka_conn_id, str) or not self.kafka_conn_id.strip():
            raise ValueError(f"kafka_conn_id must be a non-empty connection id, got {self.kafka_conn_id!r}")
        if self.value_format not in VALUE_FORMATS:
            raise ValueError(f"value_format must be one of {', '.join(VALUE_FORMATS)}, got {self.value_format!r}")
        if not isinstance(self.acceptors, list):
            raise ValueError(f"acceptors must be a list of conditions, got {type(self.acceptors).__name__}")
        self.acceptors = canonical_acceptors(acceptors=self.acceptors)
        for i, acceptor in enumerate(self.acceptors):
            if self.value_format == "bytes" and acceptor["matcher"] in ("path", "value"):
                raise ValueError(
                    f"acceptors[{i}]: matcher {acceptor['matcher']!r} needs value_format 'json' or 'text', not 'bytes'"
                )
            if self.value_format == "text" and acceptor["matcher"] == "path":
                raise ValueError(f"acceptors[{i}]: matcher 'path' needs value_format 'json'")
        self._conditions = ConditionSet.load(self.acceptors, self.predicate, matchers=MATCHERS)
        self._spec = MatchSpec(self._conditions, self.value_format)
        self._validate_predicate_binding()
        if self.start_from not in START_FROM:
            raise ValueError(f"start_from must be one of {', '.join(START_FROM)}, got {self.start_from!r}")
        if self.group_id is not None and (not isinstance(self.group_id, str) or not self.group_id):
            raise ValueError(f"group_id must be a non-empty string or None, got {self.group_id!r}")
        if self.start_from == "committed" and self.group_id is None:
            raise ValueError("group_id is required with start_from='committed'")
        if isinstance(self.start_after_ms, str):  # rendered in the triggerer (start_from_trigger)
            self.start_after_ms = to_epoch_ms(self.start_after_ms, argument="start_after_ms")
        if self.start_after_ms is not None and (
            isinstance(self.start_after_ms, bool) or not isinstance(self.start_after_ms, int) or self.start_after_ms < 0
        ):
            raise ValueError(f"start_after_ms must be epoch milliseconds (an int >= 0), got {self.start_after_ms!r}")
        self._validate_start_offsets()
        if self._starts_at_its_start() and self.start_budget is None:
            self.start_after_ms = int(self.clock.time() * 1000)
        if not isinstance(self.wait_for_topic, bool):
            raise ValueError(f"wait_for_topic must be true or false, got {self.wait_for_topic!r}")

    def _starts_at_its_start(self) -> bool:
        """Whether the wait reads from when it started: no offsets, no moment, not the whole log."""
        return self.start_after_ms is None and self.start_offsets is None and self.start_from != "earliest"

    def work_out_from_run(self, context: Any) -> None:
        """Started in the triggerer: the first try reads what was produced from its start on.

        The worker path fixes the log end offsets at the first try's first deferral and keeps
        them in the task state store for the retries; a trigger cannot reach that store in
        Airflow 3.3. So the start is a moment, mapped to offsets by the messages' timestamps as
        ``start_after`` is: the first try's start (:meth:`started_at`, from its stored trigger
        timeout, the same after a triggerer restart or an adoption); a later try, which cannot
        know the first one's, starts from the dag run's start, as the worker path does when it
        finds nothing stored. A retry never starts later than the first try did.
        """
        if not self._starts_at_its_start():
            return
        ti = context.get("ti")
        run_started = getattr(context.get("dag_run"), "start_date", None)
        if (getattr(ti, "try_number", None) or 1) > 1 and isinstance(run_started, dt.datetime):
            self.start_after_ms = int(run_started.timestamp() * 1000)
        else:
            self.start_after_ms = int((self.started_at() or self.clock.time()) * 1000)

    def _validate_predicate_binding(self) -> None:
        if self.predicate_receives not in PREDICATE_RECEIVES:
            raise ValueError(
                f"predicate_receives must be one of {', '.join(PREDICATE_RECEIVES)}, got {self.predicate_receives!r}"
            )
        if isinstance(self.predicate_args, tuple):
            self.predicate_args = list(self.predicate_args)
        if not isinstance(self.predicate_args, list):
            raise ValueError(f"predicate_args must be a list, got {type(self.predicate_args).__name__}")
        if not isinstance(self.predicate_kwargs, dict) or not all(isinstance(k, str) for k in self.predicate_kwargs):
            raise ValueError(f"predicate_kwargs must be a dict with string keys, got {self.predicate_kwargs!r}")
        if self.predicate is None and (self.predicate_args or self.predicate_kwargs):
            raise ValueError("predicate_args and predicate_kwargs are bound to the predicate: give predicate too")

    def _predicate_subject(self, message: KafkaMessage) -> Any:
        if self.predicate_receives == "message":
            return ConfluentStyleMessage(message)
        return message.subject(self.value_format)

    def _validate_start_offsets(self) -> None:
        offsets = self.start_offsets
        if offsets is None:
            return
        if self.start_from != "timestamp":
            raise ValueError(f"start_offsets only applies to start_from='timestamp', not {self.start_from!r}")
        if self.start_after_ms is not None:
            raise ValueError("give start_offsets or start_after_ms, not both")
        shape = "start_offsets must be {topic: {partition: offset}} with offsets >= 0"
        if not isinstance(offsets, dict):
            raise ValueError(f"{shape}, got {type(offsets).__name__}")
        normalised: dict[str, dict[str, int]] = {}
        for topic, partitions in offsets.items():
            if not isinstance(topic, str) or not isinstance(partitions, dict):
                raise ValueError(f"{shape}, got {topic!r}: {partitions!r}")
            normalised[topic] = {}
            for partition, offset in partitions.items():
                good_offset = isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0
                if not str(partition).isdigit() or not good_offset:
                    raise ValueError(f"{shape}, got {topic!r}: {{{partition!r}: {offset!r}}}")
                normalised[topic][str(int(partition))] = offset
        self.start_offsets = normalised

    def describe(self) -> str:
        condition = f"{len(self.acceptors)} condition(s)" if self.acceptors else "any message"
        if self.predicate:
            condition += f" + predicate {self.predicate}"
        if self.start_from != "timestamp":
            start = self.start_from
        elif self.start_offsets is not None:
            start = "the log end offsets when the task first deferred"
        else:
            start = f"after {self.start_after_ms} ms"
        return f"Kafka message on {', '.join(self.topics)} via {self.kafka_conn_id} ({condition}; from {start})"

    def classify_error(self, exc: Exception) -> WaitError:
        return classify_kafka_error(exc) or super().classify_error(exc)

    # ------------------------------------------------------------------- the check
    async def check(self) -> Found | None:
        """Deferred: wait up to ``poll_interval`` for the shared readers to deliver a match.

        The check itself is the interruptible sleep: it returns the moment a match is delivered,
        and the base loop re-enters it at once (see :meth:`next_poll_delay`).
        """
        if self._scanning:
            return await self._scan()
        subscription = self._subscription
        if subscription is None:
            if self._starts_at_its_start():  # started in the triggerer, not by Airflow (a test)
                self.start_after_ms = int((self.started_at() or self.clock.time()) * 1000)
            subscription = self._subscription = self._subscribe()
            if self.predicate is not None:
                await self._import_predicate()
        if not subscription.started():
            subscription.join(await self._shared_reader())
            await subscription.start()
        interval = float(self.poll_interval)
        if not self._phased:
            # Waits that started together would otherwise all come back together every interval.
            self._phased = True
            interval = self.phase(interval)
        # One alarm for every sleep of this check, on the triggerer's shared paced timers.
        budget = paced_alarm(interval)
        try:
            return await subscription.next_match(budget, self._settle)
        finally:
            budget.cancel()  # ended early: its turn is skipped

    def next_poll_delay(self) -> float:
        # check() already waited (interruptibly) for up to poll_interval; go straight back in.
        return 0.0 if not self._scanning else float(self.poll_interval)

    async def _import_predicate(self) -> None:
        assert self.predicate is not None
        try:
            await asyncio.to_thread(import_predicate, self.predicate)
        except ValueError as exc:
            raise FatalError(str(exc), error_type=ErrorType.PREDICATE_ERROR) from exc

    def _subscribe(self) -> Subscription:
        return Subscription(
            self._spec,
            conn_id=self.kafka_conn_id,
            topics=self.topics,
            start_from=self.start_from,
            start_after_ms=self.start_after_ms,
            start_offsets=self.start_offsets,
            group_id=self.group_id,
            wait_for_topic=self.wait_for_topic,
            cap=float(self.max_backoff),
            log=self.log,
        )

    async def _shared_reader(self) -> Any:
        """The connection's shared reader, leased for as long as this wait runs."""
        opening = functools.partial(_open_shared_reader, self.kafka_conn_id)
        return await self.lease(reader_key(self.kafka_conn_id), opening, close_reader)

    async def _settle(self, message: KafkaMessage, kind: str, decision: Decision | None) -> Found | None:
        """Turn a delivered message into the outcome: run the predicate if needed, then decide."""
        matched = capped_decision(None if decision is None else decision.as_dict(), MAX_ACTUAL_CHARS)
        returned: Any = MISSING
        if kind == PREDICATE:
            try:
                verdict = await self._conditions.judge(
                    self._predicate_subject(message), decision, args=self.predicate_args, kwargs=self.predicate_kwargs
                )
            except FatalError as exc:  # the predicate raised: the wait ends, naming it and the message
                exc.message = f"{exc.message} (on message {message.topic}[{message.partition}]@{message.offset})"
                raise
            if verdict.state == "retry":
                return None
            kind = SUCCESS if verdict.state == "success" else FAILURE
            matched = capped_decision(verdict.decided_by or {}, MAX_ACTUAL_CHARS)
            returned = verdict.returned
        data = self._payload(message, matched)
        if returned is not MISSING:
            # The answer itself, as data: what the official triggers fire as their event (an
            # apply_function's dict is a dict here, not its repr in matched.returned).
            data["returned"] = answer_as_data(returned)
        return settle(
            kind,
            data,
            lambda: f"a failure condition matched message {message.topic}[{message.partition}]@{message.offset}",
        )

    def _payload(self, message: KafkaMessage, matched: dict[str, Any] | None) -> dict[str, Any]:
        data = message.payload(self.value_format)
        data["matched"] = matched
        data["start"] = {
            "from": self.start_from,
            "after_ms": self.start_after_ms,
            # Of the message's topic only: with many topics and partitions the whole map is large.
            "offsets": None if self.start_offsets is None else self.start_offsets.get(message.topic, {}),
            "group_id": self.group_id,
        }
        if self._subscription is not None:
            data.update(self._subscription.stats())
        return data

    # ------------------------------------------------------------ bounded scan
    async def poll_once(self) -> dict[str, Any] | None:
        """The poke path: one bounded scan from the start position to the log end at this moment."""
        self._scanning = True
        return await super().poll_once()

    def resume_scan_from(self, cursor: Mapping[tuple[str, int], int]) -> None:
        """Start the next bounded scan where an earlier one stopped (the sensor's poke mode)."""
        self._resume = dict(cursor)

    async def _scan(self) -> Found | None:
        subscription = self._subscription = self._subscribe()
        if self.predicate is not None:
            await self._import_predicate()
        return await subscription.scan(self._settle, resume=self._resume, reached=self.scan_cursor)

    # --------------------------------------------------- the sensor's lookups, in the worker
    @staticmethod
    def acceptors_from(
        *,
        acceptors: Iterable[Mapping[str, Any]] | None = None,
        success: Iterable[Mapping[str, Any]] | None = None,
        failure: Iterable[Mapping[str, Any]] | None = None,
    ) -> list[dict[str, Any]]:
        """Kafka conditions (canonical, or the sensor's ``success``/``failure`` sugar) in canonical form."""
        return canonical_acceptors(acceptors=acceptors, success=success, failure=failure)

    @staticmethod
    async def log_ends(kafka_conn_id: str, topics: list[str]) -> dict[str, dict[str, int]]:
        """The log end offset of every partition of ``topics`` now, as ``start_offsets`` carries them.

        Topics that do not exist are left out. A short-lived consumer of its own, bounded in time.
        """
        return await log_end_offsets(kafka_conn_id, topics)

    @staticmethod
    async def commit_match(*, kafka_conn_id: str, group_id: str, topic: str, partition: int, offset: int) -> None:
        """Commit the matched message (``offset + 1``) to ``group_id``: the sensor's opt-in, after the event."""
        await commit_offset(
            kafka_conn_id=kafka_conn_id, group_id=group_id, topic=topic, partition=partition, offset=offset
        )

    # ------------------------------------------------------------------- release
    async def release(self) -> None:
        if self._subscription is not None:
            await self._subscription.leave()
        await super().release()


async def _open_shared_reader(conn_id: str) -> Any:
    return await open_reader(await load_options(conn_id))


__all__ = ["KafkaMessageTrigger"]
