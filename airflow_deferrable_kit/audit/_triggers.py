"""The kit's triggers as the ``trigger`` table stores them: their wait kind, their kwargs read back.

The audit (what waits share now) and the Waits page (what each deferred task waits for) both
read trigger rows; this is where a classpath becomes a kind and a stored ``kwargs`` column
becomes a mapping again. Only the kit's own triggers are ever decoded by their callers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

KIT_TRIGGERS = "airflow_deferrable_kit.triggers."
#: The kit's wait kinds by trigger module (``airflow_deferrable_kit.triggers.<module>``).
KINDS: dict[str, str] = {
    "s3": "s3",
    "s3_events": "s3",
    "s3_unchanged": "s3-unchanged",
    "http": "http",
    "http_events": "http",
    "postgres": "postgres",
    "postgres_events": "postgres",
    "kafka": "kafka",
    "kafka_events": "kafka",
    "official_events": "kafka",
    "temporal": "datetime",
}


def kind_of(classpath: str) -> str:
    """The kit's wait kind for a trigger classpath; ``""`` for any other provider's trigger."""
    if not classpath.startswith(KIT_TRIGGERS):
        return ""
    module = classpath[len(KIT_TRIGGERS) :].rsplit(".", 1)[0]
    return KINDS.get(module, "custom")


def decode_kwargs(stored: str | None) -> Mapping[str, Any] | None:
    """The kwargs of a ``trigger`` row, as Airflow reads them; ``None`` when they cannot be read.

    Airflow's own reader (``Trigger._decrypt_kwargs``, 3.2 and 3.3: plain JSON or Fernet, then
    Airflow's serde) is private API, used here alone and fenced: if it is gone or fails, a
    plain JSON object is read as is and anything else is not read.
    """
    if not stored:
        return None
    try:
        from airflow.models.trigger import Trigger

        value = Trigger._decrypt_kwargs(stored)
    except Exception:
        try:
            value = json.loads(stored)
        except ValueError:
            return None
    return value if isinstance(value, Mapping) else None
