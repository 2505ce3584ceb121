"""The apache-kafka provider's example sensor calls, import changed, against a real broker.

For each situation the outcome is compared with what the official ``AwaitMessageSensor`` does,
as its source and docs say (tests/fixtures/official/apache_kafka/kafka.py and its trigger): it
calls ``apply_function(message)`` on each message and ends on the first truthy answer, with that
answer as the XCom (also under ``xcom_push_key``); with no truthy answer it waits until its
``timeout``. The example's ``apply_function`` path and connection extras are kept as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import types
from typing import Any

import pytest
from aiokafka.errors import TopicAlreadyExistsError
from airflow.sdk.exceptions import AirflowSensorTimeout

from airflow_deferrable_kit.testing import assert_defers, make_context, run_trigger
from airflow_deferrable_kit.triggers.kafka import KafkaMessageTrigger
from tests.fixtures.official_examples import apache_kafka
from tests.fixtures.official_examples.calls import ExampleCall
from tests.integration.kafka.conftest import Message, create_topic, produce, set_connection

AWAITING_MESSAGE: ExampleCall = next(c for c in apache_kafka.CALLS if c.task_id == "awaiting_message")
#: What the official sensor's XCom is for the first value divisible by 5 (the example's function).
OFFICIAL_ANSWER_FOR_5 = " Got the following message: 5"


class RecordingTaskInstance:
    """A task instance that keeps what is pushed under a key, as the official sensor pushes."""

    try_number = 1

    def __init__(self) -> None:
        self.pushed: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value

    def get_first_reschedule_date(self, context: Any) -> None:
        return None


@pytest.fixture
def example_dag_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """The example's DAG module, importable as its ``apply_function`` path names it."""
    module = types.ModuleType("example_dag_hello_kafka")
    module.await_function = apache_kafka.await_function  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "example_dag_hello_kafka", module)


@pytest.fixture
def example_topic(bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The example's connection ``t5`` (its extras, the local broker) and its topic ``test_1``."""
    set_connection(
        monkeypatch, "t5", bootstrap, **{k: v for k, v in apache_kafka.T5_EXTRAS.items() if "bootstrap" not in k}
    )
    with contextlib.suppress(TopicAlreadyExistsError):
        asyncio.run(create_topic(bootstrap, "test_1", partitions=1))
    # The local broker answers a log end lookup with the start of the last batch + 1, so a
    # batch of several records left by an earlier test would put this test's start inside it:
    # end the log with a one-record batch (a value the example's function does not accept).
    asyncio.run(produce(bootstrap, "test_1", *values(1)))
    return "test_1"


def example_sensor(**changes: Any) -> Any:
    arguments = AWAITING_MESSAGE.filled({})
    arguments.update(changes)
    return AWAITING_MESSAGE.kit_class()(**arguments)


def values(*numbers: int) -> list[Message]:
    """Messages as the example's producer writes them: JSON key i, JSON value i."""
    return [Message(number, key=json.dumps(number)) for number in numbers]


@pytest.mark.usefixtures("example_dag_module")
def test_the_first_message_the_function_accepts_ends_the_wait_in_the_worker(bootstrap: str, example_topic: str) -> None:
    """As ported (no ``deferrable``, so ``[operators] default_deferrable``, off here): pokes."""
    task = example_sensor()
    assert task.deferrable is False
    context = make_context(task, ti=RecordingTaskInstance())
    task.fix_start(context)  # where the first execution starts: the log end, before the producer runs
    asyncio.run(produce(bootstrap, example_topic, *values(1, 2, 5, 10)))
    payload = task.execute(context)
    # Official: fires on the first truthy answer (value 5), not on 1 or 2, nor on 10 after it.
    assert (payload["value"], payload["key"]) == (5, "5")
    assert payload["matched"]["returned"] == repr(OFFICIAL_ANSWER_FOR_5)
    assert context["ti"].pushed == {"retrieved_message": payload}


@pytest.mark.usefixtures("example_dag_module")
def test_no_message_the_function_accepts_keeps_the_poke_waiting(bootstrap: str, example_topic: str) -> None:
    task = example_sensor()
    context = make_context(task, ti=RecordingTaskInstance())
    task.fix_start(context)
    asyncio.run(produce(bootstrap, example_topic, *values(1, 2, 3)))
    assert task.poke(context) is False  # official: none is divisible by 5, it keeps waiting
    assert context["ti"].pushed == {}


@pytest.mark.usefixtures("example_dag_module")
def test_deferred_the_trigger_fires_on_the_same_message(bootstrap: str, example_topic: str) -> None:
    task = example_sensor(deferrable=True)
    context = make_context(task, ti=RecordingTaskInstance())
    trigger = assert_defers(task, KafkaMessageTrigger, context=context)
    assert (trigger.predicate, trigger.predicate_receives) == ("example_dag_hello_kafka.await_function", "message")
    asyncio.run(produce(bootstrap, example_topic, *values(3, 4, 5)))
    rebuilt = KafkaMessageTrigger(**json.loads(json.dumps(trigger.serialize()[1])))
    payload = asyncio.run(run_trigger(rebuilt, timeout=20)).payload
    assert payload["status"] == "success" and payload["value"] == 5
    assert payload["matched"]["returned"] == repr(OFFICIAL_ANSWER_FOR_5)
    assert task.execute_complete(context, payload) == payload
    assert context["ti"].pushed == {"retrieved_message": payload}


@pytest.mark.usefixtures("example_dag_module")
def test_deferred_without_a_match_the_task_times_out(bootstrap: str, example_topic: str) -> None:
    task = example_sensor(deferrable=True, timeout=2)
    context = make_context(task, ti=RecordingTaskInstance())
    trigger = assert_defers(task, KafkaMessageTrigger, context=context)
    asyncio.run(produce(bootstrap, example_topic, *values(6, 7, 8)))
    payload = asyncio.run(run_trigger(KafkaMessageTrigger(**trigger.serialize()[1]), timeout=20)).payload
    assert payload["status"] == "timeout"
    # Official: the deferral's timeout fails the task; here the same, from the payload.
    with pytest.raises(AirflowSensorTimeout):
        task.execute_complete(context, payload)
    assert context["ti"].pushed == {}


@pytest.mark.usefixtures("example_dag_module")
def test_a_match_already_in_the_topic_needs_start_from_earliest(bootstrap: str, example_topic: str) -> None:
    """The example's ``auto.offset.reset: beginning`` with a new group reads what is there already.

    Here the wait starts at the log end when the task first runs, whatever the connection says;
    ``start_from="earliest"`` (docs/migration.md) is the official example's reading.
    """
    asyncio.run(produce(bootstrap, example_topic, *values(20)))
    asyncio.run(produce(bootstrap, example_topic, *values(21)))  # a one-record batch ends the log
    default = example_sensor()
    context = make_context(default, ti=RecordingTaskInstance())
    default.fix_start(context)
    assert default.poke(context) is False
    earliest = example_sensor(start_from="earliest")
    payload = earliest.execute(make_context(earliest, ti=RecordingTaskInstance()))
    assert payload["value"] % 5 == 0
    assert payload["offset"] < default.start_offsets[example_topic]["0"]


def test_apply_function_args_and_kwargs_are_bound_as_officially(bootstrap: str, kafka_conn: str, topic: str) -> None:
    """``partial(f, *args, **kwargs)(message)``, the official trigger's call, on confluent-style methods."""
    task = AWAITING_MESSAGE.kit_class()(
        task_id="bound",
        kafka_config_id=kafka_conn,
        topics=[topic],
        apply_function="tests.integration.kafka.predicates.official_style_at_least",
        apply_function_args=[3],
        apply_function_kwargs={"field": "n"},
        deferrable=True,
    )
    trigger = assert_defers(task, KafkaMessageTrigger)
    asyncio.run(produce(bootstrap, topic, *[Message({"n": n}, key=f"k{n}", partition=0) for n in (1, 2, 3)]))
    payload = asyncio.run(run_trigger(KafkaMessageTrigger(**trigger.serialize()[1]), timeout=20)).payload
    assert payload["status"] == "success" and payload["value"] == {"n": 3}
    assert payload["matched"]["returned"] == repr({"topic": topic, "partition": 0, "offset": 2, "n": 3})
