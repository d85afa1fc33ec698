"""Where the log and the models live: on this machine, or (fleet mode) shared by many
replicas on S3-compatible object storage.

The layer between the entry points and the log: :mod:`service` and :mod:`training`
use it; it uses :mod:`logstore` and :mod:`classifier`, which never import it. The site
and the human-label writer run on every machine, for every command; the object-store
modules run only when a store is configured.

Modules: :mod:`~fleet.errors` (the named errors), :mod:`~fleet.config` (the
``s3://BUCKET/PREFIX`` URL and the AWS environment, credentials never shown),
:mod:`~fleet.objects` (the object store client, the only importer of ``obstore``,
from the optional ``flywheel[fleet]`` extra) and :mod:`~fleet.registry` (the fleet's model
registry, :class:`~fleet.registry.BucketRegistry`, and :class:`~fleet.sync.RegistrySync` (:mod:`~fleet.sync`),
which makes a replica follow its ``CURRENT`` pointer).

The fleet's log: :mod:`~fleet.shipper` (:class:`~fleet.shipper.ObjectShipper`, the spool
drain that ships segments as Parquet objects, create-only), :mod:`~fleet.mirror`
(:func:`fleet.mirror.mirror`: the bucket's log into a local DuckDB, exactly once; not
re-exported here, where its name would hide the module),
:mod:`~fleet.bucket_labels` (:class:`~fleet.bucket_labels.BucketLabels`: labels from the command line)
and :mod:`~fleet.retention` (:func:`~fleet.retention.prune_log`: raw text past N days
removed from the bucket and the local file).

Where it all lives, and what is served: :mod:`~fleet.site` (:func:`~fleet.site.open_site`,
local or fleet, decided once; :meth:`~fleet.site.Site.served` and
:meth:`~fleet.site.Site.contract`, the one answer to "what is served, what should be") and
:mod:`~fleet.deployment` (``flywheel check``: whether the two agree);
:mod:`~fleet.human_labels` (the one writer of human labels, local or fleet);
:mod:`~fleet.blobs` (encoder blobs shared by the bucket's versions) and
:mod:`~fleet.parallel` (bounded parallel object transfers).
"""

from __future__ import annotations

from flywheel.fleet.bucket_labels import BucketLabels
from flywheel.fleet.config import StoreConfig
from flywheel.fleet.errors import FleetError, PreconditionFailed, StoreConfigError, StoreUnavailable
from flywheel.fleet.mirror import MirrorReport
from flywheel.fleet.objects import NOT_MODIFIED, ObjectInfo, ObjectStore
from flywheel.fleet.registry import BucketRegistry
from flywheel.fleet.retention import PruneReport, prune_log
from flywheel.fleet.shipper import ObjectShipper
from flywheel.fleet.sync import RegistrySync

__all__ = ["BucketLabels", "BucketRegistry", "FleetError", "MirrorReport", "NOT_MODIFIED", "ObjectInfo",
           "ObjectShipper", "ObjectStore", "PreconditionFailed", "PruneReport", "RegistrySync", "StoreConfig",
           "StoreConfigError", "StoreUnavailable", "prune_log"]
