"""The on-disk record of a model version's own encoder (``<version>/encoder/``): its
file names, the content id, and the checks that read it. Two kinds share the layout: a
tuned encoder's ONNX export (:mod:`classifier.encoders.version_encoder`, id ``tuned:``)
and an adapter on a fixed encoder (:mod:`classifier.encoders.adapter`, ``kind: adapter``
in the record, id ``adapted:``). Imports only the standard library
and the named errors, so :mod:`classifier.versions.model` can check a version's encoder without importing an
encoder (see :mod:`classifier.encoders.version_encoder` for the export and serving).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flywheel.classifier.errors import EmbedderError

__all__ = ["ADAPTER_FILE", "ADAPTER_ID_PREFIX", "ADAPTER_KIND", "ENCODER_DIR", "FP32_FILE", "ID_PREFIX", "INT8_FILE",
           "MANIFEST", "TOKENIZER", "EncoderExport", "adapter_content_id", "check_recorded_export", "content_id",
           "file_sha256", "is_adapter", "read_export", "read_manifest"]

#: The directory a version keeps its encoder in.
ENCODER_DIR = "encoder"
#: The encoder id's prefix (an id made from content, never from settings).
ID_PREFIX = "tuned:"
#: The export's record inside ``encoder/`` (the ONNX cache's manifest, with ``served`` and ``encoder_id``).
MANIFEST = "manifest.json"
TOKENIZER = "tokenizer.json"
FP32_FILE = "model.onnx"
INT8_FILE = "model.int8.onnx"
#: An adapter on a fixed encoder (:mod:`classifier.encoders.adapter`): ``kind`` in its record,
#: the one served file (numpy arrays, no pickle) and its id's prefix.
ADAPTER_KIND = "adapter"
ADAPTER_FILE = "adapter.npz"
ADAPTER_ID_PREFIX = "adapted:"
#: The recipe fields that enter the id besides the served graph and the tokenizer.
_RECIPE = ("pooling", "layers", "max_length", "inputs", "outputs", "pad_id", "pad_token", "pad_type_id",
           "padding_side")


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def content_id(graph_sha256: str, tokenizer_sha256: str, manifest: dict[str, Any]) -> str:
    """``tuned:<16 hex>``: the encoder id of a served graph, its tokenizer, the export
    recipe recorded in ``manifest`` and the blobs it names with their SHA-256 (see
    :mod:`classifier.encoders.version_encoder`; an export without blobs keeps its id)."""
    fields = {k: manifest.get(k) for k in _RECIPE}
    if manifest.get("query_prefix"):   # e5's "query: " (absent before it existed: those ids unchanged)
        fields["query_prefix"] = manifest["query_prefix"]
    if manifest.get("blobs"):   # the weights kept in shared blobs (classifier.encoders.blobs): each one's SHA-256
        fields["blobs"] = manifest["blobs"]
    recipe = json.dumps(fields, sort_keys=True)
    digest = hashlib.sha256(f"{graph_sha256}\n{tokenizer_sha256}\n{recipe}".encode()).hexdigest()
    return f"{ID_PREFIX}{digest[:16]}"


def adapter_content_id(adapter_sha256: str, manifest: dict[str, Any]) -> str:
    """``adapted:<16 hex>``: the encoder id of an adapter (its arrays' file) on the base
    encoder ``manifest["base_id"]``, whose vectors it maps to ``manifest["dim"]`` dimensions."""
    recipe = json.dumps({k: manifest.get(k) for k in ("base_id", "base_dim", "dim")}, sort_keys=True)
    digest = hashlib.sha256(f"{adapter_sha256}\n{recipe}".encode()).hexdigest()
    return f"{ADAPTER_ID_PREFIX}{digest[:16]}"


def is_adapter(manifest: dict[str, Any]) -> bool:
    """Whether an export record (:func:`read_manifest`) is an adapter's."""
    return manifest.get("kind") == ADAPTER_KIND


def _recorded_id(manifest: dict[str, Any], shas: dict[str, str]) -> str:
    """The id the files ``shas`` (name: SHA-256) make for the export ``manifest`` records;
    ValueError when one it needs is not among them."""
    needed = (manifest["served"],) if is_adapter(manifest) else (manifest["served"], TOKENIZER)
    missing = [name for name in needed if name not in shas]
    if missing:
        raise ValueError(f"{', '.join(missing)} is missing")
    if is_adapter(manifest):
        return adapter_content_id(shas[manifest["served"]], manifest)
    return content_id(shas[manifest["served"]], shas[TOKENIZER], manifest)


@dataclass(frozen=True)
class EncoderExport:
    """One exported encoder directory (what
    :func:`~classifier.encoders.version_encoder.export_encoder` wrote, or :func:`read_export` read).

    ``files`` maps each file's path relative to ``path`` to its SHA-256; ``cosine`` is the
    fp32 graph's min cosine to torch on the probe set; ``int8_cosine`` the int8 graph's min
    cosine to fp32 (``None`` when int8 was not made); ``served`` the graph file serving
    uses (``quantized``: it is the int8 one); ``note`` says why int8 is not served when it
    was asked for; ``seconds`` is the whole export's wall time as recorded."""

    id: str
    dim: int
    path: Path
    served: str
    files: dict[str, str] = field(default_factory=dict)
    cosine: float = 0.0
    int8_cosine: float | None = None
    note: str = ""
    seconds: float = 0.0
    blobs: tuple[Any, ...] = ()   # the shared blobs it names (classifier.encoders.blobs.BlobRef)

    @property
    def quantized(self) -> bool:
        return self.served == INT8_FILE

    @property
    def size_bytes(self) -> int:
        """The bytes a version carries for this encoder (every file; the blobs it names are shared)."""
        return sum((self.path / name).stat().st_size for name in self.files)

    @property
    def blob_bytes(self) -> int:
        """The bytes of the shared blobs it names (stored once per home, whichever versions name them)."""
        return sum(int(b.bytes) for b in self.blobs)


def read_manifest(directory: Path) -> dict[str, Any]:
    """The export record ``directory/manifest.json``; ValueError when it is not one (OSError unreadable)."""
    doc = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    if not isinstance(doc, dict):
        raise ValueError(f"{MANIFEST} is not a JSON object")
    missing = [k for k in ("encoder_id", "served", "dim", "probe_text", "probe_fp32") if k not in doc]
    if is_adapter(doc):
        missing += [k for k in ("base_id", "base_dim") if k not in doc]
    if missing:
        raise ValueError(f"{MANIFEST} lacks {', '.join(missing)} (not a version encoder export)")
    served = doc["served"]
    if served not in ((ADAPTER_FILE,) if is_adapter(doc) else (FP32_FILE, INT8_FILE)):
        raise ValueError(f"{MANIFEST} names an unknown graph file {served!r}")
    if doc.get("blobs"):
        from flywheel.classifier.encoders.blobs import blob_refs

        blob_refs(doc)   # ValueError naming a malformed entry
    return doc


def read_export(directory: str | os.PathLike[str]) -> EncoderExport:
    """The export in ``directory``, checked: its served graph and tokenizer hash to its
    recorded id (else :class:`EmbedderError`). Every plain file in it is listed in ``files``."""
    d = Path(directory)
    try:
        m = read_manifest(d)
        files = {p.name: file_sha256(p) for p in sorted(d.iterdir())
                 if p.is_file() and not p.is_symlink() and not p.name.startswith(".")}
        cid = _recorded_id(m, files)
    except (OSError, ValueError) as exc:
        raise EmbedderError(f"{d}: not a usable encoder export: {exc}") from None
    if cid != m["encoder_id"]:
        raise EmbedderError(f"{d}: the encoder files do not match the recorded id {m['encoder_id']} "
                            f"(they hash to {cid}: corrupt or replaced)")
    return EncoderExport(id=cid, dim=int(m["dim"]), path=d, served=m["served"], files=files,
                         cosine=float(m.get("verified_min_cosine", 0.0)),
                         int8_cosine=(m.get("int8") or {}).get("min_cosine_to_fp32"),
                         note=str(m.get("int8_not_served") or ""), seconds=float(m.get("total_seconds", 0.0)),
                         blobs=tuple(_blob_refs(m)))


def _blob_refs(manifest: dict[str, Any]) -> list[Any]:
    from flywheel.classifier.encoders.blobs import blob_refs

    return blob_refs(manifest)


def check_recorded_export(directory: str | os.PathLike[str], shas: dict[str, str]) -> tuple[str, int]:
    """``(encoder id, dim)`` of the export in ``directory`` whose files' SHA-256 a model
    manifest records as ``shas`` (names relative to ``directory``, already checked against
    the files): the manifest, tokenizer and served graph must be among them and the
    recorded id must be theirs. Raises ValueError naming what is wrong. Hashes nothing."""
    d = Path(directory)
    if MANIFEST not in shas:
        raise ValueError(f"the version's manifest records no checksum for {ENCODER_DIR}/{MANIFEST}")
    try:
        m = read_manifest(d)
    except OSError as exc:
        raise ValueError(f"cannot read {ENCODER_DIR}/{MANIFEST}: {exc}") from None
    needed = (m["served"],) if is_adapter(m) else (TOKENIZER, m["served"])
    for name in needed:
        if name not in shas:
            raise ValueError(f"the version's manifest records no checksum for {ENCODER_DIR}/{name}")
    cid = _recorded_id(m, shas)
    if cid != m["encoder_id"]:
        raise ValueError(f"{ENCODER_DIR}/{MANIFEST} records id {m['encoder_id']}, its files make {cid}")
    return cid, int(m["dim"])
