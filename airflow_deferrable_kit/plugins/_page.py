"""The Waits page as server-rendered HTML: no script, no build step, links into Airflow's own pages.

The page lives in the UI's iframe, so every link into Airflow (a DAG, a run, a task instance)
targets the top window. Every value from the metadata DB is escaped. The cost section embeds the
audit's own rendering (:func:`airflow_deferrable_kit.audit.figures_html` with its stylesheet),
so the page and ``airflow-deferrable-kit audit --html`` show the same figures the same way.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from html import escape
from urllib.parse import quote, urlencode

from airflow_deferrable_kit.audit import STYLE as AUDIT_STYLE
from airflow_deferrable_kit.audit import Report, figures_html
from airflow_deferrable_kit.plugins._describe import KIND_CHOICES
from airflow_deferrable_kit.plugins._read import SORTS, UNASSIGNED, Deferred, DeferredPage, Triggerer, Watcher

PAGE_STYLE = """
body { max-width: none; margin: 1rem; }
nav.tabs a { margin-right: 1rem; } nav.tabs a.on { font-weight: 600; text-decoration: none; color: #1d2330; }
form.filters { display: flex; flex-wrap: wrap; gap: .5rem 1rem; align-items: end; margin: .5rem 0 1rem; }
form.filters label { display: flex; flex-direction: column; font-size: 12px; color: #5a6275; }
.warn { color: #a4262c; font-weight: 600; } .muted { color: #5a6275; } .pager a { margin: 0 .4rem; }
code { font-size: 12px; }
"""


def _e(value: object) -> str:
    return escape("" if value is None else str(value), quote=True)


def age(seconds: float | None) -> str:
    """A duration in the largest unit that keeps it readable: ``45 s``, ``12 min``, ``3.5 h``, ``2.1 d``."""
    if seconds is None:
        return "—"
    sign, seconds = ("-", -seconds) if seconds < 0 else ("", seconds)
    if seconds < 90:
        text = f"{seconds:.0f} s"
    elif seconds < 5400:
        text = f"{seconds / 60:.0f} min"
    elif seconds < 172800:
        text = f"{seconds / 3600:.1f} h"
    else:
        text = f"{seconds / 86400:.1f} d"
    return sign + text


class Links:
    """URLs of Airflow's own UI pages and of this page, under the deployment's base path."""

    def __init__(self, base: str, prefix: str) -> None:
        self.base = base.rstrip("/")
        self.page = f"{self.base}{prefix}/waits"
        self.cost = f"{self.base}{prefix}/waits/cost"

    def dag(self, dag_id: str) -> str:
        return f"{self.base}/dags/{quote(dag_id, safe='')}"

    def run(self, dag_id: str, run_id: str) -> str:
        return f"{self.dag(dag_id)}/runs/{quote(run_id, safe='')}"

    def task(self, row: Deferred) -> str:
        url = f"{self.run(row.dag_id, row.run_id)}/tasks/{quote(row.task_id, safe='')}"
        return f"{url}/mapped/{row.map_index}" if row.map_index >= 0 else url


def _link(url: str, text: str) -> str:
    return f'<a href="{_e(url)}" target="_top">{_e(text)}</a>'


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], css_id: str) -> str:
    head = "".join(f"<th>{_e(name)}</th>" for name in header)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<table id="{css_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _document(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{AUDIT_STYLE}{PAGE_STYLE}</style></head><body>{body}</body></html>\n"
    )


def _tabs(links: Links, current: str) -> str:
    tabs = [("now", links.page, "Deferred now"), ("cost", links.cost, "What waiting cost")]
    return (
        '<nav class="tabs">'
        + "".join(
            f'<a href="{_e(url)}"{" class=on" if key == current else ""}>{_e(text)}</a>' for key, url, text in tabs
        )
        + "</nav>"
    )


def _select(name: str, label: str, options: Sequence[tuple[str, str]], chosen: str | None) -> str:
    rendered = "".join(
        f'<option value="{_e(value)}"{" selected" if value == (chosen or "") else ""}>{_e(text)}</option>'
        for value, text in [("", "any"), *options]
    )
    return f'<label>{_e(label)}<select name="{name}">{rendered}</select></label>'


def _filters(page: DeferredPage) -> str:
    f = page.filters
    sorts = [(key, key) for key in SORTS]
    return (
        '<form class="filters" method="get">'
        + _select("dag", "DAG", [(dag, f"{dag} ({count})") for dag, count in page.by_dag], f.dag)
        + _select("kind", "kind", [(kind, kind) for kind in KIND_CHOICES], f.kind)
        + _select("triggerer", "triggerer", [(host, host) for host in page.triggerers], f.triggerer)
        + f'<label>deferred at least (min)<input name="min_age" type="number" min="0" step="any" size="6" '
        f'value="{_e(f.min_age_minutes if f.min_age_minutes else "")}"></label>'
        + '<label>sort<select name="sort">'
        + "".join(f'<option value="{k}"{" selected" if k == f.sort else ""}>{_e(t)}</option>' for k, t in sorts)
        + "</select></label>"
        + '<label>order<select name="order">'
        + f'<option value="asc"{"" if f.descending else " selected"}>ascending</option>'
        + f'<option value="desc"{" selected" if f.descending else ""}>descending</option></select></label>'
        + f'<input type="hidden" name="per_page" value="{f.per_page}"><button type="submit">Show</button></form>'
    )


def _query(page: DeferredPage, number: int) -> str:
    f = page.filters
    params: dict[str, object] = {"page": number, "per_page": f.per_page, "sort": f.sort}
    params["order"] = "desc" if f.descending else "asc"
    for key, value in (("dag", f.dag), ("kind", f.kind), ("triggerer", f.triggerer), ("min_age", f.min_age_minutes)):
        if value:
            params[key] = value
    return "?" + urlencode(params)


def _pager(page: DeferredPage) -> str:
    number = page.filters.page
    parts = [f"page {number} of {page.pages}"]
    if number > 1:
        parts.insert(0, f'<a rel="prev" href="{_e(_query(page, number - 1))}">previous</a>')
    if number < page.pages:
        parts.append(f'<a rel="next" href="{_e(_query(page, number + 1))}">next</a>')
    return f'<p class="pager">{" ".join(parts)}</p>'


def _deferred(page: DeferredPage, links: Links) -> str:
    if not page.rows:
        empty = "No deferred task matches these filters." if page.total == 0 and page.by_dag else "Nothing is deferred."
        return f'<p class="note" id="no-deferred">{empty}</p>'
    rows = []
    for row in page.rows:
        task = row.task_id if row.map_index < 0 else f"{row.task_id} [{row.map_index}]"
        budget = age(row.budget_left)
        if row.budget_left is not None and row.budget_left < 0:
            budget = f'<span class="warn">over by {_e(age(-row.budget_left))}</span>'
        rows.append(
            [
                _link(links.dag(row.dag_id), row.dag_id),
                _link(links.run(row.dag_id, row.run_id), row.run_id),
                _link(links.task(row), task) + f'<br><span class="muted">{_e(row.operator)}</span>',
                f"<code>{_e(row.classpath)}</code>",
                _e(row.wait.kind or "—"),
                _e(row.wait.target or "—"),
                _e(f"{row.since:%Y-%m-%d %H:%M:%S} UTC" if row.since else "—"),
                budget,
                _e(row.triggerer or UNASSIGNED)
                + (f'<br><span class="muted">queue {_e(row.queue)}</span>' if row.queue else ""),
            ]
        )
    header = ["DAG", "run", "task", "trigger", "kind", "target", "deferred since", "budget left", "triggerer"]
    shown = f"{len(page.rows)} of {page.total} deferred task(s) shown"
    return f'<p class="meta" id="deferred-count">{_e(shown)}</p>' + _table(header, rows, "deferred") + _pager(page)


def _triggerers(rows: Sequence[Triggerer], unassigned: int) -> str:
    if not rows:
        return '<p class="warn" id="no-triggerer">No triggerer is running: deferred tasks are not being watched.</p>'
    body = [
        [
            _e(row.hostname) + ("" if row.state == "running" else f' <span class="muted">({_e(row.state)})</span>'),
            _e(age(row.heartbeat_age)),
            _e(f"{row.held} / {row.capacity}"),
            _e(", ".join(row.queues) or "default"),
            "<br>".join(f'<span class="warn">{_e(warning)}</span>' for warning in row.warnings) or "ok",
        ]
        for row in rows
    ]
    table = _table(["host", "heartbeat", "triggers held / capacity", "queues", "health"], body, "triggerers")
    note = f'<p class="note">{unassigned} trigger(s) not yet picked up by any triggerer.</p>' if unassigned else ""
    return table + note


def _watchers(rows: Sequence[Watcher], links: Links) -> str:
    if not rows:
        return '<p class="note" id="no-watchers">No AssetWatcher schedules a DAG you can read.</p>'
    body = [
        [
            _e(row.asset)
            + (f'<br><span class="muted">{_e(row.asset_uri)}</span>' if row.asset_uri != row.asset else ""),
            _e(row.name),
            f"<code>{_e(row.classpath)}</code>",
            _e(row.wait.kind or "—") + (f"<br>{_e(row.wait.target)}" if row.wait.target else ""),
            ", ".join(_link(links.dag(dag_id), dag_id) for dag_id in row.dag_ids),
            _e(
                f"{row.last_event:%Y-%m-%d %H:%M:%S} UTC ({age(row.last_event_age)} ago)"
                if row.last_event
                else "none yet"
            ),
            _e(age(row.watermark_age) + " ago" if row.watermark_age is not None else "—"),
            _e(row.triggerer or UNASSIGNED),
        ]
        for row in rows
    ]
    header = ["asset", "watcher", "trigger", "wait", "schedules", "last asset event", "kit watermark", "triggerer"]
    return _table(header, body, "watchers")


def waits_page(
    *,
    links: Links,
    page: DeferredPage,
    triggerers: Sequence[Triggerer],
    unassigned: int,
    watchers: Sequence[Watcher],
    now: dt.datetime,
) -> str:
    """The page: what is deferred now, the triggerers holding it, and the watchers."""
    body = (
        "<h1>Waits</h1>"
        + _tabs(links, "now")
        + f'<p class="meta">As of {now:%Y-%m-%d %H:%M:%S} UTC; read-only.</p>'
        + "<h2>Deferred now</h2>"
        + _filters(page)
        + _deferred(page, links)
        + "<h2>Triggerers</h2>"
        + _triggerers(triggerers, unassigned)
        + "<h2>Watchers</h2>"
        + _watchers(watchers, links)
    )
    return _document("Waits", body)


def cost_page(*, links: Links, report: Report | None, days: float, error: str | None = None) -> str:
    """What waiting cost over ``days``: the audit's figures, rendered by the audit itself."""
    form = (
        '<form class="filters" method="get"><label>last days'
        f'<input name="days" type="number" min="0.01" step="any" size="6" value="{days:g}"></label>'
        '<button type="submit">Show</button></form>'
    )
    if error is not None:
        figures = f'<p class="warn">{_e(error)}</p>'
    elif report is None:
        figures = '<p class="note">No DAG you can read.</p>'
    else:
        figures = (
            f'<p class="meta">{report.since:%Y-%m-%d %H:%M} to {report.until:%Y-%m-%d %H:%M} UTC; '
            f"price {report.price:g} per slot-hour (the same figures as <code>airflow-deferrable-kit audit</code>)</p>"
            + figures_html(report)
        )
    return _document("Waits: what waiting cost", "<h1>Waits</h1>" + _tabs(links, "cost") + form + figures)
