"""The fleet's errors: what can go wrong talking to the shared object store.

Every message names the bucket and key it concerns, never a credential
(:func:`fleet.config.StoreConfig.redact` scrubs what the client library says).
"""

from __future__ import annotations

from flywheel.classifier.errors import FlywheelError

__all__ = ["FleetError", "PreconditionFailed", "StoreConfigError", "StoreUnavailable"]


class FleetError(FlywheelError):
    """The object store refused or failed an operation (the base of the fleet's errors).

    Exit code 3, like a model problem: the input was fine, the store was not (an outage,
    :class:`StoreUnavailable`, is worth retrying later); a bad store URL or environment is
    :class:`StoreConfigError`, exit code 2."""

    exit_code = 3


class StoreUnavailable(FleetError):
    """The store cannot be reached now: connection refused, timeout, or a 5xx/429 answer.
    Worth retrying later; nothing was decided."""


class PreconditionFailed(FleetError):
    """A conditional write lost (412): the key already exists, or its etag moved."""


class StoreConfigError(FleetError):
    """The store URL or its environment (endpoint, credentials) is invalid or incomplete."""

    exit_code = 2
