"""Helpers for the fleet's object store (a prefix of the real S3 server, see
tests/support/s3.py): model versions published to it, spool sinks shipping into it.

- :func:`save_version` / :func:`publish`: copies of one fitted model saved (and published
  to a :class:`~fleet.registry.BucketRegistry`) under other version names.
- :func:`tamper`, :func:`without_serving_head`, :func:`upload_raw`: broken or old-format
  versions, as an attacker, a broken disk or an older release would leave them.
- :func:`shipping_sink`: a SpoolSink draining into the store; :func:`log_keys`: what arrived.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from flywheel.classifier.versions.model import IntentModel
from flywheel.classifier.versions.registry import ModelRegistry
from flywheel.fleet.objects import ObjectStore
from flywheel.fleet.registry import BucketRegistry
from flywheel.fleet.shipper import ObjectShipper
from flywheel.logstore import SpoolSink


def save_version(reg: ModelRegistry, trained: IntentModel, name: str, **manifest: object) -> Path:
    """Save ``trained`` as version ``name`` in ``reg`` (manifest fields changed by ``manifest``)."""
    model = IntentModel(trained.intents, trained.head, dataclasses.replace(trained.manifest, version=name, **manifest))
    return model.save(reg.version_dir(name))


def publish(bucket: BucketRegistry, trained: IntentModel, *names: str) -> None:
    """Publish ``trained`` to ``bucket`` as each of ``names`` (saved in its local home first)."""
    for name in names:
        bucket.publish(save_version(bucket.local, trained, name))


def tamper(objects: ObjectStore, key: str, data: bytes = b"tampered bytes") -> None:
    """Overwrite an object in place (as an attacker or a broken disk would), etag-checked."""
    objects.put_if_match(key, data, objects.head(key))


def without_serving_head(src: Path, dst: Path, **manifest: object) -> Path:
    """A copy of version ``src`` as versions were saved before ``head.npz`` existed (it still
    verifies locally, by loading ``head.joblib``)."""
    shutil.copytree(src, dst)
    (dst / "head.npz").unlink()
    doc = json.loads((dst / "manifest.json").read_text())
    doc.update(serving_head_sha256="", version=dst.name, **manifest)
    (dst / "manifest.json").write_text(json.dumps(doc, indent=2))
    return dst


def upload_raw(objects: ObjectStore, directory: Path) -> None:
    """Upload a version directory by hand, bypassing every check of publish()."""
    for f in sorted(directory.iterdir(), key=lambda p: p.name == "manifest.json"):
        objects.put_if_absent(f"models/{directory.name}/{f.name}", f.read_bytes())


def shipping_sink(spool: Path, objects: ObjectStore, **kw) -> tuple[SpoolSink, ObjectShipper]:
    """A SpoolSink draining into ``objects`` (no background drain unless asked)."""
    shipper = ObjectShipper(objects)
    kw.setdefault("drain_interval_s", 3600.0)
    kw.setdefault("flush_interval_s", 0.05)
    return SpoolSink(spool, shipper, **kw), shipper


def log_keys(objects: ObjectStore, part: str = "") -> list[str]:
    """The keys under ``log/`` (``log/<part>`` when given) in the store."""
    return [o.key for o in objects.list(f"log/{part}".rstrip("/"))]
