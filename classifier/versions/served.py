"""What a deployment serves, and whether a version fits the intent set it is configured for.

A deployment's intent set is the configured ``intents`` file (flag > environment > config
file), read once per command. A model version *fits* it when the intent set it bundles is
that file's, examples, rules and settings included (:func:`intent_digest` of both is the
same): that is the one test every move of the served pointer passes (``promote``, both
kinds of ``rollback``, the hot reload of a serving process, a start). Without an
``intents`` setting, the version served now is the deployment's set.

- :class:`ServedVersion`: a version as the deployment sees it (name, intent-set digest and
  labels, encoder, where it came from), read from its manifest and bundled intent file
  without loading its head.
- :class:`IntentContract`: the configured intent set and the check (:meth:`~IntentContract.check`
  raises :class:`~classifier.errors.IntentSetMismatch`, one line that names both sides).
- :class:`ServedHome`: the models home a serving process follows; it refuses to load a
  version of another intent set, so the watcher keeps the old one serving and counts the
  refusal (``flywheel_model_reloads_total{outcome="refused"}``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path

from flywheel.classifier.errors import IntentFileError, IntentSetMismatch, ModelError
from flywheel.classifier.settings.intents import IntentSet, load_intents
from flywheel.classifier.versions.model import INTENTS_FILE, IntentModel, Manifest, intents_to_doc
from flywheel.classifier.versions.registry import ModelRegistry

__all__ = ["IntentContract", "ServedHome", "ServedVersion", "home_choice", "intent_digest", "set_difference"]

log = logging.getLogger("flywheel.serving")


def intent_digest(intents: IntentSet) -> str:
    """A short digest of everything a version bundles of an intent set (its saved document,
    :func:`~classifier.versions.model.intents_to_doc`): equal digests, the same set."""
    doc = json.dumps(intents_to_doc(intents), sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(doc.encode("utf-8")).hexdigest()[:16]


def set_difference(want: IntentSet, have: IntentSet, have_name: str) -> str | None:
    """How the set ``have`` (bundled by the version ``have_name``) differs from ``want``, in
    words; ``None`` when they are the same set."""
    if intent_digest(want) == intent_digest(have):
        return None
    only_want = sorted(set(want.labels) - set(have.labels))
    only_have = sorted(set(have.labels) - set(want.labels))
    if only_want or only_have:
        return (f"intents only in the file: {', '.join(only_want) or 'none'}; "
                f"only in {have_name}: {', '.join(only_have) or 'none'}")
    return "same intents, other examples, rules or settings"


@dataclass(frozen=True)
class ServedVersion:
    """A version as a deployment sees it: ``version`` (its name), ``digest`` of the intent
    set it bundles (:func:`intent_digest`) and its ``labels``, the ``encoder`` id it was
    trained with, ``source`` (where it came from: ``"model setting"``, ``"models home"``,
    ``"fleet"``, ``"default model"``) and its local ``path`` (``None``: not on this host)."""

    version: str
    digest: str
    labels: tuple[str, ...]
    encoder: str
    source: str
    path: Path | None = None
    intents: IntentSet | None = None

    @classmethod
    def of_model(cls, model: IntentModel, source: str) -> "ServedVersion":
        return cls(model.version, intent_digest(model.intents), tuple(model.intents.labels),
                   str(model.manifest.encoder.get("id", "")), source, model.path, model.intents)

    @classmethod
    def read(cls, directory: str | os.PathLike[str], source: str) -> "ServedVersion":
        """The version saved in ``directory``, from its manifest and bundled intent file (no
        head is loaded); :class:`~classifier.errors.ModelError` when either is unreadable."""
        d = Path(directory)
        manifest = Manifest.read(d)
        try:
            intents = load_intents(d / INTENTS_FILE)
        except IntentFileError as exc:
            raise ModelError(f"{d}: bundled intents are unreadable: {exc}") from None
        return cls(manifest.version or d.name, intent_digest(intents), tuple(intents.labels),
                   str(manifest.encoder.get("id", "")), source, d, intents)

    def summary(self) -> str:
        return (f"{self.version} ({self.source}; intents {', '.join(self.labels)}; set {self.digest}; "
                f"encoder {self.encoder})")


@dataclass(frozen=True)
class IntentContract:
    """The intent set a deployment is configured for (``intents``; ``None``: no ``intents``
    setting, and any set fits) and the file it came from."""

    intents: IntentSet | None = None
    source: str = ""

    @classmethod
    def from_file(cls, path: str | os.PathLike[str] | None) -> "IntentContract":
        """The contract of the configured ``intents`` file (``None``: none configured);
        :class:`~classifier.errors.IntentFileError` when it cannot be read or is invalid."""
        if not path:
            return cls()
        p = Path(path).expanduser()
        return cls(load_intents(p), str(p))

    @property
    def digest(self) -> str | None:
        return None if self.intents is None else intent_digest(self.intents)

    def fits(self, bundled: IntentSet) -> bool:
        return self.intents is None or intent_digest(bundled) == intent_digest(self.intents)

    def check(self, name: str, bundled: IntentSet, *, doing: str, fix: str = "") -> None:
        """Raise :class:`~classifier.errors.IntentSetMismatch` unless version ``name``'s
        bundled set fits: ``doing`` says what was refused (``"promote v3"``), ``fix`` what to do."""
        if self.intents is None:
            return
        diff = set_difference(self.intents, bundled, name)
        if diff is None:
            return
        raise IntentSetMismatch(f"refusing to {doing}: {name} was trained on another intent set than "
                                f"{self.source} ({diff})" + (f"; {fix}" if fix else ""))

    def newest_fit(self, registry: ModelRegistry, *, among: list[str] | None = None) -> str | None:
        """The newest valid version of the local ``registry`` (or the last of the names
        ``among``, in order) that fits; ``None`` when none does."""
        names = among if among is not None else [v.name for v in sorted(
            registry.versions(), key=lambda v: (v.created_at, v.name)) if v.valid]
        for name in reversed(names):
            try:
                served = ServedVersion.read(registry.version_dir(name), "models home")
            except ModelError:
                continue
            if served.intents is not None and self.fits(served.intents):
                return name
        return None


def home_choice(home: ModelRegistry, contract: IntentContract, *,
                last_good: bool = False) -> tuple[ServedVersion, str] | None:
    """Which version of the models ``home`` (one with ``CURRENT``) a process serves under
    ``contract``, read from manifests (no head is loaded): ``CURRENT`` when it fits; else the
    latest promoted (else newest stored) version that fits, with a note that says so; else,
    with ``last_good``, ``CURRENT`` all the same, with a loud note; else ``None`` (nothing
    may be served)."""
    current = ServedVersion.read(home.current_path(), "models home")
    assert current.intents is not None, "read from its bundled intent file"
    if contract.fits(current.intents):
        return current, ""
    promoted = contract.newest_fit(home, among=home.history())
    fit = promoted if promoted is not None else contract.newest_fit(home)
    if fit is not None:
        which = "the latest promoted version" if promoted is not None else "the newest stored version"
        note = (f"the models home ({home.home}) serves {current.version}, trained on another intent set than "
                f"{contract.source}; serving {fit}, {which} trained on it (flywheel models promote {fit} makes "
                f"it the served version)")
        return ServedVersion.read(home.version_dir(fit), "stored version fitting the intents file"), note
    if not last_good:
        return None
    note = (f"SERVING ANOTHER INTENT SET: {current.version} was trained on another intent set than "
            f"{contract.source} and no stored version fits it; serving it because of --serve-last-good "
            f"(flywheel retrain trains the file)")
    return replace(current, source="last good version (serve_last_good)"), note


class ServedHome(ModelRegistry):
    """The models home a serving process follows under the deployment's contract:
    :meth:`load` refuses a version of another intent set with
    :class:`~classifier.errors.IntentSetMismatch` (a :class:`~classifier.errors.ModelError`),
    so the :class:`~classifier.versions.registry.ModelWatcher` logs and counts the refusal and the
    old version keeps serving. ``contract`` is read again at every load (``intents``: the
    configured file's path, ``None``: any set fits), so a file edited while the process
    runs is the one a promotion must fit; a file that cannot be read refuses the load."""

    def __init__(self, home: str | os.PathLike[str], intents: str | os.PathLike[str] | None) -> None:
        super().__init__(home)
        self.intents = intents

    def contract(self) -> IntentContract:
        try:
            return IntentContract.from_file(self.intents)
        except IntentFileError as exc:
            raise IntentSetMismatch(f"the configured intents file cannot be read ({exc}); nothing new is "
                                    f"served until it can") from None

    def load(self, name: str) -> IntentModel:
        contract = self.contract()
        model = super().load(name)
        contract.check(name, model.intents, doing=f"serve {name}",
                       fix=f"run flywheel retrain to train {contract.source} and promote it")
        return model
