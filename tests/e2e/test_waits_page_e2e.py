"""The Waits page in a real browser, on a real Airflow: a person's way in, a person's view.

The HA deployment's api-server loads the kit's plugin from its entry point. The admin signs in
through Airflow's own login form in headless Chromium, opens **Waits** from the UI's navigation,
and sees, inside the UI's iframe, the run's deferred HTTP wait (its trigger, its kind and
target, the triggerer holding it) and that triggerer's row. Once the test sets the batch ready
and the task resumes, a reload shows the task gone. The screenshot is kept under ``.test-reports/``.

A user refused the ``TRIGGERS`` view is a route-level test (tests/integration/plugins/): it needs
an auth manager that can refuse, which the deployment's simple one cannot.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import urllib.error
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from playwright.sync_api import FrameLocator, Page, expect, sync_playwright

from scripts.airflow_local import LocalAirflow
from tests import REPO
from tests.e2e.event_deployment import TRIGGERER_DEFAULTS, EventDeployment
from tests.e2e.metadata import set_batch, wait_for

pytestmark = pytest.mark.e2e

HERE = Path(__file__).parent
DAG_FILE = HERE / "waits_dags" / "e2e_waits_page.py"
DAG_ID = "adk_e2e_waits_page"
TASK_ID = "wait_for_the_batch"
TRIGGER = "airflow_deferrable_kit.triggers.http.HttpBatchReadyTrigger"
#: Debian's Chromium: the browser is the system's, never one Playwright downloads.
CHROMIUM = "/usr/bin/chromium"
#: A headless browser with nothing of its own to fetch (no updates, sync or background requests).
CHROMIUM_ARGS = [
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
CAPACITY = TRIGGERER_DEFAULTS["AIRFLOW__TRIGGERER__CAPACITY"]
SCREENSHOT = REPO / ".test-reports" / "waits-page.png"
#: How long the browser waits for a page or an element to show (a busy 2-core machine).
SHOWN_WITHIN_MS = 30_000


@pytest.fixture(scope="module")
def waits_deployment(ha_deployment: EventDeployment) -> Iterator[EventDeployment]:
    """The HA deployment with this module's DAG; afterwards no DAG, file or trigger of it left."""
    deployment = ha_deployment
    deployment.install(DAG_FILE)
    try:
        yield deployment
    finally:
        deployment.uninstall([DAG_FILE], [DAG_ID], [])
        _forget(deployment.airflow, DAG_ID)


def _forget(airflow: LocalAirflow, dag_id: str) -> None:
    """Delete the DAG once the DAG processor has seen its file gone (so no parse brings it back)."""

    def stale() -> bool:
        try:
            return bool(airflow.api("GET", f"/api/v2/dags/{dag_id}")["is_stale"])
        except urllib.error.HTTPError as exc:  # never parsed, or already gone
            return exc.code == 404

    wait_for(f"{dag_id} marked stale", stale, timeout=120)
    with contextlib.suppress(urllib.error.HTTPError):
        airflow.api("DELETE", f"/api/v2/dags/{dag_id}")
    with pytest.raises(urllib.error.HTTPError, match="404"):
        airflow.api("GET", f"/api/v2/dags/{dag_id}")


@contextlib.contextmanager
def _browser() -> Iterator[Page]:
    """A page of headless Chromium (as root, without its sandbox, which refuses root)."""
    args = [*CHROMIUM_ARGS, *(["--no-sandbox"] if os.geteuid() == 0 else [])]
    expect.set_options(timeout=SHOWN_WITHIN_MS)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.set_default_timeout(SHOWN_WITHIN_MS)
            yield page
        finally:
            browser.close()


def _sign_in(page: Page, airflow: LocalAirflow) -> None:
    """Airflow's own login form, with the admin the simple auth manager generated."""
    user, password = airflow.login()
    page.goto(f"{airflow.base_url}/auth/login?next={quote(airflow.base_url + '/', safe='')}")
    page.get_by_label("Username").fill(user)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{airflow.base_url}/")


def _open_waits(page: Page) -> FrameLocator:
    """The **Waits** entry of the UI's Browse menu; the page it shows in the UI's iframe."""
    page.get_by_role("button", name="Browse").click()
    page.get_by_role("menuitem", name="Waits").click()
    page.wait_for_url(re.compile(r"/plugin/waits$"))
    return page.frame_locator('iframe[src$="/deferrable-kit/waits"]')


def _deferred_and_held(deployment: EventDeployment, run_id: str) -> str:
    """Wait until the run's task is deferred and its trigger held by a triggerer; that host."""
    rows = wait_for(
        "the task deferred and its trigger held by a triggerer",
        lambda: deployment.query(
            "SELECT j.hostname FROM task_instance ti JOIN trigger t ON t.id = ti.trigger_id "
            "JOIN job j ON j.id = t.triggerer_id "
            "WHERE ti.dag_id = %s AND ti.run_id = %s AND ti.task_id = %s AND ti.state = 'deferred'",
            DAG_ID,
            run_id,
            TASK_ID,
        ),
        timeout=180,
    )
    return str(rows[0][0])


def test_the_admin_sees_a_deferred_wait_and_its_triggerer_until_it_resumes(waits_deployment: EventDeployment) -> None:
    airflow = waits_deployment.airflow
    airflow.wait_for_dag(DAG_ID)
    # The wait ends when the test sets its batch ready, once the page was read: a moment set
    # ahead could pass while a busy machine is still signing in.
    batch = f"waits-page-{uuid.uuid4().hex[:8]}"
    set_batch(waits_deployment.api_url, batch, "pending")
    run_id = airflow.trigger(DAG_ID, conf={"batch": batch})
    host = _deferred_and_held(waits_deployment, run_id)

    with _browser() as page:
        _sign_in(page, airflow)
        waits = _open_waits(page)

        row = waits.locator("#deferred tbody tr").filter(has_text=TASK_ID)
        expect(row).to_have_count(1)
        expect(row).to_contain_text(DAG_ID)
        expect(row).to_contain_text(run_id)
        expect(row).to_contain_text(TRIGGER)
        expect(row.locator("td").nth(4)).to_have_text("http")
        expect(row.locator("td").nth(5)).to_contain_text(f"v1/batches/{batch}/status")
        expect(row.locator("td").nth(8)).to_have_text(host)
        # Its links lead out of the iframe to Airflow's own pages.
        task_link = row.get_by_role("link", name=TASK_ID)
        expect(task_link).to_have_attribute("href", f"/dags/{DAG_ID}/runs/{quote(run_id, safe='')}/tasks/{TASK_ID}")
        expect(task_link).to_have_attribute("target", "_top")
        # The live triggerer holding the deployment's one trigger (its host name is the
        # machine's, shared by every triggerer started here).
        triggerer = waits.locator("#triggerers tbody tr").filter(has_text=host).filter(has_text=f"1 / {CAPACITY}")
        expect(triggerer).to_have_count(1)
        # Its heartbeat as an age. (Its health may read "ok" or, on a machine busy enough to
        # delay a heartbeat past the api-server's threshold, the warning: both are right.)
        expect(triggerer.locator("td").nth(1)).to_have_text(re.compile(r"^\d+ (s|min)$"))
        SCREENSHOT.parent.mkdir(exist_ok=True)
        page.screenshot(path=str(SCREENSHOT))

        # The scheduler has taken in the exit of the worker that deferred (a resume before
        # then can lose to Airflow's own race, docs/operations.md); then the batch is ready.
        wait_for("the deferring worker's exit taken in", lambda: TASK_ID in airflow.worker_exits(DAG_ID, run_id))
        set_batch(waits_deployment.api_url, batch, "ready")
        run = airflow.watch_run(DAG_ID, run_id, timeout=240)
        assert run.run_state == "success" and "deferred" in run.states[TASK_ID], run.states
        resumed = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
        page.reload()
        waits = page.frame_locator('iframe[src$="/deferrable-kit/waits"]')

        as_of = waits.locator("p.meta").first
        expect(as_of).to_contain_text("As of")
        shown_at = dt.datetime.strptime(
            re.search(r"As of (\S+ \S+) UTC", as_of.inner_text()).group(1),  # type: ignore[union-attr]
            "%Y-%m-%d %H:%M:%S",
        ).replace(tzinfo=dt.timezone.utc)
        assert shown_at >= resumed  # the page rendered after the resume, not a cached one
        expect(waits.locator("#triggerers tbody tr").filter(has_text=host).first).to_be_visible()
        expect(waits.locator("#deferred tbody tr").filter(has_text=TASK_ID)).to_have_count(0)
