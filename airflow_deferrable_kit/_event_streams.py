"""The plumbing behind every event trigger: one poll per upstream, watermarks behind storage.

Airflow 3.3's triggerer runs event triggers whose ``shared_stream_key()`` compare equal on one
*shared stream*: a single producer polls the upstream and every trigger of the group filters
what it yields. We run it in *ack mode* (``create_shared_stream_producer``): the triggerer
calls the producer's ``advance()`` for a polled batch only once every trigger that received it
moved past it and each event they derived from it is stored in the metadata database. That is
the one signal Airflow gives that an event is safe, so a watcher writes its watermark only
behind it (:class:`Committer`): an event is never covered by a saved watermark before it is
stored, so a triggerer that dies never loses one.

A :class:`Board` is where one group's producer and triggers meet in this process: the sequence
numbers of the polled batches, which of them are stored (``clean_through``), and the cursors the
triggers still need (a Postgres watcher far behind makes the shared query start lower).

Airflow counts its ack timeout (``[triggerer] shared_stream_ack_timeout``, 300 s by default) from
the moment a batch is broadcast, so nothing here holds a batch for long:

* a subscriber fires **at most one event per batch** and moves on at once; what else a look
  found waits in the subscriber's outbox, and the subscriber asks the producer for a batch when
  the next event is due (:meth:`Board.want_batch`);
* the producer sends a :data:`TICK` (a batch without a look) for that, and an item watcher's
  producer looks again only once every subscriber moved past its previous batch
  (:meth:`Board.until_settled`), so batches never pile up with their clocks running. An edge
  watcher's producer goes on looking while a few of its events wait to be stored
  (:meth:`Board.until_stored`): a look skipped could miss a transition, and a batch that fired
  nothing is done with as soon as its subscribers move past it, so only the batches that fired
  an event run against the ack timeout.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

from airflow_deferrable_kit._asset_state import WatermarkStore
from airflow_deferrable_kit._backoff import full_jitter
from airflow_deferrable_kit._per_loop import PerLoop
from airflow_deferrable_kit._redact import redact
from airflow_deferrable_kit.errors import describe_exception

try:  # Airflow >= 3.3; on 3.2 the triggerer has no shared streams and runs run() alone
    from airflow.triggers.shared_stream import SharedStreamProducer
except ImportError:  # pragma: no cover - exercised by the Airflow floor check
    SharedStreamProducer = object  # type: ignore[assignment,misc]

if TYPE_CHECKING:
    from airflow.triggers.shared_stream import AdvanceItem

log = logging.getLogger(__name__)

#: Backoff of a watermark write that failed (the store is the metadata DB through the supervisor).
SAVE_RETRY_BASE, SAVE_RETRY_CAP = 0.5, 30.0
#: CPU seconds of judging one loop iteration may hold before the other watchers wait a turn.
JUDGING_BUDGET = 0.01
#: What judging one unit (a row, a listed key) is assumed to cost before it has been measured.
FIRST_UNIT_COST = 5e-6


class Tick:
    """A batch without a look: a chance for subscribers to fire the next event of their outbox."""

    def __repr__(self) -> str:
        return "TICK"


#: The data of a batch the producer sends without looking (see :meth:`Board.want_batch`).
TICK: Final = Tick()


@dataclasses.dataclass(frozen=True)
class Raw:
    """One polled batch as the group's triggers receive it: its number, its data, its board."""

    seq: int
    data: Any
    board: Board


class Board:
    """Where one shared stream's producer and subscribers meet in this process."""

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self._seq = itertools.count()
        #: The newest batch every subscriber accepted, with all their events stored (-1: none).
        self.clean_through = -1
        self._listeners: set[Callable[[], None]] = set()
        self._cursors: dict[int, Any] = {}
        self._baselines = 0
        #: Set when a subscriber wants the producer to look now (a new cursor, a baseline).
        self.poke = asyncio.Event()
        #: Set whenever a subscriber's cursor moves (the producer catching up waits for it).
        self.moved = asyncio.Event()
        #: When a subscriber last fired an event (the clock's time; the producer paces its looks).
        self.last_fired = -math.inf
        #: The newest batch numbered so far, and the newest every subscriber is done with (any outcome).
        self.issued = -1
        self.settled_through = -1
        self._settled = asyncio.Event()
        #: The batches on which a subscriber fired an event that is not yet done with (stored).
        self._unstored: set[int] = set()
        #: When each subscriber with events waiting wants the next batch (the clock's time).
        self._batch_wanted: dict[int, float] = {}
        #: Set whenever a subscriber asks for a batch sooner than it asked before.
        self.batch_wanted = asyncio.Event()
        #: Set once a subscriber is built and filtering: a producer whose trigger could not be
        #: built (a missing extra) waits for it before building its own (the fix is deployed).
        self.subscriber_built = asyncio.Event()

    def next_seq(self) -> int:
        self.issued = next(self._seq)
        return self.issued

    def event_fired_on(self, seq: int) -> None:
        """A subscriber fired an event on batch ``seq``: done with once that event is stored."""
        self._unstored.add(seq)

    def resolved(self, seq: int, clean: bool) -> None:
        """The producer heard that batch ``seq`` is done with; ``clean``: every event stored.

        Airflow hands batches back in order, so every batch up to ``seq`` is done with too.
        """
        if seq > self.settled_through:
            self.settled_through = seq
            self._unstored = {unstored for unstored in self._unstored if unstored > seq}
            self._settled.set()
        if clean and seq > self.clean_through:
            self.clean_through = seq
            for listener in list(self._listeners):
                listener()

    async def until_settled(self) -> None:
        """Until every subscriber is done with the newest batch: moved past it, its events stored.

        Airflow fails a subscriber whose batch is not done with within its ack timeout, and a
        failed or departed subscriber counts as done, so this wait is bounded by that timeout.
        """
        while self.issued > self.settled_through:
            self._settled.clear()
            await self._settled.wait()

    async def until_stored(self, lag: int) -> None:
        """Until at most ``lag`` batches that fired an event are not done with (their event stored).

        The batches that fired nothing do not count: Airflow is done with one as soon as every
        subscriber moved past it, so however many pile up behind an event waiting for storage,
        none of them runs against the ack timeout.
        """
        while len(self._unstored) > lag:
            self._settled.clear()
            await self._settled.wait()

    # ------------------------------------------------------------------ subscribers' outboxes
    def want_batch(self, owner: object, at: float) -> None:
        """``owner`` has an event to fire at ``at`` (the clock's time): send a batch by then."""
        earlier = at < self._batch_wanted.get(id(owner), math.inf)
        self._batch_wanted[id(owner)] = at
        if earlier:
            self.batch_wanted.set()

    def batch_not_wanted(self, owner: object) -> None:
        self._batch_wanted.pop(id(owner), None)

    def tick_sent(self) -> None:
        """A :data:`TICK` is on its way to every subscriber: it answers every want so far.

        Each subscriber says again what it wants once it has taken the tick, so the producer
        sends no second tick before one was taken (a tick per loop turn would never let the
        subscribers run).
        """
        self._batch_wanted.clear()

    def next_batch_wanted(self) -> float | None:
        """When the earliest subscriber with an event waiting wants a batch (``None``: none waits)."""
        return min(self._batch_wanted.values(), default=None)

    def fired(self, moment: float) -> None:
        """A subscriber fired an event at ``moment``."""
        self.last_fired = max(self.last_fired, moment)

    def listen(self, callback: Callable[[], None]) -> Callable[[], None]:
        self._listeners.add(callback)
        return lambda: self._listeners.discard(callback)

    # ------------------------------------------------------------------ what subscribers need
    def set_cursor(self, owner: object, cursor: Any) -> None:
        """Say where ``owner`` is (a Postgres watcher's last row); the producer starts at the lowest."""
        fresh = id(owner) not in self._cursors
        self._cursors[id(owner)] = cursor
        self.moved.set()
        if fresh:
            self.poke.set()

    def drop(self, owner: object) -> None:
        self._cursors.pop(id(owner), None)
        self._batch_wanted.pop(id(owner), None)

    def cursors(self) -> list[Any]:
        return list(self._cursors.values())

    def want_baseline(self, wanted: bool) -> None:
        """A subscriber with no watermark asks the producer to say where the upstream is now."""
        self._baselines += 1 if wanted else -1
        if wanted:
            self.poke.set()

    @property
    def wants_baseline(self) -> bool:
        return self._baselines > 0


_boards: PerLoop[dict[Hashable, list[Any]]] = PerLoop(dict)


def acquire_board(key: Hashable) -> Board:
    """The board of ``key`` in this loop, shared by its producer and subscribers while any holds it."""
    boards = _boards.get()
    entry = boards.get(key)
    if entry is None:
        entry = boards[key] = [Board(key), 0]
    entry[1] += 1
    board: Board = entry[0]
    return board


def release_board(board: Board) -> None:
    boards = _boards.get()
    entry = boards.get(board.key)
    if entry is None or entry[0] is not board:
        return
    entry[1] -= 1
    if entry[1] <= 0:
        del boards[board.key]


def live_boards() -> dict[Hashable, int]:
    """Boards held in the running loop and their holders (for tests and diagnostics)."""
    return {key: entry[1] for key, entry in _boards.get().items()}


class JudgingGate:
    """Watchers judge a look a few per loop iteration, so that no iteration runs long.

    A look is fanned out to every watcher of it at once: a thousand watchers judging a page of
    a thousand rows would otherwise all run in one loop iteration, for seconds, and hold every
    other trigger (and Airflow's blocked-loop watchdog would say so). Each watcher says how big
    its judging is (rows, listed keys); the gate admits, per iteration, what fits in
    :data:`JUDGING_BUDGET` at the cost per unit it has measured so far, always at least one.
    """

    def __init__(self) -> None:
        self._waiting: deque[tuple[asyncio.Future[None], float]] = deque()
        self._reserved = 0.0
        self._scheduled = False
        self.unit_cost = FIRST_UNIT_COST

    async def enter(self, units: int) -> float:
        """Wait for a turn to judge ``units``; returns the CPU clock to pass to :meth:`leave`."""
        estimate = self.unit_cost * max(units, 1)
        if self._waiting or (self._reserved and self._reserved + estimate > JUDGING_BUDGET):
            admitted = asyncio.get_running_loop().create_future()
            self._waiting.append((admitted, estimate))
            self._schedule()
            await admitted
        else:
            self._reserved += estimate
            self._schedule()
        return time.thread_time()

    def leave(self, units: int, started: float) -> None:
        """Judging ``units`` took from ``started`` to now: learn the cost per unit."""
        measured = (time.thread_time() - started) / max(units, 1)
        self.unit_cost = 0.7 * self.unit_cost + 0.3 * measured

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._turn)

    def _turn(self) -> None:
        self._scheduled = False
        self._reserved = 0.0
        while self._waiting:
            admitted, estimate = self._waiting[0]
            if self._reserved and self._reserved + estimate > JUDGING_BUDGET:
                break
            self._waiting.popleft()
            if not admitted.done():  # a cancelled watcher's turn is skipped
                admitted.set_result(None)
                self._reserved += estimate
        if self._waiting or self._reserved:
            self._schedule()


_gates: PerLoop[JudgingGate] = PerLoop(JudgingGate)


def judging_gate() -> JudgingGate:
    return _gates.get()


# ---------------------------------------------------------------------------- the producer
class Source(Protocol):
    """What a producer polls: an event trigger built from one group member's kwargs."""

    def shared_stream_key(self) -> Hashable | None: ...

    def poll_forever(self, board: Board) -> AsyncIterator[Any]: ...

    async def release(self) -> None: ...


class EventProducer(SharedStreamProducer):
    """The ack-mode producer of one shared stream: polls, numbers each batch, relays advances."""

    def __init__(self, source: Source, *, late_key: Hashable | None = None) -> None:
        self._source = source
        self._late_key = late_key
        self._board: Board | None = None

    async def open_stream(self) -> AsyncIterator[tuple[Raw, int]]:
        key = self._source.shared_stream_key()
        if self._late_key is not None and self._late_key in _boards.get():
            # Its subscriber could not be built when Airflow subscribed it, and this trigger
            # could by the time the stream started (the fix deployed in between): the stream
            # is the one Airflow made for the subscriber, under the key it had then.
            key = self._late_key
        board = self._board = acquire_board(key)
        try:
            if key == self._late_key:
                await board.subscriber_built.wait()  # no batch before a subscriber can take it
            async for data in self._source.poll_forever(board):
                seq = board.next_seq()
                yield Raw(seq, data, board), seq
        finally:
            release_board(board)

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Airflow: these batches are done with; a clean one had every derived event stored."""
        if self._board is None:
            return
        for item in batch:
            self._board.resolved(int(item.broker_payload), item.outcome.is_clean)

    async def aclose(self) -> None:
        await self._source.release()


async def standalone_stream(source: Source) -> AsyncGenerator[Raw, None]:
    """The shared stream without a triggerer: a batch counts as done once the filter moved past it.

    What ``run()`` uses (tests, ``dag.test()``, an Airflow without shared streams): there is
    no storage confirmation here, so a watermark follows the consumer taking the events.
    """
    key = source.shared_stream_key()
    board = acquire_board(key)
    try:
        async for data in source.poll_forever(board):
            seq = board.next_seq()
            yield Raw(seq, data, board)
            board.resolved(seq, clean=True)
    finally:
        release_board(board)
        await source.release()


# ---------------------------------------------------------------------------- the committer
class Committer:
    """Saves one subscriber's watermark, each time only behind the batches whose events are stored.

    The subscriber *stages* its state after each batch that changed it; a staged state is saved
    once the board says a batch at least as new was clean. A later clean batch covers the earlier
    ones: a subscriber that failed to get an event stored is failed out of every outstanding
    batch by Airflow, so no batch it received after that can be clean.
    """

    def __init__(self, store: WatermarkStore, board: Board, *, describe: str) -> None:
        self._store = store
        self._board = board
        self._describe = describe
        self._staged: list[tuple[int, Any]] = []
        self._wake = asyncio.Event()
        self._unlisten = board.listen(self._wake.set)
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"watermark:{describe}")
        self.saves = 0

    def stage(self, seq: int, state: Any) -> None:
        self._staged.append((seq, state))
        if seq <= self._board.clean_through:
            self._wake.set()

    async def _run(self) -> None:
        failures = 0
        while True:
            await self._wake.wait()
            self._wake.clear()
            through = self._board.clean_through
            ready = [i for i, (seq, _) in enumerate(self._staged) if seq <= through]
            if not ready:
                continue
            last = ready[-1]
            state = self._staged[last][1]
            try:
                await self._store.save(state)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                delay = full_jitter(failures, base=SAVE_RETRY_BASE, cap=SAVE_RETRY_CAP)
                log.warning(
                    "Could not save the watermark of %s (%s); retrying in %.1fs",
                    self._describe,
                    redact(describe_exception(exc)),
                    delay,
                )
                await asyncio.sleep(delay)
                self._wake.set()
                continue
            failures = 0
            self.saves += 1
            del self._staged[: last + 1]

    async def close(self) -> None:
        """Stop (on cancel or exit): what is not saved yet is re-derived, and re-fired, next time."""
        self._unlisten()
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


__all__ = [
    "TICK",
    "Board",
    "Committer",
    "EventProducer",
    "JudgingGate",
    "Raw",
    "Source",
    "acquire_board",
    "judging_gate",
    "live_boards",
    "release_board",
    "standalone_stream",
]
