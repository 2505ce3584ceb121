"""Event triggers: start DAG runs when something happens outside, with no sensor task at all.

Airflow 3 schedules a DAG on an asset whose ``AssetWatcher`` holds a ``BaseEventTrigger``: each
event the trigger yields becomes an asset event. :class:`EventTrigger` is the base every event
trigger here is built on, and it reuses the wait it watches for: a wait's parameters, its client,
its conditions and its error classification are those of the wait (an ``S3KeyEventTrigger`` *is*
an ``S3KeyTrigger`` that never stops). What the base adds, the same for every kind:

* **one poll per upstream**: triggers whose :meth:`~EventTrigger.stream_identity` and poll
  interval are equal share one poll loop in the triggerer (Airflow's shared streams), and each
  of them filters what it polled against its own watermark;
* **watermarks in the asset state store**, saved only once the events they cover are stored in
  the metadata database (see :mod:`airflow_deferrable_kit._event_streams`): a triggerer that
  stops or dies never loses an event; one that dies in the second or two between an event
  being stored and its watermark being saved fires it again after the restart;
* **errors never fire**: transient errors back off with full jitter, fatal ones are logged and
  retried every ``max_backoff`` seconds (an event trigger must run for ever: one that exits
  is restarted at once by the triggerer), and a batch that cannot be judged is judged again.

Two semantics cover the kinds: *items* (each new S3 object, each new Postgres row: see
:mod:`~airflow_deferrable_kit.triggers.s3_events`, :mod:`~airflow_deferrable_kit.triggers.postgres_events`)
and *edges* (:class:`EdgeEventTrigger`: one event each time a wait's condition becomes true,
none while it stays true). Any :class:`~airflow_deferrable_kit.triggers.base.PollingTrigger`
becomes an edge event trigger with ``wait.as_event_trigger()`` (:class:`ConditionEventTrigger`).

Why one module past 700 lines: it is the base every watcher is built on (the shared look, the
outbox of events behind storage, watermarks, a watcher built late) and the edge form every wait
gets, and Airflow stores the classpaths of :class:`EventTrigger`'s kinds here
(``...events.EdgeEventTrigger``, ``...events.ConditionEventTrigger`` in its trigger rows), so
they stay in this module; each wait's own watcher lives in its ``<wait>_events.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import importlib
import json
import math
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Hashable, Mapping, Sequence
from typing import Any, ClassVar, Final

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from airflow_deferrable_kit import _collector
from airflow_deferrable_kit._arguments import require_seconds
from airflow_deferrable_kit._asset_state import WatermarkStore, watermark_key
from airflow_deferrable_kit._backoff import full_jitter
from airflow_deferrable_kit._event_streams import (
    TICK,
    Board,
    Committer,
    EventProducer,
    Raw,
    acquire_board,
    judging_gate,
    release_board,
    standalone_stream,
)
from airflow_deferrable_kit._redact import redact, redact_value
from airflow_deferrable_kit.errors import ConditionFailed, TransientError, WaitError, describe_exception
from airflow_deferrable_kit.payload import Found, fit_payload, json_safe, json_size
from airflow_deferrable_kit.triggers.base import PollingTrigger, register_event_form

#: Parameters of a wait that an event trigger, which never ends, cannot take.
WAIT_ONLY: Final = ("deadline", "end_from_trigger", "soft_fail", "never_fail", "do_xcom_push", "start_budget")
#: Parameters that say how often or how hard to look, never what is watched: left out of the
#: watermark's key, so changing them keeps the watermark.
HOW_TO_LOOK: Final = ("poll_interval", "max_backoff", "backfill", "min_event_interval")
#: After a wake-up (a notification, a new subscriber), the next poll still waits this long
#: after the previous one started, so a storm of wake-ups cannot become a storm of polls.
MIN_WAKE_GAP: Final = 0.25
#: Retry backoff of a watermark read that failed.
LOAD_RETRY_BASE, LOAD_RETRY_CAP = 0.5, 30.0
#: A watcher the triggerer could not build (a missing extra, an unimportable wait, a bad
#: argument) tries again with this backoff: deploying the fix and nothing else brings it back.
UNBUILT_RETRY_BASE, UNBUILT_RETRY_CAP = 5.0, 300.0
#: Seconds between two asset events of one watcher, by default (see ``min_event_interval``).
MIN_EVENT_INTERVAL: Final = 5.0
#: Events an edge watcher may have waiting to be stored and still look. It keeps looking every
#: ``poll_interval`` while the triggerer is slow to store (a look skipped could miss a transition
#: that is undone before the next); only the batches that fired an event wait for storage, so
#: the looks in between never run against Airflow's ack timeout, and this bound stops the looks
#: only when storage has stalled for many transitions. Item watchers never run ahead: their
#: next look finds whatever appeared meanwhile.
EDGE_LOOK_AHEAD: Final = 10
#: The items one asset event carries at most, in bytes of JSON (each item is cut to fit the
#: kit's payload size first): a look that found more is fired as several events, spaced.
MAX_EVENT_BYTES: Final = 512 * 1024
#: The key a list travels under in the kwargs of an event trigger (see :func:`portable_kwargs`).
LIST_KEY: Final = "__adk_list__"


def portable_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Kwargs Airflow can register as an ``AssetWatcher``: each top-level list holding a dict wrapped.

    Airflow 3.3.2 identifies a watcher's trigger by a hash of its kwargs, computed once from the
    DAG and once from the ``trigger`` row it stored. A top-level list of objects (conditions such
    as ``success=[{"path": "state", "equals": "ready"}]``) comes back from the row still wrapped
    in Airflow's serialization envelopes, so the two hashes differ and the watcher is silently
    never attached to its asset (and a new row is written at every parse). The same values
    inside an object round-trip intact, so such lists travel as ``{"__adk_list__": [...]}``
    and are unwrapped when the trigger is built (:func:`unwrap_lists`).
    """
    return {
        name: {LIST_KEY: value} if isinstance(value, list) and _holds_object(value) else value
        for name, value in kwargs.items()
    }


def _holds_object(value: Any) -> bool:
    if isinstance(value, dict):
        return True
    return isinstance(value, list) and any(_holds_object(item) for item in value)


def unwrap_lists(trigger: Any) -> None:
    """Undo :func:`portable_kwargs` on a trigger just built from its kwargs."""
    for field in dataclasses.fields(trigger):
        value = getattr(trigger, field.name)
        if isinstance(value, dict) and set(value) == {LIST_KEY} and isinstance(value[LIST_KEY], list):
            setattr(trigger, field.name, value[LIST_KEY])


def event_payload(data: Mapping[str, Any]) -> dict[str, Any]:
    """An event's payload: JSON-safe, secrets masked, cut to fit like every payload of the kit."""
    return fit_payload(redact_value(json_safe(dict(data))))


def item_events(items: Sequence[dict[str, Any]], limit: int = MAX_EVENT_BYTES) -> list[dict[str, Any]]:
    """The payloads of the events that carry ``items``: ``{"items": [...], "count": n}``, in order.

    As many items as fit ``limit`` bytes as stored (:func:`~airflow_deferrable_kit.payload.json_size`,
    the envelope included) go into one event (at least one, each already cut to the kit's payload
    size), so a look that found a thousand small objects is one asset event, which one DAG run
    consumes whole.
    """
    events: list[dict[str, Any]] = []
    chunk: list[dict[str, Any]] = []
    size = envelope = json_size({"items": [], "count": len(items)})
    for item in items:
        item_size = json_size(item) + 2  # ", " between items
        if chunk and size + item_size > limit:
            events.append({"items": chunk, "count": len(chunk)})
            chunk, size = [], envelope
        chunk.append(item)
        size += item_size
    if chunk:
        events.append({"items": chunk, "count": len(chunk)})
    return events


#: An outbox entry whose look left the watermark as it was.
UNCHANGED: Final = object()


class Outbox:
    """One watcher's events found and not fired yet, each look's watermark after its last event.

    A look's watermark may be saved only once every event it found is stored: a state reached
    is handed on (:meth:`take`) with the event that completes its look, or at once when the
    look found nothing.
    """

    def __init__(self) -> None:
        self._entries: deque[tuple[dict[str, Any] | None, Any]] = deque()
        self.last_fired = -math.inf

    def __bool__(self) -> bool:
        return any(payload is not None for payload, _ in self._entries)

    def __len__(self) -> int:
        """The events waiting to be fired."""
        return sum(1 for payload, _ in self._entries if payload is not None)

    def add(self, events: Sequence[dict[str, Any]], state: Any) -> None:
        """A look's events, in order, and the watermark that covers them all (or :data:`UNCHANGED`)."""
        for payload in events[:-1]:
            self._entries.append((payload, UNCHANGED))
        self._entries.append((events[-1] if events else None, state))

    def next_due(self, now: float, interval: float) -> float | None:
        """``None`` when something can be handed on now, else when the next event may fire."""
        if not self._entries or self._entries[0][0] is None:
            return None
        at = self.last_fired + interval
        return None if at <= now else at

    def take(self) -> tuple[dict[str, Any] | None, list[Any]]:
        """The next event (``None``: only watermarks are due), and the watermarks it completes."""
        payload = None
        reached = []
        if self._entries and self._entries[0][0] is not None:
            payload, state = self._entries.popleft()
            if state is not UNCHANGED:
                reached.append(state)
        while self._entries and self._entries[0][0] is None:
            _, state = self._entries.popleft()
            if state is not UNCHANGED:
                reached.append(state)
        return payload, reached

    def fired(self, moment: float) -> None:
        self.last_fired = moment


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


class EventTrigger(PollingTrigger, BaseEventTrigger):
    """The base of every event trigger: shared polls, watermarks behind storage, no stop.

    :param backfill: whether what is already there when the watcher first runs counts as new
        (S3 objects, Postgres rows, a condition already true). ``False`` (the default) takes it
        as the starting point: only what appears afterwards fires.

    A subclass (usually also a subclass of the wait it watches) implements :meth:`poll` (one
    look at the upstream, run once per group), :meth:`derive` (the events of one look and the
    next watermark, for one trigger) and, if the default "every parameter" is too wide,
    :meth:`stream_identity` (what the shared look depends on).
    """

    backfill: bool = False
    min_event_interval: float = MIN_EVENT_INTERVAL

    #: Whether a look finds items (objects, rows, messages) fired together as ``{"items": [...]}``
    #: (:func:`item_events`), or edges (a condition becoming true) fired one payload each.
    fires_items: ClassVar[bool] = False
    #: Parameters of the subclass that say how to look, not what: not part of the watermark key.
    tuning_parameters: ClassVar[tuple[str, ...]] = ()
    #: The items one event carries at most, in bytes as stored (:func:`item_events`).
    max_event_bytes: ClassVar[int] = MAX_EVENT_BYTES
    #: A watcher built late keeps the stream key Airflow subscribed it with, and its built self.
    #: Typed by comments, not annotations, so that they are no dataclass fields (no kwargs).
    _pinned_key = None  # type: Hashable | None
    _late_source = None  # type: EventTrigger | None

    def __post_init__(self) -> None:
        self.asset_state_store: Any = None  # injected by the triggerer before the trigger runs
        unwrap_lists(self)
        for name in WAIT_ONLY:
            field = next(f for f in dataclasses.fields(self) if f.name == name)
            if getattr(self, name) != field.default:
                raise ValueError(
                    f"{type(self).__name__} takes no {name}: an event trigger watches for ever and fires "
                    "an asset event each time, so there is no deadline and no task to end"
                )
        if not isinstance(self.backfill, bool):
            raise ValueError(f"backfill must be True or False, got {self.backfill!r}")
        self.min_event_interval = require_seconds(
            self.min_event_interval, argument="min_event_interval", allow_zero=True
        )
        super().__post_init__()

    @classmethod
    def parameter_names(cls) -> tuple[str, ...]:
        return tuple(name for name in super().parameter_names() if name not in WAIT_ONLY)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        if self._unbuilt is not None:
            # As it was given: Airflow builds the stream's producer from these, and its stream
            # key (made of them, see shared_stream_key) must be this trigger's.
            return f"{type(self).__module__}.{type(self).__qualname__}", dict(self._build_kwargs)
        classpath, kwargs = super().serialize()
        if kwargs.get("min_event_interval") == MIN_EVENT_INTERVAL:
            # The default is left out: Airflow identifies a watcher by a hash of its kwargs, and
            # a watcher stored before this parameter existed keeps its identity.
            del kwargs["min_event_interval"]
        return classpath, portable_kwargs(kwargs)

    def as_event_trigger(self, **options: Any) -> EventTrigger:
        """Already one: returned as it is (with ``options``, a copy with them changed)."""
        return dataclasses.replace(self, **options) if options else self

    # ----------------------------------------------------------------- the subclass contract
    def stream_identity(self) -> Any:
        """JSON naming what :meth:`poll` reads: triggers with equal identities share one poll.

        The default is every parameter except ``backfill``; a subclass narrows it to what the
        shared look depends on (an S3 prefix, a query), leaving out what each trigger judges
        on its own (a pattern, the conditions).
        """
        kwargs = self.serialize()[1]
        return {
            name: value
            for name, value in kwargs.items()
            if name not in ("backfill", "poll_interval", "min_event_interval")
        }

    async def poll(self, board: Board) -> Any:
        """One look at the upstream (runs on one trigger of the group, for all of them)."""
        raise NotImplementedError(f"{type(self).__name__} must implement poll()")

    async def derive(self, data: Any, state: Any) -> tuple[list[dict[str, Any]], Any]:
        """This trigger's events in one look, and its next watermark (``state`` ``None``: the first look).

        Must not raise for data it cannot judge yet: return no events and the same state. An
        exception is logged and the look is ignored (the next one is judged again).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement derive()")

    def judging_units(self, data: Any) -> int:
        """How big judging one look is for :meth:`derive` (rows, listed keys); default 1."""
        return 1

    def needs_catch_up(self, data: Any) -> bool:
        """Whether to look again at once (a page was full) instead of after ``poll_interval``."""
        return False

    def follow(self, board: Board, state: Any) -> None:
        """Tell the group's producer what this trigger needs (a Postgres cursor); default nothing."""

    def unfollow(self, board: Board) -> None:
        board.drop(self)

    def wake_events(self) -> list[asyncio.Event]:
        """Events that cut the producer's sleep short (a Postgres notification); default none."""
        return []

    # ------------------------------------------------------------------ shared streams
    def watermark_key(self) -> str:
        """The state-store key of this trigger's watermark (what is watched, not how often)."""
        skip = set(HOW_TO_LOOK) | set(self.tuning_parameters)
        identity = {name: value for name, value in self.serialize()[1].items() if name not in skip}
        return watermark_key(type(self).__name__, identity)

    def shared_stream_key(self) -> Hashable | None:
        if self._pinned_key is not None:
            return self._pinned_key  # built late: it stays in the stream Airflow subscribed it to
        if self._unbuilt is not None:
            # A stream of its own until it can be built, in ack mode like any other: its
            # watermark follows storage from its first event (see _late_filter, _late_poll).
            return self.unbuilt_stream_key(self._build_kwargs)
        identity = json.dumps(self.stream_identity(), sort_keys=True, separators=(",", ":"))
        return (
            "airflow_deferrable_kit",
            self.serialize()[0],
            identity,
            float(self.poll_interval),
            float(self.min_event_interval),
        )

    @classmethod
    def unbuilt_stream_key(cls, kwargs: Mapping[str, Any]) -> Hashable:
        """The stream key of a watcher of ``kwargs`` that could not be built when Airflow subscribed it."""
        identity = json.dumps(kwargs, sort_keys=True, separators=(",", ":"), default=repr)
        return ("airflow_deferrable_kit", f"{cls.__module__}.{cls.__qualname__}", "unbuilt", identity)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> EventProducer:
        return EventProducer(cls(**kwargs), late_key=cls.unbuilt_stream_key(kwargs))

    async def poll_forever(self, board: Board) -> AsyncIterator[Any]:
        """Poll, yield, sleep, for ever: errors back off and are logged, never raised.

        Between two looks it yields a :data:`TICK` whenever a subscriber has an event waiting
        (see :meth:`filter_shared_stream`). An item watcher's producer yields nothing, look or
        tick, until every subscriber is done with the previous batch (:meth:`Board.until_settled`);
        an edge watcher's goes on while at most :data:`EDGE_LOOK_AHEAD` of its events wait to be
        stored (:meth:`Board.until_stored`).
        """
        if self._unbuilt is not None:
            async for data in self._late_poll(board):
                yield data
            return
        self.log.info("Watching %s (every %ss)", self.describe(), self.poll_interval)
        failures = 0
        # Groups started together (a triggerer starting, a deployment) would poll together for
        # ever, their answers all landing in the same loop iterations: the first healthy sleep
        # is shortened by a random part of one interval, as the waits' is.
        phased = not self.spread_polls
        while True:
            await self._until_caught_up(board)
            # Items: no look sooner than min_event_interval after the group's last event, so what
            # appears meanwhile is found by one look and is one event (see filter_shared_stream).
            # Edges are looked at every poll_interval (a look skipped could miss one); only the
            # firing is spaced.
            pause = board.last_fired + float(self.min_event_interval) - self.clock.time()
            if self.fires_items and pause > 0:
                await self.clock.sleep(pause)
            if self._batch_due(board):
                board.tick_sent()
                yield TICK
                continue
            started = asyncio.get_running_loop().time()
            await self.clock.sleep(0)  # a turn: groups started together poll a few per loop turn
            try:
                data = await self.poll(board)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                delay = self._failure_delay(failures, self.classify_error(exc))
                async for tick in self._ticks_until_look(board, delay, started):
                    yield tick
                continue
            if failures:
                self.log.info("%s: recovered after %d failed poll(s)", self.describe(), failures)
            failures = 0
            board.moved.clear()
            yield data
            # A full page: look again as soon as the triggers have moved past it (not before, or
            # the same page comes back; not at all while one of them is stuck on it).
            extra = [board.moved] if self.needs_catch_up(data) else []
            delay = float(self.poll_interval)
            if not phased:
                phased = True
                delay = self.phase(delay)
            async for tick in self._ticks_until_look(board, delay, started, extra):
                yield tick

    def _judges_with(self, outbox: Outbox) -> bool:
        """Whether a look is judged while ``outbox`` holds what earlier looks found."""
        return not outbox if self.fires_items else len(outbox) < EDGE_LOOK_AHEAD

    async def _until_caught_up(self, board: Board) -> None:
        """Until storage has caught up enough for the next look or tick (see :meth:`poll_forever`)."""
        if self.fires_items:
            await board.until_settled()
        else:
            await board.until_stored(EDGE_LOOK_AHEAD)

    def _batch_due(self, board: Board) -> bool:
        wanted = board.next_batch_wanted()
        return wanted is not None and wanted <= self.clock.time()

    async def _ticks_until_look(
        self, board: Board, delay: float, started: float, extra: Sequence[asyncio.Event] = ()
    ) -> AsyncIterator[Any]:
        """The ticks subscribers want during the ``delay`` before the next look."""
        end = self.clock.time() + delay
        while True:
            await self._until_caught_up(board)
            if self._batch_due(board):
                board.tick_sent()
                yield TICK
                continue
            if await self._sleep(board, end - self.clock.time(), started, extra):
                return

    def _failure_delay(self, failures: int, error: WaitError) -> float:
        if isinstance(error, TransientError):
            delay = self.backoff_delay(failures, error.retry_after)
            self.log.warning(
                "%s: transient error %d (%s): %s; retrying in %.1fs",
                self.describe(), failures, error.error_type, redact(error.message), delay,
            )  # fmt: skip
            return delay
        delay = max(self.backoff_delay(failures), float(self.max_backoff) / 2)
        self.log.error(
            "%s: %s (%s); nothing fires until this is fixed, retrying in %.1fs",
            self.describe(), redact(error.message), error.error_type, delay,
        )  # fmt: skip
        return delay

    async def _sleep(self, board: Board, delay: float, started: float, extra: Sequence[asyncio.Event] = ()) -> bool:
        """Sleep ``delay``, unless the board or a wake event asks for a poll sooner: ``True``.

        ``False``: woken before that because a subscriber wants a batch (it has an event due).
        """
        wakers = [board.poke, *self.wake_events(), *extra]
        if not any(event.is_set() for event in wakers):
            board.batch_wanted.clear()
            wanted = board.next_batch_wanted()
            nap = delay if wanted is None else min(delay, wanted - self.clock.time())
            sleeper = asyncio.ensure_future(self.clock.sleep(max(nap, 0.0)))
            waiters = [asyncio.ensure_future(event.wait()) for event in (*wakers, board.batch_wanted)]
            try:
                await asyncio.wait({sleeper, *waiters}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (sleeper, *waiters):
                    task.cancel()
                await asyncio.gather(sleeper, *waiters, return_exceptions=True)
            slept = sleeper.done() and not sleeper.cancelled()
            if not any(event.is_set() for event in wakers) and not (slept and nap >= delay):
                return False  # a subscriber's batch is due (or it wants one sooner) before the look
        if any(event.is_set() for event in wakers):
            gap = started + MIN_WAKE_GAP - asyncio.get_running_loop().time()
            if gap > 0:
                await self.clock.sleep(gap)
            for event in wakers:
                event.clear()
        return True

    async def _late_poll(self, board: Board) -> AsyncIterator[Any]:
        """The producer of a watcher that could not be built: polls once its subscriber is built.

        Building is retried by the subscriber (with backoff, logging why); the producer waits for
        it rather than retrying on its own schedule, then builds and polls as any producer.
        """
        key = self.shared_stream_key()
        await board.subscriber_built.wait()
        source = await self._until_built()
        source._pinned_key = key
        self._late_source = source
        async for data in source.poll_forever(board):
            yield data

    async def _late_filter(self, shared_stream: AsyncIterator[Any]) -> AsyncGenerator[TriggerEvent, None]:
        """A watcher that could not be built: tries again with backoff, then filters as one built at once."""
        key = self.shared_stream_key()
        board = acquire_board(key)  # held from the start: the producer finds it (EventProducer)
        try:
            built = await self._until_built()
            built._pinned_key = key
            self._late_source = built
            async with contextlib.aclosing(built.filter_shared_stream(shared_stream)) as events:
                async for event in events:
                    yield event
        finally:
            release_board(board)

    async def release(self) -> None:
        if self._late_source is not None:
            await self._late_source.release()
        await super().release()

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncGenerator[TriggerEvent, None]:
        """This trigger's events from the group's looks, its watermark saved behind storage."""
        _collector.apply_once()  # the deployment's opt-in, in the triggerer only (never on import)
        if self._unbuilt is not None:
            async for event in self._late_filter(shared_stream):
                yield event
            return
        store = WatermarkStore(self.asset_state_store, self.watermark_key())
        if not store.durable:
            self.log.warning(
                "%s has no asset state store (not run as an AssetWatcher on Airflow 3.3+): its watermark "
                "is kept in memory only, so a restart starts afresh",
                self.describe(),
            )
        state = await self._load(store)
        board = acquire_board(self.shared_stream_key())
        committer = Committer(store, board, describe=self.describe())
        outbox = Outbox()
        board.subscriber_built.set()
        try:
            self.follow(board, state)
            gate = judging_gate()
            async for raw in shared_stream:
                # An item watcher judges a look only once everything the previous ones found is
                # fired: what it holds in memory stays one look's worth, and what it skips is
                # found again by the next look (its watermark has not moved past it). An edge
                # watcher judges every look (a look skipped could miss a transition), while a
                # few of its events wait for their turn at most.
                if raw.data is not TICK and self._judges_with(outbox):
                    # The watchers of one look judge it a few per loop iteration (JudgingGate),
                    # so a thousand of them never hold the loop for the sum of their work.
                    units = self.judging_units(raw.data)
                    started = await gate.enter(units)
                    try:
                        derived = await self._derive(raw, state)
                    finally:
                        gate.leave(units, started)
                    if derived is not None:
                        payloads, new_state = derived
                        events = item_events(payloads, self.max_event_bytes) if self.fires_items else payloads
                        outbox.add(events, new_state if new_state != state else UNCHANGED)
                        if new_state != state:
                            state = new_state
                            self.follow(board, state)
                # At most one event per batch, then on to the next at once: Airflow's ack timeout
                # runs from each batch's broadcast, so this batch is done with in a sync round
                # however much the look found. The rest waits here, and the producer sends a
                # batch (a tick, if no look is due) when the next is due.
                due = outbox.next_due(self.clock.time(), float(self.min_event_interval))
                if due is None:
                    payload, reached = outbox.take()
                    if payload is not None:
                        board.event_fired_on(raw.seq)
                        yield TriggerEvent(payload)
                        outbox.fired(self.clock.time())
                        board.fired(outbox.last_fired)
                    for covered in reached:  # the watermark of what is now fired (stored with this batch)
                        committer.stage(raw.seq, covered)
                    due = outbox.next_due(self.clock.time(), float(self.min_event_interval))
                if outbox:
                    board.want_batch(self, self.clock.time() if due is None else due)
                else:
                    board.batch_not_wanted(self)
        finally:
            board.batch_not_wanted(self)
            await committer.close()
            self.unfollow(board)
            release_board(board)

    async def _derive(self, raw: Raw, state: Any) -> tuple[list[dict[str, Any]], Any] | None:
        try:
            return await self.derive(raw.data, state)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.log.error(
                "%s: could not judge a poll, judged again at the next one: %s",
                self.describe(),
                redact(describe_exception(exc)),
            )
            return None

    async def _load(self, store: WatermarkStore) -> Any:
        failures = 0
        while True:
            try:
                state = await store.load()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                delay = full_jitter(failures, base=LOAD_RETRY_BASE, cap=LOAD_RETRY_CAP)
                self.log.warning(
                    "%s: could not read the watermark (%s); nothing fires until it is read, retrying in %.1fs",
                    self.describe(), redact(describe_exception(exc)), delay,
                )  # fmt: skip
                await asyncio.sleep(delay)
                continue
            self.log.info(
                "%s: %s", self.describe(), "starting from its saved watermark" if state is not None else "first run"
            )
            return state

    async def _until_built(self) -> EventTrigger:
        """Build this watcher again with backoff until it can be (see ``PollingTrigger._not_built``).

        Nothing fires meanwhile, and each failed try logs the reason: the triggerer and every
        other trigger on it go on; deploying the missing extra or module brings this one back.
        """
        failures = 0
        while self._unbuilt is not None:
            failures += 1
            delay = full_jitter(failures, base=UNBUILT_RETRY_BASE, cap=UNBUILT_RETRY_CAP)
            self.log.error(
                "%s; nothing fires until this is fixed, trying again in %.1fs", redact(self._unbuilt.message), delay
            )
            await asyncio.sleep(delay)
            importlib.invalidate_caches()  # a module deployed since is found
            try:
                fresh = type(self)(**self._build_kwargs)
            except Exception as exc:  # built outside the runner: the constructor raises
                self._not_built(exc, self._build_kwargs)
                continue
            if fresh._unbuilt is None:
                fresh.asset_state_store = self.asset_state_store
                fresh.trigger_id = self.trigger_id
                self.log.info("%s: built after %d attempt(s); watching", type(self).__name__, failures)
                return fresh
            self._unbuilt = fresh._unbuilt
        return self

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Alone (no shared stream): poll and filter in this task; the watermark follows the consumer.

        The triggerer of Airflow 3.3 uses :meth:`filter_shared_stream` instead; this path is for
        tests, ``dag.test()`` and Airflows without shared streams.
        """
        _collector.apply_once()  # the deployment's opt-in, in the triggerer only (never on import)
        if self._unbuilt is not None:
            built = await self._until_built()
            async for event in built.run():
                yield event
            return
        source = type(self)(**self.serialize()[1])
        stream = standalone_stream(source)
        async with contextlib.aclosing(stream), contextlib.aclosing(self.filter_shared_stream(stream)) as events:
            async for event in events:
                yield event


# ------------------------------------------------------------------------------ edges
@dataclasses.dataclass(frozen=True)
class _NotReady:
    """What a look says when a failure condition matched: definitely not ready."""

    reason: str


class EdgeEventTrigger(EventTrigger):
    """Fires once each time the wait's condition becomes true; never while it stays true.

    The watermark is the last state seen, ``{"ready": bool, "since": time}``. A look that
    cannot be judged (an error status, an unreadable body) leaves it as it was, so an endpoint
    that flaps between "ready" and 503 fires once, not once per recovery. With ``backfill``, a
    condition already true at the first look fires; without it, it is the starting point.

    A subclass may split the wait's ``check()`` into :meth:`observe` (the shared look) and
    :meth:`judge` (this trigger's verdict on it); by default the look is ``check()`` itself.
    """

    async def poll(self, board: Board) -> Any:
        return await self.observe()

    async def observe(self) -> Any:
        """The shared look; by default the wait's whole ``check()``."""
        try:
            return await self.check()
        except ConditionFailed as exc:
            return _NotReady(exc.message)

    async def judge(self, observed: Any) -> Found | None:
        """This trigger's verdict on the look: ``Found`` (ready), ``None`` (not), or raise."""
        if isinstance(observed, _NotReady):
            raise ConditionFailed(observed.reason)
        return observed if isinstance(observed, Found) else None

    async def derive(self, data: Any, state: Any) -> tuple[list[dict[str, Any]], Any]:
        try:
            found = await self.judge(data)
        except ConditionFailed:
            found = None
        except WaitError as error:  # cannot tell: the state stays as it was
            if not getattr(self, "_unjudged", False):
                self.log.warning("%s: cannot tell whether ready (%s)", self.describe(), redact(error.message))
            self._unjudged = True
            return [], state
        if getattr(self, "_unjudged", False):
            self.log.info("%s: can tell again", self.describe())
        self._unjudged = False
        ready = found is not None
        was_ready = None if state is None else bool(state.get("ready"))
        if was_ready is ready:
            return [], state
        now = utc_now()
        new_state = {"ready": ready, "since": now}
        if found is None or (was_ready is None and not self.backfill):
            return [], new_state
        event_id = edge_event_id(state)
        return [event_payload({**found.data, "became_ready_at": now, "event_id": event_id})], new_state


def edge_event_id(previous: Any) -> str:
    """The ``event_id`` of a transition to ready: named after the state it leaves, not the clock.

    A triggerer that dies after the event is stored but before the new state is saved fires it
    again from the same saved state, at another moment (``became_ready_at`` differs): naming
    the transition by the saved "not ready since" moment it leaves gives both copies one
    ``event_id``, so a consumer can tell the repeat. ``ready-after@start`` is the first look's
    (with ``backfill``).
    """
    since = previous.get("since") if isinstance(previous, Mapping) else None
    return f"ready-after@{since}" if since else "ready-after@start"


class ConditionEventTrigger(EdgeEventTrigger):
    """Any wait as an event trigger: one event each time its condition becomes true.

    Built by ``wait.as_event_trigger()`` rather than by hand. The wait is rebuilt in the
    triggerer from its classpath and parameters (so its module must be importable there, as
    for any trigger), and its ``check()``, error classification and clients are used unchanged.

    :param wait_classpath: the wait's classpath, ``"package.module.MyTrigger"``.
    :param wait_params: the wait's own parameters (JSON), without the polling ones.
    """

    wait_classpath: str
    wait_params: dict[str, Any] = dataclasses.field(default_factory=dict)

    def validate(self) -> None:
        self._wait = build_wait(self.wait_classpath, self.wait_params)

    @classmethod
    def of(cls, wait: PollingTrigger, **options: Any) -> ConditionEventTrigger:
        """The event form of ``wait``: its parameters, its ``poll_interval`` and ``max_backoff``."""
        classpath, kwargs = wait.serialize()
        for name in WAIT_ONLY:
            if name in kwargs and kwargs[name] != _default_of(name):
                raise ValueError(
                    f"{type(wait).__name__}(..., {name}=...) cannot become an event trigger: an event trigger "
                    f"watches for ever and fires an asset event each time; build the wait without {name}"
                )
        base = {f.name for f in dataclasses.fields(PollingTrigger)}
        params = {name: value for name, value in kwargs.items() if name not in base}
        options.setdefault("poll_interval", kwargs["poll_interval"])
        options.setdefault("max_backoff", kwargs["max_backoff"])
        return cls(wait_classpath=classpath, wait_params=params, **options)

    def describe(self) -> str:
        return f"{self._wait.describe()}, as events"

    async def check(self) -> Found | None:
        return await self._wait.check()

    def classify_error(self, exc: Exception) -> WaitError:
        return self._wait.classify_error(exc)

    async def release(self) -> None:
        wait = getattr(self, "_wait", None)  # none when it could not be built
        if wait is not None:
            await wait.release()
        await super().release()


def _default_of(name: str) -> Any:
    return next(f.default for f in dataclasses.fields(PollingTrigger) if f.name == name)


def build_wait(classpath: str, params: Any) -> PollingTrigger:
    """Import ``classpath`` and build the wait from ``params``, with errors naming the argument."""
    if not isinstance(classpath, str) or "." not in classpath:
        raise ValueError(
            f"wait_classpath must be a trigger classpath such as 'package.module.MyTrigger', got {classpath!r}"
        )
    if not isinstance(params, dict):
        raise ValueError(f"wait_params must be an object of the wait's parameters, got {type(params).__name__}")
    module_name, _, name = classpath.rpartition(".")
    try:
        wait_class = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"wait_classpath {classpath!r} cannot be imported: {exc}") from exc
    if not (isinstance(wait_class, type) and issubclass(wait_class, PollingTrigger)):
        raise ValueError(f"wait_classpath {classpath!r} is not a PollingTrigger subclass")
    if issubclass(wait_class, EventTrigger):
        raise ValueError(f"wait_classpath {classpath!r} is an event trigger already")
    clashes = sorted(set(params) & {f.name for f in dataclasses.fields(PollingTrigger)})
    if clashes:
        raise ValueError(
            f"wait_params may not hold {', '.join(clashes)}: poll_interval and max_backoff are the event "
            "trigger's own parameters, and a watcher has no deadline or task to end"
        )
    try:
        wait: PollingTrigger = wait_class(**params)
    except TypeError as exc:  # a missing or unknown parameter
        raise ValueError(f"wait_params do not fit {classpath}: {exc}") from exc
    if wait._unbuilt is not None:
        # Built in the triggerer, the wait keeps its own failure (a missing extra, a bad value) to
        # end with it; a watcher of it cannot run at all: it is not built either, and says why.
        raise ValueError(f"its wait {classpath}: {wait._unbuilt.message}")
    return wait


register_event_form(PollingTrigger, ConditionEventTrigger.of)

__all__ = [
    "ConditionEventTrigger",
    "EdgeEventTrigger",
    "EventTrigger",
    "edge_event_id",
    "event_payload",
]
