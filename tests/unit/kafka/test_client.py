"""The aiokafka side of the Kafka wait, without a broker: connection mapping and error classification."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka import errors

from airflow_deferrable_kit._kafka.consumers import classify_kafka_error
from airflow_deferrable_kit._kafka.settings import KafkaOptions, options_from_connection
from airflow_deferrable_kit.errors import FatalError, TransientError


def test_connection_maps_to_aiokafka_settings_without_leaking_the_secret() -> None:
    options, tls = options_from_connection(
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


def test_options_are_frozen_hashable_keywords_with_no_secret_in_their_repr() -> None:
    options = KafkaOptions(
        conn_id="k",
        bootstrap_servers=("b1:9093",),
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username="svc",
        sasl_plain_password="pw-secret",
    )
    assert dict(options) == {
        "bootstrap_servers": ["b1:9093"],
        "security_protocol": "SASL_PLAINTEXT",
        "client_id": "airflow-deferrable-kit",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "svc",
        "sasl_plain_password": "pw-secret",
    }
    assert "pw-secret" not in repr(options) and "pw-secret" not in str(options)
    assert {options: 1}[KafkaOptions(**{**vars(options)})] == 1  # equal options, one key
    with pytest.raises(AttributeError):
        options.sasl_plain_password = "other"  # type: ignore[misc]


def test_connection_extra_credentials_win_and_host_port_work() -> None:
    options, tls = options_from_connection(
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
        options_from_connection(conn_id="k", host=None, port=None, login=None, password=None, **fields)
    assert caught.value.error_type == "bad_connection"


@pytest.mark.parametrize(
    ("exc", "kind", "error_type"),
    [
        (errors.KafkaConnectionError("refused"), TransientError, "unavailable"),
        (errors.RequestTimedOutError(), TransientError, "unavailable"),
        (errors.NotLeaderForPartitionError(), TransientError, "unavailable"),
        (errors.KafkaTimeoutError(), TransientError, "unavailable"),
        (errors.SaslAuthenticationFailed("bad password"), FatalError, "authentication"),
        (errors.UnsupportedSaslMechanismError(), FatalError, "authentication"),
        (errors.TopicAuthorizationFailedError(), FatalError, "authorization"),
        (errors.GroupAuthorizationFailedError(), FatalError, "authorization"),
    ],
)
def test_errors_are_classified(exc: Exception, kind: type, error_type: str) -> None:
    error = classify_kafka_error(exc)
    assert isinstance(error, kind) and error.error_type == error_type
