"""An end-to-end DAG scheduled on an asset whose watcher is the kit's Kafka event trigger.

The test that serves this file (tests/e2e/test_events_e2e.py, the Kafka part) names the topic
in the environment and defines the connection.
"""

from __future__ import annotations

import datetime as dt
import os

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, Asset, AssetWatcher

from airflow_deferrable_kit.triggers.kafka_events import KafkaMessageEventTrigger

TOPIC = os.environ.get("ADK_E2E_EVENTS_TOPIC", "adk-e2e-events")

orders = Asset(
    name="adk_e2e_kafka_orders",
    watchers=[
        AssetWatcher(
            name="adk_e2e_kafka_orders_watcher",
            trigger=KafkaMessageEventTrigger(
                topics=[TOPIC],
                kafka_conn_id="adk_e2e_kafka",
                acceptors=[
                    {
                        "state": "success",
                        "matcher": "path",
                        "argument": "kind",
                        "comparator": "equals",
                        "expected": "order",
                    }
                ],
                poll_interval=1,
            ),
        )
    ],
)

with DAG(dag_id="adk_e2e_kafka_orders_consumer", schedule=[orders], start_date=dt.datetime(2024, 1, 1), catchup=False):
    EmptyOperator(task_id="consume")
