"""What every :class:`~airflow_deferrable_kit.triggers.base.PollingTrigger` subclass is held to as it is defined.

Two of Airflow's rules, checked once per class: a parameter may not be named like an attribute
Airflow's ``BaseTrigger`` or the base trigger sets or calls (:func:`refuse_reserved_parameters`),
and the constructor raises nothing but ``TypeError`` inside Airflow's trigger runner, which dies on
anything else (:func:`reported_from_run`: what went wrong ends that one wait from ``run()``;
everywhere else the constructor raises as before, so bad input is still refused at parse).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from types import FrameType
from typing import Any, Final, Protocol

from airflow.triggers.base import BaseTrigger


class Unbuilt(Protocol):
    """A trigger that can keep the failure of its constructor to report it from ``run()``."""

    def _not_built(self, exc: Exception, kwargs: dict[str, Any]) -> None: ...


#: Airflow's modules that build triggers in the triggerer: the runner builds each trigger, and a
#: shared stream builds its producer's trigger (``create_shared_stream_producer``) in its own task.
TRIGGER_RUNNER_MODULES: Final = ("airflow.jobs.triggerer_job_runner", "airflow.triggers.shared_stream")


def built_by_trigger_runner() -> bool:
    """Whether Airflow's trigger runner is on the stack (asked only after a constructor failed)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") in TRIGGER_RUNNER_MODULES:
            return True
        frame = frame.f_back
    return False


def reported_from_run(cls: type[Any]) -> None:
    """Make ``cls``'s constructor (an :class:`Unbuilt`'s) raise nothing but ``TypeError`` inside Airflow's runner.

    ``TriggerRunner.create_triggers()`` (Airflow 3.3.2) survives a ``TypeError`` from a
    constructor and nothing else: any other exception kills the runner, the triggerer exits, and
    the trigger row is still there for the next triggerer (or an HA peer) to die on. So there
    a failed validation, a missing extra or an unimportable wait class is kept and reported from
    ``run()`` (one ``error`` event for a wait; a watcher logs it and tries again). Everywhere
    else (a DAG file being parsed, a worker deferring) the constructor raises as before, so bad
    input is still refused at parse. The healthy path pays nothing: the stack is only looked at
    after a constructor failed.
    """
    build = cls.__init__

    @functools.wraps(build)
    def __init__(self: Unbuilt, *args: Any, **kwargs: Any) -> None:
        try:
            build(self, *args, **kwargs)
        except TypeError:
            raise  # the runner's own "failed to inflate": a wrong or missing keyword
        except Exception as exc:
            if not built_by_trigger_runner():
                raise
            self._not_built(exc, kwargs)

    cls.__init__ = __init__


#: Names ``BaseTrigger`` sets or uses on every instance (``__init__`` resets some of them).
BASE_TRIGGER_ATTRIBUTES = frozenset(
    {"trigger_id", "task_id", "template_fields", "template_ext", "task_instance", "timeout_after", "triggerer_job_id"}
)


def refuse_reserved_parameters(cls: type[Any], base: type[Any]) -> None:
    """A parameter named like a BaseTrigger attribute or a method would be silently overwritten."""
    own = {f.name for f in dataclasses.fields(base)}
    reserved = BASE_TRIGGER_ATTRIBUTES | {name for name in dir(BaseTrigger) if not name.startswith("__")}
    reserved |= {name for name, value in vars(base).items() if callable(value) or isinstance(value, property)}
    clashes = sorted(f.name for f in dataclasses.fields(cls) if f.name not in own and f.name in reserved)
    if clashes:
        raise TypeError(
            f"{cls.__name__}: parameter(s) {', '.join(clashes)} clash with attributes Airflow's BaseTrigger or "
            "PollingTrigger set or call on every trigger (BaseTrigger.__init__ resets trigger_id, task_id, "
            "template_fields and template_ext); rename them, e.g. 'job_id' instead of 'task_id'"
        )


__all__ = [
    "BASE_TRIGGER_ATTRIBUTES",
    "TRIGGER_RUNNER_MODULES",
    "Unbuilt",
    "built_by_trigger_runner",
    "refuse_reserved_parameters",
    "reported_from_run",
]
