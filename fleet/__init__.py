"""Fleet mode: replicas share one traffic log and one model registry on S3-compatible
object storage (issue 14).

The layer between the entry points and the log: :mod:`service` and :mod:`training`
use it; it uses :mod:`logstore` and :mod:`classifier`, which never import it. Without
a store configured nothing here runs and flywheel works on one machine as before.

Modules: :mod:`~fleet.errors` (the named errors), :mod:`~fleet.config` (the
``s3://BUCKET/PREFIX`` URL and the AWS environment, credentials never shown),
:mod:`~fleet.objects` (the object store client, the only importer of ``obstore``,
from the optional ``flywheel[fleet]`` extra) and :mod:`~fleet.registry` (the fleet's model
registry, :class:`~fleet.registry.BucketRegistry`, and :class:`~fleet.registry.RegistrySync`,
which makes a replica follow its ``CURRENT`` pointer).
"""

from __future__ import annotations

from fleet.config import StoreConfig
from fleet.errors import FleetError, PreconditionFailed, StoreConfigError, StoreUnavailable
from fleet.objects import NOT_MODIFIED, ObjectInfo, ObjectStore
from fleet.registry import BucketRegistry, RegistrySync

__all__ = ["BucketRegistry", "FleetError", "NOT_MODIFIED", "ObjectInfo", "ObjectStore", "PreconditionFailed",
           "RegistrySync", "StoreConfig", "StoreConfigError", "StoreUnavailable"]
