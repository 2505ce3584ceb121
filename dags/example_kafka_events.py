"""Start DAG runs for the finished batches announced on Kafka, with no sensor task: an asset watcher.

``finished_batch_messages``: the messages on ``batch-events`` whose JSON value says
``{"state": "done"}`` (the loader publishes one per batch, keyed ``batch-<date>``). What one look
finds is one asset event, ``{"items": [...], "count": n}`` in ``event.extra["payload"]``, an item
per message: topic, partition, offset, key, value and ``event_id``. Events are at least
``min_event_interval`` (5 s) apart, so each joins a DAG run. Messages produced
before the watcher first ran do not fire; after that none is missed across triggerer restarts
(the next offset of each partition is kept in the asset state store, saved only once the events
it covers are stored). Every watcher of ``batch-events`` in a triggerer shares one fetch.

Connection ``kafka_default`` is defined by docker-compose.yaml. This file makes no network call
when parsed. See docs/events.md for the delivery semantics.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import DAG, Asset, AssetWatcher, task

from airflow_deferrable_kit.triggers.kafka_events import KafkaMessageEventTrigger

done_batches = KafkaMessageEventTrigger(
    kafka_conn_id="kafka_default",
    topics=["batch-events"],
    acceptors=[
        {"state": "success", "matcher": "path", "argument": "state", "comparator": "equals", "expected": "done"}
    ],
)
finished_batch_messages = Asset(
    name="finished_batch_messages", watchers=[AssetWatcher(name="batch_done_message", trigger=done_batches)]
)

with DAG(dag_id="example_load_announced_batches", schedule=[finished_batch_messages],
         start_date=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc), catchup=False,
         tags=["deferrable-kit", "events", "kafka", "example"], doc_md=__doc__) as load_dag:  # fmt: skip

    @task
    def load(triggering_asset_events: Any = None) -> list[str]:
        """Every message the run's events carry (those one look found), each once: each names its batch."""
        messages: dict[str, Any] = {}
        for events in triggering_asset_events.values():
            for event in events:
                for message in event.extra.get("payload", {}).get("items", []):
                    messages.setdefault(message["event_id"], message)  # a repeat after a crash: once
        return [f"{m['key']} ({m['event_id']}): {m['value'].get('rows')} rows" for m in messages.values()]

    load()
