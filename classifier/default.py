"""The default classifier behind module-level :func:`classifier.classify`.

Model resolution: the configured ``model`` (a version directory, or a models home
with a ``CURRENT`` pointer), else the models home once a version was promoted there,
else the configured ``intents`` file, else the starter intents that ship as package data
(``classifier/data/starter_intents.yaml``), trained on first use and cached under
``<home>/cache/``. A configured ``intents`` file is always read and validated; when a
model or promoted version wins, it must bundle that same intent set, else a
:class:`~classifier.errors.ConfigError` names the file and the version served instead.
The encoders keep their own caches (ONNX exports, the USE tokenizer) under the same
resolved home (:attr:`Config.cache_root`).

:func:`served_model` resolves it once, for :func:`build_classifier` and for the serving
runtime (``service.runtime.open_runtime``) alike: the model, and the models home it follows.
"""

from __future__ import annotations

import hashlib
import logging
import sys
import threading
from pathlib import Path
from typing import Any, NamedTuple

from flywheel.classifier.config import Config, load_config, starter_intents_path
from flywheel.classifier.errors import ConfigError, IntentFileError
from flywheel.classifier.intents import IntentSet, load_intents
from flywheel.classifier.model import DISTRIBUTION, MANIFEST, IntentModel
from flywheel.classifier.protocols import ManagedTeacher
from flywheel.classifier.registry import CURRENT, ModelRegistry

log = logging.getLogger("flywheel.default")
_lock = threading.Lock()
_default: Any = None


def cached_model_dir(cfg: Config, intents_path: Path) -> Path:
    from importlib.metadata import PackageNotFoundError, version

    try:
        lib = version(DISTRIBUTION)
    except PackageNotFoundError:
        lib = "dev"
    try:
        data = intents_path.read_bytes()
    except FileNotFoundError:
        raise IntentFileError(str(intents_path), "file not found") from None
    except OSError as exc:
        raise IntentFileError(str(intents_path), f"cannot read file: {exc}") from None
    digest = hashlib.sha256(data + lib.encode()).hexdigest()[:12]
    return cfg.cache_root / f"{intents_path.stem}-{digest}"


def ensure_trained(intents_path: Path, target: Path, *, progress: bool = True,
                   cache_root: Path | None = None) -> Path:
    """Train the intent set into ``target`` unless a valid version is already there;
    ``cache_root`` is where its encoder keeps its caches (see
    :func:`~classifier.encoders.factory.make_embedder`)."""
    if (target / MANIFEST).is_file():
        return target
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / MANIFEST).is_file():
            return target
        intents = load_intents(intents_path)
        if progress:
            print(f"flywheel: training the default model from {intents_path} (first use) ...", file=sys.stderr)
        from flywheel.classifier.encoders import make_embedder
        from flywheel.classifier.trainer import fit_model

        embedder = make_embedder(intents.embedder, cache_root=cache_root)
        model = fit_model(intents, embedder=embedder, version=target.name, progress=progress)
        model.save(target)
    return target


def existing_model_dir(cfg: Config) -> Path | None:
    """The version the default classifier would serve, if it exists already (trains nothing)."""
    from flywheel.classifier.registry import ModelRegistry

    if cfg.model:
        path = Path(cfg.model).expanduser()
        return ModelRegistry(path).current_path() if (path / CURRENT).is_file() else path
    if (cfg.models_dir / CURRENT).is_file():
        return ModelRegistry(cfg.models_dir).current_path()
    intents_path = Path(cfg.intents).expanduser() if cfg.intents else starter_intents_path()
    cached = cached_model_dir(cfg, intents_path) if intents_path.is_file() else None
    return cached if cached is not None and (cached / MANIFEST).is_file() else None


def default_model_dir(cfg: Config, *, progress: bool = True) -> Path:
    """The configured model, else the models home once a version was promoted there,
    else the intent set (configured or starter) trained into the cache.

    A configured ``intents`` file is read and validated first (a missing or invalid one
    raises :class:`~classifier.errors.IntentFileError`); when the model or the models home
    wins, its served version must bundle that intent set (:func:`check_served_intents`)."""
    explicit = load_intents(Path(cfg.intents).expanduser()) if cfg.intents else None
    served = Path(cfg.model).expanduser() if cfg.model else None
    if served is None and (cfg.models_dir / CURRENT).is_file():
        served = cfg.models_dir
    if served is not None:
        if explicit is not None:
            check_served_intents(explicit, served, "the model setting" if cfg.model else "the models home")
        return served
    intents_path = Path(cfg.intents).expanduser() if cfg.intents else starter_intents_path()
    return ensure_trained(intents_path, cached_model_dir(cfg, intents_path), progress=progress,
                          cache_root=cfg.cache_root)


def check_served_intents(intents: IntentSet, served: Path, what: str) -> None:
    """Raise :class:`~classifier.errors.ConfigError` when the version ``served`` (a version
    directory, or a models home's ``CURRENT``) bundles another intent set than ``intents``,
    the configured ``intents`` file: examples, rules and settings included, as the retrain
    compares them. A directory without a bundled intent set is left for loading to reject.
    When ``served`` is a models home that stores a version of exactly ``intents`` (after
    ``flywheel models rollback``, say), the error names ``flywheel models promote`` for it."""
    from flywheel.classifier.model import INTENTS_FILE, intents_to_doc
    from flywheel.classifier.registry import ModelRegistry

    version_dir = ModelRegistry(served).current_path() if (served / CURRENT).is_file() else served
    if not (version_dir / INTENTS_FILE).is_file():
        return
    bundled = load_intents(version_dir / INTENTS_FILE)
    if intents_to_doc(bundled) == intents_to_doc(intents):
        return
    only_file = sorted(set(intents.labels) - set(bundled.labels))
    only_model = sorted(set(bundled.labels) - set(intents.labels))
    if only_file or only_model:
        diff = (f"intents only in the file: {', '.join(only_file) or 'none'}; "
                f"only in {version_dir.name}: {', '.join(only_model) or 'none'}")
    else:
        diff = "same intents, other examples, rules or settings"
    stored = _stored_version_of(intents, served) if (served / CURRENT).is_file() else None
    promote = (f"flywheel models promote {stored} to serve {stored}, already trained on this intent set, or "
               if stored else "")
    raise ConfigError(f"{intents.source}: not served: {what} ({served}) serves {version_dir.name}, "
                      f"trained on another intent set ({diff}); run {promote}flywheel retrain --intents "
                      f"{intents.source} to train it on the labels already logged and promote it (labels of removed "
                      f"intents are dropped), or drop the intents setting to serve {version_dir.name}")


def _stored_version_of(intents: IntentSet, home: Path) -> str | None:
    """The newest valid version in the models home ``home`` that bundles exactly ``intents``
    (compared as :func:`check_served_intents` compares them), or ``None``."""
    from flywheel.classifier.model import INTENTS_FILE, intents_to_doc

    want = intents_to_doc(intents)
    for v in sorted(ModelRegistry(home).versions(), key=lambda v: (v.created_at, v.name), reverse=True):
        if not v.valid or v.current or not (v.path / INTENTS_FILE).is_file():
            continue
        try:
            if intents_to_doc(load_intents(v.path / INTENTS_FILE)) == want:
                return v.name
        except IntentFileError:   # a damaged copy: not one to advise
            continue
    return None


class ServedModel(NamedTuple):
    """The version to serve, and the models home it was promoted in (``None``: a version
    directory, nothing to follow)."""

    model: IntentModel
    home: ModelRegistry | None


def served_model(cfg: Config, *, progress: bool = True, into_home: bool = False) -> ServedModel:
    """The model ``cfg`` serves (:func:`default_model_dir`), loaded, with the models home
    to follow. ``into_home`` (a fleet replica whose home the fleet's sync fills): when no
    ``model`` is configured and the models home has no version yet, the default model is
    published and promoted there once, so that the home's watcher follows the fleet's
    first promotion."""
    path = default_model_dir(cfg, progress=progress)
    if into_home and cfg.model is None and not (path / CURRENT).is_file():
        home = ModelRegistry(cfg.models_dir)
        home.promote(home.publish(path))
        log.info("replica: the fleet has promoted no model yet; serving %s locally until it does",
                 home.current_name())
        path = home.home
    if (path / CURRENT).is_file():   # a models home: serve CURRENT and follow promotions
        registry = ModelRegistry(path)
        return ServedModel(registry.load_current(), registry)
    return ServedModel(IntentModel.load(path), None)


def build_classifier(cfg: Config | None = None, *, progress: bool = True,
                     background_reload: bool = False, **kwargs: Any) -> Any:
    """The classifier ``cfg`` describes (see the module docs); ``kwargs`` go to
    :class:`~classifier.pipeline.Classifier`. Served from a models home, it follows
    promotions (``follow``): on a watcher thread with ``background_reload``, else checked
    on the calling thread. The encoder keeps its caches under ``cfg``'s home."""
    from flywheel.classifier.pipeline import Classifier
    from flywheel.classifier.teachers.factory import build_teacher

    cfg = cfg or load_config()
    # the parts first: the served model, then the teacher its intent set names (the config
    # overrides it), then one Classifier that joins them
    served = served_model(cfg, progress=progress)
    kwargs.setdefault("cache_root", cfg.cache_root)
    if "teacher" not in kwargs:
        kwargs["teacher"] = build_teacher(cfg, served.model.intents)
    clf = Classifier(served.model, follow=served.home, **kwargs)
    if background_reload and clf.watcher is not None:
        clf.watcher.start()
    return clf


def default_classifier() -> Any:
    global _default
    with _lock:
        if _default is None:
            _default = build_classifier()
        return _default


def reset_default() -> None:
    """Forget the default classifier (tests; after changing configuration), closing it
    and the teacher :func:`build_classifier` opened for it."""
    global _default
    with _lock:
        old, _default = _default, None
    if old is not None:
        try:
            old.close()
        finally:
            if isinstance(old.teacher, ManagedTeacher):
                old.teacher.close()
