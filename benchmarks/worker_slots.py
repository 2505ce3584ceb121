"""Worker slots on a real Airflow: M sensors wait W seconds five ways, side by side in one run.

One throw-away Airflow 3 (api-server, scheduler, triggerer, dag-processor; SQLite +
LocalExecutor with ``parallelism`` = 4 x M, one slot per sensor of the four modes that use a
worker, see :mod:`scripts.airflow_local`) runs
``adk_worker_slots`` (``benchmarks/dags/worker_slots.py``): M of this kit's ``DateTimeSensor`` per
mode - ``poke``, ``reschedule``, ``deferrable``, ``deferrable`` + ``end_from_trigger``, and
``start_from_trigger`` + ``end_from_trigger`` (Airflow 3.3+: no worker at all) - all
waiting for the same moment (the run's trigger time + W, passed as ``dag_run.conf['target']``)
and checking every ``--poke-interval`` seconds. A warm-up DAG of the same size runs first, so
the API server, the triggerer and every LocalExecutor worker process have done their one-off
imports before the measured run (see the DAG file).

Measured per mode, after the run:

* worker-occupied seconds: what :func:`airflow_deferrable_kit.audit.run_audit` reads from the
  metadata DB ``log`` table (each ``running`` row to the row that ended the worker's hold, the
  first start refined by ``task_instance.start_date``; see docs/audit.md);
* executor slot seconds: the ``duration`` of every "Workload finished" line the LocalExecutor's
  supervisors write (from just after the supervisor's API client exists to the supervisor being
  done with the task process), a cross-check that also covers the fork before and the process
  exit after the ``log`` rows;
* churn: tries, reschedules (``up_for_reschedule`` rows), worker starts (``running`` rows,
  cross-checked with the task processes started according to the task logs);
* wall time per task (first worker start to end) and for the run;
* where each worker run's seconds went, from the task log's own timestamps (see ``PHASES``).

Usage (prints a table, writes ``benchmarks/worker_slots.json``; exit 1 if a task does not
succeed or a mode did not run as intended, 2 if Airflow cannot start)::

    PYTHONPATH=. .venv/bin/python -m benchmarks.worker_slots --sensors 4 --wait 300
    PYTHONPATH=. .venv/bin/python -m benchmarks.worker_slots --sensors 2 --wait 30   # ~2-3 min
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from airflow_deferrable_kit.audit import (
    LOG,
    WORKER_START,
    WORKER_STOP,
    Event,
    open_engine,
    run_audit,
    worker_intervals,
)
from benchmarks.quiet import MachineBusy, quiet_cell
from scripts.airflow_local import LocalAirflow, WatchedRun
from scripts.services import ServiceUnavailable

ROOT = Path(__file__).resolve().parents[1]
DAGS = ROOT / "benchmarks" / "dags"
OUT = ROOT / "benchmarks" / "worker_slots.json"
UTC = dt.timezone.utc

# The names benchmarks/dags/worker_slots.py defines; checked against the run's task ids.
DAG_ID = "adk_worker_slots"
WARMUP_DAG_ID = "adk_worker_slots_warmup"
MODES = ("poke", "reschedule", "deferrable", "end_from_trigger", "start_from_trigger")
#: How the audit must classify each mode's tries, or the mode did not run as intended.
AUDIT_MODE = {
    "poke": "poke",
    "reschedule": "reschedule",
    "deferrable": "deferred",
    "end_from_trigger": "deferred",
    "start_from_trigger": "deferred",
}
#: The targets: worker-occupied seconds of a mode as a share of poke mode's, for W = 300 s.
#: Starting and ending in the triggerer, no worker may start at all (checked on its own too).
TARGETS = {"deferrable": 2.0, "end_from_trigger": 1.0, "start_from_trigger": 0.0}
TARGET_WAIT = 300.0
#: The warm-up sensors wait this long, so the deferrable ones really defer on a cold Airflow.
WARMUP_WAIT = 30.0

#: Where one worker run's seconds go, each phase ending at a timestamp of the executor's log,
#: the ``log`` table or the task log: (name, what it covers).
PHASES = (
    ("start", "executor: logging and secrets setup, fork, 'run' API call until the server recorded running"),
    ("hand_off", "running recorded until the task process begins (startup message)"),
    ("parse", "task process: load the DAG bundle and parse the DAG file"),
    ("prepare", "task process: context, template rendering, pre-execute"),
    ("execute", "the operator's execute (poke loop, defer, or resume)"),
    ("state_call", "reporting the outcome (defer / reschedule / success) until the server recorded it"),
    ("exit", "task process exit and supervisor teardown"),
)


class BenchmarkError(RuntimeError):
    """The benchmark could not produce a valid measurement (a task failed, a mode misbehaved)."""


# ------------------------------------------------------------------------------ the run
@dataclass
class Settings:
    sensors: int
    wait: float
    poke_interval: float
    timeout: float
    parallelism: int

    @property
    def env(self) -> dict[str, str]:
        """Settings for every Airflow component: room for every sensor to hold a slot at once."""
        slots = 4 * self.sensors
        return {
            "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
            "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": str(max(16, slots)),
            "AIRFLOW__CORE__DEFAULT_POOL_TASK_SLOT_COUNT": str(max(128, slots)),
            "AIRFLOW__SCHEDULER__MAX_TIS_PER_QUERY": str(max(16, slots)),
            # 4 x M workers asking the one API server at the same moment can take longer than the
            # default 5 s; a retried "run" call then conflicts with the first and fails the task.
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",
            "ADK_WORKER_SLOTS_SENSORS": str(self.sensors),
            "ADK_WORKER_SLOTS_POKE_INTERVAL": f"{self.poke_interval:g}",
            "ADK_WORKER_SLOTS_TIMEOUT": f"{self.timeout:g}",
        }


class CpuSampler:
    """The machine's CPU busy share and highest load average while the measured run went on."""

    def __init__(self) -> None:
        self.start = self.read()
        self.load_max = os.getloadavg()[0]

    @staticmethod
    def read() -> tuple[int, int]:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(ticks), ticks[3] + ticks[4]  # all, idle + iowait

    def tick(self, _: WatchedRun | None = None) -> None:
        self.load_max = max(self.load_max, os.getloadavg()[0])

    def result(self) -> dict[str, float]:
        total, idle = self.read()
        busy = 1 - (idle - self.start[1]) / max(total - self.start[0], 1)
        return {"cpu_busy_pct": round(100 * busy, 1), "load_avg_1m_max": round(self.load_max, 2)}


@dataclass
class Ran:
    """One finished, successful DAG run and when its sensors were told to stop waiting."""

    watched: WatchedRun
    triggered: dt.datetime
    target: dt.datetime
    run: dict[str, Any]


def now() -> dt.datetime:
    return dt.datetime.now(UTC)


def parse_time(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    moment = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def seconds(start: dt.datetime | None, end: dt.datetime | None) -> float | None:
    return None if start is None or end is None else (end - start).total_seconds()


def last_log_lines(airflow: LocalAirflow, dag_id: str, run_id: str, watched: WatchedRun, task: str) -> str:
    """The end of a task's log, to say why it did not succeed."""
    try:
        return airflow.task_log(dag_id, run_id, task, int(watched.last[task].get("try_number") or 1))[-2000:]
    except Exception as exc:  # the task may never have run: say so rather than hide the failure
        return f"(no log: {exc})"


def run_dag(
    airflow: LocalAirflow, dag_id: str, wait: float, *, timeout: float, sampler: CpuSampler | None = None
) -> Ran:
    """Trigger ``dag_id`` with a target ``wait`` seconds away and watch it; every task must succeed."""
    try:
        airflow.wait_for_dag(dag_id)
    except AssertionError as exc:
        raise BenchmarkError(str(exc)) from exc
    triggered = now()
    target = triggered + dt.timedelta(seconds=wait)
    run_id = airflow.trigger(dag_id, {"target": target.isoformat()})
    try:
        watched = airflow.watch_run(
            dag_id, run_id, timeout=timeout, interval=1.0, on_tick=sampler.tick if sampler else None
        )
    except AssertionError as exc:
        raise BenchmarkError(str(exc)) from exc
    failed = {task: ti.get("state") for task, ti in watched.last.items() if ti.get("state") != "success"}
    if watched.run_state != "success" or failed:
        tails = [f"--- {task} ---\n{last_log_lines(airflow, dag_id, run_id, watched, task)}" for task in failed]
        raise BenchmarkError(
            f"run {run_id} of {dag_id} ended {watched.run_state!r}; tasks that did not succeed: {failed}\n"
            + "\n".join(tails)
        )
    run = airflow.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
    return Ran(watched, triggered, target, run)


# -------------------------------------------------------------------------- measuring
@dataclass
class WorkerRun:
    """One worker process of a task, seen three ways: the executor's log, the ``log`` table
    (``running`` row and the row that ended the hold) and the task process's own log lines."""

    running: dt.datetime
    closed: dt.datetime | None
    closed_by: str | None
    executor_end: dt.datetime | None = None
    executor_seconds: float | None = None
    final_state: str | None = None
    marks: dict[str, dt.datetime] = field(default_factory=dict)

    @property
    def executor_start(self) -> dt.datetime | None:
        if self.executor_end is None or self.executor_seconds is None:
            return None
        return self.executor_end - dt.timedelta(seconds=self.executor_seconds)

    def phases(self) -> dict[str, float] | None:
        """Seconds per phase of ``PHASES``; a phase whose end is unknown merges into the next."""
        ends = [
            self.running,
            self.marks.get("pre"),
            self.marks.get("parsed"),
            self.marks.get("prepared"),
            self.marks.get("post"),
            self.closed,
            self.executor_end,
        ]
        start = self.executor_start
        if start is None or self.executor_end is None:
            return None
        out: dict[str, float] = {}
        previous = start
        for (name, _), end in zip(PHASES, ends, strict=True):
            if end is None:
                out[name] = 0.0
                continue
            out[name] = max(0.0, (end - previous).total_seconds())
            previous = max(previous, end)
        return out


def log_events(url: str, run_id: str) -> dict[str, list[Event]]:
    """The worker start/stop rows of every task of the run, in order (same rows as the audit)."""
    engine = open_engine(url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                sa.select(LOG.c.task_id, LOG.c.event, LOG.c.dttm)
                .where(LOG.c.dag_id == DAG_ID, LOG.c.run_id == run_id, LOG.c.event.in_((WORKER_START, *WORKER_STOP)))
                .order_by(LOG.c.dttm, LOG.c.id)
            ).all()
    finally:
        engine.dispose()
    events: dict[str, list[Event]] = {}
    for row in rows:
        events.setdefault(row.task_id, []).append(Event(row.event, row.dttm))
    return events


WORKLOAD_FINISHED = re.compile(r"^(?P<at>\S+) .*Workload finished.*$", re.MULTILINE)


def executor_records(scheduler_log: str) -> dict[str, list[tuple[dt.datetime, float, str]]]:
    """``{ti_id: [(finished at, seconds, final state), ...]}`` from the executor's supervisors."""
    records: dict[str, list[tuple[dt.datetime, float, str]]] = {}
    for match in WORKLOAD_FINISHED.finditer(scheduler_log):
        line = match.group(0)
        fields = dict(re.findall(r"(\w+)=(\S+)", line))
        at = parse_time(match.group("at"))
        if at is None or "workload_id" not in fields or "duration" not in fields:
            continue
        records.setdefault(fields["workload_id"], []).append(
            (at, float(fields["duration"]), fields.get("final_state", "?"))
        )
    return records


#: Task-log lines that mark the end of a phase inside the task process.
TASK_LOG_MARKS = (
    ("pre", "::group::Pre Execute"),
    ("parsed", "Worker startup parse complete"),
    ("prepared", "::endgroup::"),
    ("post", "::group::Post Execute"),
)


def task_log_runs(path: Path) -> list[dict[str, dt.datetime]]:
    """The task processes one attempt's log file shows, each with its phase marks."""
    runs: list[dict[str, dt.datetime]] = []
    if not path.exists():
        return runs
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        at = parse_time(record.get("timestamp"))
        event = record.get("event")
        if at is None or not isinstance(event, str):
            continue
        if event == "::group::Pre Execute":
            runs.append({"pre": at})
            continue
        if runs and len(runs[-1]) < len(TASK_LOG_MARKS):
            name, text = TASK_LOG_MARKS[len(runs[-1])]  # the marks come in this order
            if event == text:
                runs[-1][name] = at
    return runs


@dataclass
class TaskResult:
    """One sensor of the run: the audit's figures and its worker runs."""

    task_id: str
    mode: str
    audit: dict[str, Any]
    ti: dict[str, Any]
    runs: list[WorkerRun]
    task_log_starts: int
    executor_starts: int
    reschedules: int
    end_after_target: float | None
    first_start_after_trigger: float | None

    @property
    def worker_s(self) -> float:
        return float(self.audit["worker_held_hours"]) * 3600

    @property
    def wall_s(self) -> float:
        return float(self.audit["wall_hours"]) * 3600

    @property
    def executor_s(self) -> float | None:
        if self.executor_starts != len(self.runs):
            return None
        return sum(run.executor_seconds or 0.0 for run in self.runs)


def wait_for_executor(airflow: LocalAirflow, wanted: dict[str, int], timeout: float = 30) -> dict[str, list[Any]]:
    """The executor's records, once every task instance id has ``wanted`` of them (or timeout).

    A supervisor writes "Workload finished" after the state the run waits for is recorded."""
    deadline = time.monotonic() + timeout
    while True:
        records = executor_records(airflow.log_tail("scheduler", chars=50_000_000))
        if all(len(records.get(ti_id, [])) >= count for ti_id, count in wanted.items()):
            return records
        if time.monotonic() > deadline:
            return records
        time.sleep(1)


def collect(airflow: LocalAirflow, ran: Ran, sensors: int) -> list[TaskResult]:
    """Read every measurement of the run; a mode that did not run as intended is an error."""
    expected = {f"{mode}_{number}": mode for mode in MODES for number in range(sensors)}
    if set(ran.watched.last) != set(expected):
        raise BenchmarkError(
            f"{DAG_ID} has tasks {sorted(ran.watched.last)}, expected {sorted(expected)}: "
            "benchmarks/dags/worker_slots.py and this script disagree"
        )
    url = f"sqlite:///{airflow.home / 'airflow.db'}"
    run_id = ran.watched.run_id
    rows = {row["task_id"]: row for row in run_audit(url, dag_ids=[DAG_ID], days=1).as_dict()["rows"]}
    events = log_events(url, run_id)
    starts = {
        ti["id"]: sum(e.name == WORKER_START for e in events.get(task, [])) for task, ti in ran.watched.last.items()
    }
    records = wait_for_executor(airflow, starts)
    logs = airflow.home / "logs" / f"dag_id={DAG_ID}" / f"run_id={run_id}"
    results: list[TaskResult] = []
    problems: list[str] = []
    for task_id, mode in expected.items():
        ti = ran.watched.last[task_id]
        row = rows.get(task_id)
        if row is None:
            problems.append(f"{task_id}: the audit found no finished try")
            continue
        if row["modes"] != [AUDIT_MODE[mode]] or row["estimated_runs"]:
            problems.append(f"{task_id}: held its wait as {row['modes']}, not {AUDIT_MODE[mode]!r}")
        task_events = events.get(task_id, [])
        closed_by = {event.at: event.name for event in task_events if event.name != WORKER_START}
        intervals = worker_intervals(task_events, parse_time(ti.get("end_date")))
        runs = [WorkerRun(opened, closed, closed_by.get(closed)) for opened, closed in intervals]
        executor = sorted(records.get(ti["id"], []))
        if len(executor) == len(runs):
            for run, (end, duration, state) in zip(runs, executor, strict=True):
                run.executor_end, run.executor_seconds, run.final_state = end, duration, state
        task_log = task_log_runs(logs / f"task_id={task_id}" / f"attempt={ti.get('try_number') or 1}.log")
        if len(task_log) == len(runs):
            for run, marks in zip(runs, task_log, strict=True):
                run.marks = marks
        results.append(
            TaskResult(
                task_id=task_id,
                mode=mode,
                audit=row,
                ti=ti,
                runs=runs,
                task_log_starts=len(task_log),
                executor_starts=len(executor),
                reschedules=sum(event.name == "up_for_reschedule" for event in task_events),
                end_after_target=seconds(ran.target, parse_time(ti.get("end_date"))),
                first_start_after_trigger=seconds(ran.triggered, runs[0].executor_start if runs else None),
            )
        )
    if problems:
        raise BenchmarkError("a mode did not run as intended:\n  " + "\n  ".join(problems))
    return results


# ------------------------------------------------------------------------ summarizing
def mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def max_concurrent(results: Sequence[TaskResult]) -> int:
    """Most worker slots held at the same moment (executor intervals), to check parallelism."""
    edges: list[tuple[dt.datetime, int]] = []
    for result in results:
        for run in result.runs:
            if run.executor_start is not None and run.executor_end is not None:
                edges += [(run.executor_start, 1), (run.executor_end, -1)]
    held = peak = 0
    for _, step in sorted(edges, key=lambda edge: (edge[0], edge[1])):
        held += step
        peak = max(peak, held)
    return peak


def phase_summary(results: Sequence[TaskResult]) -> list[dict[str, Any]]:
    """Mean seconds per phase, per mode, for the first worker run and for the later ones."""
    out = []
    for mode in MODES:
        for label, pick in (("first", slice(0, 1)), ("later", slice(1, None))):
            runs = [run for result in results if result.mode == mode for run in result.runs[pick]]
            phased = [phases for run in runs if (phases := run.phases()) is not None]
            if not runs:
                continue
            entry: dict[str, Any] = {"mode": mode, "worker_run": label, "runs": len(runs), "with_phases": len(phased)}
            for name, _ in PHASES:
                entry[name] = rounded(mean([phases[name] for phases in phased]))
            entry["executor_s"] = rounded(mean([sum(phases.values()) for phases in phased]))
            entry["log_table_s"] = rounded(mean([seconds(run.running, run.closed) or 0.0 for run in runs]))
            out.append(entry)
    return out


def summarize(results: Sequence[TaskResult]) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Per-mode figures and the targets (share of poke mode's worker-occupied seconds)."""
    modes: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        tasks = [result for result in results if result.mode == mode]
        worker = [task.worker_s for task in tasks]
        executor = [task.executor_s for task in tasks]
        known = [value for value in executor if value is not None]
        modes[mode] = {
            "sensors": len(tasks),
            "worker_s_total": rounded(sum(worker)),
            "worker_s_per_sensor": rounded(mean(worker)),
            "worker_s_per_sensor_max": rounded(max(worker)),
            "executor_s_total": rounded(sum(known)) if len(known) == len(tasks) else None,
            "executor_s_per_sensor": rounded(mean(known)) if len(known) == len(tasks) else None,
            "tries": sum(int(task.audit["runs"]) for task in tasks),
            "reschedules": sum(task.reschedules for task in tasks),
            "worker_starts": sum(int(task.audit["worker_runs"]) for task in tasks),
            "worker_starts_task_log": sum(task.task_log_starts for task in tasks),
            "worker_starts_executor": sum(task.executor_starts for task in tasks),
            "wall_s_per_task": rounded(mean([task.wall_s for task in tasks])),
            "wall_s_per_task_max": rounded(max(task.wall_s for task in tasks)),
            "end_after_target_s": rounded(mean([t.end_after_target for t in tasks if t.end_after_target is not None])),
            "first_start_after_trigger_s": rounded(
                mean([t.first_start_after_trigger for t in tasks if t.first_start_after_trigger is not None])
            ),
        }
    poke, poke_executor = modes["poke"]["worker_s_total"], modes["poke"]["executor_s_total"]
    for figures in modes.values():
        figures["pct_of_poke"] = rounded(100 * figures["worker_s_total"] / poke) if poke else None
        executor = figures["executor_s_total"]
        figures["executor_pct_of_poke"] = (
            rounded(100 * executor / poke_executor) if executor is not None and poke_executor else None
        )
    targets = []
    for mode, limit in TARGETS.items():
        pct, executor_pct = modes[mode]["pct_of_poke"], modes[mode]["executor_pct_of_poke"]
        targets.append(
            {
                "mode": mode,
                "ratio_to_poke": rounded(pct / 100, 5) if pct is not None else None,
                "pct_of_poke": pct,
                "limit_pct": limit,
                "met": pct is not None and pct <= limit,
                "executor_pct_of_poke": executor_pct,
                "executor_met": executor_pct is not None and executor_pct <= limit,
            }
        )
    return modes, targets


def task_detail(result: TaskResult) -> dict[str, Any]:
    return {
        "mode": result.mode,
        "ti_id": result.ti.get("id"),
        "start_date": result.ti.get("start_date"),
        "end_date": result.ti.get("end_date"),
        "worker_s": rounded(result.worker_s),
        "executor_s": rounded(result.executor_s),
        "wall_s": rounded(result.wall_s),
        "end_after_target_s": rounded(result.end_after_target),
        "first_start_after_trigger_s": rounded(result.first_start_after_trigger),
        "worker_runs": [
            {
                "running": run.running.isoformat(),
                "closed": run.closed.isoformat() if run.closed else None,
                "closed_by": run.closed_by,
                "log_table_s": rounded(seconds(run.running, run.closed)),
                "executor_s": rounded(run.executor_seconds),
                "final_state": run.final_state,
                "phases": {k: rounded(v) for k, v in (run.phases() or {}).items()},
            }
            for run in result.runs
        ],
    }


# ----------------------------------------------------------------------- environment
def machine_info() -> dict[str, Any]:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "?",
    )
    mem_kb = next(
        (
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal:")
        ),
        0,
    )
    return {
        "platform": platform.platform(),
        "cpu_model": model,
        "cpus": os.cpu_count(),
        "memory_gb": round(mem_kb / 1024 / 1024, 1),
        "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
    }


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in (
        "apache-airflow",
        "apache-airflow-core",
        "apache-airflow-task-sdk",
        "airflow-deferrable-kit",
        "sqlalchemy",
    ):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    try:
        found["git_commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        found["git_commit"] = None
    return found


def command_line(argv: Sequence[str]) -> str:
    python = Path(sys.executable)
    with_root = python.absolute()
    try:
        shown = str(with_root.relative_to(Path.cwd()))
    except ValueError:
        shown = str(python)
    return f"PYTHONPATH=. {shown} -m benchmarks.worker_slots {shlex.join(argv)}".rstrip()


# -------------------------------------------------------------------------- rendering
def grid(header: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    """A plain table: the first column left-aligned, the rest right-aligned."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *lines, strict=True)]

    def render(cells: Sequence[str]) -> str:
        return "  ".join(
            str(cell).ljust(width) if index == 0 else str(cell).rjust(width)
            for index, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([render(header), render(["-" * width for width in widths]), *map(render, lines)])


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def render(result: dict[str, Any]) -> str:
    params, modes, run = result["parameters"], result["modes"], result["run"]
    verdict = {target["mode"]: target for target in result["targets"]}
    lines = []
    for mode in MODES:
        figures = modes[mode]
        target = verdict.get(mode)
        lines.append(
            [
                mode,
                str(figures["sensors"]),
                fmt(figures["worker_s_total"]),
                fmt(figures["worker_s_per_sensor"], 2),
                fmt(figures["executor_s_per_sensor"], 2),
                str(figures["tries"]),
                str(figures["reschedules"]),
                str(figures["worker_starts"]),
                fmt(figures["wall_s_per_task"]),
                fmt(figures["end_after_target_s"]),
                fmt(figures["pct_of_poke"], 2),
                f"<= {target['limit_pct']:g} %: {'met' if target['met'] else 'MISSED'}" if target else "",
            ]
        )
    header = [
        "mode",
        "sensors",
        "worker-occupied s",
        "per sensor",
        "executor s/sensor",
        "tries",
        "reschedules",
        "worker starts",
        "wall s/task",
        "end-target s",
        "% of poke",
        "target",
    ]
    out = [
        f"Worker slots on a real Airflow {result['versions'].get('apache-airflow')}: "
        f"{params['sensors']} sensors per mode, wait {params['wait_s']:g} s, "
        f"poke/poll interval {params['poke_interval_s']:g} s, LocalExecutor parallelism {params['parallelism']} "
        f"(at most {result['max_concurrent_worker_slots']} slots held at once)",
        "",
        grid(header, lines),
        "",
        f"Run: {fmt(run['run_wall_s'])} s from the DAG run's start to its end; triggered {run['triggered']}, "
        f"target {run['target']}; first worker runs started {fmt(run['first_starts_after_trigger_s'][0])} to "
        f"{fmt(run['first_starts_after_trigger_s'][1])} s after the trigger; machine CPU busy {run['cpu_busy_pct']} %, "
        f"load average (1 min) up to {run['load_avg_1m_max']} on {result['machine']['cpus']} CPUs",
    ]
    for target in result["targets"]:
        out.append(
            f"Target {target['mode']}/poke <= {target['limit_pct']:g} %: {fmt(target['pct_of_poke'], 2)} % "
            f"{'met' if target['met'] else 'MISSED'} (executor-measured: {fmt(target['executor_pct_of_poke'], 2)} %, "
            f"{'met' if target['executor_met'] else 'missed'})"
        )
    starts = {
        mode: (
            modes[mode]["worker_starts"],
            modes[mode]["worker_starts_task_log"],
            modes[mode]["worker_starts_executor"],
        )
        for mode in MODES
    }
    mismatched = {mode: counts for mode, counts in starts.items() if len(set(counts)) > 1}
    out.append(
        "Worker starts agree in the log table, the task logs and the executor's log"
        if not mismatched
        else f"Worker starts DISAGREE (log table, task logs, executor): {mismatched}"
    )
    if params["wait_s"] != TARGET_WAIT:
        out.append(f"(the targets are defined for a {TARGET_WAIT:g} s wait; this run waited {params['wait_s']:g} s)")
    phase_header = ["mode", "worker run", "n", *(name for name, _ in PHASES), "executor s", "log-table s"]
    phase_lines = [
        [
            p["mode"],
            p["worker_run"],
            str(p["runs"]),
            *(fmt(p[name], 2) for name, _ in PHASES),
            fmt(p["executor_s"], 2),
            fmt(p["log_table_s"], 2),
        ]
        for p in result["phases"]
    ]
    out += [
        "",
        "Where a worker run's seconds go (mean per run; executor s = the phases' sum; log-table s = the "
        "running row to the row that ended the hold):",
        "",
        grid(phase_header, phase_lines),
        "",
    ]
    out += [f"  {name}: {meaning}" for name, meaning in PHASES]
    return "\n".join(out)


# ------------------------------------------------------------------------------- main
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="benchmarks.worker_slots", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sensors", type=int, default=4, help="sensors per mode (M); default 4")
    parser.add_argument("--wait", type=float, default=300.0, help="seconds from the trigger to the target (W)")
    parser.add_argument("--poke-interval", type=float, default=30.0, help="poke interval = trigger poll interval")
    parser.add_argument("--timeout", type=float, help="each sensor's timeout; default wait + 600 s")
    parser.add_argument("--parallelism", type=int, help="LocalExecutor parallelism; default 4 x sensors")
    parser.add_argument("--out", type=Path, default=OUT, help=f"the JSON results (default {OUT.relative_to(ROOT)})")
    parser.add_argument("--keep-home", action="store_true", help="keep the throw-away AIRFLOW_HOME to inspect")
    parser.add_argument("--patience", type=float, default=600.0, help="seconds to wait for a quiet machine")
    parser.add_argument("--allow-busy", action="store_true", help="measure on a busy machine; marked busy")
    args = parser.parse_args(argv)
    if args.sensors < 1:
        parser.error("--sensors must be at least 1")
    if not args.wait > 0 or not args.poke_interval > 0:
        parser.error("--wait and --poke-interval must be positive")
    if args.parallelism is not None and args.parallelism < 4 * args.sensors:
        parser.error(f"--parallelism must cover 4 x --sensors = {4 * args.sensors} tasks at once")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    settings = Settings(
        sensors=args.sensors,
        wait=args.wait,
        poke_interval=args.poke_interval,
        timeout=args.timeout if args.timeout is not None else args.wait + 600,
        parallelism=args.parallelism or 4 * args.sensors,
    )
    machine = machine_info()
    try:
        with quiet_cell(patience=args.patience, allow_busy=args.allow_busy) as quiet:
            return measure(argv, args, settings, {**machine, **quiet})
    except MachineBusy as busy:
        print(f"worker_slots: refused, {busy}", file=sys.stderr)
        return 3


def measure(argv: Sequence[str], args: argparse.Namespace, settings: Settings, machine: dict[str, Any]) -> int:
    """The measured run (alone on a quiet machine: see benchmarks/quiet.py)."""
    airflow = LocalAirflow(dags_folder=DAGS, extra_env=settings.env)
    began = time.monotonic()
    keep = args.keep_home
    try:
        try:
            airflow.start()
        except ServiceUnavailable as exc:
            keep = True
            print(f"worker_slots: error: Airflow could not start: {exc}", file=sys.stderr)
            return 2
        print(f"Airflow up in {time.monotonic() - began:.0f} s; warm-up run ...", file=sys.stderr, flush=True)
        warmup = run_dag(airflow, WARMUP_DAG_ID, WARMUP_WAIT, timeout=WARMUP_WAIT + 300)
        print(
            f"Measured run: {len(MODES) * settings.sensors} sensors, wait {settings.wait:g} s ...",
            file=sys.stderr,
            flush=True,
        )
        sampler = CpuSampler()
        ran = run_dag(
            airflow, DAG_ID, settings.wait, timeout=settings.wait + 4 * settings.poke_interval + 300, sampler=sampler
        )
        conditions = sampler.result()
        results = collect(airflow, ran, settings.sensors)
    except BenchmarkError as exc:
        keep = True
        print(f"worker_slots: error: {exc}", file=sys.stderr)
        return 1
    finally:
        airflow.stop()
        if keep:
            print(f"Airflow home kept at {airflow.home}", file=sys.stderr)
        else:
            shutil.rmtree(airflow.home, ignore_errors=True)
    modes, targets = summarize(results)
    starts = [r.first_start_after_trigger for r in results if r.first_start_after_trigger is not None]
    result = {
        "benchmark": "worker_slots",
        "command": command_line(argv),
        "finished_utc": now().isoformat(timespec="seconds"),
        "elapsed_s": round(time.monotonic() - began, 1),
        "parameters": {
            "sensors": settings.sensors,
            "wait_s": settings.wait,
            "poke_interval_s": settings.poke_interval,
            "sensor_timeout_s": settings.timeout,
            "parallelism": settings.parallelism,
            "warmup_wait_s": WARMUP_WAIT,
            "metadata_db": "sqlite",
            "executor": "LocalExecutor",
        },
        "machine": machine,
        "versions": versions(),
        "run": {
            "dag_id": DAG_ID,
            "run_id": ran.watched.run_id,
            "triggered": ran.triggered.isoformat(),
            "target": ran.target.isoformat(),
            "start_date": ran.run.get("start_date"),
            "end_date": ran.run.get("end_date"),
            "run_wall_s": rounded(seconds(parse_time(ran.run.get("start_date")), parse_time(ran.run.get("end_date")))),
            "first_starts_after_trigger_s": [
                rounded(min(starts, default=None)),
                rounded(max(starts, default=None)),
            ],
            **conditions,
            "warmup_states": warmup.watched.states,
        },
        "max_concurrent_worker_slots": max_concurrent(results),
        "modes": modes,
        "targets": targets,
        "phases": phase_summary(results),
        "phase_meanings": dict(PHASES),
        "tasks": {result.task_id: task_detail(result) for result in results},
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(render(result))
    print(f"\nWrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
