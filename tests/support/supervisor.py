"""A stand-in for the triggerer's supervisor channel, to inject the connection-lookup faults.

Inside Airflow's triggerer, a trigger asks for a connection through ``SUPERVISOR_COMMS`` (the
execution-API secrets backend sends ``GetConnection``; the supervisor asks the API server). A test
process has no supervisor, so these stand-ins take its place: one that cannot reach the API server
(as during a triggerer restart or an API outage: the real channel raises ``AirflowRuntimeError``
from an error frame, which the backend turns into "not found"), and one whose API server answers
that the connection does not exist (the real answer is an ``ErrorResponse`` with
``CONNECTION_NOT_FOUND``). Every other message (secret masking) is accepted and answered with
nothing, as the real channel does.
"""

from __future__ import annotations

from typing import Any, Literal

import pytest

ConnectionAnswer = Literal["unreachable", "not_found"]


class SupervisorStandIn:
    """Answers ``GetConnection`` as told; records the connection ids asked for, and every message sent."""

    def __init__(self, connection_answer: ConnectionAnswer) -> None:
        self.connection_answer = connection_answer
        self.asked: list[str] = []
        self.sent: list[Any] = []

    def masked(self) -> list[Any]:
        """The values sent to be masked (``MaskSecret``), in order."""
        from airflow.sdk.execution_time.comms import MaskSecret

        return [msg.value for msg in self.sent if isinstance(msg, MaskSecret)]

    def _answer(self, msg: Any) -> Any:
        from airflow.sdk.exceptions import AirflowRuntimeError, ErrorType
        from airflow.sdk.execution_time.comms import ErrorResponse, GetConnection

        self.sent.append(msg)
        if not isinstance(msg, GetConnection):
            return None
        self.asked.append(msg.conn_id)
        if self.connection_answer == "unreachable":
            raise AirflowRuntimeError(
                ErrorResponse(error=ErrorType.API_SERVER_ERROR, detail={"message": "API server unreachable"})
            )
        return ErrorResponse(error=ErrorType.CONNECTION_NOT_FOUND, detail={"conn_id": msg.conn_id})

    async def asend(self, msg: Any) -> Any:
        return self._answer(msg)

    def send(self, msg: Any) -> Any:
        return self._answer(msg)


def install_supervisor(monkeypatch: pytest.MonkeyPatch, connection_answer: ConnectionAnswer) -> SupervisorStandIn:
    """Make this process look like Airflow's TriggerRunner to the secrets-backend lookup."""
    from airflow.sdk.execution_time import task_runner

    stand_in = SupervisorStandIn(connection_answer)
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", stand_in, raising=False)
    return stand_in
