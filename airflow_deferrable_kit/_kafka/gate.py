"""When the Kafka wait may open a connection to a broker: one backoff per (connection, broker).

While a broker is down, aiokafka retries on its own fixed timers (``retry_backoff_ms`` in the
fetcher and in offset lookups, its metadata synchronizer woken on every failure), once per
consumer: a process with many consumers would hit a recovering broker with a steady storm. Every
consumer and admin client of this package asks a :class:`ConnectGate` first. The gate of one
(Airflow connection, broker address) lets one attempt through at a time, and after a failure
none until a backoff has passed (capped exponential with full jitter, the package's one
formula), whatever the number of waits, topics or consumers behind it. Refused attempts cost
no network and log nothing; each failed attempt logs one warning with the next delay, and the
first success after an outage one line saying so. Recovery is within one backoff step: the
first attempt after the broker is back succeeds and opens the gate for everyone.

The backoff is capped by the smallest ``max_backoff`` among the waits using the connection
(:meth:`ConnectGates.hold_cap`), or ``settings.CONNECT_BACKOFF_CAP`` when none asked for less: the
gate is shared, so a wait that asked to be retried at least every 5 s is never held to 30 s.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from airflow_deferrable_kit._backoff import full_jitter
from airflow_deferrable_kit._kafka import settings
from airflow_deferrable_kit._per_loop import PerLoop
from airflow_deferrable_kit._redact import redact

log = logging.getLogger(__name__)


@dataclass
class ConnectGate:
    """Connection attempts to one broker address of one Airflow connection."""

    conn_id: str
    address: str
    failures: int = 0
    #: Loop time before which no attempt may start (0: open).
    not_before: float = 0.0
    #: Attempts in progress (while the broker is down, at most one: the probe).
    in_flight: int = 0
    attempts: int = 0
    #: What the last failed attempt said (filled in by the attempt, or by aiokafka's log line).
    last_error: str | None = None
    #: The cap of the backoff, asked each time (its connection's :attr:`ConnectGates.cap`).
    cap: Callable[[], float] = field(default=lambda: float(settings.CONNECT_BACKOFF_CAP), repr=False)

    @property
    def down(self) -> bool:
        """Whether the last attempt failed (the broker is believed unreachable)."""
        return self.failures > 0

    def try_begin(self) -> bool:
        """Start an attempt; while the broker is down, only once the backoff has passed and no
        other attempt is in flight (healthy, every client connects at once)."""
        if self.failures and (self.in_flight or asyncio.get_running_loop().time() < self.not_before):
            return False
        self.in_flight += 1
        self.attempts += 1
        self.last_error = None
        return True

    def succeeded(self) -> None:
        self.in_flight = max(self.in_flight - 1, 0)
        if self.failures:
            log.info(
                "Kafka %s: broker %s reachable again after %d failed attempt(s)",
                self.conn_id,
                self.address,
                self.failures,
            )
        self.failures = 0
        self.not_before = 0.0

    def failed(self, error: str | None = None) -> float:
        """Record a failed attempt; log it once and return the delay before the next one.

        Attempts that were already in flight when the broker went down fail together: the
        backoff steps once for them, and only the first is logged.
        """
        self.in_flight = max(self.in_flight - 1, 0)
        if self.failures and asyncio.get_running_loop().time() < self.not_before:
            return self.seconds_to_wait()
        self.failures += 1
        delay = full_jitter(self.failures, base=settings.CONNECT_BACKOFF_BASE, cap=self.cap())
        self.not_before = asyncio.get_running_loop().time() + delay
        reason = error or self.last_error or "connection failed"
        log.warning(
            "Kafka %s: cannot connect to broker %s (attempt %d): %s; next attempt in %.1fs",
            self.conn_id,
            self.address,
            self.failures,
            redact(reason),
            delay,
        )
        return delay

    def abandoned(self) -> None:
        """An attempt that was cancelled: neither a success nor a failure."""
        self.in_flight = max(self.in_flight - 1, 0)

    def seconds_to_wait(self) -> float:
        return max(0.0, self.not_before - asyncio.get_running_loop().time())


class ConnectGates:
    """The gates of one Airflow connection, one per broker address."""

    def __init__(self, conn_id: str) -> None:
        self.conn_id = conn_id
        self.gates: dict[str, ConnectGate] = {}
        #: The ``max_backoff`` of every wait using the connection (a count per value).
        self._caps: collections.Counter[float] = collections.Counter()

    def for_address(self, host: str, port: int) -> ConnectGate:
        address = f"{host}:{port}"
        gate = self.gates.get(address)
        if gate is None:
            gate = self.gates[address] = ConnectGate(self.conn_id, address, cap=lambda: self.cap)
        return gate

    # ------------------------------------------------------------------ the cap
    @property
    def cap(self) -> float:
        """The backoff cap: the smallest ``max_backoff`` of the waits holding one, at most
        ``settings.CONNECT_BACKOFF_CAP``."""
        return min(float(settings.CONNECT_BACKOFF_CAP), min(self._caps, default=math.inf))

    def hold_cap(self, seconds: float) -> None:
        """A wait using the connection asks to be retried at least every ``seconds``.

        A gate already waiting longer than the new cap is brought forward to it, so the wait
        is not held to a delay drawn before it came.
        """
        self._caps[float(seconds)] += 1
        cap = self.cap
        try:
            now = asyncio.get_running_loop().time()
        except RuntimeError:  # no loop: no gate can be waiting
            return
        for gate in self.gates.values():
            gate.not_before = min(gate.not_before, now + cap)

    def drop_cap(self, seconds: float) -> None:
        """The wait that held ``seconds`` (:meth:`hold_cap`) no longer uses the connection."""
        seconds = float(seconds)
        self._caps[seconds] -= 1
        if self._caps[seconds] <= 0:
            del self._caps[seconds]

    @property
    def down(self) -> bool:
        """Whether some broker of this connection is in backoff (its failures are being logged)."""
        return any(gate.down for gate in self.gates.values())

    def attempts(self) -> int:
        return sum(gate.attempts for gate in self.gates.values())


class CapHold:
    """One wait's hold on its connection's backoff cap: held once while it uses the connection."""

    __slots__ = ("_gates", "_seconds")

    def __init__(self, seconds: float) -> None:
        self._seconds = float(seconds)
        self._gates: ConnectGates | None = None

    def hold(self, gates: ConnectGates) -> None:
        """Cap ``gates``' reconnect backoff at this wait's ``seconds`` (once; later calls keep it)."""
        if self._gates is None:
            gates.hold_cap(self._seconds)
            self._gates = gates

    def drop(self) -> None:
        gates, self._gates = self._gates, None
        if gates is not None:
            gates.drop_cap(self._seconds)


_gates: PerLoop[dict[str, ConnectGates]] = PerLoop(dict)


def gates_for(conn_id: str) -> ConnectGates:
    """The gates of ``conn_id`` in the running loop (shared by every client of that connection)."""
    registry = _gates.get()
    gates = registry.get(conn_id)
    if gates is None:
        gates = registry[conn_id] = ConnectGates(conn_id)
    return gates


__all__ = [
    "CapHold",
    "ConnectGate",
    "ConnectGates",
    "gates_for",
]
