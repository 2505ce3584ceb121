"""The Kafka wait's pure parts: kwargs, validation, connection mapping, errors, conditions, payload."""

from __future__ import annotations

import asyncio
import itertools
import json
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition, errors

from airflow_deferrable_kit import _kafka_fanout
from airflow_deferrable_kit._kafka_client import classify_kafka_error, client_options
from airflow_deferrable_kit._kafka_fanout import CatchUpPass, Waiter
from airflow_deferrable_kit._kafka_messages import MATCHERS, KafkaMessage, MatchSpec, canonical_acceptors
from airflow_deferrable_kit._kafka_reader import TopicReader
from airflow_deferrable_kit.conditions import load_acceptors
from airflow_deferrable_kit.payload import FatalError, TransientError
from airflow_deferrable_kit.triggers.kafka import KafkaMessageTrigger


def record(value: bytes | None, *, key: bytes | None = b"k", headers: Any = (), offset: int = 0) -> Any:
    return SimpleNamespace(
        topic="t", partition=0, offset=offset, timestamp=1_700_000_000_000, key=key, value=value, headers=headers
    )


# ----------------------------------------------------------------------------- kwargs
def test_round_trip_is_exact_and_json_only() -> None:
    trigger = KafkaMessageTrigger(
        topics="orders",
        kafka_conn_id="kafka_prod",
        acceptors=canonical_acceptors(success=[{"key": "batch-42"}], failure=[{"path": "state", "in": ["failed"]}]),
        predicate="tests.kafka.predicates:total_over_100",
        start_from="committed",
        group_id="airflow-waits",
        start_after_ms=1_700_000_000_000,
        poll_interval=5,
        deadline="2030-01-01T00:00:00+00:00",
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_deferrable_kit.triggers.kafka.KafkaMessageTrigger"
    assert kwargs["topics"] == ["orders"]
    again = KafkaMessageTrigger(**json.loads(json.dumps(kwargs)))
    assert again == trigger and again.serialize() == (classpath, kwargs)


def test_start_moment_is_fixed_when_built_and_kept_in_kwargs() -> None:
    trigger = KafkaMessageTrigger(topics=["t"])
    assert isinstance(trigger.start_after_ms, int) and trigger.start_after_ms > 1_600_000_000_000
    assert KafkaMessageTrigger(**trigger.serialize()[1]).start_after_ms == trigger.start_after_ms
    assert KafkaMessageTrigger(topics=["t"], start_from="earliest").start_after_ms is None


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"topics": []}, "topics"),
        ({"topics": ["a", "a"]}, "topics"),
        ({"topics": [" a"]}, "topics"),
        ({"topics": ["a"], "kafka_conn_id": ""}, "kafka_conn_id"),
        ({"topics": ["a"], "value_format": "avro"}, "value_format"),
        ({"topics": ["a"], "start_from": "latest"}, "start_from"),
        ({"topics": ["a"], "start_from": "committed"}, "group_id"),
        ({"topics": ["a"], "start_after_ms": -1}, "start_after_ms"),
        ({"topics": ["a"], "start_after_ms": True}, "start_after_ms"),
        ({"topics": ["a"], "predicate": "not a path"}, "predicate"),
        ({"topics": ["a"], "acceptors": [{"state": "success", "matcher": "offset", "expected": 1}]}, "matcher"),
        (
            {"topics": ["a"], "acceptors": [{"state": "failure", "matcher": "key", "expected": "x"}]},
            "can never succeed",
        ),
        (
            {
                "topics": ["a"],
                "value_format": "bytes",
                "acceptors": canonical_acceptors(success=[{"path": "a", "equals": 1}]),
            },
            "value_format",
        ),
        (
            {
                "topics": ["a"],
                "value_format": "text",
                "acceptors": canonical_acceptors(success=[{"path": "a", "equals": 1}]),
            },
            "value_format 'json'",
        ),
        ({"topics": ["a"], "wait_for_topic": "yes"}, "wait_for_topic"),
    ],
)
def test_bad_input_names_the_argument(kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        KafkaMessageTrigger(**kwargs)


def test_sugar_becomes_canonical_acceptors() -> None:
    acceptors = canonical_acceptors(
        success=[{"key": "b-1"}, {"header": "event", "equals": "done"}, {"value": ["a", "b"]}],
        failure=[{"path": "state", "in": ["failed"]}],
    )
    assert acceptors == [
        {"state": "failure", "matcher": "path", "comparator": "in", "argument": "state", "expected": ["failed"]},
        {"state": "success", "matcher": "key", "comparator": "equals", "expected": "b-1"},
        {"state": "success", "matcher": "header", "comparator": "equals", "argument": "event", "expected": "done"},
        {"state": "success", "matcher": "value", "comparator": "in", "expected": ["a", "b"]},
    ]
    with pytest.raises(ValueError, match=r"success\[0\]"):
        canonical_acceptors(success=[{"key": "x", "path": "y"}])


# ------------------------------------------------------------------------ connection
def test_connection_maps_to_aiokafka_settings_without_leaking_the_secret() -> None:
    options, tls = client_options(
        conn_id="k",
        host=None,
        port=None,
        login="svc",
        password="pw",
        extra={
            "bootstrap.servers": "b1:9093, b2:9093",
            "security.protocol": "sasl_ssl",
            "sasl.mechanisms": "SCRAM-SHA-512",
            "ssl.ca.location": "/etc/ca.pem",
            "ssl.endpoint.identification.algorithm": "none",
            "group.id": "ignored",
        },
    )
    assert options == {
        "bootstrap_servers": ["b1:9093", "b2:9093"],
        "security_protocol": "SASL_SSL",
        "client_id": "airflow-deferrable-kit",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "svc",
        "sasl_plain_password": "pw",
    }
    assert tls == {
        "cafile": "/etc/ca.pem",
        "certfile": None,
        "keyfile": None,
        "password": None,
        "check_hostname": False,
    }


def test_connection_extra_credentials_win_and_host_port_work() -> None:
    options, tls = client_options(
        conn_id="k",
        host="h1,h2:9000",
        port=9092,
        login="ignored",
        password=None,
        extra={"security.protocol": "SASL_PLAINTEXT", "sasl.username": "u", "sasl.password": "p"},
    )
    assert options["bootstrap_servers"] == ["h1:9092", "h2:9000"]
    assert (options["sasl_mechanism"], options["sasl_plain_username"], options["sasl_plain_password"]) == (
        "PLAIN",
        "u",
        "p",
    )
    assert tls is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"extra": {}}, "no bootstrap servers"),
        ({"extra": {"bootstrap.servers": "broker"}}, "host:port"),
        ({"extra": {"bootstrap.servers": "b:1", "security.protocol": "TLS"}}, "security.protocol"),
        (
            {"extra": {"bootstrap.servers": "b:1", "security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}},
            "sasl.mechanism",
        ),
        ({"extra": {"bootstrap.servers": "b:1", "security.protocol": "SASL_SSL"}}, "username and password"),
    ],
)
def test_bad_connection_is_a_fatal_configuration_error(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(FatalError, match=message) as caught:
        client_options(conn_id="k", host=None, port=None, login=None, password=None, **fields)
    assert caught.value.error_type == "configuration"


@pytest.mark.parametrize(
    ("exc", "kind", "error_type"),
    [
        (errors.KafkaConnectionError("refused"), TransientError, "broker"),
        (errors.RequestTimedOutError(), TransientError, "broker"),
        (errors.NotLeaderForPartitionError(), TransientError, "broker"),
        (errors.KafkaTimeoutError(), TransientError, "broker"),
        (errors.SaslAuthenticationFailed("bad password"), FatalError, "authentication"),
        (errors.UnsupportedSaslMechanismError(), FatalError, "authentication"),
        (errors.TopicAuthorizationFailedError(), FatalError, "authorization"),
        (errors.GroupAuthorizationFailedError(), FatalError, "authorization"),
    ],
)
def test_errors_are_classified(exc: Exception, kind: type, error_type: str) -> None:
    error = KafkaMessageTrigger(topics=["t"]).classify_error(exc)
    assert isinstance(error, kind) and error.error_type == error_type


def test_unknown_exceptions_fall_back_to_the_base() -> None:
    assert classify_kafka_error(ValueError("x")) is None
    assert isinstance(KafkaMessageTrigger(topics=["t"]).classify_error(ConnectionResetError()), TransientError)


# ---------------------------------------------------------------------- conditions
def spec(acceptors: list[dict[str, Any]], predicate: str | None = None, value_format: str = "json") -> MatchSpec:
    return MatchSpec(load_acceptors(acceptors, matchers=MATCHERS), predicate, value_format)


def test_evaluation_follows_acceptor_order_and_predicate_rules() -> None:
    message = KafkaMessage(record(b'{"state": "running", "id": 1}', headers=[("e", b"x")]))
    retry_first = spec(
        canonical_acceptors(
            acceptors=[{"state": "retry", "matcher": "path", "argument": "state", "expected": "running"}],
            success=[{"path": "id", "equals": 1}],
        )
    )
    assert retry_first.evaluate(message) is None
    success = spec(canonical_acceptors(success=[{"path": "id", "equals": 1}]))
    outcome = success.evaluate(message)
    assert outcome is not None and outcome[0] == "success"
    with_predicate = spec(canonical_acceptors(success=[{"path": "id", "equals": 1}]), predicate="m:f")
    assert with_predicate.evaluate(message)[0] == "predicate"  # type: ignore[index]
    only_predicate = spec([], predicate="m:f")
    assert only_predicate.evaluate(message) == ("predicate", None)
    assert spec([]).evaluate(message) == ("success", None)  # no condition: any message


def test_index_keys_distinguish_json_types() -> None:
    keys = spec(canonical_acceptors(success=[{"path": "id", "in": [1, True, "1"]}])).index_keys()
    assert keys is not None and len({value for _, value in keys}) == 3
    assert spec(canonical_acceptors(success=[{"path": "id", "exists": True}])).index_keys() is None
    assert spec([], predicate="m:f").index_keys() is None
    assert spec(canonical_acceptors(success=[{"path": "id", "equals": [1]}])).index_keys() is None


def test_message_problems_depend_on_the_format() -> None:
    assert KafkaMessage(record(None)).problem("bytes") == "tombstone"
    assert KafkaMessage(record(b"\xff")).problem("text") == "undecodable"
    assert KafkaMessage(record(b"\xff")).problem("bytes") is None
    assert KafkaMessage(record(b"hello")).problem("json") == "malformed"
    assert KafkaMessage(record(b"hello")).problem("text") is None
    assert KafkaMessage(record(b"Infinity")).problem("json") == "malformed"


def test_payload_caps_escape_heavy_values() -> None:
    value = json.dumps({"text": "\u00e9" * 40_000}, ensure_ascii=False).encode()
    payload = KafkaMessage(record(value, key=b"\xff" * 3000, headers=[("h", b"\x00" * 2000)])).payload("json")
    assert payload["value_truncated"] is True
    assert len(json.dumps(payload)) < 48_000
    assert payload["key"].startswith("\\xff")


def test_key_cap_keeps_what_fits_even_when_every_character_is_escaped() -> None:
    fits, too_long = "\U0001f600" * 85, "\U0001f600" * 86  # 12 characters each once escaped
    assert KafkaMessage(record(b"{}", key=fits.encode())).payload("json")["key"] == fits
    assert KafkaMessage(record(b"{}", key=too_long.encode())).payload("json")["key"] != too_long


# ------------------------------------------------------------------ fan-out and catch-up
TP = TopicPartition("t", 0)


def keyed(offset: int, *, value: bytes = b'{"n": 1}') -> Any:
    return record(value, key=f"k{offset}".encode(), offset=offset)


def waiter_for(key: str, cursor: int, reader: TopicReader) -> Waiter:
    waiter = Waiter(spec(canonical_acceptors(success=[{"key": key}])), start_from="timestamp", start_after_ms=0)
    waiter.cursor[TP] = cursor
    waiter.readers["t"] = reader
    return waiter


def reader_at(position: int) -> TopicReader:
    reader = TopicReader("conn", "t", {})
    reader.positions[TP] = position
    return reader


async def test_a_catch_up_pass_counts_each_wait_from_its_own_start_and_hands_it_over() -> None:
    reader = reader_at(10)
    early = waiter_for("k3", 0, reader)  # its message is in the gap
    late = waiter_for("k3", 6, reader)  # the same key, but before its start: not its message
    other = waiter_for("k8", 6, reader)
    run = CatchUpPass(reader, [early, late, other])
    assert run.positions == {TP: 0}  # the earliest start of the three
    assert all(waiter.join(run) for waiter in (early, late, other))
    await run._dispatch({TP: [keyed(o, value=b"not json" if o == 7 else b'{"n": 1}') for o in range(10)]})
    assert [m.offset for m, _, _ in early.queue] == [3] and early.stats()["examined"] == 4
    assert [m.offset for m, _, _ in other.queue] == [8] and other.stats()["examined"] == 3
    assert not late.queue and not late.finished
    assert run.level() and run.hand_over()
    assert late.attached["t"] is reader and late.cursor[TP] == 10
    assert late.stats() == {
        "examined": 4,  # offsets 6..9, counted from its own start although the pass read from 0
        "skipped": {"tombstone": 0, "undecodable": 0, "malformed": 1, "predicate_error": 0},
    }
    await reader._dispatch({TP: [keyed(10)]})
    assert late.stats()["examined"] == 5  # and on from there by the reader


async def test_a_wait_ahead_of_the_reader_counts_only_from_its_own_position() -> None:
    reader = reader_at(0)
    ahead = waiter_for("k1", 3, reader)  # e.g. a pass read a little further than the reader
    assert ahead.try_attach("t")
    await reader._dispatch({TP: [keyed(o) for o in range(5)]})
    assert not ahead.queue  # k1 at offset 1 lies before its position
    assert ahead.stats()["examined"] == 2


async def test_a_burst_of_matches_wakes_a_batch_of_waits_per_loop_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_kafka_fanout, "WAKES_PER_SLICE", 8)
    reader = reader_at(0)
    waiters = [waiter_for(f"k{i}", 0, reader) for i in range(100)]
    assert all(waiter.try_attach("t") for waiter in waiters)
    samples: list[int] = []

    async def sample() -> None:
        while True:
            samples.append(reader.evaluations)
            await asyncio.sleep(0)

    sampler = asyncio.ensure_future(sample())
    await asyncio.sleep(0)
    await reader._dispatch({TP: [keyed(o) for o in range(100)]})
    sampler.cancel()
    assert all(waiter.finished for waiter in waiters)
    turns = [after - before for before, after in itertools.pairwise(samples)]
    assert len(turns) >= 100 // 8 and max(turns) <= 8  # the loop got a turn after every 8 wake-ups


async def test_a_pass_hands_waits_over_a_slice_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_kafka_fanout, "DISPATCH_SLICE_SECONDS", 0.0)
    reader = reader_at(5)
    waiters = [waiter_for("never", 5, reader) for _ in range(3)]
    run = CatchUpPass(reader, waiters)
    assert all(waiter.join(run) for waiter in waiters) and run.level()
    moved = []
    while not run.hand_over():
        moved.append(sum(waiter.attached["t"] is reader for waiter in waiters))
    assert moved == [1, 2]
    assert all(waiter.attached["t"] is reader for waiter in waiters)
