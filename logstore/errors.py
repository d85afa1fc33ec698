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
    """A label names a decision id that is not in the log."""
