"""The door of the Kafka client package: what the trigger side asks of it, and nothing more.

Every client package offers the same three verbs:

* :func:`load_options`: an Airflow ``kafka`` connection -> :class:`KafkaOptions` (async, in the
  triggerer; the trigger's kwargs carry only the ``kafka_conn_id``);
* :func:`open_reader` / :func:`close_reader`: the shared client, here the connection's shared
  reader (:class:`~airflow_deferrable_kit._kafka.reader.ConnectionReader`), opened from the
  options and leased under :func:`reader_key` by every wait on the connection in the process;
* :func:`classify_kafka_error`: aiokafka's exceptions -> ours, so no trigger names one.

The engine behind it sits below in this package (see its docstring); aiokafka itself, with every
private-API use fenced, is :mod:`airflow_deferrable_kit._kafka.consumers`.
"""

from __future__ import annotations

from airflow_deferrable_kit._kafka.consumers import classify_kafka_error
from airflow_deferrable_kit._kafka.reader import ConnectionReader
from airflow_deferrable_kit._kafka.settings import KafkaOptions, load_options, reader_key


async def open_reader(options: KafkaOptions) -> ConnectionReader:
    """The shared reader of ``options``' connection (no broker contacted yet)."""
    return ConnectionReader(options.conn_id, options)


async def close_reader(reader: ConnectionReader) -> None:
    """Stop the reader's loops and consumers (its last lease was given back)."""
    await reader.close()


__all__ = ["KafkaOptions", "classify_kafka_error", "close_reader", "load_options", "open_reader", "reader_key"]
