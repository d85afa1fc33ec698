"""Model versions on disk and hot reload.

A models home holds one directory per version plus a ``CURRENT`` file naming the
served version and ``HISTORY`` (one promoted version per line, oldest first) for
rollback. ``CURRENT`` is replaced atomically (write a temp file, fsync, rename), so
a reader sees the old or the new name, never a partial one. :meth:`ModelRegistry.prune`
deletes the versions nobody needs any more (old kept challengers, old promotions).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from classifier.errors import InvalidInputError, ModelError
from classifier.model import MANIFEST, IntentModel

log = logging.getLogger("flywheel.registry")

CURRENT = "CURRENT"
HISTORY = "HISTORY"
# a version being deleted is first renamed to ``..pruning-<name>-<random>``: hidden, so
# ``versions()`` no longer sees it, and recognisable, so a later prune can finish the job
# (two dots: a save in progress is ``.<name>.<random>`` and a name never starts with a dot)
PRUNING_PREFIX = "..pruning-"


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
    """The versions under ``home`` (created on demand)."""

    def __init__(self, home: str | os.PathLike[str]) -> None:
        self.home = Path(home)

    # -------------------------------------------------------------- reading
    def current_name(self) -> str | None:
        try:
            name = (self.home / CURRENT).read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        return name or None

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

    def load_current(self, **kw: Any) -> IntentModel:
        return IntentModel.load(self.current_path(), **kw)

    # -------------------------------------------------------------- writing
    def version_dir(self, name: str) -> Path:
        if not name or "/" in name or name.startswith(".") or name in (CURRENT, HISTORY):
            raise ModelError(f"invalid version name {name!r}")
        return self.home / name

    def promote(self, name: str, *, verify: bool = True) -> Path:
        """Make ``name`` the served version (after loading it to check it, by default)."""
        d = self.version_dir(name)
        if not d.is_dir():
            raise ModelError(f"{self.home}: no version {name!r}")
        if verify:
            IntentModel.load(d)  # raises ModelError for a corrupt or mismatched version
        self.home.mkdir(parents=True, exist_ok=True)
        hist = self.history()
        if not hist or hist[-1] != name:
            _atomic_write(self.home / HISTORY, "\n".join([*hist, name]) + "\n")
        _atomic_write(self.home / CURRENT, name + "\n")
        log.info("promoted %s", name)
        return d

    def rollback(self) -> str:
        """Serve the previously promoted version again; returns its name."""
        hist = self.history()
        cur = self.current_name()
        while hist and hist[-1] == cur:
            hist.pop()
        if not hist:
            raise ModelError(f"{self.home}: nothing to roll back to")
        prev = hist[-1]
        IntentModel.load(self.home / prev)
        _atomic_write(self.home / HISTORY, "\n".join(hist) + "\n")
        _atomic_write(self.home / CURRENT, prev + "\n")
        log.info("rolled back to %s", prev)
        return prev

    def prune(self, *, keep_promoted: int = 5, keep_recent: int = 3, dry_run: bool = False) -> list[str]:
        """Delete the version directories that nothing needs any more.

        A version is kept when it is any of:

        * the served version (``CURRENT``), always;
        * one of the last ``keep_promoted`` entries of ``HISTORY``, so :meth:`rollback`
          keeps working that far back;
        * one of the ``keep_recent`` newest versions (in the order of :meth:`versions`,
          by name, which is creation order for the ``vYYYYMMDD-HHMMSS-ffffff`` names
          retrain gives), promoted or not.

        Every other version directory is removed, kept challengers and old promotions
        alike. Only version directories (those :meth:`versions` lists: not hidden, with a
        manifest) are touched; ``CURRENT``, ``HISTORY``, lock files and stray files or
        folders stay as they are. The ``HISTORY`` lines of removed versions are dropped
        first (atomically), so a rollback never points at a deleted version; then each
        directory is renamed to a hidden ``..pruning-*`` name and deleted, so an
        interrupted prune never leaves a half-deleted directory that looks like a
        version (leftovers are deleted by the next prune).

        The registry takes no lock: a caller that may run beside ``flywheel retrain``
        should hold the retrain lock (``flywheel models prune`` does).

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
        for arg, value in (("keep_promoted", keep_promoted), ("keep_recent", keep_recent)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidInputError(f"{arg} must be an integer >= 0, got {value!r}")
            if value < 0:
                raise InvalidInputError(f"{arg} must be >= 0, got {value}")
        names = [v.name for v in self.versions()]
        protected = set(names[-keep_recent:]) if keep_recent else set()
        if keep_promoted:
            protected.update(self.history()[-keep_promoted:])
        current = self.current_name()
        if current is not None:
            protected.add(current)
        doomed = [n for n in names if n not in protected]
        if dry_run or not doomed:
            if not dry_run:
                self._remove_leftovers()
            return doomed
        # HISTORY first: if we stop half way, the survivors are plain unpromoted versions
        gone = set(doomed)
        hist = self.history()
        kept_hist = [n for n in hist if n not in gone]
        if kept_hist != hist:
            kept_hist = [n for i, n in enumerate(kept_hist) if i == 0 or kept_hist[i - 1] != n]
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
        """Finish the deletions an interrupted prune left behind (``..pruning-*``)."""
        if not self.home.is_dir():
            return
        for p in self.home.iterdir():
            if p.name.startswith(PRUNING_PREFIX):
                self._delete(p)


class ModelWatcher:
    """Checks a registry's ``CURRENT`` pointer at most every ``interval_s`` seconds and
    loads a newly promoted version; ``on_change(model)`` swaps it in. A version that
    fails to load is refused (logged, remembered, the old one keeps serving).

    ``poll()`` is cheap (one ``stat``-free read of a tiny file, rate-limited) and is
    called from the request path; ``start()`` runs it in a daemon thread instead.
    """

    def __init__(self, registry: ModelRegistry, on_change: Callable[[IntentModel], None],
                 interval_s: float = 2.0, current: str | None = None) -> None:
        self.registry = registry
        self.on_change = on_change
        self.interval_s = interval_s
        self.serving = current if current is not None else registry.current_name()
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
            name = self.registry.current_name()
            if name is None or name == self.serving or name in self.refused:
                return False
            try:
                model = IntentModel.load(self.registry.home / name)
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
