"""The shared encoder blobs (:mod:`classifier.encoders.blobs`) in the fleet's bucket:
``models/blobs/<sha256>``, one object per blob whichever versions name it.

:class:`~fleet.registry.BucketRegistry` uploads a version's blobs that the bucket lacks
before its manifest (:func:`upload_blobs`), a download fetches only the blobs the local
home does not hold intact (:func:`fetch_blobs`, each one's SHA-256 checked), a promotion
checks they are all there (:func:`missing_blobs`), and a prune deletes the blobs no
version names any more (:func:`collect_bucket_garbage`)."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from flywheel.classifier.encoders.blobs import (
    BLOB_GRACE_S,
    BLOBS_DIR,
    BlobRef,
    blob_refs,
    find_blob,
    put_blob,
    store_blob,
)
from flywheel.classifier.errors import ModelError
from flywheel.fleet.objects import NOT_MODIFIED, ObjectStore

__all__ = ["BLOBS_PREFIX", "BlobTransfer", "collect_bucket_garbage", "fetch_blobs", "missing_blobs", "refs_in",
           "upload_blobs"]

log = logging.getLogger("flywheel.fleet.registry")

#: Where the bucket keeps the blobs (``blobs`` is not a version name)
BLOBS_PREFIX = f"models/{BLOBS_DIR}"


@dataclass(frozen=True)
class BlobTransfer:
    """What one upload or download moved: blobs sent or fetched (``moved``, ``moved_bytes``)
    and those already there (``kept``, ``kept_bytes``)."""

    moved: int = 0
    moved_bytes: int = 0
    kept: int = 0
    kept_bytes: int = 0


def key(sha256: str) -> str:
    return f"{BLOBS_PREFIX}/{sha256}"


def refs_in(manifest_bytes: bytes | None, where: str) -> list[BlobRef]:
    """The blobs an encoder's ``manifest.json`` (its bytes; ``None``: no own encoder) names."""
    if manifest_bytes is None:
        return []
    try:
        return blob_refs(json.loads(manifest_bytes.decode("utf-8")))
    except (ValueError, UnicodeDecodeError, AttributeError) as exc:
        raise ModelError(f"{where}: unreadable encoder manifest: {exc}") from None


def upload_blobs(objects: ObjectStore, encoder_dir: Path, refs: Iterable[BlobRef]) -> BlobTransfer:
    """Upload the blobs ``refs`` that the bucket lacks (create-only), read from where the
    encoder in ``encoder_dir`` finds them."""
    moved = moved_bytes = kept = kept_bytes = 0
    for ref in refs:
        if objects.head(key(ref.sha256)) is not None:
            kept, kept_bytes = kept + 1, kept_bytes + ref.bytes
            continue
        path = find_blob(encoder_dir, ref.sha256)
        if path is None:
            raise ModelError(f"{encoder_dir}: encoder blob {ref.sha256} ({ref.name}) is missing; cannot publish")
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != ref.sha256:
            raise ModelError(f"{path}: does not match its SHA-256 (corrupt or replaced); cannot publish")
        objects.put_if_absent(key(ref.sha256), data)
        moved, moved_bytes = moved + 1, moved_bytes + ref.bytes
    return BlobTransfer(moved, moved_bytes, kept, kept_bytes)


def fetch_blobs(objects: ObjectStore, home: Path, refs: Iterable[BlobRef], version: str) -> BlobTransfer:
    """Put the blobs ``refs`` into ``home/blobs``: those not there intact are fetched and
    their SHA-256 checked (:class:`ModelError` naming the blob and the version)."""
    store = home / BLOBS_DIR
    moved = moved_bytes = kept = kept_bytes = 0
    for ref in refs:
        local = store / ref.sha256
        if local.is_file() and store_blob(local, store, ref.sha256) == 0:   # intact: its time refreshed
            kept, kept_bytes = kept + 1, kept_bytes + ref.bytes
            continue
        where = objects.cfg.location(key(ref.sha256))
        got = objects.get(key(ref.sha256))
        if got is None or got is NOT_MODIFIED:
            raise ModelError(f"{where}: missing (encoder blob {ref.name} of version {version!r})")
        if hashlib.sha256(got[0]).hexdigest() != ref.sha256:
            raise ModelError(f"{where}: encoder blob {ref.name} of version {version!r} does not match its "
                             f"SHA-256 (corrupt or replaced)")
        local.unlink(missing_ok=True)   # a corrupt copy
        put_blob(store, ref.sha256, got[0])
        moved, moved_bytes = moved + 1, moved_bytes + ref.bytes
    return BlobTransfer(moved, moved_bytes, kept, kept_bytes)


def missing_blobs(objects: ObjectStore, refs: Iterable[BlobRef]) -> list[str]:
    """The keys of the blobs ``refs`` that the bucket does not hold."""
    return [key(r.sha256) for r in refs if objects.head(key(r.sha256)) is None]


def collect_bucket_garbage(objects: ObjectStore, named: set[str], grace_s: float = BLOB_GRACE_S) -> list[str]:
    """Delete the bucket's blobs not in ``named`` (SHA-256s the remaining versions name)
    and older than ``grace_s`` (an upload in progress sends its blobs before its manifest)."""
    cutoff = time.time() - grace_s
    removed = []
    for info in objects.list(BLOBS_PREFIX + "/"):
        sha = info.key.rsplit("/", 1)[-1]
        if sha in named or info.last_modified.timestamp() >= cutoff:
            continue
        objects.delete(info.key)
        removed.append(sha)
    if removed:
        log.info("removed %d blob(s) no version names from %s", len(removed), objects.cfg.location(BLOBS_PREFIX))
    return removed
