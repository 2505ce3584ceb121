"""Offset lookups of many Kafka waits, gathered and asked together.

A thousand waits deferred at once, each on its own topic, each ask where they start: the end,
beginning or timestamp offsets of a few partitions. One by one that is thousands of broker round
trips queued on one connection. :class:`BatchedLookups` looks like a consumer's lookups to its
callers (it is an :class:`~airflow_deferrable_kit._kafka.offsets.OffsetsSource`), but holds
each question for a moment, asks all of them at once (aiokafka groups a lookup by partition
leader), and hands every caller its part. Transient failures are retried here, once for all
callers, so a broker outage does not make every waiting wait log its own retries.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from airflow_deferrable_kit._backoff import full_jitter
from airflow_deferrable_kit._kafka import settings
from airflow_deferrable_kit._kafka.consumers import classify_kafka_error, quiet_aiokafka
from airflow_deferrable_kit._kafka.offsets import group_by_partition
from airflow_deferrable_kit._redact import redact
from airflow_deferrable_kit.errors import TransientError, describe_exception

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer, TopicPartition

log = logging.getLogger(__name__)

#: Backoff of a batch that failed transiently (full jitter), seconds.
RETRY_BASE, RETRY_CAP = 0.5, 30.0

_Kind = str  # "begin", "end" or "times"


class BatchedLookups:
    """``beginning_offsets`` / ``end_offsets`` / ``offsets_for_times``, batched across callers.

    ``consumer`` returns the (started) consumer to ask; ``retry_delay`` says how long to wait
    after a transient failure (the connection's gate knows when the broker may be tried again).
    """

    def __init__(
        self,
        name: str,
        consumer: Callable[[], Awaitable[AIOKafkaConsumer]],
        retry_delay: Callable[[int], float] | None = None,
        quiet: Callable[[], bool] = lambda: False,
    ) -> None:
        self.name = name
        self._consumer = consumer
        self._retry_delay = retry_delay or (lambda failures: full_jitter(failures, base=RETRY_BASE, cap=RETRY_CAP))
        self._quiet = quiet
        self._queue: list[tuple[_Kind, Any, asyncio.Future[dict[TopicPartition, Any]]]] = []
        self._flushing: asyncio.Task[None] | None = None
        #: Batches asked so far (each is one round of broker requests).
        self.batches = 0

    async def beginning_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        return await self._ask("begin", list(partitions))

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        return await self._ask("end", list(partitions))

    async def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, Any]:
        return await self._ask("times", dict(timestamps))

    async def _ask(self, kind: _Kind, question: Any) -> dict[TopicPartition, Any]:
        if not question:
            return {}
        answer: asyncio.Future[dict[TopicPartition, Any]] = asyncio.get_running_loop().create_future()
        self._queue.append((kind, question, answer))
        if self._flushing is None:
            self._flushing = asyncio.get_running_loop().create_task(self._flush(), name=f"kafka-lookups:{self.name}")
        return await answer

    async def close(self) -> None:
        task, self._flushing = self._flushing, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        for _, _, answer in self._queue:
            answer.cancel()
        self._queue.clear()

    async def _flush(self) -> None:
        """Ask everything queued, batch after batch, until nobody is waiting."""
        quiet_aiokafka()
        try:
            while self._queue:
                await asyncio.sleep(settings.GATHER_SECONDS)
                batch, self._queue = self._queue, []
                batch = [entry for entry in batch if not entry[2].done()]  # askers cancelled meanwhile
                if batch:
                    await self._answer(batch)
        finally:
            if self._flushing is asyncio.current_task():
                self._flushing = None

    async def _answer(self, batch: list[tuple[_Kind, Any, asyncio.Future[dict[TopicPartition, Any]]]]) -> None:
        begins: set[TopicPartition] = set()
        ends: set[TopicPartition] = set()
        times: list[tuple[TopicPartition, int]] = []
        for kind, question, _ in batch:
            if kind == "begin":
                begins.update(question)
            elif kind == "end":
                ends.update(question)
            else:
                times.extend(question.items())
        failures = 0
        while True:
            try:
                consumer = await self._consumer()
                found_begins = await consumer.beginning_offsets(sorted(begins)) if begins else {}
                found_ends = await consumer.end_offsets(sorted(ends)) if ends else {}
                found_times: dict[tuple[TopicPartition, int], Any] = {}
                for round_ in group_by_partition(times):
                    for tp, hit in (await consumer.offsets_for_times(round_)).items():
                        found_times[(tp, round_[tp])] = hit
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                error = classify_kafka_error(exc) or TransientError(describe_exception(exc))
                if not isinstance(error, TransientError):
                    for _, _, answer in batch:
                        if not answer.done():
                            answer.set_exception(error)
                    return
                failures += 1
                delay = self._retry_delay(failures)
                log.log(
                    logging.DEBUG if self._quiet() else logging.WARNING,
                    "Kafka %s: offset lookup failed (%s); retrying in %.1fs",
                    self.name,
                    redact(error.message),
                    delay,
                )
                await asyncio.sleep(delay)
        self.batches += 1
        by_kind = collections.defaultdict(dict, {"begin": found_begins, "end": found_ends})
        for kind, question, answer in batch:
            if answer.done():
                continue
            if kind == "times":
                answer.set_result({tp: found_times.get((tp, ts)) for tp, ts in question.items()})
            else:
                answer.set_result({tp: by_kind[kind][tp] for tp in question})


__all__ = ["BatchedLookups"]
