"""Which model a deployment serves: :func:`served_model`, and the default model behind it.

Model resolution: the configured ``model`` (a version directory, or a models home
with a ``CURRENT`` pointer), else the models home once a version was promoted there,
else the configured ``intents`` file, else the starter intents that ship as package data
(``classifier/data/starter_intents.yaml``), trained on first use and cached under
``<home>/cache/``. A configured ``intents`` file is always read and validated; when a
model or promoted version wins, it must bundle that same intent set
(:class:`~classifier.versions.served.IntentContract`): else the latest promoted (else newest
stored) version that does is served, else an :class:`~classifier.errors.IntentSetMismatch` names the file, the version
served instead and the command that fixes it (``serve_last_good`` serves it anyway).
The encoders keep their own caches (ONNX exports, the USE tokenizer) under the same
resolved home (:attr:`Config.cache_root`).

:func:`served_model` resolves it once, for :func:`~classifier.assembly.build_classifier` and for
the serving runtime (``service.runtime.open_runtime``) alike: the model, and the models home it
follows. Building a classifier from it is theirs: this module imports no pipeline and no teacher.
"""

from __future__ import annotations

import hashlib
import logging
import sys
from pathlib import Path
from typing import NamedTuple

from flywheel.classifier.errors import IntentFileError, IntentSetMismatch
from flywheel.classifier.settings.config import Config, starter_intents_path
from flywheel.classifier.settings.intents import IntentSet, load_intents
from flywheel.classifier.versions.model import DISTRIBUTION, MANIFEST, IntentModel
from flywheel.classifier.versions.registry import CURRENT, ModelRegistry
from flywheel.classifier.versions.served import IntentContract, ServedHome, ServedVersion, home_choice, set_difference

log = logging.getLogger("flywheel.default")


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
        from flywheel.classifier.layer2.fitter import fit_model

        embedder = make_embedder(intents.embedder, cache_root=cache_root)
        model = fit_model(intents, embedder=embedder, version=target.name, progress=progress)
        model.save(target)
    return target


def existing_model_dir(cfg: Config) -> Path | None:
    """The version the default classifier would serve, if it exists already (trains nothing)."""
    from flywheel.classifier.versions.registry import ModelRegistry

    if cfg.model:
        path = Path(cfg.model).expanduser()
        return ModelRegistry(path).current_path() if (path / CURRENT).is_file() else path
    if (cfg.models_dir / CURRENT).is_file():
        return ModelRegistry(cfg.models_dir).current_path()
    intents_path = Path(cfg.intents).expanduser() if cfg.intents else starter_intents_path()
    cached = cached_model_dir(cfg, intents_path) if intents_path.is_file() else None
    return cached if cached is not None and (cached / MANIFEST).is_file() else None


def _served_home(cfg: Config) -> tuple[Path | None, str]:
    """The configured ``model`` (a version directory or a models home), else the models home
    once a version was promoted there; ``(None, "")`` before that. With what it is, in words."""
    if cfg.model:
        return Path(cfg.model).expanduser(), "the model setting"
    if (cfg.models_dir / CURRENT).is_file():
        return cfg.models_dir, "the models home"
    return None, ""


def check_served_intents(intents: IntentSet, served: Path, what: str, *, last_good: bool = False) -> None:
    """Raise :class:`~classifier.errors.IntentSetMismatch` (a configuration error, exit 2)
    when the version ``served`` (a version directory, or a models home's ``CURRENT``)
    bundles another intent set than ``intents``, the configured ``intents`` file: examples,
    rules and settings included, as the retrain compares them. A directory without a
    bundled intent set is left for loading to reject. ``last_good``: the message names
    ``--serve-last-good`` as a way to start anyway."""
    from flywheel.classifier.versions.model import INTENTS_FILE

    version_dir = ModelRegistry(served).current_path() if (served / CURRENT).is_file() else served
    if not (version_dir / INTENTS_FILE).is_file():
        return
    diff = set_difference(intents, load_intents(version_dir / INTENTS_FILE), version_dir.name)
    if diff is None:
        return
    anyway = (f", or flywheel serve --serve-last-good keeps serving {version_dir.name} until then"
              if last_good else "")
    raise IntentSetMismatch(f"{intents.source}: not served: {what} ({served}) serves {version_dir.name}, "
                            f"trained on another intent set ({diff}), and no stored version was trained on this "
                            f"file; run flywheel retrain --intents {intents.source} to train it on the labels "
                            f"already logged and promote it (labels of removed intents are dropped){anyway}, or "
                            f"drop the intents setting to serve {version_dir.name}")


class ServedModel(NamedTuple):
    """The version to serve, the models home it was promoted in (``None``: a version
    directory, nothing to follow), and what it is (:class:`~classifier.versions.served.ServedVersion`,
    with ``note``: why it is not the home's ``CURRENT``, or serves another set on request)."""

    model: IntentModel
    home: ModelRegistry | None
    served: ServedVersion | None = None
    note: str = ""


def served_model(cfg: Config, *, progress: bool = True, into_home: bool = False) -> ServedModel:
    """The model ``cfg`` serves, loaded, with the models home to follow: the configured
    ``model``, else the models home's ``CURRENT``, else the default model (the intent set
    trained into the cache). ``into_home`` (a fleet replica whose home the fleet's sync
    fills): when no ``model`` is configured and the models home has no version yet, the
    default model is published and promoted there once, so that the home's watcher follows
    the fleet's first promotion.

    Under a configured ``intents`` file (:class:`~classifier.versions.served.IntentContract`) a
    version of another set is never served: the home's ``CURRENT`` when it fits, else the
    latest promoted (else newest stored) version that does (a warning says which, and how to
    promote it), else, with ``cfg.serve_last_good``, ``CURRENT`` all the same (an error line says so), else
    :class:`~classifier.errors.IntentSetMismatch`. The home followed is a
    :class:`~classifier.versions.served.ServedHome`, which refuses a promotion of another set than the
    configured file as it reads then; the default model follows the models home too, so the
    first promotion is swapped in without a restart."""
    contract = IntentContract.from_file(cfg.intents)
    path, what = _served_home(cfg)
    if path is None:
        source = Path(cfg.intents).expanduser() if cfg.intents else starter_intents_path()
        path = ensure_trained(source, cached_model_dir(cfg, source), progress=progress, cache_root=cfg.cache_root)
        if into_home:
            home = ModelRegistry(cfg.models_dir)
            home.promote(home.publish(path))
            log.info("replica: the fleet has promoted no model yet; serving %s locally until it does",
                     home.current_name())
            path, what = home.home, "the models home"
        else:   # follow the models home: the first promotion is swapped in without a restart
            model = IntentModel.load(path)
            return ServedModel(model, ServedHome(cfg.models_dir, cfg.intents),
                               ServedVersion.of_model(model, "default model"))
    if not (path / CURRENT).is_file():   # a version directory: nothing to follow
        model = IntentModel.load(path)
        if contract.intents is not None:
            check_served_intents(contract.intents, path, what)
        return ServedModel(model, None, ServedVersion.of_model(model, "model setting"))
    return _from_home(cfg, contract, ServedHome(path, cfg.intents), what)


def _from_home(cfg: Config, contract: IntentContract, home: ServedHome, what: str) -> ServedModel:
    """The version of the models ``home`` to serve under ``contract`` (see :func:`served_model`)."""
    choice = home_choice(home, contract, last_good=cfg.serve_last_good)
    if choice is None:
        assert contract.intents is not None, "any set fits without an intents setting"
        check_served_intents(contract.intents, home.home, what, last_good=True)
        raise AssertionError("check_served_intents raises for a version of another set")
    version, note = choice
    if note:
        (log.error if version.source.startswith("last good") else log.warning)("%s", note)
    model = ModelRegistry(home.home).load(version.version)   # checked above (or served anyway: last good)
    return ServedModel(model, home, version, note)
