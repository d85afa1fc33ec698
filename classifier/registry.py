"""Model versions on disk and hot reload.

A models home holds one directory per version plus a ``CURRENT`` file naming the
served version and ``HISTORY`` (one promoted version per line, oldest first) for
rollback. ``CURRENT`` is replaced atomically (write a temp file, fsync, rename), so
a reader sees the old or the new name, never a partial one.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from classifier.errors import ModelError
from classifier.model import MANIFEST, IntentModel

log = logging.getLogger("flywheel.registry")

CURRENT = "CURRENT"
HISTORY = "HISTORY"


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
                return False
            self.serving = name
            return True
        finally:
            self._lock.release()

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
