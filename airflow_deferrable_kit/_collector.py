"""An opt-in for the triggerer's garbage collector: thresholds the kit applies in that process.

With thousands of waits in one triggerer, the longest stalls of its event loop are CPython's
full collections, which walk every object in the process (docs/operations.md, "Large
triggerers"). Raising the thresholds makes them rare; where the figures come from is
docs/benchmarks.md. A deployment opts in with ``[deferrable_kit] triggerer_gc_thresholds`` (or
``AIRFLOW__DEFERRABLE_KIT__TRIGGERER_GC_THRESHOLDS``); by default nothing changes.

It is applied when the first of the kit's triggers starts running in a process, never on import:
the same classes are imported by workers and the DAG processor, whose collectors are not ours to
change. A value that is not three whole numbers is logged as an error naming the option, and the
collector is left as it was: a typo in a setting never stops a wait.
"""

from __future__ import annotations

import gc
import logging
import threading
from typing import Final

SECTION: Final = "deferrable_kit"
OPTION: Final = "triggerer_gc_thresholds"
#: What docs/operations.md measured at 10,000 waits, offered as the example value.
EXAMPLE: Final = "50000,5,1000"

log = logging.getLogger(__name__)
_lock = threading.Lock()
_applied = False


def parse_thresholds(value: str) -> tuple[int, int, int] | None:
    """``"a,b,c"`` as ``gc.set_threshold`` takes it; ``None`` for an empty value (off).

    Raises ``ValueError`` naming the option and the form expected.
    """
    text = value.strip()
    if not text:
        return None
    parts = [part.strip() for part in text.split(",")]
    try:
        numbers = tuple(int(part) for part in parts)
    except ValueError:
        numbers = ()
    if len(numbers) != 3 or numbers[0] < 1 or min(numbers) < 0:
        raise ValueError(
            f"[{SECTION}] {OPTION} must be three whole numbers for gc.set_threshold, the first at least 1 "
            f"(for example {EXAMPLE!r}), not {value!r}"
        )
    return numbers[0], numbers[1], numbers[2]


def configured() -> str:
    """The option's value in this process's Airflow configuration (``""``: not set)."""
    from airflow.configuration import conf

    return str(conf.get(SECTION, OPTION, fallback="") or "")


def apply_once() -> None:
    """Apply the configured thresholds, once per process (the triggerer's first kit trigger)."""
    global _applied
    if _applied:
        return
    with _lock:
        if _applied:
            return
        _applied = True
        try:
            thresholds = parse_thresholds(configured())
        except ValueError as exc:
            log.error("%s; the collector is left as it was", exc)
            return
        if thresholds is None:
            return
        before = gc.get_threshold()
        gc.set_threshold(*thresholds)
        log.info(
            "Garbage collector thresholds set to %s (were %s) by [%s] %s",
            thresholds, before, SECTION, OPTION,
        )  # fmt: skip
