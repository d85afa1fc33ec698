"""A model version on disk: ``manifest.json`` + ``head.joblib`` + ``head.npz`` + ``intents.yaml``,
and ``encoder/`` when the version carries its own (fine-tuned) encoder.

``head.joblib`` is the fitted scikit-learn estimator; ``head.npz`` holds the arrays that
scoring needs (:class:`~classifier.layer2.scoring.ServingHead`, no pickle) and is what
:meth:`IntentModel.load` serves by default, so serving never imports scikit-learn.
Versions saved before ``head.npz`` existed load their estimator, as before.

SetFit-style: the model (encoder settings + fitted head + intent set) is separate
from the trainer. Loading checks the manifest against every file it records (sha256 of
the head files and the bundled ``intents.yaml``: :meth:`Manifest.files`), the labels and
dimension, and the encoder, and refuses a corrupt or mismatched version with
:class:`~classifier.errors.ModelError`, so a copied or downloaded version is checked
whole. Versions saved before ``intents_sha256`` was recorded still load (their intent
file is only parsed).

A version may carry its own encoder (:mod:`classifier.encoders.version_encoder`): the
files of ``encoder/`` are recorded with their sha256 in :attr:`Manifest.encoder_files`
(written only when present, so a replica of an earlier release reads the manifest and
ignores them, then refuses the version for its encoder id), :meth:`Manifest.files` lists
them, so every verifier (install, publish, download, promote, rollback) hashes them too,
and :attr:`IntentModel.encoder_dir` points at them once loaded. The large weights such an
encoder names as shared blobs (:mod:`classifier.encoders.blobs`: e5's token table) live
once in ``blobs/`` beside the versions; loading checks each one's SHA-256 too.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator

import yaml

from flywheel.classifier.encoders.version_format import file_sha256  # its one owner
from flywheel.classifier.errors import EmbedderError, IntentFileError, ModelError
from flywheel.classifier.layer2.scoring import Head
from flywheel.classifier.settings.followups import DEFAULT_FOLLOWUPS
from flywheel.classifier.settings.intents import EmbedderSettings, IntentSet, load_intents

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
HEAD_FILE = "head.joblib"
SERVING_HEAD_FILE = "head.npz"
INTENTS_FILE = "intents.yaml"
ENCODER_DIR = "encoder"            # a version's own encoder (classifier.encoders.version_encoder)
BLOBS_DIR = "blobs"                # beside the versions: their encoders' shared weights (classifier.encoders.blobs)
_ENCODER_FILE = re.compile(rf"{ENCODER_DIR}/[A-Za-z0-9][A-Za-z0-9._-]{{0,127}}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


#: this project's distribution on PyPI (the import name stays ``flywheel``)
DISTRIBUTION = "flywheel-intent"


def library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in (DISTRIBUTION, "scikit-learn", "numpy", "torch", "transformers", "sentence-transformers"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def new_version_name() -> str:
    """``v20261122-104901-123456``: sorts by creation time."""
    t = time.time()
    return time.strftime("v%Y%m%d-%H%M%S", time.gmtime(t)) + f"-{int((t % 1) * 1e6):06d}"


_TEACHER_KEYS_V1 = frozenset({"backend", "model", "host", "timeout_s", "max_candidates", "examples_per_intent",
                              "history_size", "breaker_failures", "breaker_reset_s", "confidence"})
_THRESHOLD_KEYS_V1 = frozenset({"confident", "ambiguous_ratio", "oos", "target_precision", "per_intent"})


def _set_only(settings: Any, always: frozenset[str]) -> dict[str, Any]:
    """``settings`` as a dict: the keys in ``always``, and any other only where it differs
    from its default."""
    out = {}
    for f in fields(settings):
        value = getattr(settings, f.name)
        if f.name in always or value != f.default:
            out[f.name] = value
    return out


def _embedder_doc(settings: EmbedderSettings) -> dict[str, Any]:
    """The ``embedder`` section; ``tune`` only when set or off (older replicas refuse unknown keys)."""
    doc = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(settings).items()
           if k not in ("tune", "tune_off")}
    if settings.tune is not None:
        doc["tune"] = asdict(settings.tune)
    elif settings.tune_off:   # the file's "tune: off", kept so the retrain on the bundled set stays off
        doc["tune"] = False
    return doc


def intents_to_doc(intents: IntentSet) -> dict[str, Any]:
    """The inverse of :func:`classifier.settings.intents.parse_intents` (for saving a copy)."""
    rules = []
    for r in intents.rules:
        pats: Any = [sorted(p) for p in r.patterns] if r.kind == "keywords" else list(r.patterns)
        rules.append({"id": r.id, "intent": r.intent, "priority": r.priority, r.kind: pats,
                      **({"description": r.description} if r.description else {})})
    th = intents.thresholds
    return {
        "version": 1,
        "name": intents.name,
        "languages": list(intents.languages),
        "embedder": _embedder_doc(intents.embedder),
        # settings added later are written only when set: a replica of the previous release
        # can still read a version a newer retrain job saved (rolling upgrades of a fleet)
        "teacher": _set_only(intents.teacher, _TEACHER_KEYS_V1),
        "thresholds": {**_set_only(th, _THRESHOLD_KEYS_V1), "per_intent": dict(th.per_intent)},
        "rules": rules,
        "intents": [{"name": i.name, "description": i.description, "examples": list(i.examples),
                     **({"metadata": dict(i.metadata)} if i.metadata else {})}
                    for i in intents.intents],
        "out_of_scope": {"examples": list(intents.oos_examples), "synthetic": intents.synthetic_negatives},
        **({"followups": intents.followups} if intents.followups != DEFAULT_FOLLOWUPS else {}),   # written when set
    }


@dataclass
class Manifest:
    version: str
    labels: list[str]
    encoder: dict[str, Any]          # backend, model, id, dim
    thresholds: dict[str, Any]
    training_size: int
    metrics: dict[str, Any] = field(default_factory=dict)
    created_at: str = ""
    intent_set: str = ""
    head_sha256: str = ""
    serving_head_sha256: str = ""    # head.npz; empty for versions saved without one
    intents_sha256: str = ""         # intents.yaml; empty for versions saved before it was recorded
    encoder_files: dict[str, str] = field(default_factory=dict)   # "encoder/<file>": sha256; empty: no own encoder
    libraries: dict[str, str] = field(default_factory=library_versions)
    format_version: int = FORMAT_VERSION
    parent: str | None = None        # the version this one was trained to replace

    @classmethod
    def read(cls, directory: str | os.PathLike[str]) -> "Manifest":
        """The manifest of the version in ``directory``, read and checked without loading
        the version; :class:`ModelError` when there is none or it is corrupt."""
        d = Path(directory)
        mpath = d / MANIFEST
        if not mpath.is_file():
            raise ModelError(f"{d}: not a model version (no {MANIFEST})")
        try:
            return cls.from_dict(json.loads(mpath.read_text(encoding="utf-8")))
        except (ValueError, TypeError, OSError) as exc:
            raise ModelError(f"{mpath}: corrupt manifest: {exc}") from None

    @classmethod
    def from_dict(cls, d: Any) -> "Manifest":
        """Read a manifest document; raises ValueError naming the missing or mistyped keys."""
        if not isinstance(d, dict):
            raise ValueError(f"expected a JSON object, found {type(d).__name__}")
        missing = [k for k in _REQUIRED if k not in d]
        if missing:
            raise ValueError(f"missing key{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}")
        wrong = [f"{k!r} should be {_KINDS[k][1]}, found {type(d[k]).__name__}" for k in _KINDS
                 if k in d and d[k] is not None and not isinstance(d[k], _KINDS[k][0])]
        if isinstance(d.get("training_size"), bool):
            wrong.append("'training_size' should be an integer, found bool")
        if wrong:
            raise ValueError("; ".join(wrong))
        enc_missing = [k for k in ("id", "dim") if k not in d["encoder"]]
        if enc_missing:
            raise ValueError(f"'encoder' is missing {', '.join(map(repr, enc_missing))}")
        bad = [f"{k!r}" for k, v in (d.get("encoder_files") or {}).items()
               if not (isinstance(k, str) and _ENCODER_FILE.fullmatch(k)
                       and isinstance(v, str) and _SHA256.fullmatch(v))]
        if bad:   # names become paths on download: one level under encoder/, nothing else
            raise ValueError(f"'encoder_files' has invalid entries {', '.join(bad)} (expected "
                             f"'{ENCODER_DIR}/<file name>': <sha256 hex>)")
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})

    def files(self) -> dict[str, str]:
        """``{file name: sha256}`` of every file of the version whose checksum this manifest
        records (the manifest itself excluded): what a copy must match to be the same version."""
        recorded = ((HEAD_FILE, self.head_sha256), (SERVING_HEAD_FILE, self.serving_head_sha256),
                    (INTENTS_FILE, self.intents_sha256), *sorted((self.encoder_files or {}).items()))
        return {name: sha for name, sha in recorded if sha}

    def to_dict(self) -> dict[str, Any]:
        """The manifest document; ``encoder_files`` only when the version carries an encoder."""
        doc = asdict(self)
        if not doc.get("encoder_files"):
            doc.pop("encoder_files", None)
        return doc


_REQUIRED = ("version", "labels", "encoder", "thresholds", "training_size")
_KINDS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "version": (str, "a string"), "labels": (list, "a list"), "encoder": (dict, "an object"),
    "thresholds": (dict, "an object"), "training_size": (int, "an integer"), "metrics": (dict, "an object"),
    "format_version": (int, "an integer"), "head_sha256": (str, "a string"), "libraries": (dict, "an object"),
    "serving_head_sha256": (str, "a string"), "intents_sha256": (str, "a string"),
    "encoder_files": (dict, "an object"),
}


def _load_serving_head(d: Path, manifest: Manifest) -> Head:
    from flywheel.classifier.layer2.scoring import ServingHead

    _check_estimator_file(d, manifest)
    path = d / SERVING_HEAD_FILE
    if not path.is_file():
        raise ModelError(f"{d}: serving head {SERVING_HEAD_FILE} is missing")
    if file_sha256(path) != manifest.serving_head_sha256:
        raise ModelError(f"{path}: checksum does not match the manifest (corrupt or replaced)")
    return ServingHead.load(path)


def _check_estimator_file(d: Path, manifest: Manifest) -> Path:
    """The estimator's file, present and matching the manifest (checked even when serving
    from ``head.npz``: a version is whole or refused)."""
    hpath = d / HEAD_FILE
    if not hpath.is_file():
        raise ModelError(f"{d}: head file {HEAD_FILE} is missing")
    if manifest.head_sha256 and file_sha256(hpath) != manifest.head_sha256:
        raise ModelError(f"{hpath}: checksum does not match the manifest (corrupt or replaced)")
    return hpath


def _check_intents_file(d: Path, manifest: Manifest) -> None:
    """The bundled intent set matches the manifest (versions saved before its checksum was
    recorded are only parsed)."""
    path = d / INTENTS_FILE
    if not manifest.intents_sha256:
        return
    if not path.is_file():
        raise ModelError(f"{d}: bundled intent set {INTENTS_FILE} is missing")
    if file_sha256(path) != manifest.intents_sha256:
        raise ModelError(f"{path}: checksum does not match the manifest (corrupt or replaced)")


def _check_encoder(d: Path, manifest: Manifest) -> Path | None:
    """The version's ``encoder/`` when it carries one, every file present and matching the
    manifest, its export record naming the id the head was trained with; else ModelError."""
    if not manifest.encoder_files:
        return None
    for name, sha in manifest.encoder_files.items():
        path = d / name
        if not path.is_file():
            raise ModelError(f"{d}: encoder file {name} is missing")
        if file_sha256(path) != sha:
            raise ModelError(f"{path}: checksum does not match the manifest (corrupt or replaced)")
    from flywheel.classifier.encoders.version_format import check_recorded_export

    enc = d / ENCODER_DIR
    shas = {name.split("/", 1)[1]: sha for name, sha in manifest.encoder_files.items()}
    try:
        cid, dim = check_recorded_export(enc, shas)
    except ValueError as exc:
        raise ModelError(f"{enc}: {exc}") from None
    if cid != manifest.encoder.get("id") or dim != int(manifest.encoder.get("dim", -1)):
        raise ModelError(f"{enc}: the encoder is {cid} ({dim}-d), the head was trained with "
                         f"{manifest.encoder.get('id')!r} ({manifest.encoder.get('dim')}-d)")
    from flywheel.classifier.encoders.blobs import check_blobs, version_blobs

    try:   # the shared weights it names (the id above covers their SHA-256): present and intact
        check_blobs(enc, version_blobs(d))
    except EmbedderError as exc:
        raise ModelError(str(exc)) from None
    return enc


def _copy_encoder(src: Path, dst: Path, manifest: Manifest, store: Path) -> dict[str, str]:
    """Copy the encoder export ``src`` into ``dst`` (a version being saved) and the shared
    blobs it names into ``store`` (those not there yet); return ``{"encoder/<file>": sha256}``
    of the copies. The export must be the encoder the head was trained with (its id and dim
    in ``manifest``)."""
    from flywheel.classifier.encoders.blobs import find_blob, store_blob
    from flywheel.classifier.encoders.version_format import read_export

    try:
        export = read_export(src)
    except EmbedderError as exc:
        raise ModelError(str(exc)) from None
    enc = manifest.encoder
    if export.id != enc.get("id") or export.dim != int(enc.get("dim", -1)):
        raise ModelError(f"{src}: encoder {export.id} ({export.dim}-d) is not the one the head was trained with, "
                         f"{enc.get('id')!r} ({enc.get('dim')}-d)")
    dst.mkdir()
    out = {}
    for name, sha in export.files.items():
        shutil.copyfile(src / name, dst / name)
        if file_sha256(dst / name) != sha:
            raise ModelError(f"{src / name}: changed while the version was saved")
        out[f"{ENCODER_DIR}/{name}"] = sha
    for ref in export.blobs:   # content-addressed: a blob another version stored already is not written again
        blob = find_blob(src, ref.sha256)
        try:
            if blob is None:
                raise ValueError("it is missing")
            store_blob(blob, store, ref.sha256)
        except (OSError, ValueError) as exc:
            raise ModelError(f"{src}: cannot store encoder blob {ref.sha256} ({ref.name}): {exc}") from None
    return out


# A pickle names the module of each class it holds. Layer 2's modules moved into the
# ``classifier.layer2`` wing (the fitter's head, its scoring and calibration), so a
# ``head.joblib`` saved before the move names the old paths: they load as the new ones.
_MOVED_MODULES = {f"flywheel.classifier.{name}": f"flywheel.classifier.layer2.{name}"
                  for name in ("head", "scoring", "calibration", "tiers", "operating_point", "targets",
                               "negatives")}
_ALIAS_LOCK = threading.Lock()


@contextmanager
def _moved_modules() -> Iterator[None]:
    """The old module paths as aliases of the new ones, for one unpickling; then gone."""
    with _ALIAS_LOCK:
        added = [old for old in _MOVED_MODULES if old not in sys.modules]
        for old in added:
            sys.modules[old] = importlib.import_module(_MOVED_MODULES[old])
        try:
            yield
        finally:
            for old in added:
                sys.modules.pop(old, None)


def _load_estimator(d: Path, manifest: Manifest) -> Head:
    import joblib

    hpath = _check_estimator_file(d, manifest)
    try:
        with _moved_modules():
            head = joblib.load(hpath)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means a corrupt head
        raise ModelError(f"{hpath}: cannot load head: {type(exc).__name__}: {exc}") from None
    if not isinstance(head, Head):   # a pickle holds whatever was dumped
        raise ModelError(f"{hpath}: not a fitted layer-2 head (a {type(head).__name__})")
    return head


@dataclass
class IntentModel:
    """Encoder settings + fitted head + intent set, and the version's own encoder when it
    carries one.

    ``head``: a :class:`~classifier.layer2.scoring.Head`, the fitted
    :class:`~classifier.layer2.head.IntentHead` (just trained, or loaded with ``estimator``) or
    the numpy-only :class:`~classifier.layer2.scoring.ServingHead` that :meth:`load` serves.

    ``encoder_dir``: the encoder export the head was trained with, when the version carries
    its own encoder (``None``: the intent set's ``embedder`` settings make the vectors).
    Before :meth:`save` it may be any export directory
    (:func:`classifier.encoders.version_encoder.export_encoder`); :meth:`save` copies it into
    the version and :meth:`load` sets it to the version's verified ``encoder/``.
    """

    intents: IntentSet
    head: Head
    manifest: Manifest
    path: Path | None = None
    encoder_dir: Path | None = None

    @property
    def version(self) -> str:
        return self.manifest.version

    @property
    def encoder_settings(self) -> EmbedderSettings:
        return self.intents.embedder

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write the version directory atomically (a temp dir renamed into place), with a copy
        of :attr:`encoder_dir` as ``encoder/`` when set (refused with :class:`ModelError`
        unless it is the encoder the manifest names); the shared blobs that encoder names go
        to the store beside the version (``<home>/blobs/``, :mod:`classifier.encoders.blobs`)."""
        import joblib

        target = Path(directory)
        if target.exists() and any(target.iterdir()):
            raise ModelError(f"{target}: refusing to overwrite a non-empty model directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            joblib.dump(self.head, tmp / HEAD_FILE)
            self.manifest.head_sha256 = file_sha256(tmp / HEAD_FILE)
            self.head.serving_head().save(tmp / SERVING_HEAD_FILE)
            self.manifest.serving_head_sha256 = file_sha256(tmp / SERVING_HEAD_FILE)
            with (tmp / INTENTS_FILE).open("w", encoding="utf-8") as f:
                yaml.safe_dump(intents_to_doc(self.intents), f, sort_keys=False, allow_unicode=True)
            self.manifest.intents_sha256 = file_sha256(tmp / INTENTS_FILE)
            self.manifest.encoder_files = ({} if self.encoder_dir is None
                                           else _copy_encoder(Path(self.encoder_dir), tmp / ENCODER_DIR, self.manifest,
                                                             target.parent / BLOBS_DIR))
            (tmp / MANIFEST).write_text(json.dumps(self.manifest.to_dict(), indent=2, sort_keys=False))
            if target.exists():
                target.rmdir()
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.path = target
        if self.encoder_dir is not None:
            self.encoder_dir = target / ENCODER_DIR
        return target

    @classmethod
    def load(cls, directory: str | os.PathLike[str], *, expected_encoder_id: str | None = None,
             estimator: bool = False) -> "IntentModel":
        """Load and verify a version directory; raise :class:`ModelError` if it is unusable.

        The head is the numpy-only :class:`~classifier.layer2.scoring.ServingHead` from ``head.npz``
        when the version has one, unless ``estimator`` asks for the fitted scikit-learn
        :class:`~classifier.layer2.head.IntentHead` (``head.joblib``, which imports scikit-learn).
        """
        d = Path(directory)
        manifest = Manifest.read(d)
        if manifest.format_version != FORMAT_VERSION:
            raise ModelError(f"{d}: format version {manifest.format_version} is not supported "
                             f"(this flywheel reads {FORMAT_VERSION})")
        if manifest.serving_head_sha256 and not estimator:
            head = _load_serving_head(d, manifest)
        else:
            head = _load_estimator(d, manifest)
        _check_intents_file(d, manifest)
        encoder_dir = _check_encoder(d, manifest)
        try:
            intents = load_intents(d / INTENTS_FILE)
        except IntentFileError as exc:
            raise ModelError(f"{d}: bundled intents are invalid: {exc}") from None
        labels = list(head.classes_)
        if labels != list(manifest.labels):
            raise ModelError(f"{d}: head labels {labels} do not match manifest labels {manifest.labels}")
        if sorted(manifest.labels) != sorted(intents.labels):
            raise ModelError(f"{d}: manifest labels do not match the bundled intent set")
        dim = head.n_features_in_
        if int(dim) != int(manifest.encoder.get("dim", -1)):
            raise ModelError(f"{d}: head expects {dim}-d embeddings, manifest encoder has "
                             f"{manifest.encoder.get('dim')}")
        if expected_encoder_id is not None and manifest.encoder.get("id") != expected_encoder_id:
            raise ModelError(f"{d}: trained with encoder {manifest.encoder.get('id')!r}, "
                             f"not {expected_encoder_id!r}")
        return cls(intents=intents, head=head, manifest=manifest, path=d, encoder_dir=encoder_dir)

    def encoder_matches(self, encoder_id: str, dim: int) -> bool:
        """Whether ``(encoder_id, dim)`` is the encoder the head was trained on."""
        enc = self.manifest.encoder
        return enc.get("id") == encoder_id and int(enc.get("dim", -1)) == int(dim)

    def check_encoder(self, encoder_id: str, dim: int) -> None:
        """Refuse an encoder that is not the one the head was trained on."""
        enc = self.manifest.encoder
        if not self.encoder_matches(encoder_id, dim):
            raise ModelError(f"model {self.version} was trained with encoder {enc.get('id')!r} "
                             f"({enc.get('dim')}-d), got {encoder_id!r} ({dim}-d)")
