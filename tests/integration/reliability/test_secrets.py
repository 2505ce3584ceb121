"""No secret in any trigger's kwargs or event payload, for every kind of wait.

Each connection carries a recognisable secret (``s3cr3t-<kind>``). The trigger is built by its
sensor's own deferral, serialized, rebuilt from the kwargs the way the triggerer does, and run
against the real service to its event.
"""

from __future__ import annotations

import base64
import json
import urllib.parse

import pytest

from airflow_deferrable_kit.testing import run_trigger

from .conftest import KINDS, SECRETS, Waits, World


def forms(secret: str) -> list[str]:
    """The secret as it could leak: plain, base64 (basic auth), URL-quoted (a DSN)."""
    return [
        secret,
        base64.b64encode(secret.encode()).decode(),
        base64.b64encode(f"AKIARELIABILITY:{secret}".encode()).decode(),
        urllib.parse.quote(secret, safe=""),
    ]


def assert_no_secret(text: str) -> None:
    for secret in SECRETS.values():
        for form in forms(secret):
            assert form not in text, f"{form!r} leaked into {text[:500]!r}"
    assert "s3cr3t" not in text


@pytest.mark.parametrize("kind", KINDS)
async def test_kwargs_and_payload_hold_no_secret(kind: str, waits: Waits, world: World) -> None:
    trigger = waits.trigger(kind, ready=True)
    _, kwargs = trigger.serialize()
    assert_no_secret(json.dumps(kwargs))
    assert_no_secret(repr(trigger))
    rebuilt = type(trigger)(**kwargs)  # what the triggerer runs: nothing but the kwargs
    requests_before = len(world.http.requests)

    event = await run_trigger(rebuilt, timeout=60)

    assert event.payload["status"] == "success", event.payload
    assert_no_secret(json.dumps(event.payload, default=str))
    if kind == "http":
        # The secret was resolved from the connection inside the trigger and used: the test
        # would pass vacuously if it never reached the wire.
        sent = [seen.headers.get("Authorization") for seen in world.http.requests[requests_before:]]
        assert f"Bearer {SECRETS['http']}" in sent


def test_no_secret_in_the_worker_side_deferral_either(waits: Waits) -> None:
    """The sensor's rendered fields, which the worker also persists, hold only conn ids."""
    for kind in KINDS:
        sensor = waits.sensor(kind, ready=False)
        fields = {name: getattr(sensor, name, None) for name in sensor.template_fields}
        assert_no_secret(json.dumps(fields, default=str))
