"""The official event-trigger calls port: built as the kit's watcher from the official arguments,
or refused at parse naming the argument and what to write instead.

The official signatures are read with ``ast`` from the providers' trigger modules vendored under
tests/fixtures/official (never imported), so every official parameter is checked to be handled
by the port and to have a row in docs/migration.md's "Event triggers" section.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
from typing import Any

import pytest
from airflow.sdk import Asset, AssetWatcher
from airflow.triggers.base import BaseEventTrigger

from airflow_deferrable_kit.triggers import official_events
from airflow_deferrable_kit.triggers.http_events import HttpBatchReadyEventTrigger
from airflow_deferrable_kit.triggers.kafka_events import KafkaMessageEventTrigger
from tests import REPO
from tests.fixtures.official_examples import event_triggers
from tests.fixtures.official_examples.calls import ExampleCall

ROOT = REPO
OFFICIAL = ROOT / "tests" / "fixtures" / "official"
MIGRATION = ROOT / "docs" / "migration.md"

#: official class -> (vendored module, the kit's port)
PORTS = {
    "MessageQueueTrigger": ("common_messaging/msg_queue.py", official_events.MessageQueueTrigger),
    "KafkaMessageQueueTrigger": ("apache_kafka/msg_queue.py", official_events.KafkaMessageQueueTrigger),
    "AwaitMessageTrigger": ("apache_kafka/await_message.py", official_events.AwaitMessageTrigger),
    "KafkaSharedStreamTrigger": ("apache_kafka/shared_stream.py", official_events.KafkaSharedStreamTrigger),
    "HttpEventTrigger": ("http/triggers_http.py", official_events.HttpEventTrigger),
}


def official_parameters(module: str, name: str) -> list[str]:
    tree = ast.parse((OFFICIAL / module).read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    init = next(f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    arguments = init.args
    return [a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs] if a.arg != "self"]


def documented_parameters(name: str) -> set[str]:
    """The names in the ``official`` column of the migration.md table headed by ``name``."""
    text = MIGRATION.read_text()
    assert "## Event triggers" in text
    section = text.split("## Event triggers", 1)[1].split("\n## ", 1)[0]
    tables = re.split(r"^### ", section, flags=re.MULTILINE)
    matching = [t for t in tables if re.search(rf"`{name}`|\b{name}\b", t.splitlines()[0])]
    assert matching, f"docs/migration.md's Event triggers section has no table for {name}"
    names: set[str] = set()
    for table in matching:
        for line in table.splitlines():
            if line.startswith("| ") and not line.startswith("|---"):
                names.update(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", line.split("|")[1]))
    return names


@pytest.mark.parametrize("official", sorted(PORTS))
def test_every_official_parameter_is_taken_by_the_port_and_documented(official: str) -> None:
    module, port = PORTS[official]
    parameters = [p for p in official_parameters(module, official) if p != "kwargs"]
    assert parameters
    taken = set(inspect.signature(port).parameters)
    assert [p for p in parameters if p not in taken] == []
    assert [p for p in parameters if p not in documented_parameters(official)] == []


@pytest.mark.parametrize("call", event_triggers.CALLS, ids=lambda call: call.official.rpartition(":")[2])
def test_the_official_calls_build_or_are_refused_at_parse(call: ExampleCall) -> None:
    arguments = call.filled({"GITHUB_HEADERS": event_triggers.GITHUB_HEADERS})
    port = call.kit_class()
    if call.refused is not None:
        with pytest.raises((TypeError, ValueError), match=call.refused):
            port(**arguments)
        return
    trigger = port(**arguments)
    assert isinstance(trigger, BaseEventTrigger)
    Asset(name="ported", watchers=[AssetWatcher(name="ported", trigger=trigger)])
    _classpath, kwargs = trigger.serialize()
    assert not {"kafka_config_id", "apply_function", "apply_function_args", "poll_timeout", "queue"} & set(kwargs)
    rebuilt = type(trigger)(**json.loads(json.dumps(kwargs)))
    assert rebuilt == trigger and rebuilt.watermark_key() == trigger.watermark_key()


def test_the_ported_kafka_calls_are_the_kit_watchers_with_the_kit_names() -> None:
    by_url = official_events.MessageQueueTrigger(queue="kafka://localhost:9092/test")
    assert by_url == KafkaMessageEventTrigger(topics=["test"], kafka_conn_id="kafka_default", value_format="text")
    many = official_events.MessageQueueTrigger(queue="kafka://b1:9092,b2:9092/orders,refunds", kafka_config_id="ev")
    assert many.topics == ["orders", "refunds"] and many.kafka_conn_id == "ev"
    explicit = official_events.MessageQueueTrigger(queue="kafka://localhost:9092/ignored", topics=["t"])
    assert explicit.topics == ["t"]  # as officially: topics= wins over the URL's
    ported = official_events.KafkaMessageQueueTrigger(
        topics=["test"], apply_function="pkg.checks.is_match", apply_function_kwargs={"field": "n"}
    )
    assert ported == KafkaMessageEventTrigger(
        topics=["test"],
        predicate="pkg.checks.is_match",
        predicate_receives="message",
        predicate_kwargs={"field": "n"},
        value_format="bytes",
    )
    by_scheme = official_events.MessageQueueTrigger(
        scheme="kafka", topics=["test"], apply_function="pkg.checks.is_match", apply_function_kwargs={"field": "n"}
    )
    assert BaseEventTrigger.hash(*by_scheme.serialize()) == BaseEventTrigger.hash(*ported.serialize())
    shared = official_events.KafkaSharedStreamTrigger(topics=["b", "a"], kafka_config_id="ev", poll_timeout=2.0)
    assert shared == KafkaMessageEventTrigger(topics=["a", "b"], kafka_conn_id="ev", value_format="text")
    # the kit's own parameters finish a port the official ones cannot express
    eu = official_events.KafkaSharedStreamTrigger(topics=["orders"], value_format="json", acceptors=[], backfill=True)
    assert eu.backfill is True


def test_the_ported_http_call_without_headers_builds_the_kit_watcher() -> None:
    trigger = official_events.HttpEventTrigger(
        endpoint="repos/apache/airflow/releases/latest",
        method="GET",
        http_conn_id="github",
        response_check_path="dags.check_airflow_releases.check_github_api_response",
        data={"per_page": 1},
        max_consecutive_failures=3,
    )
    assert trigger == HttpBatchReadyEventTrigger(
        http_conn_id="github",
        endpoint="repos/apache/airflow/releases/latest",
        query={"per_page": 1},
        predicate="dags.check_airflow_releases.check_github_api_response",
        predicate_receives="response",
    )
    release = official_events.HttpEventTrigger(
        http_conn_id="github", endpoint="repos/apache/airflow/releases/latest", fire_on_change="id", select=["name"]
    )
    assert release.fire_on_change == "id" and release.predicate is None


@pytest.mark.parametrize(
    ("port", "kwargs", "message"),
    [
        ("MessageQueueTrigger", {"queue": "sqs://queue-url"}, r"queue= .*only Kafka queues"),
        ("MessageQueueTrigger", {"scheme": "redis+pubsub", "channels": ["c"]}, r"scheme= .*only scheme='kafka'"),
        (
            "MessageQueueTrigger",
            {"scheme": "kafka", "topics": ["t"], "trigger_queue": "q"},
            r"trigger_queue= .*3\.3\.2",
        ),
        ("MessageQueueTrigger", {}, r"give queue='kafka://host:port/topic' or scheme='kafka'"),
        ("MessageQueueTrigger", {"queue": "kafka://localhost:9092"}, r"names no topic"),
        ("MessageQueueTrigger", {"scheme": "kafka"}, r"needs topics="),
        (
            "MessageQueueTrigger",
            {"scheme": "kafka", "topics": ["t"], "group_id": "g"},
            r"takes no group_id: a watcher starts from its watermark",
        ),
        ("AwaitMessageTrigger", {"topics": ["t"], "commit_offset": False}, r"commit_offset= .*watermark"),
        ("AwaitMessageTrigger", {"topics": ["t"], "apply_function": len}, r"apply_function must be a dotted path"),
        ("AwaitMessageTrigger", {"topics": ["t"], "poll_timeout": -1}, r"poll_timeout must be"),
        ("KafkaSharedStreamTrigger", {"topics": ["t"], "dlq_topic": "t.dlq"}, r"dlq_topic= .*nothing to dead-letter"),
        ("HttpEventTrigger", {"response_check_path": "m.f", "headers": {"X": "1"}}, r"headers= .*connection extras"),
        ("HttpEventTrigger", {"response_check_path": "m.f", "auth_type": object()}, r"auth_type= .*'auth_type'"),
        ("HttpEventTrigger", {"extra_options": {"verify": False}}, r"extra_options= .*'verify'"),
        ("HttpEventTrigger", {"method": "POST", "data": {"a": 1}}, r"data= .*json_body="),
        ("HttpEventTrigger", {"response_check_path": lambda r: True}, r"response_check_path= .*callable"),
        ("HttpEventTrigger", {"max_consecutive_failures": 0}, r"max_consecutive_failures"),
        ("HttpEventTrigger", {"fire_on_change": "items[*]"}, r"fire_on_change"),
    ],
)
def test_what_cannot_port_is_refused_at_parse_naming_the_argument(
    port: str, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        getattr(official_events, port)(**kwargs)


def test_the_event_triggers_take_the_official_names_their_sensors_take() -> None:
    official = KafkaMessageEventTrigger(
        topics=["orders"],
        kafka_config_id="events",
        apply_function="pkg.checks.at_least",
        apply_function_args=[5],
        apply_function_kwargs={"field": "n"},
    )
    own = KafkaMessageEventTrigger(
        topics=["orders"],
        kafka_conn_id="events",
        predicate="pkg.checks.at_least",
        predicate_receives="message",
        predicate_args=[5],
        predicate_kwargs={"field": "n"},
    )
    assert official == own and official.watermark_key() == own.watermark_key()
    _classpath, kwargs = official.serialize()
    assert not {"kafka_config_id", "apply_function", "apply_function_args", "apply_function_kwargs"} & set(kwargs)
    assert KafkaMessageEventTrigger(**json.loads(json.dumps(kwargs))) == official
    with pytest.raises(ValueError, match="kafka_conn_id= and its official name kafka_config_id="):
        KafkaMessageEventTrigger(topics=["t"], kafka_conn_id="a", kafka_config_id="b")
    with pytest.raises(ValueError, match=r"predicate= .* apply_function="):
        KafkaMessageEventTrigger(topics=["t"], predicate="a.b", apply_function="c.d")
    http = HttpBatchReadyEventTrigger(
        http_conn_id="api", request_params={"day": "2030-01-01"}, response_error_codes_allowlist=["404", "409"]
    )
    assert http == HttpBatchReadyEventTrigger(http_conn_id="api", query={"day": "2030-01-01"}, not_yet_codes=[404, 409])
    assert "request_params" not in http.serialize()[1]
