"""The sidecar's own errors; :mod:`service.servicer` maps each to a gRPC status code."""

from __future__ import annotations

from flywheel.classifier.errors import FlywheelError

__all__ = ["ServiceError", "Overloaded", "DeadlineExceeded", "NotServing", "NoTrafficLog"]


class ServiceError(FlywheelError):
    """Base of the errors the serving layer raises on purpose."""


class Overloaded(ServiceError):
    """The micro-batch queue is full: the request was refused at once (RESOURCE_EXHAUSTED)."""


class DeadlineExceeded(ServiceError):
    """The request's deadline passed before it was computed (DEADLINE_EXCEEDED)."""


class NotServing(ServiceError):
    """Not ready yet, or shutting down (UNAVAILABLE)."""


class NoTrafficLog(ServiceError):
    """Feedback needs the traffic log, and this server runs without one (FAILED_PRECONDITION)."""
