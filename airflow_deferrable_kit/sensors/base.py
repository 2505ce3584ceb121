"""The deferrable sensor every wait in this package is built on.

A subclass names its ``trigger_class`` and its ``template_fields``; the sensor takes the
trigger's parameters as its own arguments. With ``deferrable=True`` it hands the wait to the
triggerer; with ``deferrable=False`` it pokes (poke or reschedule mode) through the trigger's
very own ``check()``, so both paths agree on what "done" means.

Why one module past 700 lines: it is one class, ``DeferrableSensor``, whose methods Airflow
calls at every stage of a task's life (parse, render, execute or poke, defer, start in the
triggerer, resume) and which all read and keep the same few pieces of state (the deadline, the
refusals, the rendered parameters). Its sections are marked; the helpers above the class are the
ones only it uses. Mixins in separate files would spread one object's invariants over several.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import datetime as dt
import functools
import inspect
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from datetime import timedelta
from typing import Any, ClassVar, Final, NoReturn, TypeVar

from airflow.sdk import BaseOperator, BaseSensorOperator, Context, PokeReturnValue
from airflow.sdk.configuration import conf
from airflow.sdk.definitions._internal.mixins import ResolveMixin
from airflow.sdk.exceptions import AirflowSensorTimeout, AirflowSkipException, TaskDeferralError, TaskDeferralTimeout
from airflow.triggers.base import BaseEventTrigger, BaseTrigger, StartTriggerArgs

from airflow_deferrable_kit._arguments import require_bool, require_seconds
from airflow_deferrable_kit._trigger_queues import require_trigger_queue, route_trigger
from airflow_deferrable_kit.connections import misses_are_final
from airflow_deferrable_kit.errors import describe_exception
from airflow_deferrable_kit.extras import require_extra
from airflow_deferrable_kit.payload import ERROR, SUCCESS, TIMEOUT, cap_value, timeout_payload
from airflow_deferrable_kit.triggers.base import BACKSTOP_SECONDS, PollingTrigger, deadline_after, parse_deadline

T = TypeVar("T")

#: Bytes of a payload a task log line shows. The whole payload (up to 64 KiB) is the task's
#: XCom; a refused candidate logs its line on every resume, so the line shows a marked cut.
LOG_PREVIEW_BYTES = 2048


def log_preview(payload: Any) -> Any:
    """``payload`` for a log line: as it is when small, else its JSON cut to ``LOG_PREVIEW_BYTES``."""
    return cap_value(payload, LOG_PREVIEW_BYTES)


#: Parameters of :class:`PollingTrigger` that the sensor fills in itself.
SENSOR_MANAGED = frozenset(
    {
        "poll_interval",
        "deadline",
        "end_from_trigger",
        "soft_fail",
        "never_fail",
        "do_xcom_push",
        "max_backoff",
        "start_budget",
    }
)
#: How long after the trigger's own deadline Airflow's backstop timeout fires. The trigger's
#: timeout event normally wins; the backstop covers a trigger that never ran at all.
BACKSTOP_GRACE = timedelta(seconds=BACKSTOP_SECONDS)
#: The first Airflow whose scheduler starts a task in the triggerer with its templates rendered.
START_FROM_TRIGGER_SINCE: Final = (3, 3)


#: How an official parameter is refused: the message naming what to use instead, or a check of its
#: value (given the other arguments too) returning that message, or ``None`` to let it through.
OfficialRefusal = str | Callable[[Any, Mapping[str, Any]], "str | None"]


def unless_default(message: str, *defaults: Any) -> OfficialRefusal:
    """Refuse an official parameter with ``message``, except at one of its official ``defaults``.

    A ported DAG that spelt out the default (``verify=None``, ``fail_on_empty=False``) asks for
    nothing this sensor does not already do, so the argument is accepted as a no-op.
    """

    def check(value: Any, arguments: Mapping[str, Any]) -> str | None:
        same = any(value is default or (type(value) is type(default) and value == default) for default in defaults)
        return None if same else message

    return check


def unless_empty(message: str) -> OfficialRefusal:
    """Refuse an official parameter with ``message`` unless it is ``None`` or empty (a no-op)."""

    def check(value: Any, arguments: Mapping[str, Any]) -> str | None:
        return None if value is None or (isinstance(value, (dict, list, tuple)) and not value) else message

    return check


def if_callable(message: str) -> OfficialRefusal:
    """Refuse a callable given under a name this sensor also takes as data (``success=``)."""

    def check(value: Any, arguments: Mapping[str, Any]) -> str | None:
        return message if callable(value) else None

    return check


#: The deadline the worker's first look must end by (set by :meth:`DeferrableSensor.look_then_defer`).
_look_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("look_deadline", default=None)


class LookTimedOut(Exception):
    """The worker's first look was still running when the wait's deadline passed."""


def run_in_worker(awaitable: Coroutine[Any, Any, T]) -> T:
    """Run a look from the worker (a poke, the first look, a lookup) to its end, on a loop of its own.

    A worker asks its own supervisor for connections, so an unknown ``conn_id`` is believed at
    once (:func:`~airflow_deferrable_kit.connections.misses_are_final`), as by Airflow's own
    sensors: the triggerer's grace window would start again in every reschedule-mode poke.
    Within the first look before deferring, the look is abandoned at the wait's deadline
    (:class:`LookTimedOut`): a hung server cannot hold the worker slot past ``timeout``.
    """
    deadline = _look_deadline.get()

    async def bounded() -> T:
        assert deadline is not None
        try:
            return await asyncio.wait_for(awaitable, timeout=max(deadline - time.time(), 0.0))
        except asyncio.TimeoutError:
            raise LookTimedOut from None

    with misses_are_final():
        return asyncio.run(awaitable if deadline is None else bounded())


#: Why a task may not defer to an event trigger (Airflow does not refuse it itself).
_EVENT_TRIGGER_REASON = (
    "is an event trigger (BaseEventTrigger): it backs an AssetWatcher, runs for ever and yields an event "
    "each time its condition becomes true, so a task deferred to it would not end as a wait does. "
    "Defer to the wait's own trigger (S3KeyTrigger rather than S3KeyEventTrigger), or schedule a DAG "
    "on an Asset with AssetWatcher(trigger=...)"
)


class WaitFailedError(RuntimeError):
    """The wait ended with an error. Not an ``AirflowException``, so ``soft_fail`` cannot skip it."""


def is_unresolved(value: Any) -> bool:
    """True if ``value`` is only known at run time (a Jinja template or an XComArg).

    Such arguments are validated once rendered, in the worker, before the wait is deferred.
    """
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, ResolveMixin):
        return True
    if isinstance(value, dict):
        return any(is_unresolved(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(is_unresolved(v) for v in value)
    return False


def _resume_event(context: Context) -> Any:
    """The trigger's event this try resumes with, or ``None`` when it is not resuming.

    Read from what the API server sent the worker for this try (``next_method`` and
    ``next_kwargs``), decoded as Airflow's task runner decodes it before calling
    ``resume_execution`` (serde, else the older BaseSerialization form). Anything unexpected
    reads as "not resuming", so rendering errors then surface as before.
    """
    from_server = getattr(context.get("ti"), "_ti_context_from_server", None)
    if getattr(from_server, "next_method", None) is None:
        return None
    data = getattr(from_server, "next_kwargs", None) or {}
    try:
        from airflow.sdk.serde import deserialize

        kwargs = deserialize(data)
    except (ImportError, KeyError, AttributeError, TypeError):
        try:
            from airflow.serialization.serialized_objects import BaseSerialization

            kwargs = BaseSerialization.deserialize(data)
        except Exception:
            return None
    except Exception:
        return None
    return kwargs.get("event") if isinstance(kwargs, dict) else None


def _holds_xcom_arg(value: Any) -> bool:
    if isinstance(value, ResolveMixin):
        return True
    if isinstance(value, dict):
        return any(_holds_xcom_arg(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_xcom_arg(v) for v in value)
    return False


def _airflow_version_text() -> str:
    from airflow import __version__

    return str(__version__)


def _airflow_version() -> tuple[int, int]:
    parts = [int("".join(c for c in part if c.isdigit()) or 0) for part in _airflow_version_text().split(".")[:2]]
    major, minor, *_ = [*parts, 0, 0]
    return major, minor


def listeners_registered() -> bool:
    """Whether this process has listener plugins (Airflow's example listener, OpenLineage, ...).

    Airflow's DagBag refuses any task with ``end_from_trigger=True`` while one is registered
    (listeners must see a task end on a worker), so a DAG file asking for it would not import.
    """
    try:
        from airflow.listeners.listener import get_listener_manager
    except ImportError:  # a worker with the task SDK only: no DagBag check there either
        return False
    return bool(get_listener_manager().has_listeners)


#: Whether the process has said that ``end_from_trigger`` is off (it says so once).
_END_FROM_TRIGGER_OFF_SAID: list[bool] = []


def _say_end_from_trigger_is_off(sensor: BaseOperator) -> None:
    """Say once per process (the first such task names it) that ``end_from_trigger`` is off."""
    if _END_FROM_TRIGGER_OFF_SAID:
        return
    _END_FROM_TRIGGER_OFF_SAID.append(True)
    sensor.log.warning(
        "end_from_trigger=True is turned off for %s (task_id=%r) and every other task in this process: "
        "listener plugins are registered (OpenLineage, or Airflow's example listener with load_examples), "
        "and Airflow refuses end_from_trigger with listeners. These waits still defer, and resume on a "
        "worker for a moment at the end so the listeners see the task finish.",
        type(sensor).__name__,
        sensor.task_id,
    )


class DeferrableSensor(BaseSensorOperator):
    """Base for sensors paired with a :class:`PollingTrigger`.

    :param deferrable: wait in the triggerer instead of a worker slot. Defaults to
        ``[operators] default_deferrable``, read when the sensor is built.
    :param check_before_defer: look once in the worker first, so an already-true condition
        finishes without a trigger round trip.
    :param end_from_trigger: let the triggerer finish the task (success, skip or failure) with
        the payload as XCom, so no worker slot is taken on resume.
    :param max_backoff: cap, in seconds, of the backoff after repeated transient errors.
    :param start_from_trigger: (Airflow 3.3+) start the task in the triggerer: the scheduler
        defers it at once, with no worker, and the trigger renders the templated arguments
        itself; with ``end_from_trigger`` too, no worker ever runs it. ``timeout`` counts from
        that start. See docs/start-from-trigger.md for what cannot start there.
    :param trigger_queue: (Airflow 3.2+, ``[triggerer] queues_enabled``) the trigger queue of this
        wait's trigger alone, so the waits on one upstream share their requests on the triggerers
        started with ``--queues <name>``; the task's ``queue`` (its workers) is left as it is. See
        docs/operations.md, "One upstream, one pool of triggerers".

    ``timeout`` is one budget for the whole wait; ``soft_fail`` skips the task on timeout only,
    never on an error. ``timeout``, ``poke_interval`` and ``max_backoff`` are checked when the
    sensor is built: finite, not a bool, and at most a century (``MAX_SECONDS``), so the absolute
    deadline can be written as a date; ``poke_interval`` above zero (a zero interval would poll
    in a hot loop), ``timeout`` from zero as Airflow allows.
    """

    trigger_class: ClassVar[type[PollingTrigger]]
    #: The official sensor(s) this one replaces, as named in messages (``"HttpSensor"``).
    official_sensor: ClassVar[str] = "sensor"
    #: Official parameter names that mean the same here: official name -> this sensor's name.
    official_aliases: ClassVar[Mapping[str, str]] = {}
    #: Official parameters with another meaning or no equivalent, refused when the DAG is parsed
    #: with a message naming the replacement (see :data:`OfficialRefusal`), instead of Airflow's
    #: generic "Invalid arguments were passed". One accepted by its check is dropped, unless it is
    #: also one of this sensor's own parameters.
    official_refusals: ClassVar[Mapping[str, OfficialRefusal]] = {}
    #: Why this sensor cannot start in the triggerer (``start_from_trigger``), or ``None`` if it can.
    cannot_start_in_triggerer: ClassVar[str | None] = None
    #: The templated fields that may name a template file (``template_ext``); every other field,
    #: and every value nested inside one, is rendered as text even if it ends in ``.sql``.
    file_template_fields: ClassVar[tuple[str, ...]] = ()
    ui_color = "#d9f2e6"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "trigger_class" not in cls.__dict__:
            return
        if issubclass(cls.trigger_class, BaseEventTrigger):
            raise TypeError(f"{cls.__name__}: trigger_class={cls.trigger_class.__name__} {_EVENT_TRIGGER_REASON}")
        clashes = [name for name in cls.wait_parameter_names() if hasattr(BaseSensorOperator, name)]
        if clashes:
            raise TypeError(
                f"{cls.__name__}: parameter(s) {', '.join(clashes)} of {cls.trigger_class.__name__} clash with "
                "BaseSensorOperator attributes of the same name; rename them in the trigger"
            )

    def __init__(
        self,
        *,
        deferrable: bool | None = None,
        check_before_defer: bool = True,
        end_from_trigger: bool = False,
        max_backoff: float = 300.0,
        start_from_trigger: bool = False,
        trigger_queue: str | None = None,
        **kwargs: Any,
    ) -> None:
        # A non-bool flag would be taken for its truth value, and "yes" would become deferrable itself.
        require_bool(deferrable, argument="deferrable", optional=True)
        for flag, value in (
            ("check_before_defer", check_before_defer),
            ("end_from_trigger", end_from_trigger),
            ("start_from_trigger", start_from_trigger),
        ):
            require_bool(value, argument=flag)
        names = self.wait_parameter_names()
        params = {name: kwargs.pop(name) for name in names if name in kwargs}
        # Before Airflow's own checks: it crashes on inf, reads True as one second, and takes
        # durations whose deadline cannot be written as a date.
        for name, allow_zero in (("poke_interval", False), ("timeout", True)):
            if kwargs.get(name) is not None:
                require_seconds(kwargs[name], argument=name, allow_zero=allow_zero, allow_timedelta=True)
        require_seconds(max_backoff, argument="max_backoff")
        super().__init__(**kwargs)
        if kwargs.get("timeout") is None:
            require_seconds(self.timeout, argument="timeout (from [sensors] default_timeout)", allow_zero=True)
        missing = sorted(name for name in self._required_parameters() if name not in params)
        if missing:
            raise TypeError(
                f"{type(self).__name__} (task_id={self.task_id!r}) missing required argument(s): " + ", ".join(missing)
            )
        for name, value in params.items():
            setattr(self, name, value)
        for name in names:
            if not hasattr(self, name):
                setattr(self, name, self._default_of(name))
        if deferrable is None:  # starting in the triggerer is deferring: the official sensors' ports need no flag
            deferrable = start_from_trigger or conf.getboolean("operators", "default_deferrable", fallback=False)
        self.deferrable = deferrable
        self.trigger_queue = require_trigger_queue(
            trigger_queue,
            where=f"{type(self).__name__} (task_id={self.task_id!r})",
            deferrable=deferrable,
            start_from_trigger=start_from_trigger,
        )
        self.check_before_defer = check_before_defer
        if deferrable and getattr(self, "exponential_backoff", False):
            raise ValueError(
                f"{type(self).__name__} (task_id={self.task_id!r}): exponential_backoff=True (and max_wait) "
                "only space out pokes in a worker, and this wait defers: the trigger polls every poll_interval "
                "and backs off with jitter on errors by itself (max_backoff). Drop exponential_backoff, or set "
                "deferrable=False to poke with it"
            )
        if end_from_trigger and listeners_registered():
            _say_end_from_trigger_is_off(self)
            end_from_trigger = False
        self.end_from_trigger = end_from_trigger
        self.max_backoff = max_backoff
        if end_from_trigger and self.checks_in_worker():
            raise ValueError(
                f"{type(self).__name__} (task_id={self.task_id!r}): end_from_trigger=True cannot be combined with "
                f"a callable checked in the worker ({self.checks_in_worker()}): the triggerer would end the task "
                "without it"
            )
        trigger_class = self.trigger_class
        if trigger_class.extra is not None:
            require_extra(trigger_class.extra, *trigger_class.extra_modules, needed_by=type(self).__name__)
        if not is_unresolved([getattr(self, name) for name in names]):
            self.build_trigger(deadline=None)  # validates every argument at DAG parse
        self.start_from_trigger = False
        if start_from_trigger:
            self._refuse_start_from_trigger()
            self.start_from_trigger = True
            self._set_start_trigger_args()

    # ------------------------------------------------------------ starting in the triggerer
    def _refuse_start_from_trigger(self) -> None:
        """What cannot start in the triggerer is refused here, at DAG parse, with the fix."""
        where = f"{type(self).__name__} (task_id={self.task_id!r}): start_from_trigger=True"
        if _airflow_version() < START_FROM_TRIGGER_SINCE:
            raise ValueError(
                f"{where} needs Airflow 3.3 or later (this is {_airflow_version_text()}): the scheduler of earlier "
                "versions does not render the templated arguments in the triggerer. Drop start_from_trigger; the "
                "task then defers from a worker"
            )
        if not self.deferrable:
            raise ValueError(f"{where} needs deferrable=True: a poke or reschedule wait runs in a worker")
        if type(self).cannot_start_in_triggerer is not None:
            raise ValueError(f"{where} is not possible: {type(self).cannot_start_in_triggerer}")
        if self.checks_in_worker():
            raise ValueError(
                f"{where} cannot be combined with a callable checked in the worker ({self.checks_in_worker()}): "
                "a wait started in the triggerer has no worker to run it. Give the check as an importable "
                "path the triggerer can call (see the sensor's docs), or drop start_from_trigger"
            )
        unresolved_xcoms = [name for name in self.wait_parameter_names() if _holds_xcom_arg(getattr(self, name, None))]
        if unresolved_xcoms:
            raise ValueError(
                f"{where}: {', '.join(unresolved_xcoms)} come(s) from an upstream task's XCom, which Airflow "
                "does not resolve in the triggerer; use a template instead, e.g. "
                "\"{{ ti.xcom_pull(task_ids='upstream') }}\" (rendered as text), or drop start_from_trigger"
            )
        budget = timedelta(seconds=float(self.timeout)) + BACKSTOP_GRACE
        if self.execution_timeout is not None and self.execution_timeout < budget:
            raise ValueError(
                f"{where}: execution_timeout={self.execution_timeout} is shorter than timeout "
                f"({float(self.timeout):g} s) plus {BACKSTOP_SECONDS:g} s, and would end the wait before its own "
                "timeout could; raise execution_timeout or lower timeout"
            )

    def start_trigger(self) -> tuple[type[PollingTrigger], dict[str, Any]]:
        """The trigger Airflow builds when it starts this wait in the triggerer, and its wait's kwargs.

        The kwargs are :meth:`trigger_params`, as on a worker. Templated values stay as written,
        under the sensor's own names: Airflow renders them in the triggerer, where no sensor
        runs, and the trigger's own ``normalise()`` brings them to their form there, as it does
        on a worker. So ``trigger_params`` may normalise what is known at parse, and must leave a
        templated value as it is: one it changes, or cannot take unrendered, would reach the
        triggerer in another form than the worker's, and is refused here, at parse. A sensor
        whose worker works something out when a try starts gives a trigger that works it out
        there instead (:class:`~airflow_deferrable_kit.sensors.temporal.RunMomentSensor`).
        """
        raw = {name: getattr(self, name) for name in self.wait_parameter_names()}
        templated = [name for name, value in raw.items() if is_unresolved(value)]
        if not templated:
            return self.trigger_class, self.trigger_params()
        where = f"{type(self).__name__} (task_id={self.task_id!r}): start_from_trigger=True"
        fix = (
            f"started in the triggerer, a templated argument is rendered there, where no sensor runs "
            f"trigger_params(). Normalise it in {self.trigger_class.__name__}.normalise(), which runs after "
            "rendering on both paths (see docs/start-from-trigger.md), or drop start_from_trigger"
        )
        try:
            params = self.trigger_params()
        except Exception as exc:
            raise ValueError(
                f"{where}: {type(self).__name__}.trigger_params() fails on the unrendered {', '.join(templated)} "
                f"({type(exc).__name__}: {exc}); {fix}"
            ) from exc
        changed = [name for name in templated if name not in params or params[name] != raw[name]]
        if changed:
            raise ValueError(
                f"{where}: {type(self).__name__}.trigger_params() changes the templated {', '.join(changed)}, "
                f"so a worker and the triggerer would wait on different values; {fix}"
            )
        return self.trigger_class, params

    def _set_start_trigger_args(self) -> None:
        """This task's ``start_trigger_args``: the trigger's kwargs with a budget, not a deadline."""
        trigger, params = self.start_trigger()
        kwargs = {
            **params,
            "poll_interval": self.poke_interval,
            "end_from_trigger": self.end_from_trigger,
            "soft_fail": self.soft_fail,
            "never_fail": self.never_fail,
            "do_xcom_push": self.do_xcom_push,
            "max_backoff": self.max_backoff,
            "start_budget": float(self.timeout),
        }
        if not is_unresolved(params):
            kwargs = trigger(**kwargs).serialize()[1]  # checked now, at DAG parse
        self.start_trigger_args = StartTriggerArgs(
            trigger_cls=f"{trigger.__module__}.{trigger.__qualname__}",
            trigger_kwargs=kwargs,
            next_method="execute_complete",
            next_kwargs=None,
            timeout=timedelta(seconds=float(self.timeout)) + BACKSTOP_GRACE,
        )

    # ------------------------------------------------------- the official sensors' names
    def _hook_apply_defaults(self, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Airflow's hook before each ``__init__`` of the hierarchy: official names are translated.

        It runs before the subclass's own ``__init__`` sees the arguments, so an alias fills the
        parameter itself (``request_params`` -> ``query``), not a default the subclass already set.
        """
        return args, type(self).translate_official_arguments(kwargs)

    @classmethod
    def translate_official_arguments(cls, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """``kwargs`` with official aliases renamed; a refused official parameter raises TypeError."""
        arguments = dict(kwargs)
        where = f"{cls.__name__} (task_id={arguments.get('task_id')!r})"
        for name, refusal in cls.official_refusals.items():
            if name not in arguments:
                continue
            message = refusal if isinstance(refusal, str) else refusal(arguments[name], arguments)
            if message is not None:
                raise TypeError(f"{where}: {name}= of the official {cls.official_sensor} is not supported: {message}")
            if name not in cls.accepted_parameter_names():
                del arguments[name]
        for official, own in cls.official_aliases.items():
            if official not in arguments:
                continue
            if own in arguments:
                raise TypeError(f"{where}: {own}= and its official name {official}= are the same parameter; give one")
            arguments[own] = arguments.pop(official)
        return arguments

    @classmethod
    @functools.cache
    def accepted_parameter_names(cls) -> frozenset[str]:
        """Every keyword this sensor's constructors take, its own and Airflow's, by their names here."""
        names: set[str] = set()
        for klass in cls.__mro__:
            init = klass.__dict__.get("__init__")
            if init is None or klass is object:
                continue
            for parameter in inspect.signature(init).parameters.values():
                if parameter.kind not in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL) and parameter.name != "self":
                    names.add(parameter.name)
        return frozenset(names)

    # ------------------------------------------------------------------- the parameters
    @classmethod
    def wait_parameter_names(cls) -> tuple[str, ...]:
        """The trigger parameters this sensor accepts as its own arguments."""
        return tuple(n for n in cls.trigger_class.parameter_names() if n not in SENSOR_MANAGED)

    @classmethod
    def _fields(cls) -> dict[str, dataclasses.Field[Any]]:
        return {f.name: f for f in dataclasses.fields(cls.trigger_class)}

    @classmethod
    def _required_parameters(cls) -> list[str]:
        fields = cls._fields()
        return [
            name
            for name in cls.wait_parameter_names()
            if fields[name].default is dataclasses.MISSING and fields[name].default_factory is dataclasses.MISSING
        ]

    @classmethod
    def _default_of(cls, name: str) -> Any:
        field = cls._fields()[name]
        if field.default_factory is not dataclasses.MISSING:
            return field.default_factory()
        return field.default

    def trigger_params(self) -> dict[str, Any]:
        """The wait's own trigger kwargs from this (rendered) sensor.

        Override it for what only the sensor knows (its callables, what its last look saw). A
        value's form (a tuple to a list, a moment to UTC) belongs in the trigger's ``normalise()``:
        with ``start_from_trigger`` no sensor runs after rendering (see :meth:`start_trigger`).
        """
        return {name: getattr(self, name) for name in self.wait_parameter_names()}

    def build_trigger(self, deadline: str | None) -> PollingTrigger:
        return self.trigger_class(
            **self.trigger_params(),
            poll_interval=self.poke_interval,
            deadline=deadline,
            end_from_trigger=self.end_from_trigger,
            soft_fail=self.soft_fail,
            never_fail=self.never_fail,
            do_xcom_push=self.do_xcom_push,
            max_backoff=self.max_backoff,
        )

    # ------------------------------------------------------------------------ templates
    def resolve_template_files(self) -> None:
        """Read template files (at DAG parse) only for :attr:`file_template_fields`."""
        with self._template_fields_narrowed_to(self.file_template_fields):
            super().resolve_template_files()
        if self.start_from_trigger:
            self._set_start_trigger_args()  # the triggerer gets the file's text, not its name

    def render_template_fields(self, context: Context, jinja_env: Any = None) -> None:
        """Render as Airflow does, with ``template_ext`` applied only to :attr:`file_template_fields`.

        Airflow applies ``template_ext`` to every string of every templated field, nested ones
        included, so ``match={"file_name": "daily.sql"}`` would be read as a template file.

        A try that resumes with the trigger's ``error`` event ends with that error even if the
        arguments do not render here: the worker renders again (strictly, with the DAG's
        ``StrictUndefined``) before it resumes, and a wait started in the triggerer whose
        ``dag_run.conf`` key was missing would otherwise end with Jinja's ``UndefinedError``
        after the trigger's ``bad_configuration`` naming the argument: two errors for one mistake.
        """
        try:
            self._render_fields(context, jinja_env)
        except Exception as exc:
            event = _resume_event(context)
            if not (isinstance(event, dict) and event.get("status") == ERROR):
                raise
            self.log.info(
                "The templated arguments do not render here either (%s); the task ends with the error the "
                "trigger reported",
                describe_exception(exc),
            )

    def _render_fields(self, context: Context, jinja_env: Any) -> None:
        jinja_env = jinja_env or self.get_template_env()
        files = tuple(name for name in self.template_fields if name in self.file_template_fields)
        self._do_render_template_fields(self, files, context, jinja_env, set())
        others = tuple(name for name in self.template_fields if name not in self.file_template_fields)
        saved = self.template_ext
        self.template_ext = ()
        try:
            self._do_render_template_fields(self, others, context, jinja_env, set())
        finally:
            self.template_ext = saved

    @contextlib.contextmanager
    def _template_fields_narrowed_to(self, names: tuple[str, ...]) -> Iterator[None]:
        saved = self.template_fields
        self.template_fields = tuple(name for name in saved if name in names)
        try:
            yield
        finally:
            self.template_fields = saved

    # ------------------------------------------------------------- the worker's last word
    def checks_in_worker(self) -> str | None:
        """The name of a callable this sensor runs in the worker on each success, or ``None``.

        The official sensors' callables (``check_fn``) cannot cross to the triggerer: the trigger
        finds candidates, and on resume :meth:`accepts_in_worker` has the last word.
        """
        return None

    def accepts_in_worker(self, payload: dict[str, Any], context: Context) -> bool:
        """Whether a success the trigger found stands; ``False`` waits on, within the same deadline."""
        return True

    def _stands(self, payload: dict[str, Any] | None, context: Context) -> bool:
        if not isinstance(payload, dict) or payload.get("status") != SUCCESS or self.checks_in_worker() is None:
            return True
        accepted = bool(self.accepts_in_worker(payload, context))
        if not accepted:
            self.log.info(
                "%s said not yet to what the trigger found: %s", self.checks_in_worker(), log_preview(payload)
            )
        return accepted

    def pause_then_defer(self, deadline: str, refusals: int = 1) -> NoReturn:
        """Wait one ``poke_interval`` (in the triggerer) before deferring to the wait again.

        The candidates the worker's check refused are most likely still there, so deferring at
        once would resume the task at once, in a loop of worker slots until the deadline.
        ``refusals`` (so far, this one included) travels along for the timeout message.
        """
        from airflow_deferrable_kit.triggers.temporal import DateTimeTrigger

        wake = min(parse_deadline(deadline), time.time() + float(self.poke_interval))
        trigger = DateTimeTrigger(
            target_time=dt.datetime.fromtimestamp(wake, tz=dt.timezone.utc).isoformat(),
            poll_interval=max(float(self.poke_interval), 1.0),
            deadline=deadline,
        )
        left = max(trigger.seconds_left() or 0.0, 0.0)
        self.defer(
            trigger=trigger,
            method_name="resume_after_pause",
            kwargs={"deadline": deadline, "refusals": refusals},
            timeout=timedelta(seconds=left) + BACKSTOP_GRACE,
        )

    def resume_after_pause(self, context: Context, event: dict[str, Any], deadline: str, refusals: int = 1) -> Any:
        """After :meth:`pause_then_defer`: look again, or end on the deadline that passed meanwhile.

        The task is on a worker already and the refused candidate is most likely still there: a
        trigger deferred at once would fire at its first poll, a moment after the deferral, which
        costs a round trip and races Airflow 3.3.2's bookkeeping of the worker that just deferred
        (the scheduler can fail a task instance whose trigger fired before it processed that
        worker's exit). So the worker looks once itself first, as :meth:`execute` does.
        """
        if isinstance(event, dict) and event.get("status") == SUCCESS:
            return self.look_then_defer(deadline, context, refusals)
        if isinstance(event, dict) and event.get("status") == TIMEOUT:
            # The pause's own trigger timed out: say what the wait was, not that a pause ended.
            what = self.build_trigger(deadline=None).describe()
            event = timeout_payload(f"{what}: deadline {deadline} passed{self._refused(refusals)}")
        return self.finish(event)

    def _refused(self, refusals: int) -> str:
        """``; response_check said not yet to what the trigger found 3 time(s)``, or nothing."""
        if not refusals or self.checks_in_worker() is None:
            return ""
        return f"; {self.checks_in_worker()} said not yet to what the trigger found {refusals} time(s)"

    def look_then_defer(self, deadline: str, context: Context, refusals: int = 0) -> Any:
        """Look once here (``check_before_defer``): finish on an answer the worker's check lets
        stand, pause after one it refuses, defer to the wait on "not yet"."""
        if self.check_before_defer:
            token = _look_deadline.set(parse_deadline(deadline))
            try:
                payload = self._poll_in_worker()
            except LookTimedOut:
                what = self.build_trigger(deadline=None).describe()
                return self.finish(
                    timeout_payload(f"{what}: the first look in the worker had no answer by the deadline {deadline}")
                )
            finally:
                _look_deadline.reset(token)
            if payload is not None:
                if not self._stands(payload, context):
                    self.pause_then_defer(deadline, refusals + 1)
                return self.finish(payload)
        self.defer_until(deadline, refusals)

    # ------------------------------------------------------------------------ execution
    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        return self.look_then_defer(deadline_after(self.timeout), context)

    def defer(
        self,
        *,
        trigger: BaseTrigger,
        method_name: str,
        kwargs: dict[str, Any] | None = None,
        timeout: timedelta | int | float | None = None,
    ) -> NoReturn:
        """Airflow's ``defer``, refusing an event trigger (it would never end the task), the trigger
        routed to ``trigger_queue``."""
        if isinstance(trigger, BaseEventTrigger):
            raise TypeError(
                f"{type(self).__name__} (task_id={self.task_id!r}): trigger={type(trigger).__name__} "
                + _EVENT_TRIGGER_REASON
            )
        route_trigger(self, self.trigger_queue)
        super().defer(trigger=trigger, method_name=method_name, kwargs=kwargs, timeout=timeout)

    def defer_until(self, deadline: str, refusals: int = 0) -> NoReturn:
        """Defer to the trigger with the given absolute deadline (re-deferrals pass the same one)."""
        trigger = self.build_trigger(deadline)
        left = max(trigger.seconds_left() or 0.0, 0.0)
        self.defer(
            trigger=trigger,
            method_name="execute_complete",
            kwargs={"deadline": deadline, **({"refusals": refusals} if refusals else {})},
            timeout=timedelta(seconds=left) + BACKSTOP_GRACE,
        )

    def execute_complete(
        self, context: Context, event: dict[str, Any], deadline: str | None = None, refusals: int = 0
    ) -> Any:
        """Resume from the trigger: the payload becomes the XCom, or the task fails / skips.

        A success the worker's check refuses waits on, after a pause, within the same deadline.
        """
        if deadline is not None and not self._stands(event, context):
            self.pause_then_defer(deadline, refusals + 1)
        if refusals and isinstance(event, dict) and event.get("status") == TIMEOUT:
            event = {**event, "message": f"{event.get('message', '')}{self._refused(refusals)}"}
        return self.finish(event)

    def poke(self, context: Context) -> bool | PokeReturnValue:
        payload = self._poll_in_worker()
        if payload is None or not self._stands(payload, context):
            return False
        return PokeReturnValue(is_done=True, xcom_value=self.finish(payload))

    def _poll_in_worker(self) -> dict[str, Any] | None:
        return run_in_worker(self.build_trigger(deadline=None).poll_once())

    def finish(self, payload: Any) -> Any:
        """Turn a payload into the task's outcome: return it, or raise the right exception."""
        status = payload.get("status") if isinstance(payload, dict) else None
        if status == SUCCESS:
            self.log.info("Condition met: %s", log_preview(payload))
            return payload
        if status == TIMEOUT:
            message = payload.get("message") or "the wait timed out"
            if self.soft_fail or self.never_fail:
                raise AirflowSkipException(f"Skipping on timeout (soft_fail): {message}")
            raise AirflowSensorTimeout(message)
        if status == ERROR:
            message = f"{payload.get('error_type', 'error')}: {payload.get('message', '')}"
            if self.never_fail:
                raise AirflowSkipException(f"Skipping on error (never_fail): {message}")
            raise WaitFailedError(message)
        raise WaitFailedError(f"unexpected trigger event payload: {payload!r}")

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Context) -> Any:
        # Unlike BaseSensorOperator, soft_fail softens only a timeout into a skip: a crashed
        # trigger (TaskDeferralError) is a real error and fails the task even with soft_fail.
        # never_fail skips it, as BaseSensorOperator does and as an error event does here.
        try:
            return BaseOperator.resume_execution(self, next_method, next_kwargs, context)
        except TaskDeferralError as exc:
            if self.never_fail:
                raise AirflowSkipException(f"Skipping on error (never_fail): the trigger failed: {exc}") from exc
            raise
        except TaskDeferralTimeout as exc:
            message = f"the trigger did not report before Airflow's backstop timeout: {exc}"
            if self.soft_fail or self.never_fail:
                raise AirflowSkipException(f"Skipping on timeout (soft_fail): {message}") from exc
            raise AirflowSensorTimeout(message) from exc
