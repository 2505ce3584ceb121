"""Wait for a Kafka message that matches a condition, without a worker slot and without a group.

The default start, "every message produced after the task first deferred", is a set of offsets:
the log end of every partition when the first try first ran, looked up in the worker and kept
for the later tries in Airflow's task state store (see :meth:`KafkaMessageSensor.fix_start`).
Started in the triggerer (``start_from_trigger``) there is no worker to look them up: the trigger
starts from the moment the wait started instead (see ``KafkaMessageTrigger.work_out_from_run``).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from airflow.sdk import Context

from airflow_deferrable_kit._moments import to_epoch_ms
from airflow_deferrable_kit.payload import SUCCESS
from airflow_deferrable_kit.sensors.base import (
    DeferrableSensor,
    OfficialRefusal,
    is_unresolved,
    run_in_worker,
    unless_default,
)
from airflow_deferrable_kit.triggers.kafka import KafkaMessageTrigger

#: The task state store key (Airflow >= 3.3, scoped to the task instance: dag run, task id and
#: map index) under which the first try keeps its start for the later ones. Renaming it breaks
#: the retries of tasks already running.
START_KEY = "airflow_deferrable_kit.kafka.start"
#: Airflow's ``NEVER_EXPIRE`` retention (compared by identity): the start must outlive every try,
#: however long apart; the row still goes with its dag run, or on success with
#: ``[state_store] clear_on_success``.
NEVER_EXPIRE = dt.timedelta.max


def _refuse_topic_pattern(value: Any, arguments: Mapping[str, Any]) -> str | None:
    """The official sensors pass ``topics`` to confluent's ``subscribe``, where ``^...`` is a regex."""
    names = [value] if isinstance(value, str) else value if isinstance(value, (list, tuple)) else []
    patterns = [name for name in names if isinstance(name, str) and name.startswith("^")]
    if not patterns:
        return None
    return f"{patterns[0]!r} is a topic pattern there; list the topic names here (topics=['orders', 'refunds'])"


def _accept_poll_timeout(value: Any, arguments: Mapping[str, Any]) -> str | None:
    """How long one confluent ``poll()`` blocks: no outcome depends on it, so any duration is a no-op."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return f"expected a duration in seconds (a number >= 0), got {value!r}"
    return None


class KafkaMessageSensor(DeferrableSensor):
    """Succeed on the first Kafka message that matches; its topic, partition, offset, key,
    headers and value become the XCom.

    :param topics: a topic name or a list of them (templated).
    :param kafka_conn_id: an Airflow ``kafka`` connection (bootstrap servers, SASL/SSL settings).
    :param success: conditions that end the wait successfully, e.g. ``[{"key": "batch-42"}]``,
        ``[{"path": "batch.id", "equals": 42}]``, ``[{"header": "event", "in": ["done", "closed"]}]``.
    :param failure: conditions that end the wait with an error (``ConditionFailed``) naming the message.
    :param acceptors: the same conditions in canonical form (``{"state", "matcher", "argument",
        "comparator", "expected"}``), tried before ``failure`` and ``success``.
    :param predicate: dotted path ``"pkg.module:function"`` of a sync or async callable receiving
        the message (``topic``, ``partition``, ``offset``, ``timestamp``, ``key``, ``headers``,
        ``value``) and returning true / ``"success"``, ``"failure"`` or false.
    :param start_from: ``"timestamp"`` (default: every message produced after the task first
        deferred, or stamped at or after ``start_after`` if given), ``"earliest"`` or
        ``"committed"`` (``group_id``'s committed offsets, read-only).
    :param start_after: a start moment instead: a datetime, ISO 8601 string or epoch
        milliseconds (templated), mapped to offsets by the messages' timestamps. Default: none,
        the wait starts at the log end offsets of the task's first deferral (first poke when
        poking), kept across retries, reschedules and triggerer restarts.
    :param group_id: the consumer group for ``start_from="committed"`` and ``commit_on_match``.
    :param commit_on_match: commit the matched message's offset + 1 to ``group_id`` once the
        task has resumed with the event (at-least-once). Not compatible with ``end_from_trigger``.
    :param value_format: ``"json"`` (default), ``"text"`` or ``"bytes"``.
    :param wait_for_topic: wait for a topic that does not exist yet instead of failing.
    :param apply_function: the official sensors' form of ``predicate``: a dotted path whose
        callable receives the message with confluent-kafka ``Message``'s methods
        (``message.value()``, ``message.key()`` as bytes) and fires on a truthy answer.
    :param apply_function_args: positional values it is called with before the message (templated).
    :param apply_function_kwargs: keyword values it is called with (templated).
    :param xcom_push_key: also push the payload under this XCom key, as the official sensor does.

    The official ``AwaitMessageSensor``'s names are accepted too (``kafka_config_id``,
    ``poll_interval``, ``poll_timeout``, ``commit_offset=False``); see docs/migration.md.
    """

    trigger_class = KafkaMessageTrigger
    template_fields: Sequence[str] = (
        "topics",
        "kafka_conn_id",
        "acceptors",
        "predicate",
        "predicate_args",
        "predicate_kwargs",
        "start_after_ms",
        "group_id",
    )
    official_sensor = "AwaitMessageSensor"
    official_aliases = {"kafka_config_id": "kafka_conn_id", "poll_interval": "poke_interval"}
    official_refusals: ClassVar[Mapping[str, OfficialRefusal]] = {
        "topics": _refuse_topic_pattern,
        "poll_timeout": _accept_poll_timeout,
        "commit_offset": unless_default(
            "this sensor reads without a consumer group and commits nothing; to commit the matched message "
            "(only it, once the task has resumed with the event) pass group_id='...' and commit_on_match=True",
            False,
        ),
        "event_triggered_function": (
            "the official AwaitMessageTriggerFunctionSensor never ends: it calls the function in a worker on "
            "each match and defers again. Here a wait ends on its match: use KafkaMessageSensor and a downstream "
            "task to act once, or, to act on every matching message, schedule a DAG on an Asset whose "
            "AssetWatcher watches the topic with airflow_deferrable_kit.triggers.kafka_events."
            "KafkaMessageEventTrigger (the same topics, kafka_conn_id and conditions) and run the function "
            "there, one DAG run per message"
        ),
    }
    ui_color = "#e8e1f5"

    topics: str | list[str]
    kafka_conn_id: str
    acceptors: list[dict[str, Any]]
    predicate: str | None
    start_from: str
    start_offsets: dict[str, dict[str, int]] | None
    start_after_ms: Any
    group_id: str | None

    def __init__(
        self,
        *,
        topics: str | list[str],
        kafka_conn_id: str = "kafka_default",
        success: list[Mapping[str, Any]] | None = None,
        failure: list[Mapping[str, Any]] | None = None,
        acceptors: list[Mapping[str, Any]] | None = None,
        predicate: str | None = None,
        start_from: str = "timestamp",
        start_after: dt.datetime | str | int | None = None,
        group_id: str | None = None,
        commit_on_match: bool = False,
        value_format: str = "json",
        wait_for_topic: bool = False,
        apply_function: str | None = None,
        apply_function_args: Sequence[Any] | None = None,
        apply_function_kwargs: Mapping[str, Any] | None = None,
        xcom_push_key: str | None = None,
        **kwargs: Any,
    ) -> None:
        predicate_receives = "dict"
        if apply_function is not None:
            if predicate is not None:
                raise TypeError(
                    "give predicate= (it receives a dict) or the official apply_function= (it receives a "
                    "confluent-style Message), not both"
                )
            if not isinstance(apply_function, str):
                raise TypeError(
                    "apply_function must be a dotted path string ('my_dags.checks.is_ready'), as the official "
                    f"sensor takes it: a {type(apply_function).__name__} cannot be stored for the triggerer"
                )
            predicate, predicate_receives = apply_function, "message"
        if xcom_push_key is not None and (not isinstance(xcom_push_key, str) or not xcom_push_key):
            raise TypeError(f"xcom_push_key must be a non-empty string or None, got {xcom_push_key!r}")
        if xcom_push_key is not None and kwargs.get("end_from_trigger"):
            raise ValueError(
                "xcom_push_key needs the task to resume in a worker, which pushes it; end_from_trigger=True "
                "ends the task in the triggerer with the payload as the return value XCom only. Use one or the other."
            )
        super().__init__(
            # Anything but a name or a list of names (None, 7, a dict) goes on as given, for the
            # trigger's validation to refuse naming the argument.
            topics=[topics] if isinstance(topics, str) else list(topics) if isinstance(topics, tuple) else topics,
            kafka_conn_id=kafka_conn_id,
            acceptors=KafkaMessageTrigger.acceptors_from(acceptors=acceptors, success=success, failure=failure),
            predicate=predicate,
            predicate_receives=predicate_receives,
            predicate_args=list(apply_function_args)
            if isinstance(apply_function_args, tuple)
            else apply_function_args or [],
            predicate_kwargs=apply_function_kwargs or {},
            start_from=start_from,
            start_after_ms=start_after,
            group_id=group_id,
            value_format=value_format,
            wait_for_topic=wait_for_topic,
            **kwargs,
        )
        if not isinstance(commit_on_match, bool):
            raise TypeError(f"commit_on_match must be true or false, got {commit_on_match!r}")
        if commit_on_match and group_id is None:
            raise ValueError("commit_on_match needs group_id: the consumer group to commit the matched offset to")
        if commit_on_match and self.end_from_trigger:
            raise ValueError(
                "commit_on_match needs the task to resume in a worker after the event is stored; "
                "end_from_trigger=True skips that step. Use one or the other."
            )
        self.commit_on_match = commit_on_match
        self.xcom_push_key = xcom_push_key
        self._scan_cursor: dict[tuple[str, int], int] = {}

    def trigger_params(self) -> dict[str, Any]:
        params = super().trigger_params()
        if not is_unresolved(params["start_after_ms"]):
            params["start_after_ms"] = to_epoch_ms(params["start_after_ms"])
        return params

    def execute(self, context: Context) -> Any:
        if self.start_from == "timestamp" and self.start_after_ms is None and self.start_offsets is None:
            self.fix_start(context)
        elif self.start_from == "committed" and self.start_after_ms is None:
            # The moment for partitions where the group has no offset; the trigger carries it.
            self.start_after_ms = self._first_moment_ms(context, or_run_start=False)
        return self._push_under_key(context, super().execute(context))

    def execute_complete(
        self, context: Context, event: dict[str, Any], deadline: str | None = None, refusals: int = 0
    ) -> Any:
        return self._push_under_key(context, super().execute_complete(context, event, deadline, refusals))

    def _push_under_key(self, context: Context, result: Any) -> Any:
        """The official ``xcom_push_key``: the payload under that key too (the return value stays)."""
        if self.xcom_push_key is not None and result is not None:
            context["ti"].xcom_push(key=self.xcom_push_key, value=result)
        return result

    # ---------------------------------------------------------------- the default start
    def fix_start(self, context: Context) -> None:
        """Fix "every message produced after the task first deferred", once per task instance.

        The first execution of the first try looks up the log end offset of every partition of
        every topic (in the worker, before it checks or defers) and keeps them in the task state
        store; every later execution (another try, a reschedule, a cleared task) reads them back,
        so a retry never moves the start forward. The trigger carries them in its kwargs, so
        re-deferrals and triggerer restarts start from the same offsets. Timestamps and clocks
        play no part. Fallbacks, each logged: a broker the worker cannot reach gives "stamped
        now or later" (the rule of earlier versions); a later execution that finds nothing
        stored (Airflow < 3.3, or the row was cleared) starts from the first poke or the dag run
        start, by timestamp.
        """
        store = context.get("task_state_store")
        stored = _stored_start(store.get(START_KEY) if store is not None else None)
        topics = list(self.topics)
        if stored is not None:
            self._reuse_start(stored, store)
            return
        if not self._first_execution(context):
            self.start_after_ms = self._first_moment_ms(context, or_run_start=True)
            self.log.warning(
                "No start stored by this task's first try (%s); starting from messages stamped at or after %d ms",
                "no task state store" if store is None else f"no {START_KEY!r} key",
                self.start_after_ms,
            )
        else:
            try:
                self.start_offsets = run_in_worker(KafkaMessageTrigger.log_ends(self.kafka_conn_id, topics))
            except Exception as exc:  # the wait itself reports a broker it cannot use
                self.start_after_ms = int(time.time() * 1000)
                self.log.warning(
                    "Could not look up the log end offsets (%s: %s); starting from messages stamped at or after %d ms",
                    type(exc).__name__,
                    exc,
                    self.start_after_ms,
                )
            else:
                self.log.info("Starting at the log end offsets %s", self.start_offsets)
        if store is not None:
            if self.start_offsets is not None:
                record: dict[str, Any] = {"offsets": self.start_offsets, "topics": topics}
            else:
                record = {"after_ms": self.start_after_ms}
            store.set(START_KEY, record, retention=NEVER_EXPIRE)

    def _reuse_start(self, stored: dict[str, Any], store: Any) -> None:
        """Take the first try's start; topics added to the task since are looked up now."""
        if "after_ms" in stored:
            self.start_after_ms = stored["after_ms"]
            self.log.info("Starting from the first try's moment: %d ms", self.start_after_ms)
            return
        offsets: dict[str, dict[str, int]] = dict(stored["offsets"])
        looked_up: list[str] = list(stored["topics"])
        new = [topic for topic in self.topics if topic not in looked_up]
        if new:
            offsets.update(run_in_worker(KafkaMessageTrigger.log_ends(self.kafka_conn_id, new)))
            store.set(START_KEY, {"offsets": offsets, "topics": looked_up + new}, retention=NEVER_EXPIRE)
        self.start_offsets = {topic: offsets[topic] for topic in self.topics if topic in offsets}
        self.log.info("Starting at the first try's offsets %s", self.start_offsets)

    def _first_execution(self, context: Context) -> bool:
        """Whether this is the first try's first run (later ones: a retry, a later reschedule)."""
        ti = context["ti"]
        if (getattr(ti, "try_number", None) or 1) > 1:
            return False
        return not (not self.deferrable and self.reschedule and ti.get_first_reschedule_date(context) is not None)

    def _first_moment_ms(self, context: Context, *, or_run_start: bool) -> int:
        """The first poke (reschedule mode), else the dag run's start if asked, else now."""
        if not self.deferrable and self.reschedule:
            first = context["ti"].get_first_reschedule_date(context)
            if first is not None:
                return int(first.timestamp() * 1000)
        started = getattr(context.get("dag_run"), "start_date", None) if or_run_start else None
        if isinstance(started, dt.datetime):
            return int(started.timestamp() * 1000)
        return int(time.time() * 1000)

    def look_then_defer(self, deadline: str, context: Context, refusals: int = 0) -> Any:
        """Defer at once: the worker never scans a backlog (``check_before_defer`` is not used here).

        From ``earliest``, a group's ``committed`` offsets, an old ``start_after`` or a retry's
        stored offsets, a first look would read the whole backlog in the worker slot, and the
        trigger would then read it all again from the same start. The trigger's first poll is the
        first look, off the worker.
        """
        self.defer_until(deadline, refusals)

    def _poll_in_worker(self) -> dict[str, Any] | None:
        # One bounded scan; in poke mode the next poke continues where this one stopped.
        trigger = self.build_trigger(deadline=None)
        assert isinstance(trigger, KafkaMessageTrigger)
        trigger.resume_scan_from(self._scan_cursor)
        payload = run_in_worker(trigger.poll_once())
        self._scan_cursor.update(trigger.scan_cursor)
        return payload

    def finish(self, payload: Any) -> Any:
        result = super().finish(payload)
        if self.commit_on_match and isinstance(result, dict) and result.get("status") == SUCCESS:
            assert self.group_id is not None
            run_in_worker(
                KafkaMessageTrigger.commit_match(
                    kafka_conn_id=self.kafka_conn_id,
                    group_id=self.group_id,
                    topic=result["topic"],
                    partition=result["partition"],
                    offset=result["offset"],
                )
            )
            self.log.info(
                "Committed %s[%d] offset %d to group %s",
                result["topic"],
                result["partition"],
                result["offset"] + 1,
                self.group_id,
            )
        return result


def _stored_start(value: Any) -> dict[str, Any] | None:
    """A start record read back from the task state store, or None if absent or unreadable."""
    if not isinstance(value, dict):
        return None
    after_ms = value.get("after_ms")
    if isinstance(after_ms, int) and not isinstance(after_ms, bool) and after_ms >= 0:
        return {"after_ms": after_ms}
    offsets, topics = value.get("offsets"), value.get("topics")
    if (
        isinstance(offsets, dict)
        and isinstance(topics, list)
        and all(isinstance(partitions, dict) for partitions in offsets.values())
    ):
        return {"offsets": offsets, "topics": topics}
    return None
