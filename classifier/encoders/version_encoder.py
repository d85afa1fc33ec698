"""A model version's own encoder: the ``encoder/`` directory of a version that carries a
fine-tuned encoder, exported once (with torch, on the training host) and served with
``onnxruntime`` and ``tokenizers`` only (no torch, no transformers, no pickle).

Layout of ``<version>/encoder/`` (every file hashed in the version's manifest,
:attr:`classifier.versions.model.Manifest.encoder_files`)::

    model.int8.onnx   the served graph (``model.onnx`` when int8 was not asked for or did not hold)
    tokenizer.json    the fast tokenizer the export used
    manifest.json     the export's record: recipe, library versions, cosines, probe vectors,
                      ``served`` (the graph's file name), ``encoder_id`` and, when tuning put
                      one before every text, ``query_prefix`` (e5's ``query: ``), which
                      serving puts before every text too (the probe checks the bare graph)
    LICENSE-NOTICE.txt  (e5-multilingual) the base model's MIT licence notice

The served graph's initializers of at least ``split_min_bytes`` (8 MiB: e5's token table)
are not in it but in shared blobs (:mod:`~classifier.encoders.blobs`): ``blobs`` in the
manifest names them with their SHA-256, the id covers them, an export keeps them in its own
``blobs/`` and a saved version in the home's ``blobs/``, stored once whichever versions name them.

(:mod:`~classifier.encoders.version_format` owns these names, the id and the checks that
read them, without importing an encoder.)

- **Export** (:func:`export_encoder`): the ONNX cache's own export and check
  (:func:`~classifier.encoders.onnx_runner.export_checked`: the dynamo export of the
  transformer, masked mean pooling and L2 normalisation in numpy as
  :class:`~classifier.encoders.torch_runner.MeanPoolRunner` does, refused unless its min
  cosine to fp32 torch on :data:`~classifier.encoders.onnx_runner.PROBE` is at least
  :data:`~classifier.encoders.onnx_runner.MIN_COSINE`), then, with ``quantize``, the
  cache's int8 step (:func:`~classifier.encoders.onnx_runner.quantize_export`). int8 is
  served when its min cosine to fp32 on the probe set is at least ``int8_min_cosine``
  (:data:`INT8_MIN_COSINE`), else fp32 (the reason is recorded). Only the served graph is
  kept. The directory is built under a temporary name beside ``dest`` and renamed into
  place.
- **Id** (:func:`content_id`): ``tuned:`` + 16 hex digits of the SHA-256 of the served
  graph's SHA-256, ``tokenizer.json``'s SHA-256 and the recipe (pooling, token limit,
  inputs, outputs, padding), and the SHA-256 of each shared blob it names. Any change to
  the weights, the tokenizer or the recipe is a new id, so vectors (a head, logged vectors,
  a cache) of two encoders never mix.
- **Serving** (:class:`VersionEncoderEmbedder`): on load, the served graph and tokenizer
  must hash to the recorded id, and the probe text must encode to the recorded vector:
  cosine >= :data:`~classifier.encoders.onnx_runner.MIN_COSINE` to the one recorded at
  export. onnxruntime's int8 kernels differ per instruction set (VNNI, AVX-512, AVX2:
  BENCHMARKS.md section 12), so an int8 graph on another CPU is accepted when its probe
  vector is as close to the fp32 one as int8 was on the export host, less
  :data:`INT8_CPU_SLACK`. Anything else is an :class:`~classifier.errors.EmbedderError`.

**What a fleet pays to follow a promotion** of a version with its own encoder: every
replica downloads the version's own files plus the shared blobs it does not hold yet
(:mod:`fleet.blobs`): about 23 MB for an int8 MiniLM, whose tuning moves its token table
(about 90 MB in fp32, which is why only the served graph is kept); a tuned int8 e5 is about
62 MB of its own plus a 96 MB token-table blob that every tuned e5 version shares, so only the
first e5 promotion fetches it (BENCHMARKS.md section 18.2), within the store client's
per-request timeout (10 s by default: 2.3 MB/s for int8, 9 MB/s for fp32); it hashes those bytes when they
arrive and again each time the version is loaded (install, promotion, the watcher's load:
a SHA-256 of 23 MB is some 0.05-0.1 s per pass on one core); then the watcher's thread
opens an onnxruntime session and encodes the probe text and a warm-up query before the
swap (well under a second for MiniLM), never on a request. Until the queries that began
on the old bundle finish, both encoders are in memory (a MiniLM int8 session is some
tens of MB). A promotion that keeps the champion's encoder (same id) reuses the loaded
encoder and its vector cache, but the version still carries (and replicas still download)
its own copy of the small files: the bucket holds one copy per version, so prune it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Hashable
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from flywheel.classifier.encoders.base import Runner
from flywheel.classifier.encoders.blobs import BLOBS_DIR, SPLIT_MIN_BYTES, blob_refs, load_blobs, split_graph
from flywheel.classifier.encoders.embedders import LazyEmbedder
from flywheel.classifier.encoders.version_format import (
    ENCODER_DIR,
    FP32_FILE,
    ID_PREFIX,
    INT8_FILE,
    MANIFEST,
    TOKENIZER,
    EncoderExport,
    check_recorded_export,
    content_id,
    file_sha256,
    read_export,
    read_manifest,
)
from flywheel.classifier.errors import EmbedderError

__all__ = ["ENCODER_DIR", "ID_PREFIX", "INT8_CPU_SLACK", "INT8_MIN_COSINE", "EncoderExport",
           "VersionEncoderEmbedder", "check_recorded_export", "content_id", "export_encoder", "read_export"]

log = logging.getLogger("flywheel.onnx")

#: Serve int8 only when its min cosine to the fp32 export over the probe set is at least this
#: (BENCHMARKS.md section 12: int8 MiniLM is 0.953 at worst on 1,500 CLINC150 texts on an AVX2 CPU).
INT8_MIN_COSINE = 0.95
#: How much further from fp32 than on the export host an int8 probe vector may be on another CPU.
INT8_CPU_SLACK = 0.02


def base_max_length(source: Path) -> int:
    """``max_seq_length`` of a sentence-transformers config beside the weights, else 256 (MiniLM's)."""
    try:
        cfg = json.loads((source / "sentence_bert_config.json").read_text(encoding="utf-8"))
        return int(cfg.get("max_seq_length", 256))
    except (OSError, ValueError, TypeError):
        return 256


def _brief(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {(lines[0] if lines else '')[:400]}"


def export_encoder(hf_dir: str | os.PathLike[str], dest: str | os.PathLike[str], *, quantize: bool,
                   max_length: int | None = None, pooling: str = "mean", num_threads: int | None = None,
                   int8_min_cosine: float = INT8_MIN_COSINE, query_prefix: str = "",
                   int8_keep_fp32: Callable[[Path], list[str]] | None = None,
                   extra_files: Sequence[Path] = (), split_min_bytes: int = SPLIT_MIN_BYTES) -> EncoderExport:
    """Export the Hugging Face encoder in ``hf_dir`` to ONNX into ``dest`` (created; it must
    not exist or be empty), checked against torch; see the module docs.

    Parameters
    ----------
    hf_dir : path
        A model directory with ``config.json``, the weights and a fast tokenizer (what
        ``save_pretrained`` or ``SentenceTransformer.save`` writes, the transformer at the
        top level).
    dest : path
        The encoder directory to write, e.g. a staging ``encoder/`` that
        :meth:`classifier.versions.model.IntentModel.save` then copies into the version.
    quantize : bool
        Serve int8 when it holds (min cosine to fp32 >= ``int8_min_cosine`` on the probe set).
    max_length : int, optional
        Token limit (default the directory's ``sentence_bert_config.json``, else 256).
    pooling : ``"mean"``
        Masked mean pooling and L2 normalisation (the only pooling supported here).
    num_threads : int, optional
        onnxruntime threads for the checks.
    query_prefix : str
        Put before every text when served (e5's ``query: ``, what the tuner put before
        them); recorded as ``query_prefix`` and part of the id. ``""``: none, not recorded.
    int8_keep_fp32 : callable, optional
        Nodes of ``model.onnx`` the int8 copy leaves fp32 (e5's FFN down-projections).
    extra_files : paths
        Files copied into the directory as they are (a licence notice); hashed in the
        version's manifest like the others.
    split_min_bytes : int
        Initializers of the served graph this large or larger go to shared blobs in
        ``dest/blobs/`` (:func:`~classifier.encoders.blobs.split_graph`), recorded as
        ``blobs``; default :data:`~classifier.encoders.blobs.SPLIT_MIN_BYTES`.

    Raises
    ------
    EmbedderError
        No model directory, a ``dest`` in use, an export that fails or disagrees with torch.
    """
    from flywheel.classifier.encoders import onnx_runner
    from flywheel.classifier.encoders.torch_runner import MeanPoolRunner

    source = Path(hf_dir).expanduser().resolve()
    target = Path(dest)
    if pooling != "mean":
        raise EmbedderError(f"a version's encoder is exported with mean pooling only, not {pooling!r}")
    if not (source / "config.json").is_file():
        raise EmbedderError(f"{source}: not a Hugging Face model directory (no config.json)")
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise EmbedderError(f"{target}: refusing to overwrite an existing encoder directory")
    limit = int(max_length or base_max_length(source))
    target.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.export-", dir=target.parent))
    try:
        def reference() -> tuple[Runner, Any, Any]:  # plain fp32 torch on CPU: what the export must match
            ref = MeanPoolRunner(source, "cpu", False, False, limit, False)
            return ref, ref.model, ref.tokenizer

        try:
            manifest, _ = onnx_runner.export_checked(tmp, source, reference, pooling="mean", layers=None,
                                                     max_length=limit, num_threads=num_threads,
                                                     record={"source": source.name})
        except Exception as exc:  # noqa: BLE001 - exporter errors are many and varied
            raise EmbedderError(f"exporting {source} to ONNX failed or did not match torch: {_brief(exc)}") from exc
        served, note = FP32_FILE, ""
        if quantize:
            try:
                int8_cosine = onnx_runner.quantize_export(tmp, int8_keep_fp32)
            except Exception as exc:  # noqa: BLE001 - fp32 is verified: serve it
                note = f"int8 quantization failed ({_brief(exc)})"
            else:
                if int8_cosine >= int8_min_cosine:
                    served = INT8_FILE
                else:
                    note = f"int8 min cosine to fp32 {int8_cosine:.4f} < {int8_min_cosine}"
            manifest = json.loads((tmp / MANIFEST).read_text(encoding="utf-8"))   # with its "int8" record
            if note:
                log.warning("%s: %s; the version serves fp32", source, note)
        keep = {served, TOKENIZER, MANIFEST}
        for p in list(tmp.iterdir()):   # only the served graph travels (and its external data, if any)
            if p.name not in keep and not (served == FP32_FILE and p.name.startswith(FP32_FILE + ".")):
                p.unlink() if p.is_file() else shutil.rmtree(p)
        blobs = split_graph(tmp / served, tmp / BLOBS_DIR, split_min_bytes)
        if blobs:   # the graph is one file now: drop a large fp32 export's external data
            for p in tmp.glob(f"{served}.*"):
                p.unlink()
            manifest["blobs"] = [b.record() for b in blobs]
        for extra in extra_files:
            shutil.copyfile(extra, tmp / Path(extra).name)
        manifest.update({"served": served, "int8_not_served": note or None,
                         "total_seconds": round(time.perf_counter() - t0, 3)})
        if query_prefix:
            manifest["query_prefix"] = query_prefix
        manifest["encoder_id"] = content_id(file_sha256(tmp / served), file_sha256(tmp / TOKENIZER), manifest)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        for p in tmp.iterdir():   # mkdtemp/mkstemp make owner-only files
            p.chmod(0o755 if p.is_dir() else 0o644)
        tmp.chmod(0o755)
        if target.is_dir():
            target.rmdir()   # empty (checked above)
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    export = read_export(target)
    log.info("exported encoder %s from %s to %s: %s, %.1f MB (+ %.1f MB of shared blobs), min cosine to torch "
             "%.6f%s, in %.1fs", export.id, source, target, export.served, export.size_bytes / 1e6,
             export.blob_bytes / 1e6, export.cosine,
             f", int8 to fp32 {export.int8_cosine:.4f}" if export.int8_cosine is not None else "", export.seconds)
    return export


def _cosine(a: np.ndarray, b: Any) -> float:
    b = np.asarray(b, dtype=np.float32).reshape(-1)
    a = a.reshape(-1)
    return float(a @ b / max(float(np.linalg.norm(a) * np.linalg.norm(b)), 1e-12))


class VersionEncoderEmbedder(LazyEmbedder):
    """Serves a version's ``encoder/`` directory with onnxruntime and tokenizers (no torch,
    no pickle). Lazy (the first ``encode`` or :meth:`load` opens it; ``id`` and ``dim`` are
    read from the small export record without loading) and thread-safe.

    On load, the served graph and tokenizer must hash to the recorded id and the probe text
    must encode as recorded (see the module docs); else :class:`EmbedderError` and nothing is
    served. The loaded session belongs to this object, not to the process-wide registry of
    :mod:`~classifier.encoders.base`: each hot reload to another version's encoder would
    otherwise keep every earlier one loaded for the life of the process.

    Parameters
    ----------
    directory : path
        The version's ``encoder/`` (:attr:`classifier.versions.model.IntentModel.encoder_dir`).
    batch_size, max_chars, num_threads
        As for :class:`~classifier.encoders.embedders.MiniLMEmbedder` (``num_threads``:
        onnxruntime's intra-op threads).

    Raises
    ------
    EmbedderError
        ``directory`` holds no readable export record.
    """

    def __init__(self, directory: str | os.PathLike[str], batch_size: int = 64, *,
                 max_chars: int | None = None, num_threads: int | None = None) -> None:
        super().__init__(batch_size, None, max_chars, num_threads=num_threads)
        self.directory = Path(directory)
        try:
            self.manifest = read_manifest(self.directory)
        except (OSError, ValueError) as exc:
            raise EmbedderError(f"{self.directory}: not a version encoder: {exc}") from None
        self._id = str(self.manifest["encoder_id"])
        self._dim = int(self.manifest["dim"])
        #: put before every text (the export's ``query_prefix``: what its tuning used)
        self.query_prefix = str(self.manifest.get("query_prefix") or "")
        self._load_lock = threading.Lock()
        #: cosine of the probe vector at load to the one recorded at export (None before loading)
        self.probe_cosine: float | None = None

    @property
    def id(self) -> str:
        return self._id

    def _known_dim(self) -> int:
        return self._dim

    def _key(self) -> Hashable:
        return ("version-encoder", self._id, str(self.directory), self.num_threads)

    def _runner(self) -> Runner:
        runner = self._loaded
        if runner is not None:
            return runner
        with self._load_lock:
            if self._loaded is None:
                t0 = time.perf_counter()
                try:
                    self._loaded = self._load()
                except EmbedderError:
                    raise
                except Exception as exc:
                    raise EmbedderError(f"could not load encoder {self.id} from {self.directory}: "
                                        f"{type(exc).__name__}: {exc}") from exc
                finally:  # reported once, to the calling thread (see pop_load_ms)
                    self._tls.load_ms = getattr(self._tls, "load_ms", 0.0) + (time.perf_counter() - t0) * 1e3
            return self._loaded

    def _load(self) -> Runner:
        from flywheel.classifier.encoders import onnx_runner

        m, d = self.manifest, self.directory
        served = m["served"]
        try:
            cid = content_id(file_sha256(d / served), file_sha256(d / TOKENIZER), m)
        except OSError as exc:
            raise EmbedderError(f"{d}: cannot read the encoder: {exc}") from None
        if cid != self._id:
            raise EmbedderError(f"{d}: the encoder files do not match the recorded id {self._id} (they hash to "
                                f"{cid}: corrupt or replaced)")
        try:
            refs = blob_refs(m)
        except ValueError as exc:
            raise EmbedderError(f"{d}: {exc}") from None
        runner = onnx_runner.OnnxRunner(d, served, None, self.num_threads,
                                        initializers=load_blobs(d, refs) if refs else None)
        if int(runner.dim) != self._dim:
            raise EmbedderError(f"{d}: the graph makes {runner.dim}-d vectors, the record says {self._dim}")
        now = runner.encode_batch([str(m["probe_text"])])
        if served == INT8_FILE:
            int8 = m.get("int8") or {}
            cos = _cosine(now, int8.get("probe", m["probe_fp32"]))
            if not cos >= onnx_runner.MIN_COSINE:   # another CPU's int8 kernels: as close to fp32 as at export?
                floor = float(int8.get("min_cosine_to_fp32", 1.0)) - INT8_CPU_SLACK
                to_fp32 = _cosine(now, m["probe_fp32"])
                if not to_fp32 >= floor:
                    raise EmbedderError(f"{d}: the probe vector changed (cosine {cos:.6f} to the int8 one recorded "
                                        f"at export, {to_fp32:.4f} to fp32, below {floor:.4f})")
                log.info("encoder %s: int8 vectors differ from the export host's (probe cosine %.4f; %.4f to fp32, "
                         "within %.2f of the export's int8 figure): another CPU's int8 kernels", self._id, cos,
                         to_fp32, INT8_CPU_SLACK)
        else:
            cos = _cosine(now, m["probe_fp32"])
            if not cos >= onnx_runner.MIN_COSINE:
                raise EmbedderError(f"{d}: the probe vector changed (cosine {cos:.6f} to the one recorded at export)")
        self.probe_cosine = cos
        if self.query_prefix:   # the probe above checks the graph itself, as exported (no prefix)
            from flywheel.classifier.encoders.embedders import PrefixRunner

            return PrefixRunner(runner, self.query_prefix)
        return runner
