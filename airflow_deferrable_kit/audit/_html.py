"""The audit as one self-contained HTML page: an inline SVG chart, the savings, the advice, the totals.

The page fetches nothing (no script, stylesheet, font or image from anywhere), so it reads the
same mailed, attached to a ticket or opened offline; its only style is one inline ``<style>``.
Every value that comes from the metadata DB (DAG and task ids, operator names, the advice built
from them) is escaped. The chart draws, per sensor class and mode, the worker time the tries
held and, behind it, what a poke-mode sensor would have held for the same tries, on one scale.
"""

from __future__ import annotations

from html import escape

from airflow_deferrable_kit.audit._report import GROUP_KEYS, Held, Report, duration, money, worker_hours

#: Chart geometry, in SVG user units (pixels at 100 %).
LABEL_WIDTH = 230
BAR_WIDTH = 520
BAR_HEIGHT = 22
ROW_HEIGHT = 34
VALUE_WIDTH = 150

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; color: #1d2330; margin: 2rem auto; max-width: 980px; padding: 0 1rem; }
h1 { font-size: 1.5rem; margin-bottom: .2rem; } h2 { font-size: 1.15rem; margin-top: 2rem; }
.meta { color: #5a6275; margin-top: 0; }
table { border-collapse: collapse; width: 100%; table-layout: fixed; }
th, td { padding: .3rem .5rem; border-bottom: 1px solid #e3e6ec; overflow-wrap: anywhere; vertical-align: top; }
svg { max-width: 100%; height: auto; }
th { text-align: left; background: #f4f6f9; } td.num, th.num { text-align: right; white-space: nowrap; }
.held { fill: #2f6fdf; } .poke { fill: #f1c9b8; } .label { font-size: 13px; fill: #1d2330; }
.value { font-size: 12px; fill: #5a6275; }
.key { display: inline-block; width: 12px; height: 12px; margin: 0 .3rem 0 1rem; }
.total { font-weight: 600; } .note { color: #5a6275; }
"""


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def bar_width(seconds: float, scale: float) -> float:
    """A bar's width for ``seconds`` when ``scale`` seconds fill the chart (2 decimals, as written)."""
    return round(seconds / scale * BAR_WIDTH, 2) if scale > 0 else 0.0


def chart(held: list[Held]) -> str:
    """Horizontal bars, one row per sensor class and mode: worker time held over poke mode's."""
    if not held:
        return '<p class="note">No sensor ran on a worker in this window: nothing to chart.</p>'
    scale = max(max(h.poke_would_hold, h.held) for h in held)
    height = ROW_HEIGHT * len(held) + 8
    width = LABEL_WIDTH + BAR_WIDTH + VALUE_WIDTH
    parts = [
        f'<svg role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" aria-label="Worker time held by sensor and mode">'
    ]
    for index, h in enumerate(held):
        y = index * ROW_HEIGHT + 4
        mid = y + BAR_HEIGHT / 2 + 4
        data = f'data-sensor="{_e(h.operator)}" data-mode="{_e(h.mode)}"'
        parts += [
            f'<g class="bar" {data}>',
            f"<title>{_e(h.sentence())}</title>",
            f'<text class="label" x="{LABEL_WIDTH - 8}" y="{mid}" text-anchor="end">'
            f"{_e(h.operator)} · {_e(h.mode)}</text>",
            f'<rect class="poke" {data} data-seconds="{h.poke_would_hold!r}" x="{LABEL_WIDTH}" y="{y}" '
            f'width="{bar_width(h.poke_would_hold, scale)}" height="{BAR_HEIGHT}"/>',
            f'<rect class="held" {data} data-seconds="{h.held!r}" x="{LABEL_WIDTH}" y="{y + 5}" '
            f'width="{bar_width(h.held, scale)}" height="{BAR_HEIGHT - 10}"/>',
            f'<text class="value" x="{LABEL_WIDTH + BAR_WIDTH + 8}" y="{mid}">{_e(duration(h.held))} of '
            f"{_e(duration(h.poke_would_hold))}</text>",
            "</g>",
        ]
    parts.append("</svg>")
    legend = (
        '<p class="note"><span class="key" style="background:#2f6fdf"></span>worker time the tries held'
        '<span class="key" style="background:#f1c9b8"></span>what a poke-mode sensor would have held '
        "(the same tries' wall time)</p>"
    )
    return "".join(parts) + legend


#: Column widths (percent) of the wide tables: the advice gets the room, every cell wraps.
ADVICE_WIDTHS = (12, 12, 12, 8, 10, 7, 39)
CANDIDATE_WIDTHS = (4, 13, 13, 13, 9, 10, 38)


def _table(header: list[str], rows: list[list[str]], numeric: set[int], widths: tuple[int, ...] = ()) -> str:
    def cells(tag: str, values: list[str], *, total: bool = False) -> str:
        out = "".join(
            f'<{tag} class="num">{value}</{tag}>' if i in numeric else f"<{tag}>{value}</{tag}>"
            for i, value in enumerate(values)
        )
        return f'<tr class="total">{out}</tr>' if total else f"<tr>{out}</tr>"

    body = "".join(cells("td", row) for row in rows)
    columns = "".join(f'<col style="width:{width}%">' for width in widths)
    colgroup = f"<colgroup>{columns}</colgroup>" if widths else ""
    return f"<table>{colgroup}<thead>{cells('th', header)}</thead><tbody>{body}</tbody></table>"


def figures_html(report: Report, top: int = 10) -> str:
    """The audit's figures as HTML sections: totals, per DAG, the chart, the saving, the advice.

    One rendering for every place that shows them: the audit's own page (:func:`render_html`)
    and the Waits page's cost section, which embeds it with :data:`STYLE`.
    """
    t = report.totals
    totals = _table(
        ["runs", "wall", "worker-held", "idle-held", "cost", "idle cost"],
        [
            [
                _e(t.runs),
                _e(duration(t.wall)),
                _e(duration(t.worker)),
                _e(duration(t.idle)),
                _e(money(t.worker / 3600 * report.price)),
                _e(money(t.idle / 3600 * report.price)),
            ]
        ],
        set(range(6)),
    )
    sentences = report.saving_sentences()
    saving = "".join(f"<li>{_e(sentence)}</li>" for sentence in sentences[:-1])
    total_sentence = f'<p class="total" id="sensors-total">{_e(sentences[-1])}</p>' if sentences else ""
    shown = report.recommendations[:top]
    advice_rows = [
        [
            _e(a.key["dag_id"]),
            _e(a.key["task_id"]),
            _e(a.key["operator"]),
            _e("+".join(a.modes)),
            _e(a.change),
            _e(duration(a.saves)),
            _e(a.advice),
        ]
        for a in shown
    ]
    advice = (
        _table(["DAG", "task", "operator", "modes", "change", "saves", "advice"], advice_rows, {5}, ADVICE_WIDTHS)
        if advice_rows
        else '<p class="note">No sensor has worker time left to save.</p>'
    )
    if len(report.recommendations) > len(shown):
        advice += f'<p class="note">{len(report.recommendations) - len(shown)} more not shown (--top).</p>'
    candidates = [
        [
            _e(row.migration_rank),
            *(_e(row.key[key]) for key in GROUP_KEYS["task"]),
            _e(duration(row.totals.idle)),
            _e(duration(row.savings.deferring)),
            _e(row.advice()),
        ]
        for row in report.candidates[:top]
    ]
    migrating = (
        "<h2>Sensors worth migrating</h2>"
        + _table(
            ["#", "DAG", "task", "operator", "idle-held", "deferrable=True saves", "use"],
            candidates,
            {0, 4, 5},
            CANDIDATE_WIDTHS,
        )
        if candidates
        else ""
    )
    estimated = (
        f'<p class="note">{t.estimated} of {t.runs} runs had no state-change rows in the log table (pruned?); '
        "their worker-held time is estimated.</p>"
        if t.estimated
        else ""
    )
    return (
        f"<h2>Totals</h2>{totals}{total_sentence}"
        f"{by_dag(report)}"
        f"<h2>Worker time by sensor and mode</h2>{chart(report.held)}<ul>{saving}</ul>"
        f'<h2>What to change</h2>{advice}<p class="note">{_e(report.listeners_note())}</p>'
        + (f'<p class="note">{_e(report.start_note())}</p>' if report.start_note() else "")
        + f"{migrating}{estimated}{spread_html(report)}"
    )


def spread_html(report: Report) -> str:
    """The upstreams whose waits several triggerers hold now, with what to do (nothing if none)."""
    if not report.spread:
        return ""
    rows = [
        [
            _e(spread.upstream.kind),
            _e(spread.upstream.name),
            _e(spread.waits),
            _e(spread.triggerers),
            _e(spread.advice()),
        ]
        for spread in report.spread
    ]
    return '<h2 id="shared-requests">Shared requests made by several triggerers</h2>' + _table(
        ["kind", "upstream", "waits deferred now", "triggerers", "advice"], rows, {2, 3}
    )


def by_dag(report: Report) -> str:
    """Per DAG, the worker time its tries held against the time they waited (their wall time)."""
    if "dag_id" not in GROUP_KEYS[report.group_by]:
        return ""
    dags: dict[str, list[float]] = {}
    for row in report.rows:
        if row.sensor:
            sums = dags.setdefault(row.key["dag_id"], [0, 0.0, 0.0])
            sums[0] += row.totals.runs
            sums[1] += row.totals.worker
            sums[2] += row.totals.wall
    if not dags:
        return ""
    ordered = sorted(dags.items(), key=lambda item: (-item[1][1], item[0]))
    rows = [
        [_e(dag_id), _e(int(runs)), _e(duration(worker)), _e(duration(wall)), _e(money(worker / 3600 * report.price))]
        for dag_id, (runs, worker, wall) in ordered
    ]
    return "<h2>Sensors per DAG</h2>" + _table(
        ["DAG", "sensor runs", "worker-held", "waited", "cost"], rows, {1, 2, 3, 4}
    )


def render_html(report: Report, top: int = 10) -> str:
    """The whole page; ``top`` bounds the advice and candidate lists as in the table output."""
    window = (
        f"{report.since:%Y-%m-%d %H:%M} to {report.until:%Y-%m-%d %H:%M} UTC (last {report.days:g} days); "
        f"price {report.price:g} per slot-hour; one check allowance {report.check_seconds:g} s"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>Sensor audit: {_e(worker_hours(report.held_total.held))} worker-hours held</title>"
        f"<style>{STYLE}</style></head><body>"
        "<h1>Worker slots held by sensors</h1>"
        f'<p class="meta">Airflow metadata DB: {_e(report.database)}<br>{_e(window)}</p>'
        f"{figures_html(report, top)}</body></html>\n"
    )
