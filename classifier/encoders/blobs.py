"""Shared weights of versions' own encoders: the large initializers of a served ONNX graph
(e5's 250k x 384 token table, 82% of its weights), stored once by content and named by
every version whose graph uses them.

- **Split** (:func:`split_graph`, at export): each initializer of at least
  :data:`SPLIT_MIN_BYTES` leaves the graph for a blob, a file named after the SHA-256 of
  the tensor's bytes (little-endian, C order), and the graph keeps a declaration of it
  (name, type, shape; ``data_location: EXTERNAL``, location ``blobs/<sha256>``). The
  export's ``manifest.json`` lists them under ``blobs`` (:class:`BlobRef`), and they
  enter the encoder's content id (:func:`~classifier.encoders.version_format.content_id`),
  so a changed weight is a new id. e5's tuning freezes the token table, and int8 quantises
  that frozen table the same way each time, so every tuned e5 version names the same blob.
- **Where they live** (:func:`find_blob`): an export keeps its blobs in its own
  ``blobs/`` (``<export>/blobs/<sha256>``); a saved version keeps them in the ``blobs/``
  beside it, which in a models home is the home's one store: ``<home>/blobs/<sha256>``
  (:data:`BLOBS_DIR`; ``blobs`` is not a version name). :func:`store_blob` adds one
  atomically (a temp file renamed into place) unless an intact copy is there.
- **Serving** (:func:`load_blobs`): each blob is read, hashed and checked against its
  record; a missing or altered blob is one :class:`~classifier.errors.EmbedderError`
  naming the blob and the version. The arrays go to onnxruntime as external initializers.
- **Pruning** (:func:`collect_garbage`): a blob no version directory in the home names
  is deleted, unless it changed in the last :data:`BLOB_GRACE_S` (a save or download in
  progress stores its blobs before its version appears).

Imports numpy and the standard library (``onnx`` only inside :func:`split_graph`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from flywheel.classifier.errors import EmbedderError

__all__ = ["BLOBS_DIR", "BLOB_GRACE_S", "SPLIT_MIN_BYTES", "BlobRef", "blob_refs", "check_blobs", "collect_garbage",
           "find_blob", "load_blobs", "put_blob", "split_graph", "store_blob", "version_blobs", "version_storage"]

log = logging.getLogger("flywheel.onnx")

#: Initializers of at least this many bytes leave the served graph for a shared blob.
SPLIT_MIN_BYTES = 8 << 20
#: The store's directory: ``<home>/blobs/`` beside the versions (and ``<export>/blobs/`` in an export).
BLOBS_DIR = "blobs"
#: A blob that changed this recently is never collected (a save or download may be about to name it).
BLOB_GRACE_S = 3600.0
_SHA256 = re.compile(r"[0-9a-f]{64}")
_DTYPES = frozenset({"float16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64"})
_ENCODER = "encoder"
_MANIFEST = "manifest.json"


@dataclass(frozen=True)
class BlobRef:
    """One initializer a graph takes from a blob: its name in the graph, the blob's
    SHA-256 and size, and the array's numpy dtype and shape."""

    name: str
    sha256: str
    bytes: int
    dtype: str
    dims: tuple[int, ...]

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "sha256": self.sha256, "bytes": self.bytes, "dtype": self.dtype,
                "dims": list(self.dims)}


def blob_refs(manifest: dict[str, Any]) -> list[BlobRef]:
    """The blobs an export record names (``[]``: none, as before blobs existed); ValueError
    when an entry is malformed."""
    out = []
    for entry in manifest.get("blobs") or []:
        try:
            ref = BlobRef(str(entry["name"]), str(entry["sha256"]), int(entry["bytes"]), str(entry["dtype"]),
                          tuple(int(d) for d in entry["dims"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{_MANIFEST} has a malformed blob entry {entry!r}: {exc}") from None
        size = int(np.prod(ref.dims, dtype=np.int64)) * (np.dtype(ref.dtype).itemsize if ref.dtype in _DTYPES else 0)
        if not _SHA256.fullmatch(ref.sha256) or ref.dtype not in _DTYPES or size != ref.bytes:
            raise ValueError(f"{_MANIFEST} has an invalid blob entry {entry!r}")
        out.append(ref)
    return out


def _sha256_bytes(data: Any) -> str:
    return hashlib.sha256(memoryview(data)).hexdigest()


def _write_new(path: Path, data: Any) -> None:
    """Write ``data`` to ``path`` atomically (a temp file beside it, fsynced, renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with tmp.open("wb") as f:
            f.write(memoryview(data))
            f.flush()
            os.fsync(f.fileno())
        tmp.chmod(0o644)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def put_blob(store: Path, sha256: str, data: Any) -> None:
    """Write the blob ``data`` (already checked against ``sha256``) into ``store`` atomically."""
    _write_new(store / sha256, data)


def split_graph(graph: Path, blob_dir: Path, min_bytes: int = SPLIT_MIN_BYTES) -> list[BlobRef]:
    """Move the initializers of ``graph`` (an ONNX file, rewritten in place as one file)
    of at least ``min_bytes`` into blobs in ``blob_dir``; their records (``[]`` and the
    graph untouched when none is that large)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(graph))   # external data (a large fp32 export's sidecar) comes in too
    refs = []
    for t in model.graph.initializer:
        arr = numpy_helper.to_array(t)
        if arr.nbytes < min_bytes or arr.dtype.name not in _DTYPES:
            continue
        data = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
        sha = _sha256_bytes(data)
        if not (blob_dir / sha).is_file():
            _write_new(blob_dir / sha, data)
        for fname in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
            t.ClearField(fname)
        del t.external_data[:]
        t.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", f"{BLOBS_DIR}/{sha}"), ("offset", "0"), ("length", str(data.nbytes))):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
        refs.append(BlobRef(t.name, sha, int(data.nbytes), arr.dtype.name, tuple(int(d) for d in arr.shape)))
    if refs:
        _write_new(graph, model.SerializeToString())
    return refs


def find_blob(encoder_dir: Path, sha256: str) -> Path | None:
    """Where the blob ``sha256`` of the encoder in ``encoder_dir`` is: the export's own
    ``blobs/``, else the store beside its version (``<home>/blobs/``); ``None``: neither."""
    for store in (encoder_dir / BLOBS_DIR, encoder_dir.parent.parent / BLOBS_DIR):
        if (store / sha256).is_file():
            return store / sha256
    return None


def _version_name(encoder_dir: Path) -> str:
    return encoder_dir.parent.name if encoder_dir.name == _ENCODER else encoder_dir.name


def _read_checked(encoder_dir: Path, ref: BlobRef) -> np.ndarray:
    """The blob's bytes (a writable uint8 array), checked; EmbedderError naming it and the version."""
    what = f"version {_version_name(encoder_dir)}: encoder blob {ref.sha256} ({ref.name}, {ref.bytes:,} bytes)"
    path = find_blob(encoder_dir, ref.sha256)
    if path is None:
        raise EmbedderError(f"{what} is missing (looked in {encoder_dir / BLOBS_DIR} and "
                            f"{encoder_dir.parent.parent / BLOBS_DIR})")
    try:
        data = np.fromfile(path, dtype=np.uint8)
    except OSError as exc:
        raise EmbedderError(f"{what}: cannot read {path}: {exc}") from None
    if data.nbytes != ref.bytes or _sha256_bytes(data) != ref.sha256:
        raise EmbedderError(f"{what}: {path} does not match its SHA-256 (corrupt or replaced)")
    return data


def check_blobs(encoder_dir: Path, refs: Iterable[BlobRef]) -> None:
    """Every blob in ``refs`` is where :func:`find_blob` looks and hashes as recorded; else EmbedderError."""
    for ref in refs:
        _read_checked(encoder_dir, ref)


def load_blobs(encoder_dir: Path, refs: Iterable[BlobRef]) -> dict[str, np.ndarray]:
    """The initializers ``refs`` name, read from their blobs and checked (see :func:`check_blobs`)."""
    return {ref.name: _read_checked(encoder_dir, ref).view(np.dtype(ref.dtype).newbyteorder("<")).reshape(ref.dims)
            for ref in refs}


def store_blob(src: Path, store: Path, sha256: str) -> int:
    """Put the blob file ``src`` into ``store`` as ``sha256`` unless an intact copy is
    there (then only its time is refreshed); the bytes written (0: it was there).
    ValueError when ``src`` does not hash to ``sha256``."""
    dst = store / sha256
    if dst.is_file() and _file_sha256(dst) == sha256:
        os.utime(dst)
        return 0
    data = np.fromfile(src, dtype=np.uint8)
    if _sha256_bytes(data) != sha256:
        raise ValueError(f"{src} does not hash to {sha256}")
    _write_new(dst, data)
    return int(data.nbytes)


def _file_sha256(path: Path) -> str:
    with path.open("rb") as f:      # version_format.file_sha256 imports this module (no cycle)
        return hashlib.file_digest(f, "sha256").hexdigest()


def version_blobs(version_dir: Path) -> list[BlobRef]:
    """The blobs the version in ``version_dir`` names (``[]``: no own encoder, none, or an unreadable record)."""
    try:
        return blob_refs(json.loads((version_dir / _ENCODER / _MANIFEST).read_text(encoding="utf-8")))
    except (OSError, ValueError, AttributeError):
        return []


def collect_garbage(home: Path, *, grace_s: float = BLOB_GRACE_S) -> list[str]:
    """Delete the blobs of ``home/blobs`` that no directory of ``home`` names (hidden ones
    included: a save in progress), except those changed within ``grace_s``; the blobs removed."""
    store = home / BLOBS_DIR
    if not store.is_dir():
        return []
    named = {ref.sha256 for d in home.iterdir() if d.is_dir() and d.name != BLOBS_DIR for ref in version_blobs(d)}
    cutoff = time.time() - grace_s
    removed = []
    for p in store.iterdir():
        try:
            if p.name in named or p.stat().st_mtime >= cutoff:
                continue
            p.unlink()
        except OSError as exc:
            log.warning("could not delete blob %s (the next prune tries again): %s", p, exc)
            continue
        removed.append(p.name)
    if removed:
        log.info("removed %d blob(s) no version names from %s", len(removed), store)
    return sorted(removed)


def version_storage(version_dir: Path, have: Iterable[Path] = ()) -> dict[str, int]:
    """Bytes of the version in ``version_dir``: ``own_bytes`` (its files), ``blob_bytes``
    (the shared blobs it names), and ``download_bytes``: what a replica that holds the
    versions ``have`` (e.g. the champion) downloads to follow a promotion to it (its own
    files plus the blobs none of them names)."""
    own = sum(p.stat().st_size for p in version_dir.rglob("*") if p.is_file())
    refs = {r.sha256: r.bytes for r in version_blobs(version_dir)}
    held = {r.sha256 for d in have for r in version_blobs(Path(d))}
    return {"own_bytes": own, "blob_bytes": sum(refs.values()),
            "download_bytes": own + sum(n for sha, n in refs.items() if sha not in held)}
