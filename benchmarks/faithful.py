"""What Airflow 3.3.2's triggerer does around each trigger, for the load benchmark.

Read in ``airflow/jobs/triggerer_job_runner.py`` (``TriggerRunner``) and
``airflow/sdk/execution_time/task_runner.py`` (``_defer_task``):

* **The deferral.** A sensor's ``execute()`` raises ``TaskDeferred``; the task runner sends
  ``serde.serialize(trigger.serialize()[1])`` and the timeout; the API server stores the kwargs as
  JSON and ``trigger_timeout = utcnow() + timeout``. :func:`deferral` builds each wait the same
  way, from the kit's or the official sensor (its first look in the worker switched off: the
  condition is false when the benchmark starts), so the kwargs carry what a real deferral carries
  (the kit's 7-day deadline, the official sensors' own defaults).
* **The runner.** ``TriggerRunner.create_triggers`` decodes the kwargs (``Trigger._decrypt_kwargs``,
  ``smart_decode_trigger_kwargs``), builds the trigger, sets ``task_instance`` and
  ``timeout_after``, and starts ``run_trigger`` as one task per trigger: a greenback portal per
  trigger (``greenback.ensure_portal()``), log context variables, a tracing span, the "trigger
  starting" / "Trigger fired event" / "trigger completed" lines, ``cleanup()``. :class:`BenchRunner`
  *is* that runner (its own methods, unchanged); only the outbound event queue is timed and the
  supervisor link left out (no process to talk to).
* **Logging.** The runner process logs through the task SDK's structlog pipeline as JSON lines to
  the supervisor (``_configure_logs_over_json_channel``), at ``[logging] logging_level`` (INFO).
  :func:`configure_triggerer_logging` sets up the same pipeline, writing to ``/dev/null``.

Start-up probes (:func:`install_startup_probe`) count the waits that have made their first poll
(or, where a poll cannot be seen, built their client): the hold starts only once every wait has,
so a steady state is measured, never a ramp. A probe wraps one method at class level and is
removed before the hold, so the measured polls run the unmodified code.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import functools
import inspect
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

#: Airflow's default sensor timeout (``[sensors] default_timeout``): 7 days.
SENSOR_TIMEOUT_S = 7 * 24 * 3600


def configure_triggerer_logging() -> None:
    """The triggerer's logging: structlog JSON lines at ``[logging] logging_level``, as in its subprocess."""
    from airflow.sdk.log import configure_logging, reset_logging

    sink = open(os.devnull, "wb", buffering=0)  # noqa: SIM115 - lives as long as the process
    reset_logging()
    configure_logging(json_output=True, output=sink, sending_to_supervisor=True)


# ------------------------------------------------------------------------------ deferral
def _deferred(sensor: Any) -> tuple[str, dict[str, Any], dt.timedelta | None]:
    """Run the sensor's ``execute()`` to its ``defer()``: (classpath, serialized kwargs, timeout)."""
    from airflow.sdk.exceptions import TaskDeferred
    from airflow.sdk.serde import serialize

    try:
        sensor.execute({})
    except TaskDeferred as deferred:
        classpath, kwargs = deferred.trigger.serialize()
        return classpath, serialize(kwargs), deferred.timeout
    raise RuntimeError(f"{type(sensor).__name__} did not defer")


def _no_worker_look(sensor: Any) -> Any:
    """The official sensors look once in the worker before deferring; the condition is false here."""
    sensor.poke = lambda context: False
    return sensor


class FloorTrigger(BaseTrigger):
    """The least a trigger can do (``--impl floor``, kind ``datetime``): one ``asyncio.sleep`` to the moment, one event.

    Run by the same runner, it measures what Airflow itself costs per waiting trigger and per event.
    """

    started = 0

    def __init__(self, moment: float) -> None:
        super().__init__()
        self.moment = moment

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return "benchmarks.faithful.FloorTrigger", {"moment": self.moment}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        FloorTrigger.started += 1
        await asyncio.sleep(self.moment - time.time())
        yield TriggerEvent({"status": "success"})


class FloorProbe:
    what = "started (one asyncio.sleep each)"

    def count(self) -> int:
        return FloorTrigger.started

    def remove(self) -> None:
        pass


def deferral(
    kind: str, impl: str, i: int, poll: float, target: str | None, topics: int, start_ms: int
) -> tuple[str, dict[str, Any], dt.timedelta | None]:
    """Wait ``i`` of a cell as its sensor defers it."""
    from benchmarks.triggerer_load import BUCKET, http_endpoint, s3_wait, topic_of

    if impl == "floor":
        return "benchmarks.faithful.FloorTrigger", {"moment": dt.datetime.fromisoformat(str(target)).timestamp()}, None

    common = {"task_id": f"wait_{i}", "poke_interval": poll}
    if impl == "kit":
        kit = {**common, "deferrable": True, "check_before_defer": False}
        if kind.startswith("s3"):
            from airflow_deferrable_kit.sensors.s3 import S3KeySensor

            key, wildcard = s3_wait(kind, i)
            sensor: Any = S3KeySensor(
                bucket_key=key, bucket_name=BUCKET, wildcard_match=wildcard, aws_conn_id="bench_aws", **kit
            )
        elif kind.startswith("http"):
            from airflow_deferrable_kit.sensors.http import HttpBatchReadySensor

            sensor = HttpBatchReadySensor(http_conn_id="bench_http", endpoint=http_endpoint(kind, i), **kit)
        elif kind.startswith("postgres"):
            from airflow_deferrable_kit.sensors.postgres import PostgresBatchMarkerSensor
            from benchmarks.triggerer_load import marker_key, table_of

            sensor = PostgresBatchMarkerSensor(
                postgres_conn_id="bench_pg", table=table_of(kind, i), match={"batch_id": marker_key(i)}, **kit
            )
        elif kind.startswith("kafka"):
            from airflow_deferrable_kit.sensors.kafka import KafkaMessageSensor

            sensor = KafkaMessageSensor(
                topics=[topic_of(kind, i, topics)],
                kafka_conn_id="bench_kafka",
                start_after=start_ms,
                success=[{"path": "id", "equals": i}],
                **kit,
            )
        else:
            from airflow_deferrable_kit.sensors.temporal import DateTimeSensor

            sensor = DateTimeSensor(target_time=target, **kit)
        return _deferred(sensor)
    official = {**common, "deferrable": True}
    if kind.startswith("s3"):
        from airflow.providers.amazon.aws.sensors.s3 import S3KeySensor as OfficialS3KeySensor

        key, wildcard = s3_wait(kind, i)
        sensor = OfficialS3KeySensor(
            bucket_key=key, bucket_name=BUCKET, wildcard_match=wildcard, aws_conn_id="bench_aws", **official
        )
    elif kind.startswith("http"):
        from airflow.providers.http.sensors.http import HttpSensor

        sensor = HttpSensor(endpoint=http_endpoint(kind, i), http_conn_id="bench_http", **official)
    elif kind.startswith("kafka"):
        from airflow.providers.apache.kafka.sensors.kafka import AwaitMessageSensor

        sensor = AwaitMessageSensor(
            task_id=f"wait_{i}",
            topics=[topic_of(kind, i, topics)],
            apply_function="benchmarks.kafka_match.match_id",
            apply_function_args=[i],
            kafka_config_id=f"bench_kafka_{i}",
            poll_interval=poll,
        )
    elif kind == "datetime":
        from airflow.providers.standard.sensors.date_time import DateTimeSensorAsync

        sensor = DateTimeSensorAsync(task_id=f"wait_{i}", target_time=target)
    elif kind.startswith("postgres"):
        # No official sensor: the naive trigger as its own operator would defer it (the default
        # sensor timeout, as every deferral of a sensor carries).
        from benchmarks.naive_postgres import NaivePostgresMarkerTrigger
        from benchmarks.triggerer_load import marker_key, table_of

        naive = NaivePostgresMarkerTrigger("bench_pg", table_of(kind, i), marker_key(i), poll_interval=poll)
        classpath, kwargs = naive.serialize()
        return classpath, kwargs, dt.timedelta(seconds=SENSOR_TIMEOUT_S)
    else:
        raise SystemExit(f"no official sensor of kind {kind}")
    return _deferred(_no_worker_look(sensor))


def workloads(kind: str, impl: str, n: int, poll: float, target: str | None, topics: int, start_ms: int) -> list[Any]:
    """The ``RunTrigger`` workloads the supervisor hands the runner, one per wait."""
    return run_trigger_workloads([deferral(kind, impl, i, poll, target, topics, start_ms) for i in range(n)])


def run_trigger_workloads(deferrals: list[tuple[str, dict[str, Any], dt.timedelta | None]]) -> list[Any]:
    """One ``RunTrigger`` per deferral (trigger id = index + 1), as the supervisor hands them to the runner."""
    import json

    from airflow.executors.workloads import RunTrigger, TaskInstanceDTO

    dag_version = uuid.uuid4()
    now = dt.datetime.now(dt.timezone.utc)
    out = []
    for i, (classpath, kwargs, timeout) in enumerate(deferrals):
        ti = TaskInstanceDTO(
            id=uuid.uuid4(),
            task_id=f"wait_{i}",
            dag_id="bench",
            run_id="bench_run",
            try_number=1,
            dag_version_id=dag_version,
            pool_slots=1,
            priority_weight=1,
        )
        out.append(
            RunTrigger(
                id=i + 1,
                classpath=classpath,
                encrypted_kwargs=json.dumps(kwargs),  # what the Execution API stores on deferral
                ti=ti,
                timeout_after=now + timeout if timeout is not None else None,
            )
        )
    return out


# -------------------------------------------------------------------------------- runner
class TimedEvents(collections.deque):  # type: ignore[type-arg]
    """The runner's outbound event queue, noting when each trigger's event arrived."""

    def __init__(self, fired: dict[int, float], payloads: dict[int, Any]) -> None:
        super().__init__()
        self._fired, self._payloads = fired, payloads

    def append(self, entry: Any) -> None:
        index = entry.trigger_id - 1
        self._fired[index] = time.time()
        payload = getattr(entry.event, "payload", entry.event)
        self._payloads[index] = payload.get("status", "?") if isinstance(payload, dict) else repr(payload)[:20]
        super().append(entry)


async def bookkeeping(runner: Any) -> None:
    """``TriggerRunner.arun``'s round, less the supervisor link: finished triggers and events out, every second."""
    import anyio

    while True:
        finished = await runner.cleanup_finished_triggers()
        runner.process_trigger_events(finished)
        with anyio.move_on_after(1):
            await anyio.sleep_forever()


def bench_runner(fired: dict[int, float], payloads: dict[int, Any]) -> Any:
    """Airflow's own ``TriggerRunner``, its event queue timed (nothing else replaced)."""
    from airflow.jobs.triggerer_job_runner import TriggerRunner

    runner = TriggerRunner()
    runner.events = TimedEvents(fired, payloads)
    return runner


# -------------------------------------------------------------------------------- probes
class StartupProbe:
    """Counts the waits that got past their first poll, by wrapping one method at class level."""

    def __init__(self, owner: type, name: str, key: Callable[..., Any], what: str) -> None:
        self.owner, self.name, self.what = owner, name, what
        self.seen: set[Any] = set()
        self._original = owner.__dict__[name]
        original = self._original
        seen = self.seen
        if isinstance(original, property):
            getter = original.fget

            def read(this: Any) -> Any:
                seen.add(key(this))
                return getter(this)  # type: ignore[misc]

            setattr(owner, name, property(read))
        elif inspect.iscoroutinefunction(original):

            @functools.wraps(original)
            async def call_async(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await original(*args, **kwargs)
                finally:
                    seen.add(key(*args, **kwargs))

            setattr(owner, name, call_async)
        else:

            @functools.wraps(original)
            def call(*args: Any, **kwargs: Any) -> Any:
                try:
                    return original(*args, **kwargs)
                finally:
                    seen.add(key(*args, **kwargs))

            setattr(owner, name, call)

    def count(self) -> int:
        return len(self.seen)

    def remove(self) -> None:
        setattr(self.owner, self.name, self._original)


class AlarmProbe:
    """Kit DateTime waits on the system clock: those holding an entry in the loop's one alarm."""

    what = "first clock comparison (waiting on the shared alarm)"

    def count(self) -> int:
        from airflow_deferrable_kit.triggers import temporal

        return len(temporal._alarms.get())

    def remove(self) -> None:
        pass


def install_startup_probe(kind: str, impl: str) -> StartupProbe | AlarmProbe | FloorProbe:
    if impl == "floor":
        return FloorProbe()
    if impl == "kit" and kind == "datetime":
        from airflow_deferrable_kit.triggers import temporal

        if hasattr(temporal, "_alarms"):  # an older kit polls through check(), probed below
            return AlarmProbe()
    if impl == "kit":
        from airflow_deferrable_kit.triggers.base import PollingTrigger

        # Every kit trigger's poll is its check(); subclasses define it, so wrap the subclass's.
        cls = _kit_trigger_class(kind)
        owner = next(c for c in cls.__mro__ if "check" in c.__dict__ and issubclass(c, PollingTrigger))
        return StartupProbe(owner, "check", lambda self, *a, **k: id(self), "first check() returned")
    if kind.startswith("s3"):
        from airflow.providers.amazon.aws.hooks.s3 import S3Hook

        return StartupProbe(
            S3Hook, "check_key_async", lambda _hook, _client, _bucket, key, *a, **k: key, "first key check returned"
        )
    if kind.startswith("http"):
        from airflow.providers.http.hooks.http import HttpAsyncHook

        # One hook per trigger for its life (HttpSensorTrigger.run builds it once): counted by hook,
        # so waits that share one URL are each counted.
        return StartupProbe(
            HttpAsyncHook, "run", lambda self, *a, **k: id(self), "first request answered (404 until the flip)"
        )
    if kind.startswith("postgres"):  # the naive trigger: one connection per wait, one fetchrow per poll
        from asyncpg.connection import Connection

        return StartupProbe(Connection, "fetchrow", lambda self, *a, **k: id(self), "first statement sent")
    if kind.startswith("kafka"):
        from airflow.providers.apache.kafka.hooks.consume import KafkaConsumerHook

        return StartupProbe(
            KafkaConsumerHook, "get_consumer", lambda self: id(self), "consumer built (its polls cannot be seen)"
        )
    from airflow.providers.standard.triggers.temporal import DateTimeTrigger

    return StartupProbe(DateTimeTrigger, "moment", lambda self: id(self), "first clock comparison")


def _kit_trigger_class(kind: str) -> type:
    if kind.startswith("s3"):
        from airflow_deferrable_kit.triggers.s3 import S3KeyTrigger

        return S3KeyTrigger
    if kind.startswith("http"):
        from airflow_deferrable_kit.triggers.http import HttpBatchReadyTrigger

        return HttpBatchReadyTrigger
    if kind.startswith("postgres"):
        from airflow_deferrable_kit.triggers.postgres import PostgresBatchMarkerTrigger

        return PostgresBatchMarkerTrigger
    if kind.startswith("kafka"):
        from airflow_deferrable_kit.triggers.kafka import KafkaMessageTrigger

        return KafkaMessageTrigger
    from airflow_deferrable_kit.triggers.temporal import DateTimeTrigger

    return DateTimeTrigger
