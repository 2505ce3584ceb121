"""Benchmark hygiene: one cell at a time, on a quiet machine, and every result says how quiet.

A figure measured beside a test suite or another benchmark is not a result: on two cores a
neighbour doubles loop lag and CPU per poll. Every harness (``run_all``, ``isolation``,
``worker_slots``) runs each cell through :func:`quiet_cell`, which

* holds a machine-wide lock (:data:`LOCK`), so two benchmark cells never overlap, even from
  two harnesses started by hand;
* waits (up to ``patience`` seconds) for the machine to be quiet: the 1-minute load average
  below :data:`QUIET_LOAD` per CPU and no other benchmark or test process running;
* records the machine's state before the cell (``machine_before``) in the cell's result;
* refuses the cell when the machine stays busy (the result says why, and no figure is
  written), unless ``allow_busy`` is set, in which case the result is marked ``busy`` and
  every report shows it as such.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

#: The machine-wide lock every benchmark cell holds while it runs.
LOCK: Final = Path(os.environ.get("ADK_BENCHMARK_LOCK", "/tmp/airflow-deferrable-kit-benchmark.lock"))
#: Quiet: the 1-minute load average per CPU below this (0.35 on two cores: 0.7).
QUIET_LOAD: Final = 0.35
#: Command lines that mean another test run or benchmark is on the machine.
NEIGHBOURS: Final = ("pytest", "benchmarks.", "benchmarks/", "moto_server", "tansu")


@dataclasses.dataclass(frozen=True)
class MachineState:
    """How busy the machine is now, and with what."""

    load_1m: float
    cpus: int
    neighbours: tuple[str, ...]

    @property
    def quiet(self) -> bool:
        return self.load_1m < QUIET_LOAD * self.cpus and not self.neighbours

    def why_busy(self) -> str:
        reasons = []
        if self.load_1m >= QUIET_LOAD * self.cpus:
            limit = QUIET_LOAD * self.cpus
            reasons.append(f"load average {self.load_1m:.2f} on {self.cpus} CPUs (quiet: < {limit:.2f})")
        if self.neighbours:
            reasons.append("running beside: " + "; ".join(self.neighbours))
        return ", ".join(reasons)

    def as_dict(self) -> dict[str, Any]:
        return {"load_1m": round(self.load_1m, 2), "cpus": self.cpus, "neighbours": list(self.neighbours)}


def _ancestors() -> set[int]:
    """This process and the ones that started it (a harness running its own cells is no neighbour)."""
    pids, pid = {os.getpid()}, os.getpid()
    while pid > 1:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            break
        pid = int(fields[1])
        pids.add(pid)
    return pids


def _descendants(root: int) -> set[int]:
    """The processes this one started (a cell's own servers are no neighbours either)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, stack = set(), [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def neighbours() -> tuple[str, ...]:
    """Other test runs and benchmarks on the machine, by a short command line each."""
    own = _ancestors() | _descendants(os.getpid())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in own:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        line = " ".join(part.decode(errors="replace") for part in argv if part)
        if any(marker in line for marker in NEIGHBOURS):
            found.append(f"{entry.name}: {line[:100]}")
    return tuple(sorted(found))


def machine_state() -> MachineState:
    return MachineState(load_1m=os.getloadavg()[0], cpus=os.cpu_count() or 1, neighbours=neighbours())


class MachineBusy(RuntimeError):
    """The machine did not become quiet in time: the cell is refused, no figure is taken."""

    def __init__(self, state: MachineState) -> None:
        super().__init__(f"machine busy: {state.why_busy()}")
        self.state = state


@contextlib.contextmanager
def quiet_cell(*, patience: float = 600.0, allow_busy: bool = False, step: float = 5.0) -> Iterator[dict[str, Any]]:
    """Hold the benchmark lock and wait for a quiet machine; yields what to record in the result.

    Raises :class:`MachineBusy` when the machine is still busy after ``patience`` seconds (and
    ``allow_busy`` is not set). The yielded dict holds ``machine_before`` and, when the cell ran
    on a busy machine anyway, ``busy`` (the reason): merge it into the cell's result.
    """
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # another cell running: wait for it to finish
        try:
            deadline = time.monotonic() + patience
            state = machine_state()
            while not state.quiet and time.monotonic() < deadline:
                time.sleep(step)
                state = machine_state()
            record: dict[str, Any] = {"machine_before": state.as_dict()}
            if not state.quiet:
                if not allow_busy:
                    raise MachineBusy(state)
                record["busy"] = state.why_busy()
            yield record
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


__all__ = ["LOCK", "QUIET_LOAD", "MachineBusy", "MachineState", "machine_state", "neighbours", "quiet_cell"]
