"""Run the triggerer-load matrix and write ``results.json`` and the tables of ``RESULTS.md``.

Each cell is one ``triggerer_load.py`` process (kit and official side by side per kind and N,
on fresh servers of the same kind). ``--plan`` picks the cells:

* ``small``: N=100 and N=1,000, every kind, kit and official, poll 5 s, hold 10 s.
* ``large``: N=10,000, every kind, poll 30 s, hold 30 s (kit; ``--official`` adds official).
* ``baseline``: N=0 (the 10 ms lag ticker alone), subtracted from every CPU figure.
* ``kafka``: the two Kafka layouts on a broker holding 5,000 unrelated topics: every wait on
  one topic (``kafka``) and one topic per wait (``kafka-topics``); kit and official at N=100,
  the kit at N=1,000 and at N=10,000 (over 1,000 topics for ``kafka-topics``).

* ``floor``: Airflow's own runner with N triggers that only sleep (N=100, 1,000 and 10,000): what
  the triggerer itself costs per waiting trigger and per event, whatever the trigger.
* ``all``: every plan above, official triggers at N=10,000 included: the whole matrix in one
  command (see RESULTS.md "Commands" for its running time).

Every cell runs on the triggerer-faithful harness (``--harness airflow``: each wait deferred by
its sensor, run by Airflow's own ``TriggerRunner``, the hold starting once every wait has made
its first poll); ``--harness plain`` reruns the previous method. ``--report`` only rewrites the
tables from ``results.json``. Results accumulate in ``results.json`` (one object per run; a
re-run of a cell replaces it); the tables show one harness (``--harness``).

    PYTHONPATH=. python benchmarks/run_all.py --plan all
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.quiet import MachineBusy, quiet_cell
from benchmarks.triggerer_load import HOLD_PREFIX, KINDS, POLL_IS_ONE_REQUEST

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results.json"
REPORT = HERE / "RESULTS.md"
START, END = "<!-- tables:start -->", "<!-- tables:end -->"

OFFICIAL_NAME = {
    "s3": "amazon S3KeyTrigger",
    "s3-one-prefix": "amazon S3KeyTrigger (wildcard)",
    "s3-shared-prefix": "amazon S3KeyTrigger",
    "s3-run-prefix": "amazon S3KeyTrigger",
    "http": "http HttpSensorTrigger",
    "http-one-url": "http HttpSensorTrigger (one URL)",
    "postgres": "naive one-connection-per-wait trigger (benchmarks/naive_postgres.py)",
    "postgres-tables": "naive one-connection-per-wait trigger (benchmarks/naive_postgres.py)",
    "kafka": "apache-kafka AwaitMessageTrigger",
    "kafka-topics": "apache-kafka AwaitMessageTrigger",
    "datetime": "standard DateTimeTrigger",
}
LATENCY_TARGET = {"kafka": 0.2, "kafka-topics": 1.0, "datetime": 0.2}  # absolute; others: poll interval + 0.5 s
CPU_TARGET = {"datetime": 2.0, "kafka-topics": 20.0}  # % of one core; others 50 %
RSS_TARGET = {"kafka-topics": 30.0}  # KB per waiting trigger; others 20
#: Sockets bounded by the brokers, not the topics: the process's own 2 plus 4 clients per broker (one here).
SOCKET_TARGET = {"kafka-topics": 6}
#: Unrelated topics on the broker in the ``kafka`` plan.
UNRELATED_TOPICS = 5000
MIN_CPU_PCT = 1.0  # below this share of a core a CPU ratio is noise on this VM


PLANS = ("baseline", "floor", "small", "large", "kafka")
#: Lag target: Airflow's triggerer warns when its loop is blocked longer than this (``[triggerer]
#: blocked_main_thread_warning_threshold``, 0.2 s).
LAG_TARGET_MS = 200.0


def cells(plan: str, official_large: bool, kinds: list[str], explicit: bool = False) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if plan == "all":
        for each in PLANS:
            out += cells(each, True, kinds, explicit)
        # Not at N=10,000: the official Kafka trigger (it fired 0 of 100 waits already) and the official
        # S3 trigger (a client per wait: ~1.5 MB each, 15 GB at 10,000 on a 24 GB machine).
        return [
            c
            for c in out
            if not (c["n"] == 10000 and c["impl"] == "official" and c["kind"].startswith(("kafka", "s3")))
        ]
    if plan == "baseline":
        return [{"kind": "datetime", "impl": "kit", "n": 0, "poll": 5.0, "hold": 10.0, "warmup": 3.0}]
    if plan == "floor":
        return [
            {"kind": "datetime", "impl": "floor", "n": n, "poll": poll, "hold": hold, "warmup": 0.0}
            for n, poll, hold in ((100, 5.0, 10.0), (1000, 5.0, 10.0), (10000, 30.0, 30.0))
        ]
    if plan == "small":
        for n in (100, 1000):
            for kind in kinds:
                for impl in ("kit", "official"):  # every kind has its official anchor
                    out.append({"kind": kind, "impl": impl, "n": n, "poll": 5.0, "hold": 10.0, "warmup": 0.0})
    if plan == "kafka":
        small = {"poll": 5.0, "hold": 10.0, "warmup": 0.0, "unrelated": UNRELATED_TOPICS}
        large = {"poll": 30.0, "hold": 30.0, "warmup": 0.0, "unrelated": UNRELATED_TOPICS}
        for kind in ("kafka-topics", "kafka"):
            for impl in ("kit", "official"):
                out.append({"kind": kind, "impl": impl, "n": 100, **small})
        out.append({"kind": "kafka-topics", "impl": "kit", "n": 1000, **small})
        out.append({"kind": "kafka", "impl": "kit", "n": 1000, **small})
        out.append({"kind": "kafka-topics", "impl": "kit", "n": 10000, "topics": 1000, **large})
        out.append({"kind": "kafka", "impl": "kit", "n": 10000, **large})
        return [cell for cell in out if cell["kind"] in kinds]
    if plan == "large":
        # The all-keys-under-one-prefix layout is the most expensive: run it last, and only when
        # asked by name (--kind s3-one-prefix): at N=1,000 it already saturated the loop.
        for kind in sorted(kinds, key=lambda k: k == "s3-one-prefix"):
            if kind == "s3-one-prefix" and not explicit:
                continue
            for impl in ("kit", "official") if official_large else ("kit",):
                out.append({"kind": kind, "impl": impl, "n": 10000, "poll": 30.0, "hold": 30.0, "warmup": 0.0})
    return out


def load() -> list[dict[str, Any]]:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else []


def harness_of(r: dict[str, Any]) -> str:
    """Runs from before the triggerer-faithful harness carry no ``harness``: they are ``plain``."""
    return str(r.get("harness", "plain"))


def key(r: dict[str, Any]) -> tuple[Any, ...]:
    """What a run measures: a re-run replaces it. Baseline runs (N=0) are kept, one per session."""
    session = r.get("finished_utc", "")[:13] if r["n"] == 0 else ""
    return (r["kind"], r["impl"], r["n"], float(r["poll_interval"]), bool(r.get("freeze_gc")), session, harness_of(r))


def run_cell(
    cell: dict[str, Any],
    python: str,
    timeout: float,
    harness: str = "airflow",
    *,
    patience: float = 600.0,
    allow_busy: bool = False,
) -> dict[str, Any]:
    """One cell, alone on a quiet machine (see :mod:`benchmarks.quiet`), or refused."""
    try:
        with quiet_cell(patience=patience, allow_busy=allow_busy) as machine:
            result = _run_cell(cell, python, timeout, harness)
    except MachineBusy as busy:
        result = {"kind": cell["kind"], "impl": cell["impl"], "n": cell["n"], "poll_interval": cell["poll"]}
        result.update(harness=harness, error=f"refused: {busy}", refused=True, machine_before=busy.state.as_dict())
        print(json.dumps(result)[:400], flush=True)
        return result
    result.update(machine)
    return result


def _run_cell(cell: dict[str, Any], python: str, timeout: float, harness: str) -> dict[str, Any]:
    datetime_startup = (
        ["--datetime-startup", str(10 + cell["n"] / 250)] if cell["kind"] == "datetime" and harness == "airflow" else []
    )
    cmd = [
        python,
        "-m",
        "benchmarks.triggerer_load",
        "--kind",
        cell["kind"],
        "--impl",
        cell["impl"],
        "--n",
        str(cell["n"]),
        "--poll-interval",
        str(cell["poll"]),
        "--hold",
        str(cell["hold"]),
        "--warmup",
        str(cell["warmup"]),
        *(["--freeze-gc"] if cell.get("freeze_gc") else []),
        *(["--topics", str(cell["topics"])] if cell.get("topics") else []),
        *(["--unrelated-topics", str(cell["unrelated"])] if cell.get("unrelated") else []),
        "--harness",
        harness,
        *datetime_startup,
    ]
    started = time.time()
    print("$", "PYTHONPATH=.", *cmd[1:], flush=True)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if lines:
            result: dict[str, Any] = json.loads(lines[-1])
        else:
            result = {"error": (proc.stderr or proc.stdout)[-1500:], "returncode": proc.returncode}
    except subprocess.TimeoutExpired as exc:
        result = {"error": f"did not finish within {timeout:.0f} s", **steady_figures(exc.stderr)}
        reap_orphans()
    result.setdefault("kind", cell["kind"])
    result.setdefault("impl", cell["impl"])
    result.setdefault("n", cell["n"])
    result.setdefault("poll_interval", cell["poll"])
    result.setdefault("freeze_gc", bool(cell.get("freeze_gc")))
    result.setdefault("harness", harness)
    result["command"] = "PYTHONPATH=. python " + " ".join(cmd[1:])
    result["wall_s"] = round(time.time() - started, 1)
    result["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(json.dumps(result)[:400], flush=True)
    return result


def steady_figures(stderr: str | bytes | None) -> dict[str, Any]:
    """The hold-phase figures a cell printed before it was killed, if it got that far."""
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr or ""
    for line in reversed(text.splitlines()):
        if line.startswith(HOLD_PREFIX):
            figures: dict[str, Any] = json.loads(line[len(HOLD_PREFIX) :])
            return figures
    return {}


def reap_orphans() -> None:
    """After a killed cell: stop the bench servers and flipper it started (now orphans, by pid)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == 1 and ("benchmarks.servers" in cmdline or "benchmarks.triggerer_load --flipper" in cmdline):
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGTERM)


# ------------------------------------------------------------------------------- report
def ticker_pct(results: list[dict[str, Any]], r: dict[str, Any] | None = None) -> float:
    """The lag ticker's own CPU, from the baseline run closest in time to ``r`` (the latest if none)."""
    base = [b for b in results if b["n"] == 0 and "cpu_core_pct" in b]
    if not base:
        return 0.0
    if r is None or "finished_utc" not in r:
        return float(base[-1]["cpu_core_pct"])
    when = r["finished_utc"]
    nearest = min(base, key=lambda b: abs(_epoch(b.get("finished_utc", when)) - _epoch(when)))
    return float(nearest["cpu_core_pct"])


def _epoch(stamp: str) -> float:
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))


def marginal_kb(done: list[dict[str, Any]], kind: str, impl: str) -> float | None:
    """RSS growth per extra waiting trigger between the N=100 and N=1,000 runs."""
    runs = {r["n"]: r for r in done if r["kind"] == kind and r["impl"] == impl}
    if 100 not in runs or 1000 not in runs:
        return None
    grow = [runs[n]["rss_hold_kb"] - runs[n]["rss_base_kb"] for n in (100, 1000)]
    return (grow[1] - grow[0]) / 900


def net_pct(r: dict[str, Any], ticker: float) -> float:
    return max(r["cpu_core_pct"] - ticker, 0.0)


def net_per_poll_ms(r: dict[str, Any], ticker: float) -> float | None:
    """CPU per poll net of the ticker: per poll made when the server counted them, else per poll due."""
    made = r.get("polls_made") if r["kind"] in POLL_IS_ONE_REQUEST else None
    polls = made or r["n"] * r["hold_s"] / r["poll_interval"]
    return 1000 * net_pct(r, ticker) / 100 * r["hold_s"] / polls if polls else None


def label(r: dict[str, Any]) -> str:
    """The kind, with the Kafka layout: how many topics the waits spread over, and the others."""
    if not r["kind"].startswith("kafka") or "topics" not in r:
        return str(r["kind"])
    extra = f"{r['topics']:,} topic{'s' if r['topics'] != 1 else ''}"
    if r.get("unrelated_topics"):
        extra += f", +{r['unrelated_topics']:,} unrelated"
    return f"{r['kind']} ({extra})"


#: Runs further apart than this are from different sessions (a session's cells span a few hours).
SESSION_HOURS = 6.0


def apart(r: dict[str, Any], o: dict[str, Any]) -> bool:
    """Whether two runs are from different sessions, so that a ratio of them compares two VMs."""
    if "finished_utc" not in r or "finished_utc" not in o:
        return False
    return abs(_epoch(r["finished_utc"]) - _epoch(o["finished_utc"])) > SESSION_HOURS * 3600


def finished_at(r: dict[str, Any]) -> str:
    """When a run finished (UTC, to the minute): the session each figure comes from."""
    stamp = str(r.get("finished_utc", ""))
    return f"{stamp[:10]} {stamp[11:16]}" if stamp else "-"


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def ok(flag: bool | None) -> str:
    return "-" if flag is None else ("met" if flag else "**missed**")


def tables(results: list[dict[str, Any]]) -> str:
    def ticker(r: dict[str, Any]) -> float:
        return ticker_pct(results, r)

    baselines = sorted({f"{ticker_pct(results, b):.2f}" for b in results if b["n"] == 0 and "cpu_core_pct" in b})
    current = harness_of(results[0]) if results else "airflow"
    done = [r for r in results if "events" in r and r["n"] > 0 and r["impl"] != "floor"]
    floors = {r["n"]: r for r in results if r["impl"] == "floor" and "cpu_core_pct" in r}
    failed = [r for r in results if "error" in r or r.get("steady_state") is False]
    lines = [
        "CPU figures are net of the 10 ms lag ticker itself, measured with N=0 in the same session as "
        f"each run ({' and '.join(baselines) or '0'} % of a core).",
        "",
        "### Every run",
        "",
        "| kind | impl | N | poll s | start-up s (first polls) | hold s | CPU % core (raw) | CPU ms/poll "
        "(polls made / due) | RSS KB/trigger | objects/wait | sockets max | "
        "events/N | latency p50 / p99 / max s | loop lag max ms (startup) | GC pause max ms (full GCs) | "
        "measured (UTC) |",
        "|---|---|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---|---|---|---|",
    ]
    for r in sorted(done, key=lambda r: (r["n"], KINDS.index(r["kind"]), r["impl"], bool(r.get("freeze_gc")))):
        impl = r["impl"] + (", gc frozen" if r.get("freeze_gc") else "")
        impl += " (**busy machine**)" if r.get("busy") else ""
        gc_text = f"{r['gc_pause_max_ms']} ({r['gc_full_collections']})" if "gc_pause_max_ms" in r else "-"
        startup = f"{fmt(r['startup_s'])} ({r['startup_first_polls']:,}/{r['n']:,})" if "startup_s" in r else "warm-up"
        made = f"{r['polls_made']:,}" if r.get("polls_made") is not None else "-"
        lines.append(
            f"| {label(r)} | {impl} | {r['n']:,} | {fmt(r['poll_interval'])} | {startup} | {fmt(r['hold_s'])} | "
            f"{net_pct(r, ticker(r)):.2f} ({r['cpu_core_pct']:.1f}) | {fmt(net_per_poll_ms(r, ticker(r)))} "
            f"({made} / {r['polls_due']:,}) | "
            f"{fmt(r['rss_per_trigger_kb'])} | {fmt(r.get('objects_per_wait'))} | "
            f"{r['sockets_max']} | {r['events']:,}/{r['n']:,} | {fmt(r['latency_p50_s'])} / "
            f"{fmt(r['latency_p99_s'])} / {fmt(r['latency_max_s'])} | {r['lag_max_ms']} ({r['lag_max_startup_ms']}) | "
            f"{gc_text} | {finished_at(r)} |"
        )
    for r in failed:
        if r.get("steady_state") is False:
            reason = (
                f"never reached a steady state: {r.get('startup_first_polls', 0):,} of {r['n']:,} waits "
                f"made a first poll ({r.get('startup_probe', '')}) within {fmt(r.get('startup_s'))} s, using "
                f"{r.get('cpu_startup_core_pct', 0):.0f} % of a core; not measured"
                + (f" ({r['startup_note']})" if r.get("startup_note") else "")
            )
        else:
            reason = f"did not complete: {r['error'][:150]!r}{while_waiting(r)}"
        lines.append(
            f"| {label(r)} | {r['impl']} | {r['n']:,} | {fmt(float(r['poll_interval']))} | {reason} |||||||||| "
            f"{finished_at(r)} |"
        )
    for n, f in sorted(floors.items()):
        lines.append(
            f"| Airflow's runner alone (triggers that only sleep) | floor | {n:,} | {fmt(f['poll_interval'])} | "
            f"{fmt(f.get('startup_s'))} | {fmt(f['hold_s'])} | {net_pct(f, ticker(f)):.2f} ({f['cpu_core_pct']:.1f}) | "
            f"- | {fmt(f['rss_per_trigger_kb'])} | {fmt(f.get('objects_per_wait'))} | {f['sockets_max']} | "
            f"{f.get('events', 0):,}/{n:,} | {fmt(f.get('latency_p50_s'))} / {fmt(f.get('latency_p99_s'))} / "
            f"{fmt(f.get('latency_max_s'))} | {f.get('lag_max_ms')} ({f.get('lag_max_startup_ms')}) | "
            f"{f.get('gc_pause_max_ms')} ({f.get('gc_full_collections')}) | {finished_at(f)} |"
        )

    lines += ["", "### Kit vs official at equal N and poll interval", ""]
    lines += [
        "CPU ratio: official ÷ kit CPU per poll, net of the ticker; shown only when both use at least "
        f"{MIN_CPU_PCT:g} % of a core (below that the difference is within the noise of this VM). "
        "RSS ratio: official ÷ kit memory per waiting trigger. The kit's is its marginal cost (slope of "
        "RSS between N=100 and N=1,000: what one more wait adds beyond the shared clients); the official "
        "triggers share nothing, so theirs is the run's RSS growth ÷ N. An official run that fell behind "
        "(fewer clients built than waits) reads low; the events column shows when. Above the floor: each "
        "side's CPU (% of a core, net of the ticker) less that of Airflow's runner holding as many triggers "
        "that only sleep (the floor rows above, same harness), so what Airflow costs either way cancels.",
        "",
        "| kind | N | official trigger | CPU/poll official ÷ kit (≥ 3) | CPU above the floor: official ÷ kit "
        "(≥ 3) | RSS/trigger official ÷ kit (≥ 50) | sockets kit / official | latency p99 kit / official s "
        "(fired) | measured kit / official (UTC) |",
        "|---|---:|---|---|---|---|---|---|---|",
    ]
    by_key = {key(r): r for r in done}
    for r in sorted(done, key=lambda r: (r["n"], KINDS.index(r["kind"]))):
        if r["impl"] != "kit":
            continue
        o = by_key.get(
            (r["kind"], "official", r["n"], float(r["poll_interval"]), bool(r.get("freeze_gc")), "", harness_of(r))
        )
        if o is None:
            continue
        kit_cpu, off_cpu = net_per_poll_ms(r, ticker(r)), net_per_poll_ms(o, ticker(o))
        if net_pct(r, ticker(r)) >= MIN_CPU_PCT and net_pct(o, ticker(o)) >= MIN_CPU_PCT and kit_cpu and off_cpu:
            cpu_text = f"{fmt(off_cpu / kit_cpu)}x {ok(off_cpu / kit_cpu >= 3)}"
        elif r["kind"].startswith(("kafka", "postgres")) and net_pct(o, ticker(o)) >= MIN_CPU_PCT and off_cpu:
            # The kit is below the resolution (its CPU is at most MIN_CPU_PCT): the measured ratio is
            # shown, and judged only by the least it can be (official ÷ MIN_CPU_PCT).
            least = net_pct(o, ticker(o)) / MIN_CPU_PCT
            measured = off_cpu / kit_cpu if kit_cpu else None
            verdict = ok(True) if least >= 3 else "not judged"
            cpu_text = (
                f"{fmt(measured)}x measured, ≥ {fmt(least)}x for sure: {verdict} (kit {net_pct(r, ticker(r)):.2f} "
                f"% of a core, below the {MIN_CPU_PCT:g} % resolution)"
            )
        else:
            cpu_text = f"below resolution ({net_pct(r, ticker(r)):.1f} / {net_pct(o, ticker(o)):.1f} % core)"
        above_text = above_floor(r, o, floors.get(r["n"]), ticker)
        kit_kb = marginal_kb(done, r["kind"], "kit")
        if kit_kb is None:
            kit_kb = r["rss_per_trigger_kb"]
        off_kb = o["rss_per_trigger_kb"]
        rss_ratio = off_kb / max(kit_kb, 0.5)
        memory = f"{fmt(off_kb)} ÷ {fmt(kit_kb)} KB = {fmt(rss_ratio)}x {ok(rss_ratio >= 50)}"
        if r.get("busy") or o.get("busy"):
            cpu_text += " (**busy machine: not a result**)"
        if apart(r, o):
            cpu_text += " (**kit and official from different sessions: not a result**)"
        lines.append(
            f"| {label(r)} | {r['n']:,} | {OFFICIAL_NAME[r['kind']]} | {cpu_text} | {above_text} | {memory} | "
            f"{r['sockets_max']} / {o['sockets_max']} | {fmt(r['latency_p99_s'])} "
            f"({r['events']:,}/{r['n']:,}) / {fmt(o['latency_p99_s'])} ({o['events']:,}/{o['n']:,}) | "
            f"{finished_at(r)} / {finished_at(o)} |"
        )

    lines += ["", "### Targets at N=10,000, poll 30 s (kit)", ""]
    lines += [
        "| kind | CPU % core (net of Airflow's runner) | RSS KB/trigger (slope 1k→10k) | sockets (100 / 1k / 10k) | "
        "latency p99 s (target) | "
        "loop lag max ms (longest GC pause) | loop lag max ms, start-up objects frozen | measured (UTC) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind in KINDS:
        big = by_key.get((kind, "kit", 10000, 30.0, False, "", current))
        frozen = by_key.get((kind, "kit", 10000, 30.0, True, "", current))
        if big is None:
            failed_big = [r for r in failed if r["kind"] == kind and r["impl"] == "kit" and r["n"] == 10000]
            status = f"did not complete: {failed_big[-1]['error']}" if failed_big else "not run"
            lines.append(f"| {kind} | {status} |||||| ")
            continue
        cpu_target = CPU_TARGET.get(kind, 50.0)
        floor = floors.get(10000)
        # Net of the ticker, and of Airflow's own runner at the same N where that was measured.
        cpu = max(net_pct(big, ticker(big)) - (net_pct(floor, ticker(floor)) if floor else 0.0), 0.0)
        mid = next((r for r in done if r["kind"] == kind and r["impl"] == "kit" and r["n"] == 1000), None)
        small = next((r for r in done if r["kind"] == kind and r["impl"] == "kit" and r["n"] == 100), None)
        slope = None
        if mid is not None:
            slope = (big["rss_hold_kb"] - big["rss_base_kb"] - (mid["rss_hold_kb"] - mid["rss_base_kb"])) / 9000
        rss_target = RSS_TARGET.get(kind, 20.0)
        rss_met = big["rss_per_trigger_kb"] < rss_target and (slope is None or slope < rss_target)
        socks = [x["sockets_max"] if x else None for x in (small, mid, big)]
        bound = max(s for s in socks[:2] if s is not None) + 10 if any(socks[:2]) else 120
        bound = SOCKET_TARGET.get(kind, bound)
        rss_note = f"; < {rss_target:g}" if kind in RSS_TARGET else ""
        socket_note = f" (≤ {bound})" if kind in SOCKET_TARGET else ""
        lat_target = LATENCY_TARGET.get(kind, 30.0 + 0.5)
        p99 = big["latency_p99_s"]
        lat_met = p99 is not None and p99 < lat_target and big["events"] == big["n"]
        lines.append(
            f"| {label(big)} | {cpu:.2f} (< {cpu_target:g}) {ok(cpu < cpu_target)} | "
            f"{fmt(big['rss_per_trigger_kb'])} ({fmt(slope)}{rss_note}) {ok(rss_met)} | "
            f"{' / '.join(fmt(s) for s in socks)}{socket_note} {ok(big['sockets_max'] <= bound)} | "
            f"{fmt(p99)} (< {lat_target:g}; {big['events']:,}/{big['n']:,} fired) {ok(lat_met)} | "
            f"{big['lag_max_ms']} {ok(big['lag_max_ms'] < LAG_TARGET_MS)} ({big.get('gc_pause_max_ms', '-')}) | "
            f"{frozen_lag(frozen)} | {finished_at(big)} |"
        )
    return "\n".join(lines) + "\n"


def above_floor(kit: dict[str, Any], official: dict[str, Any], floor: dict[str, Any] | None, ticker: Any) -> str:
    """The CPU ratio with Airflow's own runner floor taken off both sides (the floor cell at the same N)."""
    if floor is None:
        return f"no floor cell at N={kit['n']:,}"
    base = net_pct(floor, ticker(floor))
    ours, theirs = (max(net_pct(r, ticker(r)) - base, 0.0) for r in (kit, official))
    figures = f"{theirs:.2f} ÷ {ours:.2f} (floor {base:.2f})"
    if ours >= MIN_CPU_PCT and theirs >= MIN_CPU_PCT:
        return f"{figures} = {fmt(theirs / ours)}x {ok(theirs / ours >= 3)}"
    if theirs >= MIN_CPU_PCT:  # ours is within the resolution: the least the ratio can be
        least = theirs / MIN_CPU_PCT
        return f"{figures}: ≥ {fmt(least)}x for sure, {ok(True) if least >= 3 else 'not judged'}"
    return f"{figures}: below resolution"


def while_waiting(r: dict[str, Any]) -> str:
    """What a killed cell measured before the flip, if it got that far."""
    if "cpu_core_pct" not in r:
        return ""
    return f"; while waiting: {r['cpu_core_pct']:.1f} % core raw, {fmt(r['rss_per_trigger_kb'])} KB/trigger"


def frozen_lag(r: dict[str, Any] | None) -> str:
    if r is None:
        return "not run"
    return f"{r['lag_max_ms']} {ok(r['lag_max_ms'] < LAG_TARGET_MS)} (GC {r['gc_pause_max_ms']})"


def write_report(results: list[dict[str, Any]]) -> None:
    body = tables(results)
    text = REPORT.read_text() if REPORT.exists() else f"# Benchmark results\n\n{START}\n{END}\n"
    if START not in text:
        text += f"\n{START}\n{END}\n"
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1] if END in rest else ""
    REPORT.write_text(f"{head}{START}\n{body}{END}{tail}")
    print(body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--plan", action="append", choices=[*PLANS, "all"], default=[])
    parser.add_argument(
        "--harness",
        choices=["airflow", "plain"],
        default="airflow",
        help="airflow: Airflow's own TriggerRunner, steady state only (the method); plain: the previous method",
    )
    parser.add_argument("--kind", action="append", choices=KINDS, help="limit to these kinds")
    parser.add_argument("--n", type=int, action="append", help="limit to these N")
    parser.add_argument("--impl", choices=["kit", "official", "floor"], help="limit to one implementation")
    parser.add_argument("--official", action="store_true", help="also run official triggers at N=10,000")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--report", action="store_true", help="only rewrite RESULTS.md tables")
    parser.add_argument("--freeze-gc", action="store_true", help="run the cells with gc.freeze() after start-up")
    parser.add_argument(
        "--patience", type=float, default=600.0, help="seconds to wait for a quiet machine before refusing a cell"
    )
    parser.add_argument(
        "--allow-busy", action="store_true", help="run a cell on a busy machine anyway; its result is marked busy"
    )
    args = parser.parse_args()
    results = load()
    if not args.report:
        kinds = args.kind or list(KINDS)
        for plan in args.plan:
            for cell in cells(plan, args.official, kinds, explicit=bool(args.kind)):
                if args.n and cell["n"] not in args.n:
                    continue
                if args.impl and cell["impl"] != args.impl:
                    continue
                # Phases, event timeout, cancel, start-up (up to 300 s); plus the flip (10,000 S3 PUTs take minutes).
                budget = cell["warmup"] + cell["hold"] + 2 * cell["poll"] + 20 + 30 + 60 + cell["n"] / 50
                budget += 300 + cell["n"] / 250 if args.harness == "airflow" else 0
                result = run_cell(
                    {**cell, "freeze_gc": args.freeze_gc},
                    args.python,
                    budget,
                    args.harness,
                    patience=args.patience,
                    allow_busy=args.allow_busy,
                )
                if result.get("refused") and any(key(r) == key(result) for r in results):
                    continue  # a refused cell never replaces a measured one
                results = [r for r in results if key(r) != key(result)] + [result]
                RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    write_report([r for r in results if harness_of(r) == args.harness])
    return 0


if __name__ == "__main__":
    sys.exit(main())
