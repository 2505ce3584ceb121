"""Deferrable sensors and natively async triggers for Apache Airflow 3."""

__version__ = "0.1.0"
