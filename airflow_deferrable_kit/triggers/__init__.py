"""Natively async triggers; importable by the triggerer without any sensor code.

Importing the package registers every wait's event form (``wait.as_event_trigger()``): the
event modules sit above the waits and register themselves, so no wait imports its event form.
"""

from airflow_deferrable_kit.triggers import events, http_events  # noqa: F401  (registers the event forms)
