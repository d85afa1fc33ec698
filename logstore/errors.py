"""The traffic log's errors."""

from __future__ import annotations

from flywheel.classifier.errors import FlywheelError

__all__ = ["LogStoreError", "LogStoreBusyError", "UnknownDecisionError"]


class LogStoreError(FlywheelError):
    """The traffic log cannot be opened, read or written."""

    exit_code = 2


class LogStoreBusyError(LogStoreError):
    """Another process kept the log database locked for longer than ``busy_timeout_s``."""


class UnknownDecisionError(LogStoreError):
    """A label names a decision id that is not in the log.

    ``message`` says which id; ``log``, when given, is the log's file, added to the text
    for the command line (``... in log <path>``) and kept out of what a gRPC client is
    told (:attr:`message`)."""

    def __init__(self, message: str, *, log: object = None) -> None:
        self.message = message
        self.log = log
        super().__init__(message if log is None else f"{message} in log {log}")
