"""Checks of argument shapes every wait shares: a connection id, a number of seconds.

Each raises ``ValueError`` naming the argument, so a bad value fails when the DAG is parsed
(sensor and trigger construction) instead of when the task runs.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any, Final

#: The longest duration a wait accepts: a century, in seconds. A wait's deadline is an absolute
#: UTC datetime, and so are Airflow's trigger timeout and reschedule date; Python's datetimes
#: end at 9999-12-31, so a budget such as 1e12 seconds (31,700 years) would be accepted at parse
#: and only fail, overflowing, when the task runs.
MAX_SECONDS: Final = 100 * 365 * 24 * 3600


def require_conn_id(value: Any, *, argument: str, optional: bool = False) -> None:
    """A connection id is a string with something in it (``None`` too, if ``optional``).

    A blank id (``""``, ``"   "``) can never name a connection, so it is refused at parse
    rather than reported as a missing connection when the wait runs.
    """
    if optional and value is None:
        return
    if not isinstance(value, str) or not value.strip():
        choices = "a non-empty string naming an Airflow connection" + (", or None" if optional else "")
        raise ValueError(f"{argument} must be {choices}, got {value!r}")


def require_bool(value: Any, *, argument: str, optional: bool = False) -> None:
    """A flag is ``True`` or ``False`` (``None`` too, if ``optional``: "use the default").

    ``"yes"``, ``"False"`` or ``1`` would be taken for their truth value and could go on as the
    flag's value itself (``deferrable="yes"``), so anything but a bool is refused at parse.
    """
    if isinstance(value, bool) or (optional and value is None):
        return
    choices = "True or False" + (", or None for the default" if optional else "")
    raise ValueError(f"{argument} expects {choices}, got {value!r}")


def require_seconds(value: Any, *, argument: str, allow_zero: bool = False, allow_timedelta: bool = False) -> float:
    """A finite number of seconds, above zero (or zero, if ``allow_zero``), at most :data:`MAX_SECONDS`.

    A bool is not a number of seconds (Airflow would read ``True`` as one second). With
    ``allow_timedelta``, a ``timedelta`` counts by its length, as Airflow's sensor arguments do.
    Returns the value as a float.
    """
    number = value.total_seconds() if allow_timedelta and isinstance(value, timedelta) else value
    if (
        isinstance(number, bool)
        or not isinstance(number, (int, float))
        or not math.isfinite(number)
        or not (number >= 0 if allow_zero else number > 0)
        or number > MAX_SECONDS
    ):
        kind = "a number of seconds" if allow_zero else "a positive number of seconds"
        kind += " or a timedelta" if allow_timedelta else ""
        bounds = f"from 0 to {MAX_SECONDS:,}" if allow_zero else f"at most {MAX_SECONDS:,}"
        raise ValueError(f"{argument} must be {kind}, {bounds} (100 years), got {value!r}")
    return float(number)


def take_official_name(target: Any, official: str, own: str, *, default: Any) -> None:
    """Move the official provider's name for a parameter onto this kit's own name, on ``target``.

    Ported DAGs keep the official spelling (``kafka_config_id=``); the kit's triggers carry only
    their own names in their kwargs, so the value moves over and the official field is cleared
    (``None``), and a trigger rebuilt from its kwargs is equal to the one built with the official
    name. Both names given at once is refused naming both, as the sensors do.
    """
    value = getattr(target, official)
    if value is None:
        return
    if getattr(target, own) != default:
        raise ValueError(f"{own}= and its official name {official}= are the same parameter; give one")
    setattr(target, own, value)
    setattr(target, official, None)


__all__ = ["MAX_SECONDS", "require_bool", "require_conn_id", "require_seconds", "take_official_name"]
