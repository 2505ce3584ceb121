"""Wait for a Kafka message that matches a condition, without a worker slot and without a group."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import Context

from airflow_deferrable_kit._kafka_client import commit_offset
from airflow_deferrable_kit._kafka_messages import canonical_acceptors
from airflow_deferrable_kit.payload import SUCCESS
from airflow_deferrable_kit.sensors.base import DeferrableSensor, is_unresolved
from airflow_deferrable_kit.sensors.temporal import to_utc_iso
from airflow_deferrable_kit.triggers.kafka import KafkaMessageTrigger


def to_epoch_ms(value: Any, *, argument: str = "start_after") -> int | None:
    """Epoch milliseconds from an int (already ms), a datetime or an ISO 8601 / digit string."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{argument} must be a datetime, an ISO 8601 string or epoch milliseconds, got a bool")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{argument} must not be negative, got {value}")
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    if isinstance(value, (str, dt.datetime)):
        return int(dt.datetime.fromisoformat(to_utc_iso(value, argument=argument)).timestamp() * 1000)
    raise TypeError(
        f"{argument} must be a datetime, an ISO 8601 string or epoch milliseconds, got {type(value).__name__}"
    )


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
    :param start_from: ``"timestamp"`` (default: messages produced after ``start_after``),
        ``"earliest"`` or ``"committed"`` (``group_id``'s committed offsets, read-only).
    :param start_after: the start moment: a datetime, ISO 8601 string or epoch milliseconds
        (templated). Default: the moment the task first deferred (first poke in reschedule mode).
    :param group_id: the consumer group for ``start_from="committed"`` and ``commit_on_match``.
    :param commit_on_match: commit the matched message's offset + 1 to ``group_id`` once the
        task has resumed with the event (at-least-once). Not compatible with ``end_from_trigger``.
    :param value_format: ``"json"`` (default), ``"text"`` or ``"bytes"``.
    :param wait_for_topic: wait for a topic that does not exist yet instead of failing.
    """

    trigger_class = KafkaMessageTrigger
    template_fields: Sequence[str] = ("topics", "kafka_conn_id", "acceptors", "predicate", "start_after_ms", "group_id")
    ui_color = "#e8e1f5"

    topics: str | list[str]
    kafka_conn_id: str
    acceptors: list[dict[str, Any]]
    predicate: str | None
    start_from: str
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
        **kwargs: Any,
    ) -> None:
        super().__init__(
            topics=[topics] if isinstance(topics, str) else list(topics),
            kafka_conn_id=kafka_conn_id,
            acceptors=canonical_acceptors(acceptors=acceptors, success=success, failure=failure),
            predicate=predicate,
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
        self._scan_cursor: dict[tuple[str, int], int] = {}

    def trigger_params(self) -> dict[str, Any]:
        params = super().trigger_params()
        if not is_unresolved(params["start_after_ms"]):
            params["start_after_ms"] = to_epoch_ms(params["start_after_ms"])
        return params

    def execute(self, context: Context) -> Any:
        if self.start_after_ms is None and self.start_from != "earliest":
            # Fixed once, here: the trigger carries it, so re-deferrals and triggerer restarts
            # map it to the same offsets and nothing produced in between is missed.
            self.start_after_ms = self._start_moment_ms(context)
        return super().execute(context)

    def _start_moment_ms(self, context: Context) -> int:
        if not self.deferrable and self.reschedule:
            first = context["ti"].get_first_reschedule_date(context)
            if first is not None:
                return int(first.timestamp() * 1000)
        return int(time.time() * 1000)

    def _poll_in_worker(self) -> dict[str, Any] | None:
        # One bounded scan; in poke mode the next poke continues where this one stopped.
        trigger = self.build_trigger(deadline=None)
        assert isinstance(trigger, KafkaMessageTrigger)
        trigger.resume_scan_from(self._scan_cursor)
        payload = asyncio.run(trigger.poll_once())
        self._scan_cursor.update(trigger.scan_cursor)
        return payload

    def finish(self, payload: Any) -> Any:
        result = super().finish(payload)
        if self.commit_on_match and isinstance(result, dict) and result.get("status") == SUCCESS:
            assert self.group_id is not None
            asyncio.run(
                commit_offset(
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
