"""A replica's thread that follows the fleet's ``models/CURRENT`` (see :mod:`fleet.registry`),
and with it ``models/SHADOW`` and ``models/LAST_RETRAIN``.

`RegistrySync` is what a replica runs: it polls ``models/CURRENT`` (a conditional
GET, every few seconds), downloads and verifies a newly promoted version, installs it in
the local home and promotes it there; the classifier's :class:`~classifier.versions.registry.ModelWatcher`
on that home then warms it and swaps it in. A version that does not verify is refused,
logged and counted once, and the old one keeps serving.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Literal

from flywheel.classifier.errors import FlywheelError, ModelError
from flywheel.classifier.versions.registry import ModelRegistry, PromotionConflict
from flywheel.fleet.objects import NOT_MODIFIED, ObjectStore
from flywheel.fleet.registry import CURRENT_KEY, LAST_RETRAIN_KEY, SHADOW_KEY, BucketRegistry, Pointer, parse_status

__all__ = ["FIRST_SYNC_TIMEOUT_S", "SYNC_OUTCOMES", "RegistrySync"]

log = logging.getLogger("flywheel.fleet.registry")

SYNC_OUTCOMES = ("not_modified", "unchanged", "new", "refused", "error")

#: How long a starting replica waits for the fleet's current model (:meth:`RegistrySync.sync_once`)
#: before it serves what it has (the store may be down: serving never waits for it longer than this).
FIRST_SYNC_TIMEOUT_S = 30.0


class RegistrySync:
    """Makes a replica's local models home follow the fleet's ``models/CURRENT``.

    :meth:`poll` does one conditional GET of the pointer (``If-None-Match`` with the last
    etag) and, when the fleet serves a version the local ``CURRENT`` does not name,
    downloads and verifies it (:meth:`BucketRegistry.download`) and promotes it locally;
    the classifier's :class:`~classifier.versions.registry.ModelWatcher` on the home then hot-reloads
    it. It returns one of :data:`SYNC_OUTCOMES`, also counted in ``polls``:

    - ``not_modified``: the pointer did not change (nothing to do);
    - ``unchanged``: it was read, and the local home already serves it (or it names nothing,
      or a version refused before);
    - ``new``: a version was installed and promoted locally;
    - ``refused``: the version does not verify; remembered in ``refused`` (name -> reason),
      logged, counted once and not tried again; the old one keeps serving;
    - ``error``: the store is unreachable or failed (``last_error``), or the pointer is
      corrupt; nothing changed, the next poll tries again.

    Each poll also reads ``models/SHADOW`` and ``models/LAST_RETRAIN`` (conditional GETs): a
    new shadow version is downloaded, verified and set as the local home's ``SHADOW`` (the
    runtime's shadow watcher loads it), a cleared one is cleared, one that does not verify
    is refused as above (outcome ``refused``); the last retrain's record is copied into the
    home (``flywheel_last_retrain_timestamp_seconds``).

    The fleet's pointer wins: a version promoted by hand in the local home is replaced by
    the fleet's at the next poll. ``serving`` is the version this sync last found or made
    current locally (``fleet_version``: what ``CURRENT`` named at the last read). :meth:`start`
    polls every ``interval_s`` on a daemon thread, :meth:`stop` ends it; :meth:`sync_once`
    is the bounded first poll of a starting replica. Nothing here raises from a poll.
    """

    def __init__(self, objects: ObjectStore, local: ModelRegistry, *, interval_s: float = 5.0,
                 on_new: Callable[[], object] | None = None) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.objects = objects
        self.local = local
        self.bucket = BucketRegistry(objects, local)
        self.interval_s = float(interval_s)
        self.polls: dict[str, int] = dict.fromkeys(SYNC_OUTCOMES, 0)
        self.refused: dict[str, str] = {}
        self.last_error: str | None = None
        self.serving: str | None = None
        self.fleet_version: str | None = None     # what models/CURRENT named at the last read
        self.fleet_shadow: str | None = None      # what models/SHADOW named at the last read
        # called (no arguments) after a version was promoted locally: the runtime passes one that
        # polls the classifier's watcher, so the swap follows at once instead of at its next check
        self.on_new = on_new
        self._etag: str | None = None
        self._side_etags: dict[str, str | None] = {SHADOW_KEY: None, LAST_RETRAIN_KEY: None}
        self._failing = False
        self._poll_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"RegistrySync({self.objects.cfg.location(CURRENT_KEY)} -> {self.local.home})"

    # ------------------------------------------------------------------ polling
    def poll(self) -> str:
        """One check of the fleet's pointer (see the class docstring); never raises."""
        with self._poll_lock:
            side = None
            try:
                outcome = self._poll()
                side = self._poll_side()
                if side is not None and outcome in ("not_modified", "unchanged"):
                    outcome, side = side, None
            except Exception as exc:  # noqa: BLE001 - a replica keeps serving whatever happens here
                outcome = self._error(exc)
            self.polls[outcome] = self.polls.get(outcome, 0) + 1
            if side is not None:       # a refused shadow in the same poll as a new CURRENT counts too
                self.polls[side] = self.polls.get(side, 0) + 1
            if outcome != "error" and self._failing:
                self._failing = False
                log.info("model sync: the store answers again")
            return outcome

    def _poll(self) -> str:
        got = self.objects.get(CURRENT_KEY, if_none_match=self._etag)
        if got is NOT_MODIFIED:
            quiet = "not_modified"
        else:
            if got is None:
                pointer = Pointer()
            else:
                pointer = Pointer.parse(got[0], got[1], self.objects.cfg.location(CURRENT_KEY))
            self.fleet_version, self._etag = pointer.version, pointer.etag
            quiet = "unchanged"
        name = self.fleet_version
        if name is None or name in self.refused:
            return quiet
        local = self.local.current_name()
        if local == name:
            self.serving = name
            return quiet
        return self._follow(name, local)

    def _read_side(self, key: str) -> tuple[bytes, str] | None | Literal[False]:
        """``models/SHADOW`` or ``models/LAST_RETRAIN`` if it changed since the last read
        (``None``: gone), ``False`` when it did not."""
        got = self.objects.get(key, if_none_match=self._side_etags[key])
        if got is NOT_MODIFIED:
            return False
        self._side_etags[key] = None if got is None else got[1]
        return got

    def _poll_side(self) -> str | None:
        """Follow the fleet's shadow and copy its last retrain record; ``refused`` when the
        shadow does not verify, else ``None``."""
        got = self._read_side(SHADOW_KEY)
        if got is not False:
            p = Pointer() if got is None else Pointer.parse(got[0], got[1], self.objects.cfg.location(SHADOW_KEY))
            self.fleet_shadow = p.version
        outcome = self._follow_shadow(self.fleet_shadow)
        got = self._read_side(LAST_RETRAIN_KEY)
        if got:
            status = parse_status(got[0])
            if status is not None:
                self.local.record_retrain(status)
        return outcome

    def _follow_shadow(self, name: str | None) -> str | None:
        local = self.local.shadow_name()
        if name == local or (name is not None and name in self.refused):
            return None
        if name is None:
            self.local.set_shadow(None)
            log.info("replica: cleared the local shadow %s, following the fleet's SHADOW", local)
            return None
        try:
            self.bucket.download(name)
            self.local.set_shadow(name, verify=False)   # download() has just verified it
        except ModelError as exc:
            self.refused[name] = str(exc)
            self.last_error = str(exc)
            log.error("refusing shadow version %s from the fleet: %s", name, exc)
            return "refused"
        log.info("replica: installed shadow version %s locally (was %s), following the fleet's SHADOW", name, local)
        return None

    def _follow(self, name: str, local: str | None) -> str:
        t0 = time.monotonic()
        try:
            self.bucket.download(name)
            self.local.promote(name, expected=local, verify=False)   # install() has just verified it
        except PromotionConflict as exc:   # another process on this host moved the local pointer
            log.info("model sync: local pointer moved while installing %s (%s); checking again next poll",
                     name, exc)
            return "unchanged"
        except ModelError as exc:
            self.refused[name] = str(exc)
            self.last_error = str(exc)
            log.error("refusing model version %s from the fleet, still serving %s: %s", name, local, exc)
            return "refused"
        self.serving = name
        log.info("replica: installed %s locally (was %s), following the fleet's CURRENT, in %.2fs", name, local,
                 time.monotonic() - t0)
        if self.on_new is not None:
            try:
                self.on_new()
            except Exception:  # noqa: BLE001 - the watcher retries on its own schedule
                log.exception("model sync: reloading %s at once failed; the watcher will retry", name)
        return "new"

    def _error(self, exc: Exception) -> str:
        text = self.objects.cfg.redact(str(exc)) if str(exc) else type(exc).__name__
        self.last_error = text
        if self._failing:   # logged once per episode; the metric counts every one
            log.debug("model sync: %s", text)
        elif isinstance(exc, FlywheelError):
            log.warning("model sync: %s (still serving %s; retrying every %gs)", text,
                        self.local.current_name(), self.interval_s)
        else:
            log.exception("model sync: unexpected failure (retrying every %gs)", self.interval_s)
        self._failing = True
        return "error"

    def sync_once(self, timeout_s: float = FIRST_SYNC_TIMEOUT_S) -> str:
        """One poll for a replica that is starting, waiting at most ``timeout_s``: an empty
        home gets the fleet's current version. Returns the outcome; ``error`` (logged, never
        raised) when the store is down or too slow: serving goes on with what is local (a
        poll still running finishes in the background)."""
        box: list[str] = []
        worker = threading.Thread(target=lambda: box.append(self.poll()), name="flywheel-registry-sync-once",
                                  daemon=True)
        worker.start()
        worker.join(timeout_s)
        if box:
            return box[0]
        self.last_error = f"the first model sync took longer than {timeout_s:g}s; it goes on in the background"
        log.warning("model sync: %s (serving %s)", self.last_error, self.local.current_name())
        return "error"

    # ------------------------------------------------------------------ thread
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> RegistrySync:
        """Poll every ``interval_s`` on a daemon thread (the first poll at once)."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="flywheel-registry-sync", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.interval_s)

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop the thread and wait for it, at most ``timeout_s`` (default: one store
        request's timeout plus a second); a download still running is left to finish on
        its daemon thread."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(self.objects.timeout_s + 1.0 if timeout_s is None else timeout_s)
            if thread.is_alive():
                log.warning("model sync thread still busy after stop(); leaving it to finish")

    def close(self) -> None:
        """Same as :meth:`stop` (for owners that close what they hold)."""
        self.stop()
