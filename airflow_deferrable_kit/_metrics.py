"""The kit's metrics, sent through Airflow's own metrics layer.

Airflow already knows where metrics go (``[metrics] statsd_on``, ``statsd_datadog_enabled`` or
``otel_on``, with their host, port and prefix), so every wait reports through it: nothing to
configure here, and nothing is sent where Airflow sends nothing. Each wait kind counts its polls,
its transient and fatal errors (by ``error_type``), its events (by status), the backoff it slept
and the time from start to event; :mod:`airflow_deferrable_kit.leases` reports the shared
clients open per client kind. docs/operations.md lists every metric.

Cardinality is bounded by construction: a name or tag holds only the wait kind (a module or
class name), a member of the error vocabulary, an event status or a client kind (the first
element of a lease key), never a connection id, key, topic or URL. The dimensions are name
segments, because plain StatsD drops tags, and tags as well, for backends that keep them.

Never blocking the loop: a StatsD send is one UDP datagram to an address resolved once, and an
OpenTelemetry record is an in-memory update. Building the backend is the costly part (the StatsD
client resolves its host name, OpenTelemetry starts its exporter), and Airflow builds it on a
process's first metric, which in a triggerer would be inside the event loop. So the first metric
of a process builds it on a thread; what is reported meanwhile is kept (bounded) and sent from
that thread once it is ready. With no metrics backend, each report costs one attribute check.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import importlib
import logging
import os
import re
import sys
import threading
from collections import Counter, deque
from collections.abc import Hashable
from typing import Any, Final

from airflow_deferrable_kit.errors import ErrorType


def _stats_layers() -> tuple[Any, ...]:
    """Airflow's ``Stats`` objects, the Task SDK's first: the one each process initialised is used.

    Airflow has two copies of its metrics layer, the Task SDK's (set up in workers, and wherever
    ``airflow.sdk.serde`` is imported) and the core's (set up by the triggerer before it forks
    its TriggerRunner). Both read ``[metrics]``; which of them a process set up varies by
    version, so the first with a backend wins. Imported here, at import time, not in the loop.
    """
    layers = []
    for module in ("airflow.sdk.observability.stats", "airflow.observability.stats"):
        try:
            layers.append(importlib.import_module(module).Stats)
        except ImportError:  # pragma: no cover - a worker without airflow-core, an older 3.x
            continue
    if not layers:  # pragma: no cover - the deprecated path, only where the others are missing
        with contextlib.suppress(ImportError):
            layers.append(importlib.import_module("airflow.stats").Stats)
    return tuple(layers)  # empty: no metrics layer at all, so the kit's metrics stay off


_LAYERS: Final = _stats_layers()

log = logging.getLogger(__name__)

#: The first segment of every metric name (after Airflow's own ``statsd_prefix``).
PREFIX: Final = "deferrable_kit"
#: Reports kept while the backend is being built; older ones are dropped past this.
PENDING_LIMIT: Final = 10_000
#: A timer built (never started, so never sent) to make Airflow build its backend.
_WARM_UP_STAT: Final = f"{PREFIX}.warm_up"
#: Longest wait kind or client kind kept in a name.
_MAX_SEGMENT: Final = 60
#: Our trigger modules whose wait is not named like the module.
_KIND_BY_MODULE: Final = {"temporal": "datetime"}
_OUR_TRIGGERS: Final = "airflow_deferrable_kit.triggers."
_VOCABULARY: Final = frozenset(member.value for member in ErrorType)
_STATUSES: Final = frozenset({"success", "timeout", "error"})
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")

_COLD, _WARMING, _ON, _OFF = "cold", "warming", "on", "off"


def segment(name: str) -> str:
    """``name`` as one metric-name segment: no dots, only characters every backend accepts."""
    return _UNSAFE.sub("_", name)[:_MAX_SEGMENT] or "unnamed"


def bounded_error_type(error_type: object) -> str:
    """A vocabulary member's value, or ``other``: a metric never carries a free-form string."""
    value = str(error_type)
    return value if value in _VOCABULARY else "other"


class _Sender:
    """Sends to Airflow's ``Stats`` once its backend is built off the loop, keeping what comes before."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._state = _COLD
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stats: Any = None
        self._pending: deque[tuple[str, str, Any, dict[str, str]]] = deque(maxlen=PENDING_LIMIT)

    def send(self, method: str, stat: str, value: Any, tags: dict[str, str]) -> None:
        if self._state == _OFF:
            return
        if self._state != _ON:
            with self._lock:
                if self._state == _COLD and not _metrics_configured():
                    self._state = _OFF  # the common case: decided at once, no thread competing with the loop
                    return
                if self._state == _COLD:
                    self._state = _WARMING
                    self._thread = threading.Thread(target=self._warm_up, name="deferrable-kit-metrics", daemon=True)
                    self._thread.start()
                if self._state == _WARMING:
                    self._pending.append((method, stat, value, tags))
                    return
            if self._state == _OFF:
                return
        _emit(self._stats, method, stat, value, tags)

    def _warm_up(self) -> None:
        try:
            self._stats = _configured_layer()
        except Exception:  # a broken metrics setup must never break a wait
            log.exception("Airflow's metrics backend could not be built; the kit's metrics are off")
        enabled = self._stats is not None
        while True:
            with self._lock:
                batch = list(self._pending)
                self._pending.clear()
                if not batch or not enabled:
                    self._state = _ON if enabled else _OFF
                    return
            for report in batch:  # sent outside the lock, in order, before the loop sends directly
                _emit(self._stats, *report)

    def wait_ready(self, timeout: float) -> None:
        """Block until the backend is built and what was kept is sent (off the loop only)."""
        if self._thread is not None:
            self._thread.join(timeout)


def _metrics_configured() -> bool:
    """Whether Airflow is set up to send metrics at all (``[metrics] statsd_on`` / ``otel_on``).

    A cheap read of the loaded configuration, so a process without metrics never starts the
    warm-up thread (whose pure-Python work would compete with the event loop for the GIL).
    """
    try:
        from airflow.configuration import conf
    except ImportError:  # pragma: no cover - the task SDK alone
        return True
    try:
        return any(conf.getboolean("metrics", name, fallback=False) for name in ("statsd_on", "otel_on"))
    except Exception:
        return True


def _emit(stats: Any, method: str, stat: str, value: Any, tags: dict[str, str]) -> None:
    try:
        getattr(stats, method)(stat, value, tags=tags)
    except Exception:  # a metric is never worth a failed wait
        log.debug("Could not send metric %s", stat, exc_info=True)


def _configured_layer() -> Any:
    """Build each layer's backend (a timer never started sends nothing); the first real one, or None."""
    for stats in _LAYERS:
        stats.timer(_WARM_UP_STAT)
        if not _backend_is_noop(stats):
            return stats
    return None


def _backend_is_noop(stats: Any) -> bool:
    """Whether this ``Stats`` has no metrics backend (Airflow's ``NoStatsLogger``).

    Private API, fenced here: Airflow 3.3 keeps the backend in its stats module, 3.2 on the
    ``Stats`` class. Unknown layouts count as configured, so metrics are sent, never lost.
    """
    backend = getattr(stats, "instance", None)  # 3.2: the metaclass keeps it on the class
    if backend is None:
        module = sys.modules.get(getattr(getattr(stats, "incr", None), "__module__", "") or "")
        get_backend = getattr(module, "_get_backend", None)
        if get_backend is None:
            return False
        backend = get_backend()
    return type(backend).__name__ == "NoStatsLogger"


_sender = _Sender()
os.register_at_fork(after_in_child=_sender._reset)  # Airflow rebuilds its backend in a fork, and so do we


def wait_until_ready(timeout: float = 10.0) -> None:
    """Block until reports made so far are handed to Airflow's backend (tests, short-lived processes)."""
    _sender.wait_ready(timeout)


# ------------------------------------------------------------------------------- waits
def wait_kind(trigger_class: type) -> str:
    """The wait's segment in metric names: its ``metrics_name``, ours by module, yours by class name."""
    explicit = getattr(trigger_class, "metrics_name", None)
    if explicit:
        return segment(str(explicit))
    module = trigger_class.__module__
    if module.startswith(_OUR_TRIGGERS):
        name = module.removeprefix(_OUR_TRIGGERS)
        return segment(_KIND_BY_MODULE.get(name, name))
    return segment(trigger_class.__name__)


class WaitMetrics:
    """The metrics of one wait kind: ``deferrable_kit.<kind>.<metric>[.<dimension>]``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._base = f"{PREFIX}.{kind}"
        self._tags = {"wait": kind}
        self._polls = f"{self._base}.polls"
        self._backoff = f"{self._base}.backoff"
        self._named: dict[tuple[str, str], tuple[str, dict[str, str]]] = {}

    def _by(self, metric: str, dimension: str, value: str) -> tuple[str, dict[str, str]]:
        named = self._named.get((metric, value))
        if named is None:
            named = self._named[(metric, value)] = (f"{self._base}.{metric}.{value}", {**self._tags, dimension: value})
        return named

    def poll(self) -> None:
        """One check started (deferred and poke paths)."""
        _sender.send("incr", self._polls, 1, self._tags)

    def transient(self, error_type: object) -> None:
        """A check failed with a transient error, to be retried."""
        stat, tags = self._by("transient_errors", "error_type", bounded_error_type(error_type))
        _sender.send("incr", stat, 1, tags)

    def fatal(self, error_type: object) -> None:
        """A wait ended with an error (deferred and poke paths)."""
        stat, tags = self._by("fatal_errors", "error_type", bounded_error_type(error_type))
        _sender.send("incr", stat, 1, tags)

    def backoff(self, seconds: float) -> None:
        """The wait is about to sleep ``seconds`` after a transient error."""
        _sender.send("timing", self._backoff, dt.timedelta(seconds=seconds), self._tags)

    def event(self, status: str, seconds: float) -> None:
        """The trigger's one event, ``seconds`` after its ``run()`` started (deferred path)."""
        status = status if status in _STATUSES else "other"
        stat, tags = self._by("events", "status", status)
        _sender.send("incr", stat, 1, tags)
        stat, tags = self._by("time_to_event", "status", status)
        _sender.send("timing", stat, dt.timedelta(seconds=max(seconds, 0.0)), tags)


@functools.cache
def for_trigger(trigger_class: type) -> WaitMetrics:
    """The (cached) metrics of ``trigger_class``'s wait kind."""
    return WaitMetrics(wait_kind(trigger_class))


# ----------------------------------------------------------------------- shared clients
def client_kind(key: Hashable) -> str:
    """A lease key's kind: its first element when it is a string (``("s3", conn_id, ...)``), else ``other``."""
    if isinstance(key, tuple) and key and isinstance(key[0], str):
        return segment(key[0])
    return "other"


class _SharedClientGauges:
    """Open shared clients and their leases per client kind in this process, as two gauges."""

    def __init__(self) -> None:
        self._open: Counter[str] = Counter()
        self._leases: Counter[str] = Counter()

    def changed(self, key: Hashable, *, clients: int = 0, leases: int = 0) -> None:
        kind = client_kind(key)
        tags = {"client": kind}
        if clients:
            self._open[kind] += clients
            _sender.send("gauge", f"{PREFIX}.shared_clients.{kind}.open", self._open[kind], tags)
        if leases:
            self._leases[kind] += leases
            _sender.send("gauge", f"{PREFIX}.shared_clients.{kind}.leases", self._leases[kind], tags)


_gauges = _SharedClientGauges()


def client_opened(key: Hashable) -> None:
    """A shared client for ``key`` is being built (it counts as open until it is closed or fails)."""
    _gauges.changed(key, clients=1)


def client_closed(key: Hashable) -> None:
    """The shared client for ``key`` left the registry: closed, or its creation failed."""
    _gauges.changed(key, clients=-1)


def leases_changed(key: Hashable, delta: int) -> None:
    """A trigger took (``+1``) or gave back (``-1``) a lease on ``key``."""
    _gauges.changed(key, leases=delta)


__all__ = [
    "PREFIX",
    "WaitMetrics",
    "bounded_error_type",
    "client_closed",
    "client_kind",
    "client_opened",
    "for_trigger",
    "leases_changed",
    "segment",
    "wait_kind",
    "wait_until_ready",
]
