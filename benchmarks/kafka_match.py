"""The ``apply_function`` the official ``AwaitMessageTrigger`` is given in the Kafka benchmark."""

from __future__ import annotations

import json
from typing import Any


def match_id(wanted: int, message: Any) -> Any:
    """Return the message value when its JSON ``id`` is ``wanted``.

    The official trigger calls ``apply_function(*apply_function_args, message)``.
    """
    try:
        value = json.loads(message.value())
    except (TypeError, ValueError):
        return None
    return value if isinstance(value, dict) and value.get("id") == wanted else None
