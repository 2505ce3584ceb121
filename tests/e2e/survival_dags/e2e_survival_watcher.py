"""End-to-end DAG: an ``as_event_trigger()`` watcher whose wait module only the DAG processor has.

``adk_processor_only_wait`` is on the DAG processor's path alone (see
tests/e2e/test_triggerer_survives_e2e.py), as in-house code shipped to the DAG processor and not
to the triggerer would be. The consumer never runs: the watcher cannot be built where it runs.
"""

from __future__ import annotations

import datetime as dt

from adk_processor_only_wait import AlwaysThere  # type: ignore[import-not-found]
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, Asset, AssetWatcher

asset = Asset(
    name="adk_e2e_unbuildable",
    watchers=[AssetWatcher(name="adk_e2e_unbuildable_watcher", trigger=AlwaysThere().as_event_trigger(backfill=True))],
)
with DAG(dag_id="adk_e2e_unbuildable_consumer", schedule=[asset], start_date=dt.datetime(2024, 1, 1), catchup=False):
    EmptyOperator(task_id="consume")
