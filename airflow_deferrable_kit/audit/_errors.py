"""The audit's own errors, shared by the reading side and the command's argument checks."""

from __future__ import annotations


class AuditError(Exception):
    """The audit could not run (unreachable database, not an Airflow 3 metadata DB, ...)."""


class AuditUsageError(AuditError):
    """An argument is unusable; ``argument`` names it as the command line spells it."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(f"argument {argument}: {message}")
        self.argument = argument
        self.message = message
