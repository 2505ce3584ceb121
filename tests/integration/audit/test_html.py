"""``--html FILE``: one self-contained page whose chart draws the audit's own numbers.

The page is parsed with the standard library's ``html.parser``: the chart's bars are read back
and compared with the report, and every tag and attribute is checked for anything fetched.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest

from airflow_deferrable_kit.audit import Report, render_html, run_audit
from airflow_deferrable_kit.audit._html import BAR_WIDTH
from airflow_deferrable_kit.cli import main
from tests.integration.audit.conftest import MetadataDB
from tests.integration.audit.scenario import NOW, at, populate

#: Tags that load something, whatever their attributes.
FETCHING_TAGS = {"script", "link", "img", "iframe", "object", "embed", "source", "video", "audio", "image", "use"}


@dataclass
class Page(HTMLParser):
    """What the checks need of a page: the chart's rects, every tag and attribute, the text."""

    rects: list[dict[str, str]] = field(default_factory=list)
    tags: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    styles: list[str] = field(default_factory=list)
    _in_style: bool = False

    def __post_init__(self) -> None:
        super().__init__(convert_charrefs=True)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        self.tags.append((tag, values))
        if tag == "rect":
            self.rects.append(values)
        self._in_style = tag == "style"

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        (self.styles if self._in_style else self.text).append(data)


def parse(html: str) -> Page:
    page = Page()
    page.feed(html)
    page.close()
    return page


def assert_self_contained(page: Page, html: str) -> None:
    assert not {tag for tag, _ in page.tags} & FETCHING_TAGS
    for tag, attrs in page.tags:
        for name in ("src", "href", "xlink:href", "srcset", "poster", "data", "action", "background"):
            assert name not in attrs or attrs[name].startswith("#"), (tag, name, attrs[name])
        assert "url(" not in attrs.get("style", "")
    style = "".join(page.styles)
    assert "url(" not in style and "@import" not in style
    assert "http://" not in html and "https://" not in html


@pytest.fixture
def report(metadata_db: MetadataDB) -> Report:
    populate(metadata_db)
    return run_audit(metadata_db.url, now=NOW)


def test_the_chart_draws_worker_time_by_sensor_and_mode_on_one_scale(report: Report) -> None:
    html = render_html(report)
    page = parse(html)
    bars = {(r["data-sensor"], r["data-mode"], r["class"]): r for r in page.rects}
    # One held bar and one poke-mode bar per sensor class and mode, nothing else.
    expected = {(h.operator, h.mode) for h in report.held}
    assert len(expected) == 8 and ("S3KeySensor", "poke") in expected and ("HttpSensor", "reschedule") in expected
    assert set(bars) == {(sensor, mode, kind) for sensor, mode in expected for kind in ("held", "poke")}
    assert len(page.rects) == 2 * len(expected)
    scale = max(max(h.held, h.poke_would_hold) for h in report.held)
    assert scale == pytest.approx(3601.5)  # the longest: S3KeySensor's poke tries, held throughout
    for h in report.held:
        for kind, seconds in (("held", h.held), ("poke", h.poke_would_hold)):
            bar = bars[(h.operator, h.mode, kind)]
            assert float(bar["data-seconds"]) == pytest.approx(seconds)
            assert float(bar["width"]) == pytest.approx(seconds / scale * BAR_WIDTH, abs=0.01)
    # The numbers drawn are the measured ones: DateTimeSensor deferred held 3.5 s of a 1,800.5 s wait.
    deferred = bars[("DateTimeSensor", "deferred", "held")]
    assert float(deferred["data-seconds"]) == pytest.approx(3.5)
    assert float(bars[("DateTimeSensor", "deferred", "poke")]["width"]) == pytest.approx(
        1800.5 / 3601.5 * BAR_WIDTH, abs=0.01
    )
    assert float(bars[("S3KeySensor", "poke", "held")]["width"]) == BAR_WIDTH


def test_the_page_states_the_totals_the_savings_and_the_advice(report: Report) -> None:
    page = parse(render_html(report, top=3))
    text = " ".join(" ".join(page.text).split())
    for sentence in report.saving_sentences():
        assert sentence in text
    assert "All sensors (11 runs): a poke-mode sensor would have held 2.82 worker-hours" in text
    for advice in report.recommendations[:3]:
        assert advice.advice in text
    assert report.recommendations[3].advice not in text
    assert f"{len(report.recommendations) - 3} more not shown" in text
    assert "1.6 h" in text and "1.56" in text  # worker-held and its cost, as in the table's TOTAL
    assert report.listeners_note() in text
    assert "3 of 13 runs had no state-change rows" in text


def test_the_page_is_self_contained_and_escapes_what_the_db_holds(metadata_db: MetadataDB) -> None:
    populate(metadata_db)
    hostile = '<script src="https://evil.example/x.js"></script>Sensor'  # a sensor: charted and advised
    metadata_db.attempt(
        "etl",
        "wait_hostile",
        operator=hostile,
        start=at(0),
        end=at(60),
        events=[("running", at(0)), ("success", at(60))],
    )
    report = run_audit(metadata_db.url, now=NOW)
    html = render_html(report)
    # Ids are escaped: the page has no script tag, and the id is shown as text.
    page = parse(html.replace("https://evil.example/x.js", "EVIL"))
    assert "script" not in {tag for tag, _ in page.tags}
    assert hostile.replace("https://evil.example/x.js", "EVIL") in " ".join(page.text)
    assert hostile.replace("https://evil.example/x.js", "EVIL") in {r["data-sensor"] for r in page.rects}
    clean = run_audit(metadata_db.url, now=NOW, dag_ids=["reports"])
    html = render_html(clean)
    assert_self_contained(parse(html), html)


def test_an_empty_audit_renders_a_page_without_a_chart(metadata_db: MetadataDB) -> None:
    html = render_html(run_audit(metadata_db.url, now=NOW))
    page = parse(html)
    assert page.rects == [] and "svg" not in {tag for tag, _ in page.tags}
    assert "No sensor ran on a worker in this window" in " ".join(page.text)
    assert_self_contained(page, html)


def test_the_command_writes_the_page_next_to_its_usual_output(
    sqlite_db: MetadataDB, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    populate(sqlite_db, base=dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=1))
    target = tmp_path / "audit.html"
    code = main(["audit", "--sql-alchemy-conn", sqlite_db.url, "--html", str(target), "--no-listeners"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "What poke mode would have held" in out
    html = target.read_text(encoding="utf-8")
    page = parse(html)
    assert len(page.rects) == 16
    assert "end_from_trigger is advised: no listener plugins (--no-listeners)." in " ".join(page.text)
    assert_self_contained(page, html)
    code = main(["audit", "--sql-alchemy-conn", sqlite_db.url, "--html", str(tmp_path / "missing" / "a.html")])
    _, err = capsys.readouterr()
    assert code == 1 and "could not write --html" in err


def test_wide_tables_wrap_inside_the_page(report: Report) -> None:
    """Long advice (dotted paths) wraps in its column instead of pushing the table past the page."""
    page = render_html(report)
    assert "table-layout: fixed" in page and "overflow-wrap: anywhere" in page
    advice = page[page.index("<h2>What to change</h2>") :]
    widths = [int(w) for w in re.findall(r'<col style="width:(\d+)%">', advice[: advice.index("</colgroup>")])]
    assert len(widths) == 7 and sum(widths) == 100
