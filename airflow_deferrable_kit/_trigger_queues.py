"""A trigger's own queue: the waits on one upstream held by one pool of triggerers.

Everything the kit shares (one listing per S3 folder, one statement per Postgres table, one
reader per Kafka connection, one response per identical HTTP request) is shared within one
triggerer process. Waits on one upstream spread over N triggerers make each shared request up to
N times. Airflow 3.2 added trigger queues: with ``[triggerer] queues_enabled`` on, the worker
gives the trigger of a task deferring there the task's ``queue`` (read from the running
operator as it defers, ``ti.task.queue``), and a triggerer started with ``--queues q`` claims
only the triggers of those queues. A task's ``queue`` also routes its worker (Celery), so
``trigger_queue`` sets the running task's ``queue`` only just before it defers: the trigger goes
to its pool, the task's workers stay the task's.

Airflow gives no queue to what the scheduler or the DAG processor creates: a wait started in the
triggerer (``start_from_trigger``) and an event watcher (``AssetWatcher``) always go to a
triggerer started without ``--queues``. So ``trigger_queue`` is refused with
``start_from_trigger`` and on a wait that does not defer, at DAG parse.
"""

from __future__ import annotations

from typing import Any, Final

from airflow.sdk.configuration import conf

#: The longest queue name Airflow's ``trigger.queue`` column holds.
MAX_QUEUE_CHARS: Final = 256


def require_trigger_queue(value: Any, *, where: str, deferrable: bool, start_from_trigger: bool = False) -> str | None:
    """``value`` if it can name a trigger queue for this wait, else a ``ValueError`` saying why.

    ``where`` names the task (``"S3KeySensor (task_id='x')"``). A comma or surrounding spaces
    could never be listed in ``airflow triggerer --queues`` (it splits on commas and strips
    each name), so such a name would route the trigger to no triggerer at all.
    """
    if value is None:
        return None
    if (
        not isinstance(value, str)
        or not value
        or value != value.strip()
        or "," in value
        or len(value) > MAX_QUEUE_CHARS
    ):
        raise ValueError(
            f"{where}: trigger_queue must be a queue name (a non-empty string of at most {MAX_QUEUE_CHARS} "
            "characters, no comma, no surrounding spaces: the name a triggerer takes with "
            f"`airflow triggerer --queues <name>`), or None, got {value!r}"
        )
    if start_from_trigger:
        raise ValueError(
            f"{where}: trigger_queue={value!r} cannot be combined with start_from_trigger=True: Airflow gives a "
            "wait the scheduler starts in the triggerer no queue, so a triggerer started without --queues runs "
            "it. Drop one of the two"
        )
    if not deferrable:
        raise ValueError(
            f"{where}: trigger_queue={value!r} routes the wait's trigger, and this wait does not defer "
            "(deferrable=False, or [operators] default_deferrable off): set deferrable=True, or drop trigger_queue"
        )
    return value


def route_trigger(task: Any, trigger_queue: str | None) -> None:
    """Give the trigger ``task`` is about to defer to the queue ``trigger_queue`` (call it just before ``defer``).

    With ``[triggerer] queues_enabled`` off where the task runs, Airflow sends no queue at all;
    the trigger then goes to a triggerer started without ``--queues``, and the log says so.
    """
    if trigger_queue is None:
        return
    if not conf.getboolean("triggerer", "queues_enabled", fallback=False):
        task.log.warning(
            "trigger_queue=%r is not applied: [triggerer] queues_enabled is off where this task runs, so Airflow "
            "gives its trigger no queue and a triggerer started without --queues runs it",
            trigger_queue,
        )
        return
    task.log.info("Deferring to the triggerers of queue %r", trigger_queue)
    task.queue = trigger_queue
