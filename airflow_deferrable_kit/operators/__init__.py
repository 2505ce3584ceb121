"""Operators that start remote work once, on the worker, and defer only its wait.

* ``http``: :class:`~airflow_deferrable_kit.operators.http.HttpJobOperator`, a job an HTTP API
  runs (submit, poll its status, fetch its paged result, cancel it), with its handle kept in
  Airflow's task state store so nothing is ever submitted twice.
"""
