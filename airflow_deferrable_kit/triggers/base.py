"""The polling trigger every wait in this package is built on.

A subclass declares its parameters as annotated class attributes and implements one async
``check()`` that looks once. The base turns that into a well-behaved trigger: exact
serialization, one absolute deadline, capped exponential backoff with full jitter on transient
errors, an immediate error event on fatal ones, exactly one event, and release of every shared
client on exit. The same ``check()`` serves the sensor's poke path, so a wait's knowledge lives
in one place.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import random
import sys
from collections.abc import AsyncIterator, Callable, Hashable
from typing import Any, ClassVar, Final

from airflow.triggers.base import (
    BaseEventTrigger,
    BaseTrigger,
    TaskFailedEvent,
    TaskSkippedEvent,
    TaskSuccessEvent,
    TriggerEvent,
)
from pydantic import JsonValue
from typing_extensions import dataclass_transform

from airflow_deferrable_kit import _collector
from airflow_deferrable_kit._arguments import require_seconds
from airflow_deferrable_kit._backoff import MIN_RETRY_DELAY, full_jitter
from airflow_deferrable_kit._metrics import for_trigger
from airflow_deferrable_kit._moments import in_utc
from airflow_deferrable_kit._per_loop import PerLoop
from airflow_deferrable_kit._redact import redact
from airflow_deferrable_kit.connections import believed_before_deadline
from airflow_deferrable_kit.errors import (
    ErrorType,
    FatalError,
    TransientError,
    WaitError,
    describe_exception,
    is_unknown_host,
)
from airflow_deferrable_kit.extras import require_extra
from airflow_deferrable_kit.leases import Closer, Factory, Leases
from airflow_deferrable_kit.payload import (
    ERROR,
    SUCCESS,
    TIMEOUT,
    Found,
    PayloadError,
    error_payload,
    require_json_primitives,
    success_payload,
    timeout_payload,
)
from airflow_deferrable_kit.triggers.subclassing import refuse_reserved_parameters, reported_from_run
from airflow_deferrable_kit.triggers.timing import (
    DEADLINE_PASSED,
    SYSTEM_CLOCK,
    Clock,
    DeadlineGuard,
    check_in_task,
    deadline_after,
    parse_deadline,
)

# paced_alarm and _pacer stay importable from here too (triggers/kafka.py, triggers/temporal.py).
from airflow_deferrable_kit.triggers.timing import paced_alarm as paced_alarm
from airflow_deferrable_kit.triggers.timing import pacer as _pacer

#: Polls in a row in which the resolver says the host name does not exist, before any poll of
#: this wait reached its host, after which the wait fails (a typo'd host would otherwise be
#: retried until the deadline). Once the name has resolved, DNS failures stay transient.
UNKNOWN_HOST_ATTEMPTS = 3
#: Shortest sleep between two polls of any kind.
MIN_POLL_DELAY = 0.001
#: Events of one process handed to the triggerer and not yet taken in (logged and queued by it).
#: The triggerer logs each event through a thread pool before it queues it; 10,000 waits due
#: at one moment would otherwise queue 10,000 log jobs at once, whose objects outlive young
#: garbage collections and set off full ones (seconds of loop lag at that size).
EVENTS_IN_FLIGHT = 32
_event_gates: PerLoop[asyncio.Semaphore] = PerLoop(lambda: asyncio.Semaphore(EVENTS_IN_FLIGHT))


#: The event form of each wait class that has one, registered by the event modules (which sit
#: above this one and import it): ``PollingTrigger`` -> the generic edge trigger, and any wait with
#: an event trigger of its own -> that one. The package's ``__init__`` imports them all, so the
#: registry is complete before any wait is built.
EventForm = Callable[..., BaseEventTrigger]
_EVENT_FORMS: dict[type, EventForm] = {}


def register_event_form(wait_class: type, build: EventForm) -> None:
    """Make ``build(wait, **options)`` what ``wait.as_event_trigger()`` returns for ``wait_class``."""
    _EVENT_FORMS[wait_class] = build


#: What Airflow's ``BaseTrigger`` and trigger runner set on every trigger, kept in slots (see
#: ``PollingTrigger.__slots__``). ``task_instance`` is a plain attribute before Airflow 3.3 and a
#: property over ``_task_instance`` from 3.3 on: a slot of that name would hide the property.
_SET_BY_AIRFLOW: Final = (
    "_task_instance",
    "task_id",
    "template_ext",
    "template_fields",
    "timeout_after",
    "trigger_id",
    "triggerer_job_id",
    *(() if isinstance(getattr(BaseTrigger, "task_instance", None), property) else ("task_instance",)),
)


@dataclass_transform(kw_only_default=True)
@dataclasses.dataclass(kw_only=True, eq=False, repr=False)
class PollingTrigger(BaseTrigger):
    """Poll ``check()`` until it returns :class:`Found`, the deadline passes, or a fatal error.

    Parameters shared by every trigger:

    :param poll_interval: seconds between healthy polls; also the base of the error backoff.
    :param deadline: absolute ISO 8601 time (with offset) at which the wait times out. Carried
        in the kwargs, so a triggerer restart or a re-deferral never restarts the clock.
    :param end_from_trigger: finish the task from the triggerer (no worker slot on resume).
    :param soft_fail: with ``end_from_trigger``, a timeout skips the task instead of failing it.
    :param never_fail: with ``end_from_trigger``, a timeout or an error skips the task.
    :param do_xcom_push: with ``end_from_trigger``, push the success payload as the XCom (a skip
        or a failure pushes none, as on the worker path).
    :param max_backoff: the cap, in seconds, of the backoff after repeated transient errors.
    :param start_budget: set by a sensor with ``start_from_trigger`` instead of ``deadline``:
        the wait's budget in seconds, counted from when Airflow started the task in the
        triggerer. The deadline is then read from Airflow's own trigger timeout of that try
        (``timeout_after``, stored with the task instance, so a restarted or adopting triggerer
        counts from the same moment): :data:`BACKSTOP_SECONDS` before it. Left out of the
        kwargs when unset.

    With ``end_from_trigger`` the task ends as it would on the worker path: a success ends it
    from the triggerer (payload as XCom), as does a skip; an error fails it with the normal
    retry rules. A timeout that fails the task resumes on the worker, which raises
    ``AirflowSensorTimeout``: Airflow retries a failure sent from the triggerer when retries
    remain, and each retry would start a fresh budget, while a sensor timeout is never retried.
    """

    #: Per-wait state in slots, not in the instance dict. CPython (3.11 to 3.13) shares one key
    #: table among the dicts of a class's instances only while they hold fewer than about 27
    #: names; past that every instance carries a table of its own, several times larger
    #: (docs/benchmarks.md).
    #: With the names below in slots the dict holds the parameters alone: the base's own state
    #: (``_deadline_*``, ``_last_error``, ``_leases``, ``_metrics``) and what Airflow's
    #: ``BaseTrigger`` and trigger runner set on every trigger (the rest). A subclass keeps its
    #: own state in its ``__slots__`` too (or in its dict, as any Python class).
    __slots__ = (
        "_deadline_guard",
        "_deadline_ts",
        "_last_error",
        "_leases",
        "_metrics",
        "_rendered",
        *_SET_BY_AIRFLOW,
    )

    poll_interval: float = 30.0
    deadline: str | None = None
    end_from_trigger: bool = False
    soft_fail: bool = False
    never_fail: bool = False
    do_xcom_push: bool = True
    max_backoff: float = 300.0
    start_budget: float | None = None

    #: Optional extra this trigger's client comes from, and the modules it provides.
    extra: ClassVar[str | None] = None
    extra_modules: ClassVar[tuple[str, ...]] = ()
    clock: ClassVar[Clock] = SYSTEM_CLOCK
    #: Start the second poll at a random phase within one interval, so waits deferred together
    #: do not poll together for ever. ``False`` for a check that costs nothing (a clock read).
    spread_polls: ClassVar[bool] = True
    #: The wait's segment in metric names (``deferrable_kit.<name>.polls``); ``None``: this
    #: package's waits are named by module (``s3``, ``datetime``), yours by class name.
    metrics_name: ClassVar[str | None] = None

    #: Why this trigger could not be built when Airflow's trigger runner built it (see
    #: :func:`~airflow_deferrable_kit.triggers.subclassing.reported_from_run`): the wait ends with
    #: this error, a watcher retries. Typed by a
    #: comment, not an annotation, so that it is no dataclass field (no trigger kwarg).
    _unbuilt = None  # type: FatalError | None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(kw_only=True, eq=False, repr=False)(cls)
        refuse_reserved_parameters(cls, PollingTrigger)
        reported_from_run(cls)

    def __post_init__(self) -> None:
        BaseTrigger.__init__(self)
        self._leases: Leases | None = None  # made on the first lease: most waits hold one client or none
        self._deadline_ts: float | None = None
        self._deadline_guard: DeadlineGuard | None = None
        self._metrics = for_trigger(type(self))
        if self.extra is not None:
            require_extra(self.extra, *self.extra_modules, needed_by=type(self).__name__)
        if self.start_budget is not None and holds_template(self._kwargs()):
            # Started by Airflow from the sensor's start_trigger_args: the templated arguments
            # are rendered in the triggerer after the constructor, then checked
            # (render_template_fields); the sensor checked everything else at DAG parse.
            return
        self._check_arguments()

    def _check_arguments(self) -> None:
        self.normalise()
        self._validate_common()
        self.validate()
        require_json_primitives(self._kwargs(), what=f"{type(self).__name__} kwargs")

    def _not_built(self, exc: Exception, kwargs: dict[str, Any]) -> None:
        """Keep what went wrong in the constructor, to be reported from :meth:`run`.

        Only when Airflow's trigger runner is building the trigger: the runner survives nothing
        but a ``TypeError`` from a constructor, and one trigger it cannot build would stop every
        wait and watcher of the triggerer (see
        :func:`~airflow_deferrable_kit.triggers.subclassing.reported_from_run`).
        """
        if getattr(self, "_metrics", None) is None:  # stopped before the base's own state was set
            BaseTrigger.__init__(self)
            self._leases = None
            self._deadline_ts = None
            self._deadline_guard = None
            self._metrics = for_trigger(type(self))
        self._build_kwargs = kwargs
        self._unbuilt = FatalError(
            f"{type(self).__name__} could not be built in the triggerer: {describe_exception(exc)}",
            error_type=ErrorType.BAD_CONFIGURATION,
        )
        self.log.error("%s", redact(self._unbuilt.message))

    def _validate_common(self) -> None:
        for name in ("poll_interval", "max_backoff"):
            require_seconds(getattr(self, name), argument=name)
        if self.deadline is not None:
            self._deadline_ts = parse_deadline(self.deadline)
        if self.start_budget is not None:
            require_seconds(self.start_budget, argument="start_budget", allow_zero=True)
            if self.deadline is not None:
                raise ValueError("start_budget and deadline are two ways to say when the wait ends; give one")

    def normalise(self) -> None:
        """Bring the parameters to their one form (a tuple to a list, a moment to UTC ISO), in place.

        Runs before :meth:`validate` wherever the trigger's arguments are final: when it is built
        from a sensor on a worker (deferral, poke, the first look) and, with ``start_from_trigger``,
        in the triggerer once Airflow has rendered the templated arguments there, where no sensor
        runs. So a value that may be templated is normalised here, never in the sensor's
        ``trigger_params()``, or the two paths would wait on different values. Must be idempotent:
        a trigger rebuilt from its own kwargs normalises them again. A ``ValueError`` naming the
        argument refuses the value, as from :meth:`validate`.
        """

    def validate(self) -> None:
        """Check the subclass's parameters; raise ``ValueError`` naming the argument."""

    # ----------------------------------------------------------------- the subclass contract
    async def check(self) -> Found | None:
        """Look once. Return :class:`Found` when done, ``None`` for "not yet".

        Raise :class:`TransientError` to retry with backoff or :class:`FatalError` to end with
        an error event; any other exception is passed to :meth:`classify_error`.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement check()")

    def classify_error(self, exc: Exception) -> WaitError:
        """Map a client exception to transient or fatal. Subclasses add their clients' errors."""
        if isinstance(exc, WaitError):
            return exc
        if isinstance(exc, (OSError, TimeoutError, asyncio.TimeoutError)):  # ConnectionError is an OSError
            return TransientError(describe_exception(exc), error_type=ErrorType.NETWORK)
        return FatalError(f"unexpected {describe_exception(exc)}", error_type=ErrorType.INTERNAL)

    def next_poll_delay(self) -> float:
        """Seconds until the next healthy poll; a subclass with a known target time shortens it."""
        return float(self.poll_interval)

    def describe(self) -> str:
        """A short human description for the log line written when the wait starts."""
        return type(self).__name__

    async def pause(self, delay: float) -> None:
        """Sleep between polls; override to wake early (e.g. on a LISTEN/NOTIFY notification)."""
        await self.clock.sleep(delay)

    def as_event_trigger(self, **options: Any) -> BaseEventTrigger:
        """This wait as an event trigger for an ``AssetWatcher``: one asset event each time its
        condition becomes true, none while it stays true (``options``: ``backfill``, ``poll_interval``,
        ``max_backoff``). See :mod:`airflow_deferrable_kit.triggers.events`.

        The event form is the one registered for the nearest class of this wait
        (:func:`register_event_form`): every wait has the generic one, a wait with an event
        trigger of its own (HTTP) has that.
        """
        for klass in type(self).__mro__:
            build = _EVENT_FORMS.get(klass)
            if build is not None:
                return build(self, **options)
        raise TypeError(  # not reached once airflow_deferrable_kit.triggers is imported
            f"{type(self).__name__} has no event form: import airflow_deferrable_kit.triggers.events"
        )

    async def lease(self, key: Hashable, factory: Factory, close: Closer) -> Any:
        """A client shared with every trigger using the same ``key`` in this loop, held until exit."""
        if self._leases is None:
            self._leases = Leases()
        return await self._leases.get(key, factory, close)

    # --------------------------------------------------------------------- serialization
    @classmethod
    def parameter_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def _kwargs(self) -> dict[str, Any]:
        kwargs = {name: getattr(self, name) for name in self.parameter_names()}
        if kwargs.get("start_budget", 0) is None:
            del kwargs["start_budget"]  # only a wait Airflow starts in the triggerer has one
        return kwargs

    # ------------------------------------------------------------- started in the triggerer
    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        """Render the sensor's templated arguments (Airflow, ``start_from_trigger``), then check them.

        Airflow 3.3 renders the trigger kwargs named like the sensor's template fields, in the
        triggerer, just before :meth:`run`. The rendered values are checked as the sensor checks
        them on a worker; whatever is wrong (a bad value, a template that fails) ends the wait
        with one ``error`` event naming the argument, never an exception in the triggerer.
        Template files were read when the DAG was parsed: nothing here is read as a file name.
        """
        self.template_ext = ()
        self._rendered = True
        try:
            self._render_each(context, jinja_env or self.get_template_env())
        except _TemplateFailed as failed:
            self._refuse_rendered(
                f"{failed.argument} could not be rendered in the triggerer: {describe_exception(failed.cause)}"
            )
            return
        try:
            self._check_arguments()
            self._deadline_from_start()
            self.work_out_from_run(context)
        except Exception as exc:
            self._refuse_rendered(f"the arguments rendered in the triggerer are not valid: {describe_exception(exc)}")

    def _refuse_rendered(self, reason: str) -> None:
        """End this wait from :meth:`run` with one ``bad_configuration`` error, logged once."""
        self._unbuilt = FatalError(f"{type(self).__name__}: {reason}", error_type=ErrorType.BAD_CONFIGURATION)
        self.log.error("%s", redact(self._unbuilt.message))

    def _render_each(self, context: Any, jinja_env: Any) -> None:
        """Render each templated argument in place, naming the one whose template fails.

        What Airflow's ``_do_render_template_fields`` does (empty values are left as they are),
        one argument at a time: a template that raises or does not parse is reported under the
        argument's name (Airflow's own rendering re-raises Jinja's error, which names no field).
        """
        for name in self.template_fields:
            value = getattr(self, name)
            if not value:
                continue
            try:
                rendered = self.render_template(value, context, jinja_env, set())
            except Exception as exc:
                raise _TemplateFailed(name, exc) from exc
            setattr(self, name, rendered)

    def work_out_from_run(self, context: Any) -> None:
        """Fix what a worker would have fixed from the run when the try started (``start_from_trigger``).

        Called once Airflow has rendered and the arguments are checked, with the run's template
        context (its dates, its DAG, the try). Only what Airflow stores with the task instance
        may go in, so a restarted or adopting triggerer works out the same: the run's dates, the
        try number, :meth:`started_at`. A ``ValueError`` ends the wait with one error event.
        """

    def started_at(self) -> float | None:
        """When Airflow started this wait in the triggerer (epoch seconds), or ``None``.

        The deadline less the budget: both come from the try's stored trigger timeout, so a
        restarted or adopting triggerer gets the same moment. ``None`` without ``start_budget``.
        """
        if self.start_budget is None:
            return None
        self._deadline_from_start()
        assert self._deadline_ts is not None
        return self._deadline_ts - float(self.start_budget)

    def _deadline_from_start(self) -> None:
        """With ``start_budget``: the deadline from Airflow's trigger timeout of this try."""
        if self.start_budget is None or self._deadline_ts is not None:
            return
        after = getattr(self, "timeout_after", None)
        if isinstance(after, dt.datetime):
            if after.tzinfo is None:
                after = after.replace(tzinfo=dt.timezone.utc)
            self._deadline_ts = after.timestamp() - BACKSTOP_SECONDS
        else:  # not started by Airflow (a test, dag.test()): from now, in memory only
            self._deadline_ts = self.clock.time() + float(self.start_budget)
        self.deadline = dt.datetime.fromtimestamp(self._deadline_ts, tz=dt.timezone.utc).isoformat()

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", self._kwargs()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PollingTrigger) and type(other) is type(self) and self.serialize() == other.serialize()

    def __hash__(self) -> int:
        classpath, kwargs = self.serialize()
        return hash((classpath, json.dumps(kwargs, sort_keys=True)))

    # ------------------------------------------------------------------------ the loop
    def _never_rendered(self) -> FatalError | None:
        """The error of a wait Airflow started in the triggerer but never rendered, else ``None``.

        Airflow renders a ``start_from_trigger`` wait only when it builds the workload with the
        DAG's data, and builds it without when the task is not in its run's DAG version (or that
        version cannot be loaded): the kwargs still hold the templates as written in the DAG, and
        the wait would poll for the literal ``s3://bucket/{{ ds }}/...`` until its timeout.
        """
        if self.start_budget is None or getattr(self, "_rendered", False):
            return None
        templated = [name for name, value in self._kwargs().items() if holds_template(value)]
        if not templated:
            return None
        return FatalError(
            f"{type(self).__name__}: {', '.join(templated)} still hold(s) a template that was never rendered: "
            "Airflow started this wait in the triggerer without the DAG it renders templates from (the task "
            "is not in the DAG version of its run, or that version could not be loaded). Clear the task once "
            "its DAG holds it, to start it again",
            error_type=ErrorType.BAD_CONFIGURATION,
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        _collector.apply_once()  # the deployment's opt-in, in the triggerer only (never on import)
        self._deadline_from_start()
        if self._unbuilt is None:
            self._unbuilt = self._never_rendered()
            if self._unbuilt is not None:
                self.log.error("%s", redact(self._unbuilt.message))
        if self._unbuilt is not None:
            # A plain event, whatever the flags (they may be what was wrong): the task resumes
            # on a worker, which fails it with this message, as it would at its first look.
            self._metrics.fatal(self._unbuilt.error_type)
            yield TriggerEvent(error_payload(self._unbuilt.error_type, self._unbuilt.message))
            return
        started = self.clock.time()
        try:
            payload = await self.wait()
        finally:
            if self._deadline_guard is not None:
                self._deadline_guard.close()  # its timer would keep this trigger alive until the deadline
            await self.release()
        self._metrics.event(payload["status"], self.clock.time() - started)
        event = self.to_event(payload)
        async with _event_gates.get():  # uncontended, this takes no turn
            yield event

    async def cleanup(self) -> None:
        await self.release()

    async def release(self) -> None:
        """Give back every shared client this trigger leased (idempotent)."""
        if self._leases is not None and len(self._leases):
            await self._leases.release_all()

    def seconds_left(self) -> float | None:
        if self._deadline_ts is None:
            return None
        return self._deadline_ts - self.clock.time()

    async def wait(self) -> dict[str, Any]:
        """Poll until done and return the single payload (the loop behind :meth:`run`)."""
        self.log.info("Waiting: %s (deadline %s)", self.describe(), self.deadline or "none")
        failures = unknown_host = 0
        reached = False  # some poll got past name resolution
        phased = not self.spread_polls
        self._last_error: WaitError | None = None
        while True:
            left = self.seconds_left()
            if left is not None and left <= 0:
                return self._timed_out()
            self._metrics.poll()
            try:
                outcome = await self._check_before(left)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # A missing connection whose grace would outlast the wait ends it with that error,
                # never a timeout (a skip with soft_fail): the grace rides out blips, not typos.
                error = believed_before_deadline(
                    self.classify_error(exc), seconds_left=self.seconds_left(), longest_retry=float(self.max_backoff)
                )
                if isinstance(error, TransientError) and not reached and is_unknown_host(exc):
                    unknown_host += 1
                    if unknown_host >= UNKNOWN_HOST_ATTEMPTS:
                        error = FatalError(
                            f"the host name never resolved ({unknown_host} attempts; check the connection's "
                            f"host): {error.message}",
                            error_type=ErrorType.BAD_CONNECTION,
                        )
                else:
                    reached = True
                if not isinstance(error, TransientError):
                    self._metrics.fatal(error.error_type)
                    self.log.error("Wait failed (%s): %s", error.error_type, redact(error.message))
                    return self._safe(error_payload, error.error_type, error.message, error.details)
                failures += 1
                self._metrics.transient(error.error_type)
                self._last_error = error
                delay = self.backoff_delay(failures, error.retry_after)
                self.log.warning(
                    "Transient error %d (%s): %s; retrying in %.2fs",
                    failures,
                    error.error_type,
                    redact(error.message),
                    delay,
                )
            else:
                reached = True
                if outcome is DEADLINE_PASSED:
                    return self._timed_out()
                if isinstance(outcome, Found):
                    # At debug: Airflow's own "Trigger fired event" line already says so, with the payload.
                    self.log.debug("Wait satisfied: %s", self.describe())
                    return self._safe(success_payload, outcome)
                if failures:
                    self.log.info("Recovered after %d transient error(s)", failures)
                failures = 0
                delay = max(self.next_poll_delay(), MIN_POLL_DELAY)
                if not phased:
                    phased = True
                    delay = self.phase(delay)
            left = self.seconds_left()
            if left is not None:
                delay = min(delay, max(left, 0.0))
            if failures:
                self._metrics.backoff(delay)
            if type(self).pause is PollingTrigger.pause and type(self.clock).sleep is Clock.sleep:
                await _pacer().sleep(delay)  # what pause() does, two coroutine frames fewer per sleeping wait
            else:
                await self.pause(delay)

    async def _check_before(self, left: float | None) -> Found | object | None:
        """Run one check, abandoning it if the deadline passes while it is in flight."""
        await _pacer().sleep(0)  # a turn: waits woken together check a few per loop iteration
        if left is None:
            return await self.check()
        if sys.version_info < (3, 11):  # no Task.uncancel: the check in a task of its own
            return await check_in_task(self.check(), left)
        # One timer for the wait's life, in this task: no task, no wait() and no timer per poll
        # (a wait's deadline is usually days away, and ten thousand waits poll every few
        # seconds). A check that runs past the deadline is cancelled in place, so it has unwound
        # before run() releases clients.
        guard = self._deadline_guard
        if guard is None:
            guard = self._deadline_guard = DeadlineGuard(self)
        cancelling = guard.enter(left)
        try:
            outcome = await self.check()
        except asyncio.CancelledError:
            if guard.leave(cancelling):
                return DEADLINE_PASSED
            raise
        except BaseException:
            guard.leave(cancelling)
            raise
        guard.leave(cancelling)  # a check that swallowed the guard's cancel still gets its result through
        return outcome

    def phase(self, delay: float) -> float:
        """The first healthy delay, shortened by a random part of one poll interval.

        Waits deferred in the same instant would otherwise poll in the same instant every
        interval. The next poll is never later than ``delay``, so "found within one poll
        interval" still holds, and it is never earlier than ``delay - poll_interval`` (a
        Retry-After is honoured up to one interval). Later polls keep the phase.
        """
        return max(delay - random.uniform(0.0, float(self.poll_interval)), MIN_POLL_DELAY)

    def backoff_delay(self, failures: int, retry_after: float | None = None) -> float:
        """Full-jitter exponential backoff: uniform in [0, min(cap, interval * 2^n)], with a floor."""
        return full_jitter(failures, base=self.poll_interval, cap=self.max_backoff, retry_after=retry_after)

    def _timed_out(self) -> dict[str, Any]:
        message = f"{self.describe()}: deadline {self.deadline} passed before the condition held"
        last = getattr(self, "_last_error", None)
        if last is not None:
            message += f"; last transient error ({last.error_type}): {last.message}"
        self.log.info("Wait timed out: %s", redact(message))
        return timeout_payload(message)

    def _safe(self, build: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
        """Build a payload; a subclass's unusable data becomes a clear error payload, not a crash."""
        try:
            payload = build(*args)
        except PayloadError as exc:
            self._metrics.fatal(ErrorType.PAYLOAD_ERROR)
            self.log.error("%s produced an unusable payload: %s", type(self).__name__, exc)
            return error_payload(ErrorType.PAYLOAD_ERROR, f"{type(self).__name__} produced an unusable payload: {exc}")
        return payload

    def to_event(self, payload: dict[str, Any]) -> TriggerEvent:
        """Wrap the payload: a plain event, or with ``end_from_trigger`` one that ends the task.

        The outcome is the worker path's for every status (see the class docstring); only a
        timeout that would fail the task goes back to the worker, so it is never retried.
        """
        if not self.end_from_trigger:
            return TriggerEvent(payload)
        status = payload["status"]
        if status == SUCCESS:
            xcoms: dict[str, JsonValue] | None = {"return_value": payload} if self.do_xcom_push else None
            return TaskSuccessEvent(xcoms=xcoms)
        # A skip or a failure pushes no XCom, as on the worker path (the payload is in the log).
        if status == TIMEOUT and (self.soft_fail or self.never_fail):
            return TaskSkippedEvent()
        if status == ERROR and self.never_fail:
            return TaskSkippedEvent()
        if status == TIMEOUT:
            return TriggerEvent(payload)  # the worker raises AirflowSensorTimeout: never retried
        return TaskFailedEvent()

    async def poll_once(self) -> dict[str, Any] | None:
        """One check for the sensor's poke path: a success or error payload, or ``None`` (not yet).

        Transient errors count as "not yet" here: the sensor's next poke is the retry.
        """
        self._metrics.poll()
        try:
            outcome = await self.check()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = self.classify_error(exc)
            if isinstance(error, TransientError):
                self._metrics.transient(error.error_type)
                self.log.warning("Transient error (%s): %s; will poke again", error.error_type, redact(error.message))
                return None
            self._metrics.fatal(error.error_type)
            return self._safe(error_payload, error.error_type, error.message, error.details)
        finally:
            await self.release()
        if outcome is None:
            return None
        return self._safe(success_payload, outcome)


class _TemplateFailed(Exception):
    """A templated argument's template raised or did not parse while rendering in the triggerer."""

    def __init__(self, argument: str, cause: Exception) -> None:
        super().__init__(argument)
        self.argument = argument
        self.cause = cause


#: How long after a wait's own deadline Airflow's backstop timeout fires: the wait's timeout
#: event normally wins; the backstop covers a trigger that never ran at all.
BACKSTOP_SECONDS: Final = 60.0


def holds_template(value: Any) -> bool:
    """Whether ``value`` (kwargs, nested) still holds an unrendered Jinja template."""
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, dict):
        return any(holds_template(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(holds_template(v) for v in value)
    return False


__all__ = [
    "ERROR",
    "MIN_RETRY_DELAY",
    "SUCCESS",
    "TIMEOUT",
    "Clock",
    "FatalError",
    "Found",
    "PollingTrigger",
    "TransientError",
    "deadline_after",
    "in_utc",
    "parse_deadline",
]
