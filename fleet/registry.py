"""The fleet's model registry in the object store.

Layout, under the store's prefix::

    models/<version>/head.npz, head.joblib, intents.yaml   the files the manifest hashes
    models/<version>/encoder/...                         a version's own encoder, hashed too (optional)
    models/blobs/<sha256>                                the large weights such encoders name, once each
                                                         (fleet/blobs.py; uploaded when the bucket lacks them)
    models/<version>/report.json, report.md              the retrain's report (optional, not hashed)
    models/<version>/manifest.json                       uploaded LAST: a version is complete once it exists
    models/CURRENT                                       {"version", "history", "updated_at", "by", "generation"}
    models/SHADOW                                        {"version", "updated_at", "by"}: scored beside CURRENT
    models/LAST_RETRAIN                                  the last retrain run: {"finished_at", "outcome", ...}

:class:`BucketRegistry` implements :class:`classifier.protocols.Registry` on that layout.
Its token is the etag of ``models/CURRENT``, which changes only by compare-and-swap
(``If-Match``; ``If-None-Match: *`` for the first promotion), so two promoters never
overwrite each other: the loser gets :class:`~classifier.versions.registry.PromotionConflict`.
Versions are written create-only and never replaced. Versions live also in a local
:class:`~classifier.versions.registry.ModelRegistry` (the host's models home): new ones are saved
there before :meth:`BucketRegistry.publish`, and :meth:`BucketRegistry.download` installs
bucket versions there after checking every file's SHA-256 against the manifest.

A replica follows it with :class:`fleet.sync.RegistrySync`.

Serving never unpickles anything from the bucket: a version is only promoted (and only
installed) when its manifest records the numpy-only serving head ``head.npz``, which is
what :meth:`IntentModel.load` serves; ``head.joblib`` is downloaded and checked, never loaded.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from flywheel.classifier.encoders.blobs import BLOB_GRACE_S, BLOBS_DIR, version_blobs
from flywheel.classifier.errors import FlywheelError, IntentFileError, ModelError
from flywheel.classifier.settings.intents import IntentSet, parse_intents
from flywheel.classifier.versions.model import (
    ENCODER_DIR,
    HEAD_FILE,
    INTENTS_FILE,
    MANIFEST,
    SERVING_HEAD_FILE,
    IntentModel,
    Manifest,
)
from flywheel.classifier.versions.registry import (
    LAST_RETRAIN,
    NOTHING_TO_ROLL_BACK,
    SHADOW,
    UNCHECKED,
    ModelRegistry,
    PromotionConflict,
    Unchecked,
)
from flywheel.classifier.versions.registry_policy import check_keep_counts, history_without, prune_plan, rollback_target
from flywheel.fleet import blobs
from flywheel.fleet.errors import PreconditionFailed
from flywheel.fleet.objects import NOT_MODIFIED, ObjectStore

__all__ = ["CURRENT_KEY", "HISTORY_LIMIT", "LAST_RETRAIN_KEY", "MODELS", "REPORT_FILES", "SHADOW_KEY",
           "BucketRegistry", "BucketVersion", "Pointer", "parse_status"]

log = logging.getLogger("flywheel.fleet.registry")

MODELS = "models"
CURRENT_KEY = f"{MODELS}/CURRENT"
SHADOW_KEY = f"{MODELS}/{SHADOW}"
LAST_RETRAIN_KEY = f"{MODELS}/{LAST_RETRAIN}"
HISTORY_LIMIT = 50                                  # promoted names kept in CURRENT, for rollback
REPORT_FILES = ("report.json", "report.md")          # uploaded with a version when present; not hashed
REQUIRED_FILES = (HEAD_FILE, SERVING_HEAD_FILE, INTENTS_FILE)   # a fleet version's manifest hashes each
DOWNLOAD_MARK = ".download-"                         # temp dirs: ``.<name>.download-<random>`` in the home
STALE_DOWNLOAD_S = 3600.0                            # leftovers of a crashed download older than this go
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
_ENCODER_MANIFEST = f"{ENCODER_DIR}/{MANIFEST}"


def _utcnow() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        user = f"uid{os.getuid()}" if hasattr(os, "getuid") else "unknown"
    return f"{user}@{socket.gethostname()}"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Pointer:
    """The content of ``models/CURRENT`` and its etag (``etag`` ``None``: no pointer yet)."""

    version: str | None = None
    history: tuple[str, ...] = ()
    updated_at: str = ""
    by: str = ""
    etag: str | None = None
    generation: int = 0          # how many times CURRENT was written (each write adds one)

    @classmethod
    def parse(cls, data: bytes, etag: str | None, where: str) -> Pointer:
        """Read the JSON document; :class:`ModelError` naming ``where`` when it is not one."""
        try:
            doc = json.loads(data.decode("utf-8"))
            if not isinstance(doc, dict):
                raise ValueError(f"expected a JSON object, found {type(doc).__name__}")
            version, history = doc.get("version"), doc.get("history", [])
            if version is not None and not isinstance(version, str):
                raise ValueError("'version' should be a string")
            if not isinstance(history, list) or not all(isinstance(h, str) for h in history):
                raise ValueError("'history' should be a list of strings")
        except (ValueError, UnicodeDecodeError) as exc:
            raise ModelError(f"{where}: corrupt model pointer: {exc}") from None
        generation = doc.get("generation", 0)
        return cls(version or None, tuple(history), str(doc.get("updated_at", "")), str(doc.get("by", "")), etag,
                   generation if isinstance(generation, int) and not isinstance(generation, bool) else 0)

    def moved_to(self, version: str | None, history: list[str], by: str) -> bytes:
        """The document that serves ``version`` (``None``: nothing, as a prune of a pointer that
        serves nothing keeps) with ``history`` (cut to :data:`HISTORY_LIMIT`),
        one generation on: every write has new bytes, so a new etag even where the store's
        etag is the content's MD5 (the same version promoted twice in a second)."""
        doc = {"version": version, "history": history[-HISTORY_LIMIT:], "updated_at": _utcnow(), "by": by,
               "generation": self.generation + 1}
        return (json.dumps(doc, indent=2) + "\n").encode("utf-8")


@dataclass(frozen=True)
class BucketVersion:
    """One complete version in the bucket (what ``flywheel models list`` shows); same field
    names as :class:`classifier.versions.registry.VersionInfo`, with ``location`` for ``path``."""

    name: str
    location: str
    created_at: str
    training_size: int
    metrics: dict[str, Any]
    current: bool
    valid: bool
    problem: str = ""
    files: tuple[str, ...] = field(default=())
    bytes: int = 0          # its own files in the bucket
    blob_bytes: int = 0     # the shared blobs its encoder names (models/blobs/, stored once)


class BucketRegistry:
    """The fleet's versions and ``CURRENT`` pointer in ``objects``, cached in ``local``
    (:class:`classifier.protocols.Registry`; the token is the etag of ``models/CURRENT``).

    ``by`` is written into ``CURRENT`` with each promotion (default ``user@host``).

    :meth:`lock` is the retrain lock of the *local* home only. That is enough: the
    Kubernetes retrain CronJob runs with ``concurrencyPolicy: Forbid``, and correctness does
    not rest on the lock anyway: versions are create-only and every promotion is a
    compare-and-swap on ``CURRENT``, so two retrains that race (on two hosts) cannot
    overwrite each other; the loser re-gates against the winner (``training.retrain``).
    """

    #: a blob no version names is deleted by :meth:`prune` once it is this old (seconds)
    blob_grace_s: float = BLOB_GRACE_S

    def __init__(self, objects: ObjectStore, local: ModelRegistry, *, by: str | None = None) -> None:
        self.objects = objects
        self.local = local
        self.by = by or _who()
        #: what the last :meth:`publish` uploaded / :meth:`download` fetched of the shared blobs
        self.last_blobs = blobs.BlobTransfer()

    def __repr__(self) -> str:
        return f"BucketRegistry({self.objects.cfg.location(MODELS)}, local={self.local.home})"

    # ------------------------------------------------------------------ reading
    def pointer(self) -> Pointer:
        """``models/CURRENT`` now (read unconditionally); an empty :class:`Pointer` when absent."""
        got = self.objects.get(CURRENT_KEY)
        if got is None or got is NOT_MODIFIED:
            return Pointer()
        data, etag = got
        return Pointer.parse(data, etag, self.objects.cfg.location(CURRENT_KEY))

    def current(self) -> tuple[str | None, str | None]:
        """``(served version, etag of models/CURRENT)``; ``(None, None)`` before any promotion."""
        p = self.pointer()
        return p.version, p.etag

    def shadow_pointer(self) -> Pointer:
        """``models/SHADOW`` now (an empty :class:`Pointer` when absent)."""
        got = self.objects.get(SHADOW_KEY)
        if got is None or got is NOT_MODIFIED:
            return Pointer()
        return Pointer.parse(got[0], got[1], self.objects.cfg.location(SHADOW_KEY))

    def shadow(self) -> str | None:
        """The fleet's shadow version (``None``: none)."""
        return self.shadow_pointer().version

    def set_shadow(self, name: str | None, *, expected: str | None | Unchecked = UNCHECKED,
                   verify: bool = True) -> None:
        """Make ``name`` the fleet's shadow, or clear it (``None``). ``name`` is checked as
        :meth:`promote` checks it (:meth:`_verified`, the one check both use): a version
        :meth:`promote` refuses is refused here with the same error. With ``expected`` (a
        version name, ``None`` = no shadow), only if the shadow still is that
        (compare-and-swap on ``models/SHADOW``; else :class:`PromotionConflict`)."""
        if name is not None:
            self._verified(name, verify=verify)
        now = self.shadow_pointer()
        if expected is not UNCHECKED and now.version != expected:
            raise PromotionConflict(expected, now.version, self.objects.cfg.location(SHADOW_KEY))
        doc = {"version": name, "updated_at": _utcnow(), "by": self.by, "generation": now.generation + 1}
        data = (json.dumps(doc, indent=2) + "\n").encode("utf-8")
        try:
            self.objects.put_if_match(SHADOW_KEY, data, now.etag)
        except PreconditionFailed:
            raise PromotionConflict(now.version, self.shadow(), self.objects.cfg.location(SHADOW_KEY)) from None
        log.info("shadow %s in %s", f"set to {name}" if name else "cleared", self.objects.cfg.location(SHADOW_KEY))

    def last_retrain(self) -> dict[str, Any] | None:
        """What :meth:`record_retrain` wrote last (``None``: never, or unreadable)."""
        got = self.objects.get(LAST_RETRAIN_KEY)
        if got is None or got is NOT_MODIFIED:
            return None
        return parse_status(got[0])

    def record_retrain(self, status: dict[str, Any]) -> None:
        """Record a finished retrain run (``models/LAST_RETRAIN``; replicas copy it into their
        home and export its time as ``flywheel_last_retrain_timestamp_seconds``)."""
        self.objects.put(LAST_RETRAIN_KEY, (json.dumps(status, sort_keys=True) + "\n").encode("utf-8"))

    def history(self) -> list[str]:
        """The promoted versions, oldest first (at most :data:`HISTORY_LIMIT`)."""
        return list(self.pointer().history)

    def manifest(self, name: str) -> tuple[Manifest, bytes]:
        """Version ``name``'s manifest and its bytes; :class:`ModelError` when the version is
        not (completely) in the bucket or its manifest is unreadable."""
        key = self._key(name, MANIFEST)
        got = self.objects.get(key)
        if got is None or got is NOT_MODIFIED:
            raise ModelError(f"{self.objects.cfg.location(self._key(name))}: no version {name!r} in the "
                             f"store (or its upload is not complete: no {MANIFEST})")
        data = got[0]
        try:
            return Manifest.from_dict(json.loads(data.decode("utf-8"))), data
        except (ValueError, TypeError, UnicodeDecodeError) as exc:
            raise ModelError(f"{self.objects.cfg.location(key)}: corrupt manifest: {exc}") from None

    def bundled_intents(self, name: str) -> IntentSet:
        """The intent set version ``name`` bundles, read from the bucket (its manifest and
        its ``intents.yaml``, checked against the manifest; nothing else is downloaded)."""
        import yaml

        manifest, _ = self.manifest(name)
        if not manifest.intents_sha256:
            return self.load(name).intents   # an early version records no checksum: verify it whole
        data = self._get_file(name, INTENTS_FILE, manifest.intents_sha256)
        try:
            return parse_intents(yaml.safe_load(data.decode("utf-8")),
                                 source=self.objects.cfg.location(self._key(name, INTENTS_FILE)))
        except (ValueError, yaml.YAMLError, IntentFileError) as exc:
            raise ModelError(f"{self.objects.cfg.location(self._key(name))}: bundled intents are invalid: {exc}") \
                from None

    def _files_by_version(self) -> dict[str, dict[str, int]]:
        """Every version folder in the bucket (complete or not): its files and their sizes."""
        by_version: dict[str, dict[str, int]] = {}
        for info in self.objects.list(MODELS):
            parts = info.key.split("/")
            if len(parts) >= 3 and parts[1] != BLOBS_DIR:   # models/<version>/<file>, .../encoder/<file>
                by_version.setdefault(parts[1], {})["/".join(parts[2:])] = info.size
        return by_version

    def _blob_refs(self, name: str, files: Any = ()) -> list[Any]:
        """The shared blobs version ``name``'s encoder names (read from the bucket; ``[]``: none)."""
        if files and _ENCODER_MANIFEST not in files:
            return []
        got = self.objects.get(self._key(name, _ENCODER_MANIFEST))
        data = None if got is None or got is NOT_MODIFIED else got[0]
        return blobs.refs_in(data, self.objects.cfg.location(self._key(name, _ENCODER_MANIFEST)))

    def versions(self) -> list[BucketVersion]:
        """Every complete version (one with a manifest), by name; partial uploads are not listed."""
        by_version = self._files_by_version()
        current = self.pointer().version
        out = []
        for name in sorted(n for n, files in by_version.items() if MANIFEST in files):
            where = self.objects.cfg.location(self._key(name))
            files = tuple(sorted(by_version[name]))
            try:
                m, _ = self.manifest(name)
                problem = self._unservable(m)
                out.append(BucketVersion(name, where, m.created_at, int(m.training_size), m.metrics,
                                         name == current, not problem, problem, files, sum(by_version[name].values()),
                                         sum(r.bytes for r in self._blob_refs(name, files))))
            except ModelError as exc:
                out.append(BucketVersion(name, where, "", 0, {}, name == current, False, str(exc), files))
        return out

    def load(self, name: str) -> IntentModel:
        """Version ``name``, downloaded into the local home if needed and verified."""
        self.download(name)
        return self.local.load(name)

    # ------------------------------------------------------------------ writing
    def staging_dir(self, name: str) -> Path:
        """Where a new version is saved before :meth:`publish`: its directory in the local home
        (so publishing, then promoting, it on this host downloads nothing)."""
        return self.local.version_dir(self._check_name(name))

    def publish(self, directory: str | os.PathLike[str]) -> str:
        """Upload the saved version ``directory`` as ``models/<its name>/``, create-only;
        returns the name.

        The files its manifest hashes go first (plus ``report.json``/``report.md`` when
        present), the manifest last, so a version without its manifest is an incomplete
        upload that nobody lists, promotes or downloads. Publishing the same version again
        (same manifest bytes) completes what is missing and changes nothing else; a version
        of that name with other content is never replaced (:class:`ModelError`). The
        version must verify locally and have the serving head ``head.npz`` and the
        checksum of every file (what replicas require)."""
        src = Path(directory)
        name = self._check_name(src.name)
        model = IntentModel.load(src)  # checks every recorded checksum (the serving head: no unpickling)
        problem = self._unservable(model.manifest)
        if problem:
            raise ModelError(f"{src}: cannot publish: {problem}")
        manifest_bytes = (src / MANIFEST).read_bytes()
        try:
            _, remote_bytes = self.manifest(name)
        except ModelError:   # not there yet (or an unreadable manifest: the create-only upload refuses it)
            remote_bytes = None
        if remote_bytes is not None and remote_bytes != manifest_bytes:
            raise ModelError(f"{self.objects.cfg.location(self._key(name))}: another version named {name!r} "
                             f"is already in the store; refusing to replace it")
        for fname, sha in model.manifest.files().items():
            self._put_file(name, fname, (src / fname).read_bytes(), sha)
        # the shared blobs it names that the bucket lacks, before the manifest
        self.last_blobs = blobs.upload_blobs(self.objects, src / ENCODER_DIR, version_blobs(src))
        for fname in REPORT_FILES:  # informational; the first upload stays
            if (src / fname).is_file():
                self.objects.put_if_absent(self._key(name, fname), (src / fname).read_bytes())
        if remote_bytes is None:
            self._put_file(name, MANIFEST, manifest_bytes, _sha256(manifest_bytes))
        log.info("published %s to %s (%d shared blob(s) uploaded, %d already there)", name,
                 self.objects.cfg.location(self._key(name)), self.last_blobs.moved, self.last_blobs.kept)
        return name

    def promote(self, name: str, *, expected: str | None, verify: bool = True) -> str:
        """Point ``models/CURRENT`` at ``name`` if its etag is still ``expected`` (``None``:
        only if there is no ``CURRENT`` yet); returns the new etag.

        ``name`` must be complete in the store with a serving head (``head.npz``) and every
        file's checksum in its manifest (else :class:`ModelError`); with ``verify`` (default)
        every file is read back from the store and checked against the manifest, as a
        replica will download it (a local copy that verifies proves nothing about the
        bucket's bytes), and the version is installed in the local home and checked whole
        (:meth:`_verified`). When the pointer moved: :class:`PromotionConflict`, naming the
        version promoted now, and nothing changes."""
        self._verified(name, verify=verify)
        now = self.pointer()
        if now.etag != expected:
            raise self._conflict(expected, now)
        history = list(now.history)
        if not history or history[-1] != name:
            history.append(name)
        return self._swap(now.moved_to(name, history, self.by), expected, name)

    def rollback(self, *, expected: str | None = None) -> str:
        """Serve the previously promoted version again; returns the new etag. With
        ``expected``, only if ``CURRENT``'s etag still is that (else :class:`PromotionConflict`);
        without it, against the pointer as read now (a concurrent change is still a conflict).

        The target is checked as :meth:`promote` checks it (complete and servable in the
        store, downloaded into the local home and verified whole); :class:`ModelError` naming
        it when it does not pass, and ``CURRENT`` stays as it is."""
        now = self.pointer()
        if expected is not None and now.etag != expected:
            raise self._conflict(expected, now)
        target = rollback_target(now.history, now.version)
        if target is None:
            raise ModelError(f"{self.objects.cfg.location(CURRENT_KEY)}: {NOTHING_TO_ROLL_BACK}")
        prev, history = target
        try:
            self._verified(prev)
        except ModelError as exc:
            raise ModelError(f"cannot roll back to {prev!r}: {exc}") from None
        return self._swap(now.moved_to(prev, history, self.by), now.etag, prev, verb="rolled back to")

    def prune(self, *, keep_promoted: int = 5, keep_recent: int = 3, dry_run: bool = False) -> list[str]:
        """Delete the versions in the bucket that nothing needs any more; the names removed
        (with ``dry_run``, that would be), oldest first.

        The same rule as :meth:`classifier.versions.registry.ModelRegistry.prune`: ``CURRENT``'s and
        ``SHADOW``'s versions always stay, and so do the last ``keep_promoted`` names of
        ``CURRENT``'s history (what :meth:`rollback` walks back through) and the
        ``keep_recent`` newest complete versions by name, promoted or not. Only complete
        versions (with a manifest) are candidates: a folder without one may be an upload in
        progress and is never touched.

        First the history in ``CURRENT`` drops the doomed names (compare-and-swap: if a
        promotion moves ``CURRENT`` meanwhile, :class:`PromotionConflict` and nothing is
        deleted), so a rollback never points at a deleted version. Then each version loses
        its files with its manifest LAST: a prune that stops half way leaves a version that
        still lists, fails to download (a missing file: :class:`ModelError`, as for any
        tampered version) and is deleted by the next prune. Before each version is deleted
        the pointers are read again, and a version promoted or shadowed meanwhile stays.
        Last, the shared blobs (``models/blobs/``) no version names any more and older
        than :attr:`blob_grace_s` are deleted. Store failures raise :class:`~fleet.errors.FleetError`."""
        check_keep_counts(keep_promoted, keep_recent)   # before any request
        by_version = self._files_by_version()
        now = self.pointer()
        doomed = prune_plan(sorted(n for n, files in by_version.items() if MANIFEST in files), now.history,
                            served=now.version, shadow=self.shadow(), keep_promoted=keep_promoted,
                            keep_recent=keep_recent)
        if dry_run or not doomed:
            if not dry_run:
                self._collect_blobs()
            return doomed
        gone = set(doomed)
        if any(n in gone for n in now.history):
            kept = history_without(now.history, gone)
            self._swap(now.moved_to(now.version, kept, self.by), now.etag, str(now.version),
                       verb="pruned the rollback history; still serving")
        removed = []
        for name in doomed:
            if name in (self.pointer().version, self.shadow()):   # promoted or shadowed meanwhile: leave it
                log.warning("not pruning %s: it was promoted or shadowed while pruning", name)
                continue
            files = sorted(set(by_version[name]) - {MANIFEST}) + [MANIFEST]
            for fname in files:
                self.objects.delete(self._key(name, fname))
            removed.append(name)
            log.info("pruned %s from %s", name, self.objects.cfg.location(self._key(name)))
        self._collect_blobs()
        return removed

    def _collect_blobs(self) -> list[str]:
        """Delete the shared blobs no version folder (complete or not) names, past :attr:`blob_grace_s`."""
        named = {r.sha256 for n, files in self._files_by_version().items() for r in self._blob_refs(n, files)}
        return blobs.collect_bucket_garbage(self.objects, named, self.blob_grace_s)

    @contextmanager
    def lock(self, *, create: bool = True) -> Iterator[bool]:
        """The retrain lock of the local home (see the class docstring for why that is enough)."""
        with self.local.lock(create=create) as taken:
            yield taken

    # ------------------------------------------------------------------ download
    def download(self, name: str, *, trust_local: bool = True) -> Path:
        """Install version ``name`` from the store in the local home (verified); its path.

        Every file the manifest hashes is fetched into a temp dir inside the local home and
        its SHA-256 checked, then :meth:`ModelRegistry.install` moves it in (checked again by
        loading it). With ``trust_local`` (a replica), a version already installed with the
        same manifest that verifies is used as it is; without it (a host about to point the
        fleet at the version), the store's files are fetched and checked all the same, and
        the local copy is kept when it matches. :class:`ModelError` when the version is
        missing, incomplete, corrupt, lacks a checksum (``head.npz``, ``head.joblib``,
        ``intents.yaml``) or cannot be installed; the temp dir is removed. Store failures
        raise :class:`~fleet.errors.FleetError`."""
        name = self._check_name(name)
        manifest, manifest_bytes = self.manifest(name)
        problem = self._unservable(manifest)
        if problem:
            raise ModelError(f"{self.objects.cfg.location(self._key(name))}: refusing version {name!r}: {problem}")
        target = self.local.version_dir(name)
        if trust_local and _same_bytes(target / MANIFEST, manifest_bytes):
            try:
                IntentModel.load(target)
                return target
            except ModelError as exc:   # a corrupt local copy: install replaces it
                log.warning("local copy of %s does not verify, downloading it again: %s", name, exc)
        self.local.home.mkdir(parents=True, exist_ok=True)
        self._remove_stale_downloads()
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}{DOWNLOAD_MARK}", dir=self.local.home))
        try:
            for fname, sha in manifest.files().items():
                data = self._get_file(name, fname, sha)
                (tmp / fname).parent.mkdir(parents=True, exist_ok=True)   # encoder/<file>
                (tmp / fname).write_bytes(data)
            (tmp / MANIFEST).write_bytes(manifest_bytes)
            enc = tmp / _ENCODER_MANIFEST   # the blobs it names: only those the home lacks are fetched
            refs = blobs.refs_in(enc.read_bytes() if enc.is_file() else None, str(enc))
            self.last_blobs = blobs.fetch_blobs(self.objects, self.local.home, refs, name)
            path = self.local.install(name, tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log.info("downloaded %s from %s (%d shared blob(s) fetched, %d already here)", name,
                 self.objects.cfg.location(self._key(name)), self.last_blobs.moved, self.last_blobs.kept)
        return path

    # ------------------------------------------------------------------ helpers
    def _key(self, name: str, fname: str | None = None) -> str:
        return f"{MODELS}/{name}/{fname}" if fname else f"{MODELS}/{name}"

    def _check_name(self, name: str) -> str:
        if not isinstance(name, str) or not _NAME.fullmatch(name) or name in ("CURRENT", SHADOW, LAST_RETRAIN):
            raise ModelError(f"invalid version name {name!r} (letters, digits, '.', '_', '+', '-'; "
                             f"starting with a letter or digit)")
        self.local.version_dir(name)   # the local home's own rules
        return name

    @staticmethod
    def _unservable(manifest: Manifest) -> str:
        """Why a replica would refuse this version ('' when it would not)."""
        files = manifest.files()
        if SERVING_HEAD_FILE not in files:
            return (f"its manifest has no serving head ({SERVING_HEAD_FILE}); replicas serve only that "
                    f"and never unpickle {HEAD_FILE} (re-save it with this flywheel)")
        missing = [f for f in REQUIRED_FILES if f not in files]
        if missing:
            return f"its manifest records no checksum for {', '.join(missing)}, so it cannot be verified whole"
        return ""

    def _check_promotable(self, name: str) -> Manifest:
        """The manifest of a complete, servable version ``name`` whose files are all in the store."""
        name = self._check_name(name)
        manifest, _ = self.manifest(name)
        problem = self._unservable(manifest)
        if problem:
            raise ModelError(f"{self.objects.cfg.location(self._key(name))}: cannot promote {name!r}: {problem}")
        for fname in manifest.files():
            if self.objects.head(self._key(name, fname)) is None:
                raise ModelError(f"{self.objects.cfg.location(self._key(name, fname))}: missing; cannot promote "
                                 f"{name!r}")
        missing = blobs.missing_blobs(self.objects, self._blob_refs(name, manifest.files()))
        if missing:
            raise ModelError(f"{self.objects.cfg.location(missing[0])}: missing (an encoder blob of {name!r}); "
                             f"cannot promote {name!r}")
        return manifest

    def _verified(self, name: str, *, verify: bool = True) -> Manifest:
        """The check a version passes before ``CURRENT`` or ``SHADOW`` may name it, shared by
        :meth:`promote`, :meth:`rollback` and :meth:`set_shadow`: complete and servable in
        the store (:meth:`_check_promotable`) and, with ``verify``, every file as the store
        holds it now matching its manifest checksum (fetched, never taken from the local
        copy: what replicas will download) and installed in the local home, checked whole
        (:meth:`download` without ``trust_local``); else :class:`ModelError`."""
        manifest = self._check_promotable(name)
        if verify:
            self.download(name, trust_local=False)
        return manifest

    def _put_file(self, name: str, fname: str, data: bytes, sha: str) -> None:
        """Create ``models/<name>/<fname>``; an existing object must hold the same bytes."""
        key = self._key(name, fname)
        if self.objects.put_if_absent(key, data):
            return
        got = self.objects.get(key)
        if got is None or got is NOT_MODIFIED or _sha256(got[0]) != sha:
            raise ModelError(f"{self.objects.cfg.location(key)}: already in the store with other content; "
                             f"refusing to replace it (a version {name!r} was partly uploaded by someone else)")

    def _get_file(self, name: str, fname: str, sha: str) -> bytes:
        key = self._key(name, fname)
        got = self.objects.get(key)
        if got is None or got is NOT_MODIFIED:
            raise ModelError(f"{self.objects.cfg.location(key)}: missing (version {name!r} is incomplete)")
        if _sha256(got[0]) != sha:
            raise ModelError(f"{self.objects.cfg.location(key)}: checksum does not match the manifest "
                             f"(corrupt or replaced)")
        return got[0]

    def _swap(self, data: bytes, expected: str | None, name: str, verb: str = "promoted") -> str:
        try:
            etag = self.objects.put_if_match(CURRENT_KEY, data, expected)
        except PreconditionFailed:
            raise self._conflict(expected, self._pointer_or_empty()) from None
        log.info("%s %s in %s", verb, name, self.objects.cfg.location(CURRENT_KEY))
        return etag

    def _pointer_or_empty(self) -> Pointer:
        try:
            return self.pointer()
        except FlywheelError:
            return Pointer()

    def _conflict(self, expected: str | None, now: Pointer) -> PromotionConflict:
        where = f"{self.objects.cfg.location(CURRENT_KEY)} (now serving {now.version or 'nothing'}" \
                f"{', promoted by ' + now.by if now.by else ''})"
        exc = PromotionConflict(expected, now.etag, where)
        exc.found_version = now.version
        return exc

    def _remove_stale_downloads(self) -> None:
        cutoff = time.time() - STALE_DOWNLOAD_S
        for p in self.local.home.glob(f".*{DOWNLOAD_MARK}*"):
            try:
                if p.is_dir() and p.stat().st_mtime < cutoff:
                    shutil.rmtree(p, ignore_errors=True)
            except OSError:
                pass


def parse_status(data: bytes) -> dict[str, Any] | None:
    """A ``LAST_RETRAIN`` document, or ``None`` when it is not a JSON object."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def _same_bytes(path: Path, data: bytes) -> bool:
    try:
        return path.read_bytes() == data
    except OSError:
        return False
