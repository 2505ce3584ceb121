"""The ported official Kafka event-trigger calls against the real broker: the example DAG's
apply_function runs unchanged on each message, and the shared-stream form fires every message."""

from __future__ import annotations

import json

from airflow_deferrable_kit.testing_events import WatcherHarness
from airflow_deferrable_kit.triggers.official_events import (
    KafkaMessageQueueTrigger,
    KafkaSharedStreamTrigger,
    MessageQueueTrigger,
)

from .conftest import Message, eventually, produce


async def test_the_example_apply_function_fires_once_per_message(bootstrap: str, kafka_conn: str, topic: str) -> None:
    # example_dag_kafka_message_queue_trigger.py's call, its function importable from the fixtures
    trigger = KafkaMessageQueueTrigger(
        topics=[topic],
        apply_function="tests.fixtures.official_examples.event_triggers.apply_function",
        kafka_config_id=kafka_conn,
        apply_function_args=None,
        apply_function_kwargs=None,
        poll_timeout=1,
        poll_interval=0.2,
    )
    async with WatcherHarness() as triggerer:
        watch = await triggerer.start(trigger)
        await eventually(lambda: watch.stores["asset"].writes >= 1, timeout=20)
        made = await produce(bootstrap, topic, *(Message({"n": i}, partition=i % 3) for i in range(4)))
        await watch.wait_for_items(4)
    assert sorted((p["partition"], p["offset"]) for p in watch.items) == sorted(made)
    assert all(p["matched"]["state"] == "success" for p in watch.items)


async def test_the_shared_stream_form_fires_every_message_as_text(bootstrap: str, kafka_conn: str, topic: str) -> None:
    trigger = KafkaSharedStreamTrigger(topics=[topic], kafka_config_id=kafka_conn)
    async with WatcherHarness() as triggerer:
        watch = await triggerer.start(trigger)
        await eventually(lambda: watch.stores["asset"].writes >= 1, timeout=20)
        await produce(bootstrap, topic, Message(b"plain text", raw=True, partition=0), Message({"n": 1}, partition=0))
        events = await watch.wait_for_items(2)
    assert [e["value"] for e in events] == ["plain text", '{"n": 1}']


async def test_a_ported_call_hands_consumers_the_functions_answer_as_data(
    bootstrap: str, kafka_conn: str, topic: str
) -> None:
    # The official trigger fires what apply_function returns ({"order": 1, ...}), and a consumer
    # reads it from the asset event. Ported, each item carries that answer as data under
    # "returned" (it was only a repr string in matched.returned: "{'order': 1, ...}").
    trigger = MessageQueueTrigger(
        queue=f"kafka://localhost:9092/{topic}",
        apply_function="tests.integration.kafka.predicates.official_order",
        kafka_config_id=kafka_conn,
        poll_interval=0.2,
    )
    async with WatcherHarness() as triggerer:
        watch = await triggerer.start(trigger)
        await eventually(lambda: watch.stores["asset"].writes >= 1, timeout=20)
        await produce(
            bootstrap,
            topic,
            Message({"kind": "order", "n": 1}, partition=0),
            Message({"kind": "refund", "n": 2}, partition=0),  # the function answers None: no event
            Message({"kind": "order", "n": 3}, partition=0),
        )
        items = await watch.wait_for_items(2)
    assert [item["returned"] for item in items] == [{"order": 1, "topic": topic}, {"order": 3, "topic": topic}]
    assert json.loads(json.dumps(watch.payloads)) == watch.payloads  # plain JSON, as stored
