"""The benchmark harnesses measure one cell at a time, on a quiet machine, or refuse (benchmarks/quiet.py)."""

from __future__ import annotations

import itertools
import os
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from benchmarks import quiet


@pytest.fixture(autouse=True)
def private_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quiet, "LOCK", tmp_path / "benchmark.lock")


def test_a_machine_is_quiet_only_with_a_low_load_and_no_neighbour() -> None:
    assert quiet.MachineState(load_1m=0.2, cpus=2, neighbours=()).quiet
    busy = quiet.MachineState(load_1m=3.1, cpus=2, neighbours=())
    assert not busy.quiet and "load average 3.10 on 2 CPUs" in busy.why_busy()
    beside = quiet.MachineState(load_1m=0.1, cpus=2, neighbours=("123: pytest tests",))
    assert not beside.quiet and "running beside: 123: pytest tests" in beside.why_busy()


def test_another_test_run_or_benchmark_on_the_machine_is_a_neighbour_but_this_process_tree_is_not() -> None:
    marker = f"benchmarks.fake_{uuid.uuid4().hex[:6]}"
    # Started by a shell that exits at once: the sleep is nobody's child here, as another run's would be.
    subprocess.run(["bash", "-c", f"(exec -a {marker} sleep 60 &)"], check=True)
    try:
        deadline = time.monotonic() + 10
        while not any(marker in line for line in quiet.neighbours()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert any(marker in line for line in quiet.neighbours())
        # This test run itself (pytest, an ancestor) and what it started are not neighbours.
        assert not any(line.startswith(f"{os.getpid()}:") for line in quiet.neighbours())
    finally:
        subprocess.run(["pkill", "-f", marker], check=False)


def test_a_busy_machine_refuses_the_cell_or_marks_it_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quiet, "QUIET_LOAD", 0.0)  # no load is low enough: always busy
    with (
        pytest.raises(quiet.MachineBusy, match="machine busy: load average"),
        quiet.quiet_cell(patience=0.2, step=0.05),
    ):
        pytest.fail("a refused cell must not run")
    with quiet.quiet_cell(patience=0.0, allow_busy=True) as record:
        assert "load average" in record["busy"] and record["machine_before"]["cpus"] >= 1


def test_a_quiet_machine_runs_the_cell_and_records_its_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quiet, "QUIET_LOAD", 1e9)
    monkeypatch.setattr(quiet, "neighbours", lambda: ())
    with quiet.quiet_cell(patience=0.0) as record:
        assert "busy" not in record and set(record["machine_before"]) == {"load_1m", "cpus", "neighbours"}


def test_two_cells_never_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quiet, "QUIET_LOAD", 1e9)
    monkeypatch.setattr(quiet, "neighbours", lambda: ())
    spans: list[tuple[float, float]] = []

    def cell() -> None:
        with quiet.quiet_cell(patience=0.0):
            began = time.monotonic()
            time.sleep(0.3)
            spans.append((began, time.monotonic()))

    threads = [threading.Thread(target=cell) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    spans.sort()
    assert len(spans) == 3
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans))
