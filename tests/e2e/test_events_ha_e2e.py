"""Event watchers under HA on a real Airflow: two triggerers share one PostgreSQL metadata DB.

* Both triggerers run: N new objects, rows and transitions to ready, one at a time, make exactly
  N asset events and N DAG runs per kind (each watcher runs on one triggerer, never on both).
* The triggerer holding the watchers is killed (SIGKILL) between events: once its heartbeat is
  older than ``[triggerer] triggerer_health_check_threshold`` (made so as soon as it is dead:
  ``outdate_heartbeat``) the survivor adopts its watchers, which start from their saved
  watermarks: what happened while nobody watched fires once, and N more make exactly N more runs.
  Nothing is missed, nothing fires twice.
* The consumers run the deduplication recipe of docs/events.md; a copy of a stored event (what
  a triggerer that died right after storing it fires again) is told apart and skipped.

The triggerers are started one after the other so each Airflow job id maps to its process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from scripts import services
from scripts.airflow_local import LocalAirflow
from tests.e2e.event_deployment import EventDeployment
from tests.e2e.metadata import (
    events_in_runs,
    items_of,
    outdate_heartbeat,
    query,
    running_triggerers,
    set_batch,
    wait_for,
    watcher_holders,
    watermarks,
)

pytestmark = pytest.mark.e2e

DAG_FILE = Path(__file__).parent / "event_dags" / "e2e_events_ha.py"
S3, PG, HTTP = "adk_e2e_ha_s3", "adk_e2e_ha_pg", "adk_e2e_ha_http"
KINDS = (S3, PG, HTTP)
#: Items per kind and phase.
N = 4
T = TypeVar("T")


@dataclasses.dataclass
class HaWorld:
    airflow: LocalAirflow
    dsn: str
    postgres: services.Postgres
    s3: Any  # a botocore S3 client
    api_url: str
    bucket: str
    table: str
    batch: str
    jobs: dict[int, str] = dataclasses.field(default_factory=dict)  # triggerer job id -> process name

    def query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        return query(self.dsn, sql, *args)

    def running_triggerers(self) -> list[int]:
        return running_triggerers(self.dsn)

    def holders(self) -> Counter[int | None]:
        return watcher_holders(self.dsn)

    def payloads(self, asset: str) -> list[tuple[int, dict[str, Any]]]:
        """``(id, payload)`` of every asset event of ``asset``, oldest first."""
        rows = self.query(
            "SELECT e.id, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id WHERE a.name = %s ORDER BY e.id",
            asset,
        )
        return [(int(i), (x if isinstance(x, dict) else json.loads(x)).get("payload") or {}) for i, x in rows]

    def events(self, asset: str) -> list[tuple[int, dict[str, Any]]]:
        """``(id, item)`` of every item the events of ``asset`` carry (an edge event is one item)."""
        return [(i, item) for i, payload in self.payloads(asset) for item in items_of(payload)]

    def runs(self, asset: str) -> list[dict[str, Any]]:
        return list(self.airflow.api("GET", f"/api/v2/dags/{asset}_consumer/dagRuns?limit=100")["dag_runs"])

    def events_in_runs(self, asset: str) -> Counter[int]:
        return events_in_runs(self.dsn, f"{asset}_consumer")

    def watermark(self, asset: str) -> Any:
        return watermarks(self.dsn, asset).get(asset)

    def saved_at(self, asset: str) -> float | None:
        """When the watermark of ``asset`` was last saved (the metadata DB's clock)."""
        rows = self.query(
            "SELECT extract(epoch FROM s.updated_at) FROM asset_state_store s JOIN asset a ON a.id = s.asset_id "
            "WHERE a.name = %s AND s.key LIKE 'airflow_deferrable_kit/%%'",
            asset,
        )
        return float(rows[0][0]) if rows else None

    def stored_at(self, asset: str) -> float:
        """When the newest event of ``asset`` was stored (the metadata DB's clock)."""
        rows = self.query(
            "SELECT extract(epoch FROM max(e.timestamp)) FROM asset_event e JOIN asset a ON a.id = e.asset_id "
            "WHERE a.name = %s",
            asset,
        )
        return float(rows[0][0])

    def covered(self, asset: str) -> bool:
        """Whether the watermark of ``asset`` was saved after its newest event was stored (or no event)."""
        rows = self.query(
            "SELECT extract(epoch FROM max(e.timestamp)) FROM asset_event e JOIN asset a ON a.id = e.asset_id "
            "WHERE a.name = %s",
            asset,
        )
        saved = self.saved_at(asset)
        return rows[0][0] is None or (saved is not None and saved > float(rows[0][0]))

    def set_batch(self, state: str) -> None:
        set_batch(self.api_url, self.batch, state)

    def not_ready_seen(self) -> None:
        """Turn the batch pending and wait until the HTTP watcher saved that it is not ready."""
        self.set_batch("pending")
        wait_for("the HTTP watcher seeing 'not ready'", lambda: (self.watermark(HTTP) or {}).get("ready") is False)

    def happen(self, name: str) -> None:
        """One new object, one new row, and (after a 'not ready' seen) one transition to ready."""
        self.s3.put_object(Bucket=self.bucket, Key=f"drop/{name}.csv", Body=b"1\n")
        self.postgres.psql(f"INSERT INTO {self.table} (dataset) VALUES ('{name}')")
        self.set_batch("ready")

    def consumed(self, asset: str) -> list[dict[str, Any]]:
        """The deduplicating consumer's answer of each finished run, oldest first."""
        runs = sorted(self.runs(asset), key=lambda run: run["run_after"])
        return [self.airflow.xcom(f"{asset}_consumer", run["dag_run_id"], "consume") for run in runs]


@pytest.fixture(scope="module")
def ha(ha_deployment: EventDeployment) -> Iterator[HaWorld]:
    deployment = ha_deployment
    names = deployment.names
    table, bucket, batch = names.table("ha"), names.bucket("ha"), names.batch("ha")
    deployment.postgres.psql(f"CREATE TABLE {table} (id serial PRIMARY KEY, dataset text NOT NULL)")
    client = deployment.s3_client()
    client.create_bucket(Bucket=bucket)
    airflow = deployment.airflow
    world = HaWorld(airflow, deployment.dsn, deployment.postgres, client, deployment.api_url, bucket, table, batch)
    # A triggerer whose heartbeat (every 2 s here) is older than this is dead: the other one
    # adopts its triggers. At 6 s, at 15 s, and once even at 30 s (three Airflows side by side), a
    # heartbeat held up on a busy 2-core machine handed live watchers over, and an event fired
    # just before a handover fired again, as after a stop. The test makes the killed one's
    # heartbeat old instead of waiting. The first triggerer runs two watchers at most: the second gets the third.
    threshold = "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD"
    [first] = deployment.restart_triggerers(1, **{threshold: "120", "AIRFLOW__TRIGGERER__CAPACITY": "2"})
    deployment.install(DAG_FILE)
    try:
        wait_for("the first triggerer running two watchers", lambda: world.holders() == Counter({first: 2, None: 1}))
        airflow.extra_env = {**airflow.extra_env, "AIRFLOW__TRIGGERER__CAPACITY": "3"}  # room to adopt every watcher
        airflow.start_component("triggerer", name="triggerer-2")
        second = wait_for("a second triggerer job", lambda: [j for j in world.running_triggerers() if j != first])[0]
        world.jobs = {first: "triggerer", second: "triggerer-2"}
        for asset in KINDS:
            airflow.wait_for_dag(f"{asset}_consumer")
        wait_for(
            "every watcher's starting point", lambda: all(world.watermark(a) is not None for a in KINDS), timeout=180
        )
        yield world
    finally:
        deployment.uninstall([DAG_FILE], [f"{asset}_consumer" for asset in KINDS], KINDS)


#: Seconds from an event being stored to the watermark covering it being saved, per kind.
WINDOWS: dict[str, list[float]] = {asset: [] for asset in KINDS}


def one_at_a_time(ha: HaWorld, names: list[str], *, runs_before: int) -> None:
    """Make each thing happen once its predecessor has its own DAG run (so each gets one).

    Also measures the at-least-once window: how long after each event was stored its watermark
    was saved (a triggerer dying in between fires the event again). Never before: a watermark
    saved ahead of its event's storage could lose the event.
    """
    for done, name in enumerate(names, start=runs_before + 1):
        # The save covering the previous event (the one of what happened while nobody watched,
        # too) lands about a second after it: taken for this event's save, it reads as negative.
        for asset in KINDS:
            wait_for(f"{asset}'s watermark covering its last event", lambda asset=asset: ha.covered(asset))
        ha.not_ready_seen()
        saved_before = {asset: ha.saved_at(asset) for asset in KINDS}
        ha.happen(name)
        for asset in KINDS:
            try:
                wait_for(f"run {done} of {asset}_consumer", lambda asset=asset, done=done: len(ha.runs(asset)) >= done)
            except AssertionError as exc:
                events = [payload.get("event_id") for _, payload in ha.events(asset)]
                raise AssertionError(f"{exc}; events {events}; watermark {ha.watermark(asset)}; runs "
                                     f"{[(r['dag_run_id'], r['state']) for r in ha.runs(asset)]}") from exc  # fmt: skip
            saved = wait_for(
                f"{asset}'s watermark saved",
                lambda asset=asset, before=saved_before: (at := ha.saved_at(asset)) != before[asset] and at,
            )
            WINDOWS[asset].append(saved - ha.stored_at(asset))
            assert WINDOWS[asset][-1] > 0, (asset, WINDOWS[asset])


def assert_exactly_once(ha: HaWorld, expected: int) -> None:
    """``expected`` events per kind, each in one run of its own, each a first delivery."""
    for asset in KINDS:
        events = ha.events(asset)
        assert len(events) == expected, (asset, [payload.get("event_id") for _, payload in events])
        assert len({payload["event_id"] for _, payload in events}) == expected  # no event fired twice
        wait_for(f"{asset}_consumer's runs finished", lambda asset=asset: all(
            run["state"] == "success" for run in ha.runs(asset)) and len(ha.runs(asset)) == expected)  # fmt: skip
        in_runs = ha.events_in_runs(asset)
        assert sorted(in_runs) == sorted({event_id for event_id, _ in events}) and set(in_runs.values()) == {1}
        consumed = ha.consumed(asset)
        assert all(len(answer["fresh"]) == 1 and answer["repeats"] == [] for answer in consumed), consumed
        assert sorted(e for answer in consumed for e in answer["fresh"]) == sorted(p["event_id"] for _, p in events)


def held_steadily(ha: HaWorld, expected: Counter[int | None], *, seconds: float = 6.0) -> Counter[int | None]:
    """The watchers' holders once they have been ``expected`` for ``seconds`` on end.

    The metadata DB names a watcher's new holder before the old one has stopped running it (it
    stops at its next state sync): a handover still in flight would fire an event twice.
    """
    end, since = time.monotonic() + 180, None
    while time.monotonic() < end:
        holders = ha.holders()
        if holders != expected:
            since = None
        elif since is None:
            since = time.monotonic()
        elif time.monotonic() - since >= seconds:
            return holders
        time.sleep(0.5)
    raise AssertionError(f"watchers not held as {dict(expected)} for {seconds:.0f}s on end: {dict(ha.holders())}")


def test_two_triggerers_fire_each_event_once_and_the_survivor_adopts_the_watchers(ha: HaWorld) -> None:
    first, second = ha.jobs
    holders = held_steadily(ha, Counter({first: 2, second: 1}))
    print(f"\nwatchers per triggerer job: {dict(holders)}")

    one_at_a_time(ha, [f"both-{i}" for i in range(N)], runs_before=0)
    time.sleep(4)  # several more polls by both triggerers: nothing more fires
    assert_exactly_once(ha, N)

    # Kill the triggerer holding two watchers, between events (nothing in flight).
    victim, survivor = first, second
    ha.not_ready_seen()
    process = ha.airflow.processes[ha.jobs[victim]]
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    killed = time.monotonic()
    outdate_heartbeat(ha.dsn, victim)
    ha.happen("orphaned")  # while nobody watches its watchers
    wait_for("the survivor adopting every watcher", lambda: ha.holders() == Counter({survivor: len(KINDS)}))
    print(f"adopted {time.monotonic() - killed:.1f}s after the kill")
    for asset in KINDS:
        wait_for(f"{asset}'s event of what happened meanwhile", lambda asset=asset: len(ha.runs(asset)) >= N + 1)
    one_at_a_time(ha, [f"survivor-{i}" for i in range(N - 1)], runs_before=N + 1)
    time.sleep(4)
    assert_exactly_once(ha, 2 * N)
    for asset, windows in WINDOWS.items():
        print(f"{asset}: watermark saved {min(windows):.2f} / {statistics.median(windows):.2f} / "
              f"{max(windows):.2f} s (min / median / max) after its event was stored")  # fmt: skip
    assert process.poll() is not None and ha.airflow.processes[ha.jobs[survivor]].poll() is None


def test_the_deduplication_recipe_skips_a_repeated_event(ha: HaWorld) -> None:
    # What a triggerer that died right after storing an event fires again: an asset event with
    # the same payload, stored later. The consumer's run of it must find it a repeat.
    if not all(ha.payloads(asset) for asset in KINDS):  # run alone: make one event of each kind
        one_at_a_time(ha, ["dedup"], runs_before=min(len(ha.runs(asset)) for asset in KINDS))
    for asset in KINDS:
        before = len(ha.runs(asset))
        _, payload = ha.payloads(asset)[-1]
        [(asset_id,)] = ha.query("SELECT id FROM asset WHERE name = %s", asset)
        ha.airflow.api("POST", "/api/v2/assets/events", {"asset_id": asset_id, "extra": {"payload": payload}})

        def finished(asset: str = asset, before: int = before) -> bool:
            runs = ha.runs(asset)
            return len(runs) == before + 1 and all(run["state"] == "success" for run in runs)

        wait_for(f"{asset}_consumer's run of the copy", finished)
        assert ha.consumed(asset)[-1] == {"fresh": [], "repeats": [item["event_id"] for item in items_of(payload)]}
