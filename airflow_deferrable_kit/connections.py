"""Resolve Airflow connections inside the triggerer without blocking its event loop.

Triggers carry only a ``conn_id``; credentials are looked up where the trigger runs, through
Airflow's async connection API, so no secret is ever stored in trigger kwargs.

"Not found" is not always final at once: inside the triggerer, Airflow's execution-API secrets
backend answers ``None`` when it cannot reach its supervisor or the API server (a triggerer
restart, an API blip), which looks exactly like a missing connection; so does any secrets backend
that raised (Airflow's lookup skips it). After a miss, every secrets backend Airflow uses here is
asked again, one by one, so that "could not ask" is told from "no" (:func:`_unanswered`):

* every backend answered "no" (each returned nothing without raising, and the API server
  itself answered "no such connection" through the supervisor): the connection cannot exist
  now, and the wait ends at once with one clear error, as on a worker. What is believed is an
  answer, never a silence: a backend that raised, or a supervisor or API server that could not
  be reached, is not a "no";
* any backend could not answer: the miss is retried as a transient error for
  :data:`NOT_FOUND_GRACE` seconds from the first miss of that ``conn_id`` in this process, and a
  connection still missing when the window closes ends the wait with one clear error.

The trade-off of that window: a typo'd ``conn_id`` during an outage of the API server or of a
secrets backend fails 30 s later than it could, and a connection created within those 30 s is
used, rather than a restart failing every wait at once. The deferred waits' log line says so.

The window is the triggerer's alone. A worker looks a connection up through its own task
supervisor, as Airflow's own sensors do, and they fail at the first poke on an unknown
``conn_id``; so the sensor's looks in the worker run inside :func:`misses_are_final` and a miss
there is believed at once. (The window could not help there anyway: every reschedule-mode poke is
a fresh process that would start it again, so a typo would wait until the sensor's timeout.)

Three things keep the lookup off the loop's critical path: Airflow's lookup machinery is imported
once in a worker thread (its first import would otherwise stall the loop); concurrent lookups of
one ``conn_id`` are merged, so a thousand triggers starting together make one lookup (some
secrets backends run on Airflow's single shared sync thread); and an extra is masked through the
triggerer's supervisor once per loop, not once per wait (:func:`get_extra`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import copy
import functools
import inspect
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from airflow_deferrable_kit._per_loop import PerLoop
from airflow_deferrable_kit._redact import register_connection
from airflow_deferrable_kit.errors import ErrorType, FatalError, TransientError, WaitError

if TYPE_CHECKING:
    from airflow.sdk import Connection

_in_flight: PerLoop[dict[str, asyncio.Future[Any]]] = PerLoop(dict)
_imported = False
#: Seconds a "connection not found" is retried before it is believed (see the module docstring).
NOT_FOUND_GRACE = 30.0
#: When each conn_id was first found missing, until a lookup of it succeeds.
_first_miss: dict[str, float] = {}
#: Set while the worker looks (see the module docstring): a miss is final at once.
_misses_final: contextvars.ContextVar[bool] = contextvars.ContextVar("misses_final", default=False)


@contextlib.contextmanager
def misses_are_final() -> Iterator[None]:
    """Within this block (and tasks started in it), an unknown ``conn_id`` is a fatal error at once."""
    token = _misses_final.set(True)
    try:
        yield
    finally:
        _misses_final.reset(token)


def _import_lookup_machinery() -> None:
    """Import (and load the secrets backends of) Airflow's lookup path, in a worker thread."""
    import airflow.sdk.definitions.connection
    import airflow.sdk.execution_time.cache
    import airflow.sdk.execution_time.context  # noqa: F401
    import asgiref.sync  # noqa: F401
    from airflow.sdk import BaseHook  # noqa: F401
    from airflow.sdk.execution_time.supervisor import ensure_secrets_backend_loaded

    ensure_secrets_backend_loaded()


async def get_connection(
    conn_id: str, *, argument: str = "conn_id", conn_types: tuple[str, ...] | None = None
) -> Connection:
    """Return the Airflow connection ``conn_id``; an unknown id is a fatal, clearly named error.

    With ``conn_types``, a connection of another type (a Postgres connection given to an HTTP
    wait) is a fatal ``bad_connection`` naming both, instead of an outage retried until the
    deadline. A connection with no type, or the type ``generic``, is accepted as any.
    """
    global _imported
    if not _imported:
        await asyncio.to_thread(_import_lookup_machinery)
        _imported = True
    pending = _in_flight.get()
    lookup = pending.get(conn_id)
    if lookup is None:
        lookup = pending[conn_id] = asyncio.ensure_future(_lookup(conn_id))
        lookup.add_done_callback(lambda _: pending.pop(conn_id, None))
    try:
        conn: Connection = await asyncio.shield(lookup)
    except _Missed as exc:
        raise _not_found(conn_id, argument, exc.unanswered) from exc
    _first_miss.pop(conn_id, None)
    conn_type = (getattr(conn, "conn_type", None) or "").lower()
    if conn_types is not None and conn_type not in (*conn_types, "", "generic"):
        raise FatalError(
            f"{argument}={conn_id!r} is a connection of type {conn_type!r}; this wait needs one of type "
            + " or ".join(repr(name) for name in conn_types),
            error_type=ErrorType.BAD_CONNECTION,
        )
    return conn


def _now() -> float:
    return time.monotonic()


class ConnectionMissing(TransientError):
    """ "Not found" within the grace window: retried, but never allowed to end as a timeout.

    :meth:`believed` is the error the wait ends with once the miss is believed.
    """

    def __init__(self, message: str, *, conn_id: str, argument: str, grace_left: float) -> None:
        super().__init__(message, error_type=ErrorType.UNAVAILABLE)
        self.conn_id = conn_id
        self.argument = argument
        #: Seconds until the grace window closes, when the error was raised.
        self.grace_left = grace_left

    def believed(self) -> FatalError:
        return _missing(self.conn_id, self.argument, "")


def _missing(conn_id: str, argument: str, since: str) -> FatalError:
    return FatalError(
        f"{argument}={conn_id!r}: no Airflow connection with this id is defined{since} "
        "(create it in the UI, an AIRFLOW_CONN_* variable or a secrets backend)",
        error_type=ErrorType.CONNECTION_NOT_FOUND,
    )


def _not_found(conn_id: str, argument: str, unanswered: list[str]) -> TransientError | FatalError:
    """Fatal at once in a worker or when every backend said no; else transient within the grace
    window of the first miss, and fatal once it has closed (see the module docstring)."""
    if _misses_final.get():
        return _missing(conn_id, argument, "")
    if not unanswered:
        _first_miss.pop(conn_id, None)
        return _missing(conn_id, argument, " (every secrets backend asked here said so)")
    now = _now()
    first = _first_miss.setdefault(conn_id, now)
    if now - first < NOT_FOUND_GRACE:
        return ConnectionMissing(
            f"{argument}={conn_id!r}: Airflow found no connection with this id, but {', '.join(unanswered)} could "
            f"not be asked, as during a triggerer restart or an outage; asking again for up to {NOT_FOUND_GRACE:g}s "
            "before failing the wait (a connection that is really missing fails it then, see "
            "docs/operations.md#connections)",
            conn_id=conn_id,
            argument=argument,
            grace_left=first + NOT_FOUND_GRACE - now,
        )
    return _missing(conn_id, argument, f" (still missing {now - first:.0f}s after the first lookup)")


def believed_before_deadline(error: WaitError, *, seconds_left: float | None, longest_retry: float) -> WaitError:
    """``error``, or the connection error itself if a miss's grace could outlast the wait.

    The grace exists to ride out a blip, never to turn a typo into a timeout (a skip with
    ``soft_fail``): when the window would not close, and one more lookup be made (a retry sleeps
    at most ``longest_retry``), before the deadline, the miss is believed now. A wait with no
    deadline (an event trigger) keeps the whole window.
    """
    if not isinstance(error, ConnectionMissing) or seconds_left is None:
        return error
    if seconds_left <= error.grace_left + longest_retry:
        return error.believed()
    return error


class _Missed(LookupError):
    """Airflow found no connection ``conn_id``; ``unanswered`` names the backends that could not say."""

    def __init__(self, conn_id: str, unanswered: list[str]) -> None:
        super().__init__(conn_id)
        self.unanswered = unanswered


async def _lookup(conn_id: str) -> Connection:
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = await BaseHook.aget_connection(conn_id)
    except AirflowNotFoundException as exc:
        unanswered = [] if _misses_final.get() else await _unanswered(conn_id)
        raise _Missed(conn_id, unanswered) from exc
    # Its secrets are known from now on, so no payload, message or log line of ours can carry them
    # (the extra's are registered when a client reads it, through get_extra, read once).
    register_connection(conn)
    return conn


async def _unanswered(conn_id: str) -> list[str]:
    """The secrets backends that could not say whether ``conn_id`` exists; empty if all said no.

    Asked after Airflow's own lookup missed, in its order, the way it asks them, with one
    difference: an answer is told from a failure. A backend that returns nothing without raising
    answered "no" (the environment, a local file, Vault or AWS Secrets Manager when the secret
    is absent: their errors raise). Airflow's execution-API backend is the exception: it returns
    nothing for "not found" and for "could not ask" alike, so the supervisor is asked directly
    and only its API server's explicit ``CONNECTION_NOT_FOUND`` counts as "no". A backend that
    now finds the connection (created a moment ago) is counted as not having said "no": the
    retry that follows finds it. Anything this cannot work out counts as "could not ask", so
    the answer can only make the grace window apply, never skip it wrongly.
    """
    try:
        from airflow.sdk.execution_time.supervisor import ensure_secrets_backend_loaded

        backends = await asyncio.to_thread(ensure_secrets_backend_loaded)
    except Exception as exc:
        return [f"Airflow's secrets backends ({type(exc).__name__})"]
    unanswered: list[str] = []
    for backend in backends:
        name = type(backend).__name__
        if _is_execution_api(backend):
            if not await _api_says_missing(conn_id):
                unanswered.append(f"{name} (the API server, through the triggerer's supervisor)")
            continue
        try:
            ask = getattr(backend, "aget_connection", None)
            found = ask(conn_id) if ask is not None else await asyncio.to_thread(backend.get_connection, conn_id)
            if inspect.isawaitable(found):
                found = await found
        except Exception:
            unanswered.append(name)
            continue
        if found is not None:
            unanswered.append(name)
    return unanswered


def _is_execution_api(backend: object) -> bool:
    try:
        from airflow.sdk.execution_time.secrets.execution_api import ExecutionAPISecretsBackend
    except ImportError:
        return type(backend).__name__ == "ExecutionAPISecretsBackend"
    return isinstance(backend, ExecutionAPISecretsBackend)


async def _api_says_missing(conn_id: str) -> bool:
    """Whether the API server answered, through this process's supervisor, that ``conn_id`` is not defined.

    The message the execution-API backend itself sends (``GetConnection``); its answer is an
    ``ErrorResponse`` naming ``CONNECTION_NOT_FOUND`` when the API server said 404. A failed send,
    an error frame (API server unreachable), or no supervisor at all is not an answer.
    """
    try:
        from airflow.sdk.exceptions import ErrorType as AirflowErrorType
        from airflow.sdk.execution_time import task_runner
        from airflow.sdk.execution_time.comms import ErrorResponse, GetConnection

        comms = getattr(task_runner, "SUPERVISOR_COMMS", None)
        if comms is None:
            return False
        answer = await comms.asend(GetConnection(conn_id=conn_id))
    except Exception:
        return False
    return isinstance(answer, ErrorResponse) and answer.error == AirflowErrorType.CONNECTION_NOT_FOUND


async def get_extra(conn: Connection) -> dict[str, Any]:
    """The connection's extra as a dict, read without the blocking secret-masking path.

    Airflow's ``aextra_dejson`` asks the triggerer's supervisor to mask the extra on every call:
    one round trip over the channel every trigger of the process shares, one at a time, each
    costing a turn of the supervisor's loop (which also reloads the id of every trigger it holds).
    Every wait reads its connection when it starts, so thousands of waits of one connection
    starting together (a triggerer restart, a mass deferral) queued as many round trips behind
    each other: the last wait made its first poll minutes late, and the events of the others
    waited in the same queue. A mask, once sent, holds for the life of the process, so an extra
    already read on this loop is parsed again from its text without asking
    (:data:`EXTRAS_KEPT` of them); concurrent first reads share one. A changed extra (a rotated
    key) is new text: read and masked anew by the next wait that sees it.
    """
    text = getattr(conn, "extra", None)
    aextra = getattr(conn, "aextra_dejson", None)
    if not isinstance(text, str) or not text:
        extra = dict(await aextra()) if aextra is not None else dict(conn.extra_dejson)
    else:
        read = aextra if aextra is not None else functools.partial(_extra_before_3_3, conn)
        extra = copy.deepcopy(await asyncio.shield(_masked_read(text, read)))
    register_connection(conn, extra)
    return extra


async def _extra_before_3_3(conn: Connection) -> dict[str, Any]:
    """Airflow before 3.3 has only ``extra_dejson``, whose mask is a blocking send: once per extra too."""
    return dict(conn.extra_dejson)


#: Distinct extras (by text) whose masked read :func:`get_extra` keeps per loop.
EXTRAS_KEPT = 256
_extras: PerLoop[collections.OrderedDict[str, asyncio.Future[Any]]] = PerLoop(collections.OrderedDict)


def _masked_read(text: str, aextra: Callable[[], Awaitable[Any]]) -> asyncio.Future[Any]:
    """The read of the extra ``text`` on this loop, started now if none is kept (a failed one is not)."""
    kept = _extras.get()
    read = kept.get(text)
    if read is not None:
        kept.move_to_end(text)
        return read
    read = kept[text] = asyncio.ensure_future(aextra())

    def forget_failure(done: asyncio.Future[Any]) -> None:
        if (done.cancelled() or done.exception() is not None) and kept.get(text) is done:
            del kept[text]

    read.add_done_callback(forget_failure)
    while len(kept) > EXTRAS_KEPT:
        kept.popitem(last=False)
    return read
