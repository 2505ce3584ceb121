"""The ``airflow-deferrable-kit`` command.

``audit`` reads an Airflow 3 metadata database and reports, per task / DAG / operator, how much
worker-slot time went to waiting, which sensors are worth moving to a deferrable wait, and what
each sensor's next change would save, in the chosen format on stdout and, with ``--html FILE``,
as one self-contained HTML page. See ``docs/audit.md``. Exit codes: 0 done, 1 the audit could not run, 2 a bad argument.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import TextIO

from airflow_deferrable_kit.audit import AuditError, AuditUsageError, Progress, render_html, run_audit

PROG = "airflow-deferrable-kit"


def _number(text: str, *, what: str, positive: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of {what}, got {text!r}") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        kind = "positive" if positive else "non-negative"
        raise argparse.ArgumentTypeError(f"must be a {kind} number of {what}, got {text!r}")
    return value


def _days(text: str) -> float:
    return _number(text, what="days", positive=True)


def _price(text: str) -> float:
    return _number(text, what="currency units per slot-hour", positive=False)


def _seconds(text: str) -> float:
    return _number(text, what="seconds", positive=False)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Tools for airflow-deferrable-kit.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    audit = commands.add_parser(
        "audit",
        help="how many worker-slot hours your sensors spend waiting, from the metadata DB",
        description="Read an Airflow 3 metadata database (read-only) and report, for the last N days, runs, "
        "wall hours, worker-held hours, idle-held hours and their cost per task, DAG or operator; rank the "
        "sensors worth migrating and name their equivalent in this kit.",
    )
    audit.add_argument(
        "--sql-alchemy-conn",
        metavar="URL",
        help="metadata DB URL (default: Airflow's [database] sql_alchemy_conn)",
    )
    audit.add_argument("--days", type=_days, default=7.0, help="look back this many days (default: 7)")
    audit.add_argument(
        "--price-per-slot-hour",
        "--price",
        dest="price",
        type=_price,
        default=1.0,
        help="cost of one worker slot for one hour (default: 1, so cost reads as slot-hours)",
    )
    audit.add_argument("--by", choices=("task", "dag", "operator"), default="task", help="one row per (default: task)")
    audit.add_argument("--format", choices=("table", "csv", "json"), default="table", help="output (default: table)")
    audit.add_argument(
        "--top", type=_count, default=10, help="migration candidates to list in table/JSON (default: 10)"
    )
    audit.add_argument(
        "--check-seconds",
        type=_seconds,
        default=5.0,
        help="worker time one check legitimately needs; a sensor's time beyond it is idle (default: 5)",
    )
    audit.add_argument("--dag-id", action="append", dest="dag_ids", metavar="DAG_ID", help="only this DAG (repeatable)")
    audit.add_argument(
        "--run-id", action="append", dest="run_ids", metavar="RUN_ID", help="only this DAG run (repeatable)"
    )
    audit.add_argument(
        "--listeners",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="whether the deployment has listener plugins (OpenLineage, load_examples' example listener); "
        "Airflow refuses end_from_trigger with them (default: what the metadata DB shows, else advised on condition)",
    )
    audit.add_argument(
        "--html",
        type=Path,
        metavar="FILE",
        help="also write a one-page HTML report (chart, savings, advice, totals) to FILE",
    )
    audit.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress on stderr (default: only when stderr is a terminal)",
    )
    audit.set_defaults(subparser=audit)
    return parser


class ProgressPrinter:
    """Progress on stderr: one rewritten line on a terminal, throttled plain lines otherwise."""

    def __init__(self, stream: TextIO, *, interval: float = 1.0) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.interval = interval
        self._last = -math.inf
        self._printed = False

    def __call__(self, progress: Progress) -> None:
        finished = progress.dags_done == progress.dags_total
        now = time.monotonic()
        if not finished and now - self._last < self.interval:
            return
        self._last = now
        text = f"audit: {progress.dags_done}/{progress.dags_total} DAGs, {progress.tries:,} task tries read"
        if self.tty:
            self.stream.write("\r" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self._printed = True

    def close(self) -> None:
        if self.tty and self._printed:
            self.stream.write("\n")
            self.stream.flush()


def _audit(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    show_progress = sys.stderr.isatty() if args.progress is None else args.progress
    printer = ProgressPrinter(sys.stderr) if show_progress else None
    try:
        report = run_audit(
            args.sql_alchemy_conn,
            days=args.days,
            price=args.price,
            group_by=args.by,
            check_seconds=args.check_seconds,
            dag_ids=args.dag_ids,
            run_ids=args.run_ids,
            progress=printer,
            listeners=args.listeners,
        )
    except AuditUsageError as exc:
        parser.print_usage(sys.stderr)
        sys.stderr.write(f"{parser.prog}: error: {exc}\n")
        return 2
    except AuditError as exc:
        sys.stderr.write(f"{parser.prog}: error: {exc}\n")
        return 1
    finally:
        if printer is not None:
            printer.close()
    if args.html is not None:
        try:
            args.html.write_text(render_html(report, top=args.top), encoding="utf-8")
        except OSError as exc:
            sys.stderr.write(f"{parser.prog}: error: could not write --html {args.html}: {exc.strerror or exc}\n")
            return 1
    if args.format == "json":
        sys.stdout.write(report.to_json(top=args.top) + "\n")
    elif args.format == "csv":
        sys.stdout.write(report.to_csv())
    else:
        sys.stdout.write(report.to_table(top=args.top))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code instead of exiting."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help (0) and on bad arguments (2)
        return exc.code if isinstance(exc.code, int) else 2
    if args.command == "audit":
        return _audit(args, args.subparser)
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
