"""Deferrable sensors, each paired with a trigger from :mod:`airflow_deferrable_kit.triggers`."""
