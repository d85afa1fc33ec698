"""An adapter on a fixed encoder: what "tuning" means for an encoder that cannot be
fine-tuned in place (the numpy USE default, a bge-m3 served as is), issue 22 item 5.

The adapter is an affine map trained on the encoder's frozen vectors
(:class:`training.tuner.adapter_trainer.AdapterTrainer`); a version that carries one keeps it in its
``encoder/`` directory, every file hashed in the version's manifest like a tuned encoder's::

    adapter.npz     ``weight`` (base dim x dim) and ``bias`` (dim), float32, read with
                    ``allow_pickle=False``
    manifest.json   ``kind: adapter``, ``served: adapter.npz``, ``base_id`` and ``base_dim``
                    (the encoder it adapts), ``dim``, the probe text and its adapted vector,
                    ``encoder_id``

A vector is ``normalise(base(text) @ weight + bias)``. The id
(:func:`~classifier.encoders.version_format.adapter_content_id`) is made from the arrays'
file and the base encoder's id, so vectors of two adapters, or of one adapter on two
encoders, never mix.

**Serving** (:class:`AdaptedEmbedder`): the base encoder is the version's own
``embedder`` settings (built by :func:`open_version_encoder`); on load the arrays must hash
to the recorded id, the base encoder must be the recorded one, and the probe text must
encode to the recorded vector (cosine >= :data:`PROBE_FLOOR`: loose enough for an int8
base on another CPU, whose kernels move its vectors a little, BENCHMARKS.md section 12;
the hash and the base id are the exact checks). Anything else is an
:class:`~classifier.errors.EmbedderError`. numpy only: no torch, no pickle.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from flywheel.classifier.encoders.version_format import (
    ADAPTER_FILE,
    ADAPTER_KIND,
    MANIFEST,
    EncoderExport,
    adapter_content_id,
    file_sha256,
    read_export,
    read_manifest,
)
from flywheel.classifier.errors import EmbedderError
from flywheel.classifier.protocols import DelegatingEmbedder, Embedder

__all__ = ["AdaptedEmbedder", "PROBE_FLOOR", "PROBE_TEXT", "apply_adapter", "write_adapter"]

#: The text whose adapted vector an export records and a load re-encodes.
PROBE_TEXT = "How do I reset my password? / ¿Cómo cambio mi contraseña?"
#: The probe's cosine floor on load.
PROBE_FLOOR = 0.97


def apply_adapter(vectors: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """``normalise(vectors @ weight + bias)``, float32 rows of unit norm (the one map that
    training, the export's probe and serving share)."""
    out = np.asarray(vectors, dtype=np.float32) @ weight + bias
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return (out / np.maximum(norms, 1e-12)).astype(np.float32)


def _read_arrays(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            weight, bias = np.asarray(z["weight"], dtype=np.float32), np.asarray(z["bias"], dtype=np.float32)
    except (OSError, ValueError, KeyError) as exc:
        raise EmbedderError(f"{path}: not an adapter's arrays: {exc}") from None
    if weight.ndim != 2 or bias.shape != (weight.shape[1],):
        raise EmbedderError(f"{path}: weight {weight.shape} and bias {bias.shape} do not make an affine map")
    return weight, bias


def write_adapter(dest: str | os.PathLike[str], weight: np.ndarray, bias: np.ndarray, base: Embedder,
                  *, trained: dict[str, Any] | None = None) -> EncoderExport:
    """Write the adapter ``(weight, bias)`` on ``base`` into ``dest`` (created; it must not
    exist or be empty), built under a temporary name beside it and renamed into place, and
    return it as read back (:func:`~classifier.encoders.version_format.read_export`).
    ``trained`` (the trainer's report) is recorded in the manifest as is."""
    target = Path(dest)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise EmbedderError(f"{target}: refusing to overwrite an existing encoder directory")
    w = np.ascontiguousarray(weight, dtype=np.float32)
    b = np.ascontiguousarray(bias, dtype=np.float32)
    if w.ndim != 2 or b.shape != (w.shape[1],) or w.shape[0] != int(base.dim):
        raise EmbedderError(f"an adapter for {base.id} ({base.dim}-d) needs weight ({base.dim}, d) and bias (d,), "
                            f"got {w.shape} and {b.shape}")
    probe = apply_adapter(base.encode([PROBE_TEXT]), w, b)[0]
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.adapter-", dir=target.parent))
    try:
        with (tmp / ADAPTER_FILE).open("wb") as fh:
            np.savez(fh, weight=w, bias=b)
        doc: dict[str, Any] = {"kind": ADAPTER_KIND, "served": ADAPTER_FILE, "base_id": base.id,
                               "base_dim": int(base.dim), "dim": int(w.shape[1]), "probe_text": PROBE_TEXT,
                               "probe_fp32": [float(x) for x in probe], "trained": trained or {}}
        doc["encoder_id"] = adapter_content_id(file_sha256(tmp / ADAPTER_FILE), doc)
        (tmp / MANIFEST).write_text(json.dumps(doc, indent=1), encoding="utf-8")
        if target.exists():
            target.rmdir()
        os.replace(tmp, target)
    except BaseException:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return read_export(target)


class AdaptedEmbedder(DelegatingEmbedder):
    """Serves a version's adapter over ``base`` (the version's encoder settings'
    embedder). Lazy: ``id`` and ``dim`` come from the small record; the first ``encode`` (or
    :meth:`load`) checks the arrays, the base encoder and the probe. Thread-safe.

    Raises
    ------
    EmbedderError
        ``directory`` holds no adapter record (at construction), or a check fails (on load).
    """

    def __init__(self, directory: str | os.PathLike[str], base: Embedder) -> None:
        super().__init__(base)   # self.inner: the base encoder
        self.directory = Path(directory)
        try:
            self.manifest = read_manifest(self.directory)
        except (OSError, ValueError) as exc:
            raise EmbedderError(f"{self.directory}: not a version encoder: {exc}") from None
        if self.manifest.get("kind") != ADAPTER_KIND:
            raise EmbedderError(f"{self.directory}: holds a tuned encoder, not an adapter")
        self._id = str(self.manifest["encoder_id"])
        self._dim = int(self.manifest["dim"])
        self._lock = threading.Lock()
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None
        #: cosine of the probe vector at load to the recorded one (None before loading)
        self.probe_cosine: float | None = None

    @property
    def id(self) -> str:
        return self._id

    @property
    def dim(self) -> int:
        return self._dim

    def load(self) -> None:
        """Check and load the adapter now (the watcher warms a version before its swap)."""
        self._get()

    def _get(self) -> tuple[np.ndarray, np.ndarray]:
        arrays = self._arrays
        if arrays is not None:
            return arrays
        with self._lock:
            if self._arrays is None:
                self._arrays = self._load()
            return self._arrays

    def _load(self) -> tuple[np.ndarray, np.ndarray]:
        m, d = self.manifest, self.directory
        try:
            cid = adapter_content_id(file_sha256(d / ADAPTER_FILE), m)
        except OSError as exc:
            raise EmbedderError(f"{d}: cannot read the adapter: {exc}") from None
        if cid != self._id:
            raise EmbedderError(f"{d}: the adapter file does not match the recorded id {self._id} (it hashes to "
                                f"{cid}: corrupt or replaced)")
        if self.inner.id != m["base_id"]:
            raise EmbedderError(f"{d}: the adapter was trained on encoder {m['base_id']}, the version's settings "
                                f"make {self.inner.id}")
        weight, bias = _read_arrays(d / ADAPTER_FILE)
        if weight.shape != (int(m["base_dim"]), self._dim):
            raise EmbedderError(f"{d}: the adapter maps {weight.shape[0]}-d to {weight.shape[1]}-d, the record "
                                f"says {m['base_dim']}-d to {self._dim}-d")
        now = apply_adapter(self.inner.encode([str(m["probe_text"])]), weight, bias)[0]
        recorded = np.asarray(m["probe_fp32"], dtype=np.float32)
        cos = float(now @ recorded / max(float(np.linalg.norm(recorded)), 1e-12))
        if not cos >= PROBE_FLOOR:
            raise EmbedderError(f"{d}: the probe vector changed (cosine {cos:.6f} to the one recorded, below "
                                f"{PROBE_FLOOR})")
        self.probe_cosine = cos
        return weight, bias

    def encode(self, texts: Sequence[str], *, batch_size: int | None = None,
               progress: bool = False) -> np.ndarray:
        weight, bias = self._get()
        return apply_adapter(self.inner.encode(texts, batch_size=batch_size, progress=progress), weight, bias)

    def __repr__(self) -> str:
        return f"AdaptedEmbedder({self._id} on {self.manifest['base_id']}, {self.directory})"
