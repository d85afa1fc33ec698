"""Model versions on disk and hot reload.

A models home holds one directory per version plus a ``CURRENT`` file naming the
served version and ``HISTORY`` (one promoted version per line, oldest first) for
rollback. ``CURRENT`` is replaced atomically (write a temp file, fsync, rename), so
a reader sees the old or the new name, never a partial one. :meth:`ModelRegistry.prune`
deletes the versions nobody needs any more (old kept challengers, old promotions).

:class:`ModelRegistry` implements :class:`classifier.protocols.Registry`: its token is
the served version's name, and a promotion compares it and swaps ``CURRENT`` under a
short file lock (``.current.lock``), so two writers never overwrite each other blindly
(:class:`PromotionConflict`). :meth:`ModelRegistry.lock` is the retrain lock
(``.retrain.lock``), held by jobs that write versions; :meth:`ModelRegistry.install`
moves a downloaded version into the home, checked whole.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import shutil
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from flywheel.classifier.errors import FlywheelError, ModelError
from flywheel.classifier.versions.model import BLOBS_DIR, ENCODER_DIR, MANIFEST, IntentModel
from flywheel.classifier.versions.registry_policy import history_without, prune_plan, rollback_target

log = logging.getLogger("flywheel.registry")

CURRENT = "CURRENT"
HISTORY = "HISTORY"
SHADOW = "SHADOW"                  # the version replicas score beside CURRENT, enforcing nothing
LAST_RETRAIN = "LAST_RETRAIN"      # JSON: when the last retrain run finished, and what it did
_POINTER_NAMES = (CURRENT, HISTORY, SHADOW, LAST_RETRAIN, BLOBS_DIR)   # BLOBS_DIR: the shared encoder weights
RETRAIN_LOCK = ".retrain.lock"     # the retrain lock (ModelRegistry.lock)
POINTER_LOCK = ".current.lock"     # held for the moment CURRENT and HISTORY are compared and rewritten
POINTER_LOCK_TIMEOUT_S = 30.0
#: What a rollback with no earlier version says (both registries): where the way back is
NOTHING_TO_ROLL_BACK = ("nothing to roll back to (flywheel models rollback --to-default serves the default "
                        "model again)")
#: How often a :class:`ModelWatcher` checks its pointer (at most; the classifier's and the shadow's)
WATCH_INTERVAL_S = 2.0
# a version being deleted is first renamed to ``..pruning-<name>-<random>``: hidden, so
# ``versions()`` no longer sees it, and recognisable, so a later prune can finish the job
# (two dots: a save in progress is ``.<name>.<random>`` and a name never starts with a dot)
PRUNING_PREFIX = "..pruning-"


class PromotionConflict(ModelError):
    """The served-version pointer moved since the caller read it: a compare-and-swap
    promotion or rollback was refused and changed nothing. ``expected`` and ``found``
    are the tokens (for a local home, the version names; ``None``: nothing promoted)."""

    #: the version served when the conflict was seen, where ``found`` is not one (the fleet
    #: registry's tokens are etags); declared only, so it exists only where it was set
    found_version: str | None

    def __init__(self, expected: str | None, found: str | None, where: str = "") -> None:
        self.expected, self.found, self.where = expected, found, where
        super().__init__(f"{where + ': ' if where else ''}the served version moved: expected "
                         f"{expected or 'none'}, found {found or 'none'}")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.expected, self.found, self.where)


class RegistryLockError(FlywheelError):
    """A registry lock file cannot be taken for a reason other than being held elsewhere
    (permissions, a read-only home), or the pointer lock stayed held too long."""


class Unchecked(enum.Enum):
    """The type of :data:`UNCHECKED`."""

    UNCHECKED = "unchecked"


UNCHECKED = Unchecked.UNCHECKED    # ModelRegistry.promote(expected=UNCHECKED): no compare-and-swap


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:  # pragma: no cover - directories cannot be fsynced on some platforms
        pass


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def is_models_home(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a models home: it holds a ``CURRENT`` or ``HISTORY`` pointer, or
    a version directory (one with a manifest). A version is saved *into* a home, never as one."""
    p = Path(path)
    if any((p / f).is_file() for f in (CURRENT, HISTORY)):
        return True
    try:
        return any(d.is_dir() and not d.name.startswith(".") and (d / MANIFEST).is_file() for d in p.iterdir())
    except OSError:   # not there (yet), or not a directory
        return False


@dataclass(frozen=True)
class VersionInfo:
    name: str
    path: Path
    created_at: str
    training_size: int
    metrics: dict[str, Any]
    current: bool
    valid: bool
    problem: str = ""


class ModelRegistry:
    """The versions under ``home`` (created on demand), and in ``home/blobs/`` the shared
    weights their own encoders name, once each (:mod:`classifier.encoders.blobs`)."""

    #: a blob no version names is collected by :meth:`prune` once it is this old (seconds)
    blob_grace_s: float = 3600.0

    def __init__(self, home: str | os.PathLike[str]) -> None:
        self.home = Path(home)

    # -------------------------------------------------------------- reading
    def _pointer(self, fname: str) -> str | None:
        """The version a pointer file (``CURRENT``, ``SHADOW``) names, or ``None``."""
        try:
            name = (self.home / fname).read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        return name or None

    def current_name(self) -> str | None:
        return self._pointer(CURRENT)

    def current_path(self) -> Path:
        name = self.current_name()
        if name is None:
            raise ModelError(f"{self.home}: no version is promoted yet (no {CURRENT} file)")
        return self.home / name

    def history(self) -> list[str]:
        try:
            return [ln.strip() for ln in (self.home / HISTORY).read_text(encoding="utf-8").splitlines() if ln.strip()]
        except FileNotFoundError:
            return []

    def versions(self) -> list[VersionInfo]:
        if not self.home.is_dir():
            return []
        cur = self.current_name()
        out = []
        for d in sorted(p for p in self.home.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if not (d / MANIFEST).is_file():
                continue
            try:
                m = json.loads((d / MANIFEST).read_text(encoding="utf-8"))
                out.append(VersionInfo(d.name, d, m.get("created_at", ""), int(m.get("training_size", 0)),
                                       m.get("metrics", {}), d.name == cur, True))
            except (ValueError, TypeError, OSError) as exc:
                out.append(VersionInfo(d.name, d, "", 0, {}, d.name == cur, False, str(exc)))
        return out

    def shadow_name(self) -> str | None:
        """The shadow version (``SHADOW``), or ``None``."""
        return self._pointer(SHADOW)

    def shadow(self) -> str | None:
        """Same as :meth:`shadow_name` (:class:`classifier.protocols.Registry`)."""
        return self.shadow_name()

    def set_shadow(self, name: str | None, *, expected: str | None | Unchecked = UNCHECKED,
                   verify: bool = True) -> None:
        """Make ``name`` the shadow version (checked first, by default), or clear it
        (``None``). Replicas score the shadow beside the served version and enforce nothing.
        With ``expected`` (a version name, ``None`` = no shadow), only if ``SHADOW`` still
        says so (else :class:`PromotionConflict`)."""
        if name is not None:
            self._verified(name, verify=verify)
        self.home.mkdir(parents=True, exist_ok=True)
        with self._pointer_lock():
            found = self.shadow_name()
            if expected is not UNCHECKED and found != expected:
                raise PromotionConflict(expected, found, f"{self.home / SHADOW}")
            if name is not None:
                _atomic_write(self.home / SHADOW, name + "\n")
            else:
                try:
                    os.unlink(self.home / SHADOW)
                except FileNotFoundError:
                    pass
        log.info("shadow %s in the local models home %s", f"set to {name}" if name else "cleared", self.home)

    def last_retrain(self) -> dict[str, Any] | None:
        """What :meth:`record_retrain` wrote last (``None``: never, or unreadable)."""
        try:
            data = json.loads((self.home / LAST_RETRAIN).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def record_retrain(self, status: dict[str, Any]) -> None:
        """Record a finished retrain run (``status``: JSON-ready, with ``finished_at`` in
        unix seconds); the sidecar exports its time as a metric."""
        self.home.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.home / LAST_RETRAIN, json.dumps(status, sort_keys=True) + "\n")

    def load_current(self, **kw: Any) -> IntentModel:
        return IntentModel.load(self.current_path(), **kw)

    def current(self) -> tuple[str | None, str | None]:
        """``(name, token)`` of the served version (``(None, None)``: none); the token is
        the name (:class:`classifier.protocols.Registry`)."""
        name = self.current_name()
        return name, name

    def load(self, name: str) -> IntentModel:
        """Version ``name``, verified (:meth:`IntentModel.load`)."""
        return IntentModel.load(self.version_dir(name))

    # -------------------------------------------------------------- writing
    def version_dir(self, name: str) -> Path:
        if not name or "/" in name or name.startswith(".") or name in _POINTER_NAMES:
            raise ModelError(f"invalid version name {name!r}")
        return self.home / name

    def staging_dir(self, name: str) -> Path:
        """Where a new version ``name`` is saved: its own directory here (then
        :meth:`publish` is a no-op)."""
        return self.version_dir(name)

    def promote(self, name: str, *, expected: str | None | Unchecked = UNCHECKED, verify: bool = True) -> str:
        """Make ``name`` the served version (after loading it to check it, by default).

        With ``expected`` (the token :meth:`current` gave: the served name, ``None`` for
        nothing promoted), the switch happens only if ``CURRENT`` still says so, checked
        and written under the pointer lock; otherwise :class:`PromotionConflict` and
        nothing changes. Without it, the switch is unconditional. Returns the new token.
        """
        self._verified(name, verify=verify)
        with self._pointer_lock():
            self._check_expected(expected)
            hist = self.history()
            if not hist or hist[-1] != name:
                _atomic_write(self.home / HISTORY, "\n".join([*hist, name]) + "\n")
            _atomic_write(self.home / CURRENT, name + "\n")
        log.info("promoted %s in the local models home %s", name, self.home)   # not a fleet promotion
        return name

    def rollback(self, *, expected: str | None = None) -> str:
        """Serve the previously promoted version again; returns its name (the new token).

        With ``expected``, only if ``CURRENT`` still names it (else :class:`PromotionConflict`).
        The target is checked as :meth:`promote` checks it; :class:`ModelError` when it is
        missing or does not verify, and nothing changes.
        """
        if not self.home.is_dir():
            raise ModelError(f"{self.home}: {NOTHING_TO_ROLL_BACK}")
        with self._pointer_lock():
            if expected is not None:
                self._check_expected(expected)
            target = rollback_target(self.history(), self.current_name())
            if target is None:
                raise ModelError(f"{self.home}: {NOTHING_TO_ROLL_BACK}")
            prev, hist = target
            try:
                self._verified(prev)
            except ModelError as exc:
                raise ModelError(f"cannot roll back to {prev!r}: {exc}") from None
            _atomic_write(self.home / HISTORY, "\n".join(hist) + "\n")
            _atomic_write(self.home / CURRENT, prev + "\n")
        log.info("rolled back to %s", prev)
        return prev

    def _verified(self, name: str, *, verify: bool = True) -> Path:
        """Version ``name``'s directory, checked before a pointer (``CURRENT``, ``SHADOW``)
        may name it: it must exist and, with ``verify``, load (every checksum of its
        manifest, :meth:`IntentModel.load`); else :class:`ModelError`. The one check
        :meth:`promote`, :meth:`rollback` and :meth:`set_shadow` share."""
        d = self.version_dir(name)
        if not d.is_dir():
            raise ModelError(f"{self.home}: no version {name!r}")
        if verify:
            IntentModel.load(d)  # raises ModelError for a corrupt or mismatched version
        return d

    def _check_expected(self, expected: str | None | Unchecked) -> None:
        """Raise :class:`PromotionConflict` unless ``CURRENT`` names ``expected`` (call it
        under the pointer lock)."""
        if expected is UNCHECKED:
            return
        found = self.current_name()
        if found != expected:
            raise PromotionConflict(expected, found, str(self.home))

    @contextmanager
    def _pointer_lock(self) -> Iterator[None]:
        """Hold ``POINTER_LOCK`` (waiting at most ``POINTER_LOCK_TIMEOUT_S``) while
        ``CURRENT``/``HISTORY`` are read, compared and rewritten. The home must exist."""
        from filelock import FileLock, Timeout

        path = self.home / POINTER_LOCK
        lock = FileLock(str(path))
        try:
            lock.acquire(timeout=POINTER_LOCK_TIMEOUT_S)
        except Timeout:
            raise RegistryLockError(f"{path} stayed held for {POINTER_LOCK_TIMEOUT_S:g}s") from None
        except OSError as exc:
            raise RegistryLockError(f"cannot take the lock {path}: {exc}") from None
        try:
            yield
        finally:
            lock.release()

    @contextmanager
    def lock(self, *, create: bool = True) -> Iterator[bool]:
        """The retrain lock (``home/.retrain.lock``), taken without waiting: yields
        ``True`` while held, ``False`` when another run holds it. ``create=False`` (a
        run that writes nothing) on a home that does not exist takes none and creates
        nothing (yields ``True``). Raises :class:`RegistryLockError` when the lock file
        cannot be opened."""
        from filelock import FileLock, Timeout

        if not create and not self.home.is_dir():
            yield True
            return
        path = self.home / RETRAIN_LOCK
        try:
            self.home.mkdir(parents=True, exist_ok=True)
            lock = FileLock(str(path))
            lock.acquire(timeout=0)
        except Timeout:
            yield False
            return
        except OSError as exc:
            raise RegistryLockError(f"cannot take the retrain lock {path}: {exc}") from None
        try:
            yield True
        finally:
            lock.release()

    # -------------------------------------------------- versions from elsewhere
    def publish(self, directory: str | os.PathLike[str]) -> str:
        """Make the saved version ``directory`` available here, under its directory name.

        A version directory of this home is already published (a no-op). One elsewhere is
        checked (:meth:`IntentModel.load`) and copied in, create-only: an existing version
        of that name is never replaced (:class:`ModelError`). Serves nothing.
        """
        src = Path(directory)
        if not (src / MANIFEST).is_file():
            raise ModelError(f"{src}: not a model version (no {MANIFEST})")
        name = src.name
        target = self.version_dir(name)
        if src.resolve() == target.resolve():
            return name
        IntentModel.load(src)
        self.home.mkdir(parents=True, exist_ok=True)
        self._adopt_blobs(src)
        tmp = self.home / f".{name}.publish-{uuid.uuid4().hex[:8]}"
        try:
            shutil.copytree(src, tmp)
            self._rename_new(tmp, target)
        finally:
            if tmp.exists():
                self._delete(tmp)
        log.info("published %s into the local models home %s (from %s)", name, self.home, src)
        return name

    def install(self, name: str, tmp_dir: str | os.PathLike[str]) -> Path:
        """Move a downloaded version directory ``tmp_dir`` (best under the home, so the
        move is one rename) into the home as ``name``; returns its path.

        The download is checked whole first (:meth:`IntentModel.load`: every checksum of
        its manifest); a version that does not verify is deleted and refused with
        :class:`ModelError`, and nothing in the home changes. When ``name`` exists with
        the same manifest and verifies, it is kept and the download deleted (installing
        twice is harmless); with the same manifest but corrupt, the download replaces it;
        with another manifest, the download is deleted and refused.
        """
        src = Path(tmp_dir)
        try:
            target = self.version_dir(name)
            IntentModel.load(src)
            if target.exists() and self._keep_installed(src, target):
                return target
            self.home.mkdir(parents=True, exist_ok=True)
            if src.resolve().parent != self.home.resolve():   # another file system, maybe: copy in first
                local = self.home / f".{name}.install-{uuid.uuid4().hex[:8]}"
                self._adopt_blobs(src)
                shutil.copytree(src, local)
                self._delete(src)
                src = local
            self._rename_new(src, target)
        except BaseException:
            if src.exists():
                self._delete(src)
            raise
        log.info("installed %s in the local models home %s", name, self.home)
        return target

    def _keep_installed(self, src: Path, target: Path) -> bool:
        """For :meth:`install`: ``True`` when ``target`` is already this version (the
        download is deleted); moves a corrupt copy of it aside (``False``); raises when
        ``target`` is another version."""
        same = _read_bytes(target / MANIFEST) == _read_bytes(src / MANIFEST)
        if not same:
            raise ModelError(f"{target}: another version named {target.name!r} is already installed; "
                             f"refusing to replace it")
        try:
            IntentModel.load(target)
        except ModelError as exc:
            log.warning("replacing the corrupt copy of %s: %s", target.name, exc)
            aside = self.home / f"{PRUNING_PREFIX}{target.name}-{uuid.uuid4().hex[:8]}"
            os.rename(target, aside)
            self._delete(aside)
            return False
        self._delete(src)
        return True

    def _adopt_blobs(self, src: Path) -> None:
        """Store the shared blobs the version ``src`` (verified) names in this home, those not here yet."""
        from flywheel.classifier.encoders.blobs import find_blob, store_blob, version_blobs

        for ref in version_blobs(src):
            blob = find_blob(src / ENCODER_DIR, ref.sha256)
            if blob is None or blob.resolve() == (self.home / BLOBS_DIR / ref.sha256).resolve():
                continue   # here already (IntentModel.load found every blob it names)
            try:
                store_blob(blob, self.home / BLOBS_DIR, ref.sha256)
            except (OSError, ValueError) as exc:
                raise ModelError(f"{self.home}: cannot store encoder blob {ref.sha256} of {src.name}: {exc}") from None

    def _rename_new(self, src: Path, target: Path) -> None:
        """Rename ``src`` to ``target``, which must not exist (create-only)."""
        if target.exists() or target.is_symlink():
            raise ModelError(f"{self.home}: version {target.name!r} already exists; refusing to replace it")
        try:
            os.rename(src, target)
        except OSError as exc:   # created meanwhile (ENOTEMPTY/EEXIST), or unwritable
            raise ModelError(f"{self.home}: cannot add version {target.name!r}: {exc}") from None

    def prune(self, *, keep_promoted: int = 5, keep_recent: int = 3, dry_run: bool = False) -> list[str]:
        """Delete the version directories that nothing needs any more.

        A version is kept when it is any of:

        * the served version (``CURRENT``) and the shadow (``SHADOW``), always;
        * one of the last ``keep_promoted`` entries of ``HISTORY``, so :meth:`rollback`
          keeps working that far back;
        * one of the ``keep_recent`` newest versions (in the order of :meth:`versions`,
          by name, which is creation order for the ``vYYYYMMDD-HHMMSS-ffffff`` names
          retrain gives), promoted or not.

        Every other version directory is removed, kept challengers and old promotions
        alike, and then the shared blobs (``blobs/``) that no version left names and that
        are older than :attr:`blob_grace_s`. Only version directories (those :meth:`versions` lists: not hidden, with a
        manifest) are touched; ``CURRENT``, ``HISTORY``, lock files and stray files or
        folders stay as they are. The ``HISTORY`` lines of removed versions are dropped
        first (atomically), so a rollback never points at a deleted version; then each
        directory is renamed to a hidden ``..pruning-*`` name and deleted, so an
        interrupted prune never leaves a half-deleted directory that looks like a
        version (leftovers are deleted by the next prune).

        The registry holds only the pointer lock while it rewrites ``HISTORY``: a caller
        that may run beside ``flywheel retrain`` should hold the retrain lock
        (:meth:`lock`; ``flywheel models prune`` does).

        Parameters
        ----------
        keep_promoted : int, default 5
            How many of the latest ``HISTORY`` entries to keep (``0``: none but ``CURRENT``).
        keep_recent : int, default 3
            How many of the newest versions to keep whatever their status (``0``: none).
        dry_run : bool, default False
            Only compute the names; delete and rewrite nothing.

        Returns
        -------
        list of str
            The names of the versions removed (with ``dry_run``, those that would be),
            oldest first.

        Raises
        ------
        InvalidInputError
            If ``keep_promoted`` or ``keep_recent`` is negative or not an integer.
        ModelError
            If a version directory cannot be moved out of the way.
        """
        doomed = prune_plan([v.name for v in self.versions()], self.history(), served=self.current_name(),
                            shadow=self.shadow_name(), keep_promoted=keep_promoted, keep_recent=keep_recent)
        if dry_run or not doomed:
            if not dry_run:
                self._remove_leftovers()
            return doomed
        # HISTORY first: if we stop half way, the survivors are plain unpromoted versions
        gone = set(doomed)
        with self._pointer_lock():
            hist = self.history()
            if any(n in gone for n in hist):
                kept_hist = history_without(hist, gone)
                _atomic_write(self.home / HISTORY, "".join(n + "\n" for n in kept_hist))
        removed = []
        for name in doomed:
            if name == self.current_name():  # promoted by hand meanwhile: leave it
                log.warning("not pruning %s: it was promoted while pruning", name)
                continue
            src = self.home / name
            tmp = self.home / f"{PRUNING_PREFIX}{name}-{uuid.uuid4().hex[:8]}"
            try:
                os.rename(src, tmp)
            except FileNotFoundError:  # deleted meanwhile by someone else
                continue
            except OSError as exc:
                raise ModelError(f"cannot remove version {src}: {exc}") from exc
            removed.append(name)
            self._delete(tmp)
            log.info("pruned %s", name)
        self._remove_leftovers()
        return removed

    @staticmethod
    def _delete(path: Path) -> None:
        try:
            if path.is_symlink() or not path.is_dir():  # a link: drop it, never what it points to
                path.unlink()
            else:
                shutil.rmtree(path)
        except OSError as exc:  # hidden already; the next prune tries again
            log.warning("could not delete %s (will retry on the next prune): %s", path, exc)

    def _remove_leftovers(self) -> None:
        """Finish the deletions an interrupted prune left behind (``..pruning-*``), then
        delete the blobs no version names (:func:`~classifier.encoders.blobs.collect_garbage`)."""
        from flywheel.classifier.encoders.blobs import collect_garbage

        if not self.home.is_dir():
            return
        for p in self.home.iterdir():
            if p.name.startswith(PRUNING_PREFIX):
                self._delete(p)
        collect_garbage(self.home, grace_s=self.blob_grace_s)


class ModelWatcher:
    """Checks a registry's ``CURRENT`` pointer at most every ``interval_s`` seconds and
    loads a newly promoted version; ``on_change(model)`` swaps it in. A version that
    fails to load is refused (logged, remembered, the old one keeps serving).

    ``pointer=SHADOW`` follows the shadow pointer instead; then a cleared pointer calls
    ``on_change(None)`` (and the watcher starts from nothing, so an existing shadow is
    loaded at the first poll).

    ``poll()`` is cheap (one ``stat``-free read of a tiny file, rate-limited) and is
    called from the request path; ``start()`` runs it in a daemon thread instead.
    """

    def __init__(self, registry: ModelRegistry, on_change: Callable[[IntentModel | None], None],
                 interval_s: float = WATCH_INTERVAL_S, current: str | None = None, *,
                 pointer: str = CURRENT) -> None:
        if pointer not in (CURRENT, SHADOW):
            raise ValueError(f"pointer must be {CURRENT!r} or {SHADOW!r}, got {pointer!r}")
        self.registry = registry
        self.on_change = on_change
        self.interval_s = interval_s
        self.pointer = pointer
        self._read = registry.current_name if pointer == CURRENT else registry.shadow_name
        self.serving = current if current is not None or pointer == SHADOW else registry.current_name()
        self.refused: dict[str, str] = {}
        # called with (version, None) after a swap and (version, error message) after a refusal
        self.listeners: list[Callable[[str, str | None], None]] = []
        self._next = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self, force: bool = False) -> bool:
        """Swap if ``CURRENT`` changed; returns True when a new version was swapped in."""
        now = time.monotonic()
        if not force and now < self._next:
            return False
        if not self._lock.acquire(blocking=False):
            return False
        try:
            self._next = now + self.interval_s
            name = self._read()
            if name == self.serving or name in self.refused:
                return False
            if name is None:
                if self.pointer == CURRENT:
                    return False
                self.on_change(None)      # the shadow was cleared
                self.serving = None
                return True
            try:
                model = self.registry.load(name)
                self.on_change(model)
            except ModelError as exc:
                self.refused[name] = str(exc)
                log.error("refusing model version %s, still serving %s: %s", name, self.serving, exc)
                self._notify(name, str(exc))
                return False
            self.serving = name
            self._notify(name, None)
            return True
        finally:
            self._lock.release()

    def _notify(self, name: str, error: str | None) -> None:
        for fn in list(self.listeners):
            try:
                fn(name, error)
            except Exception:  # noqa: BLE001 - a listener must not stop reloads
                log.exception("model watcher listener failed")

    @property
    def running(self) -> bool:
        """Whether the watcher thread is checking (then nobody needs to call :meth:`poll`)."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> "ModelWatcher":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="flywheel-model-watcher", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll(force=True)
            except Exception:  # noqa: BLE001 - the watcher must outlive any single failure
                log.exception("model watcher poll failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
