"""``flywheel models``: list, push, promote, roll back, shadow and prune model versions.

With a store configured (fleet mode) ``list``, ``push``, ``promote``, ``rollback`` and
``shadow`` act on the fleet's registry in the bucket (``promote``/``rollback`` switch
``models/CURRENT`` by compare-and-swap, and every replica follows); ``prune`` cleans the
bucket, then the local models home (``--local-only``: the home alone).

``shadow VERSION`` makes every replica score VERSION beside the served one on live layer-2
traffic, enforcing nothing (``--clear`` stops it); ``flywheel stats`` reports how it
compares, and ``promote --from-shadow`` promotes it once it has answered at least
``--min-shadow`` logged decisions (``--force`` skips that check).

``rollback --to-default`` serves the default model again: the one a home serves before
anything is promoted (the configured intents file, else the starter set, trained into the
cache as on first use). It becomes a version like any other, ``default-<its cache name>``
(:func:`default_version`), promoted by compare-and-swap, so a running process swaps it in,
a restart serves it, replicas follow it, and a plain ``rollback`` goes back again."""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from flywheel.classifier.errors import FlywheelError, InvalidInputError, ModelError
from flywheel.classifier.settings.config import Config, load_config
from flywheel.classifier.settings.output import counted, echo_json
from flywheel.classifier.versions.model import MANIFEST
from flywheel.classifier.versions.registry import RETRAIN_LOCK, ModelRegistry
from flywheel.training.cli._options import HOME_OPTION, MODELS_OPTION

if TYPE_CHECKING:   # the fleet package loads when a command opens its site, not with the CLI
    from flywheel.classifier.protocols import Registry
    from flywheel.classifier.versions.registry import VersionInfo
    from flywheel.fleet.registry import BucketVersion
    from flywheel.fleet.site import ListedRegistry, Site

__all__ = ["DEFAULT_MIN_SHADOW", "DEFAULT_PREFIX", "default_version", "default_version_name", "models_app",
           "push_version"]

#: Shadow answers a shadow version needs in the log before ``promote --from-shadow``.
DEFAULT_MIN_SHADOW = 500
#: How the default model is named as a version (``rollback --to-default``).
DEFAULT_PREFIX = "default-"


models_app = typer.Typer(help="Model versions: list, push, promote, rollback, shadow, prune.",
                         no_args_is_help=True)

_LOCAL_MODELS_HELP = "Local models home to prune (default: <home>/models)."


def _registry(models: Optional[Path], home: Optional[Path]) -> ModelRegistry:
    return ModelRegistry(models or load_config(home=home).models_dir)


def _site(home: Optional[Path]) -> Site:
    """Where the registry and the log live: the local home, or the fleet's store."""
    return _site_of(load_config(home=home))


def _site_of(cfg: Config) -> Site:
    from flywheel.fleet.site import open_site

    return open_site(cfg)


def _where(reg: Registry) -> str:
    return str(reg.home if isinstance(reg, ModelRegistry) else reg)   # a local home by its path, the bucket by its repr


@models_app.command("list")
def models_list(models: Optional[Path] = MODELS_OPTION,
                home: Optional[Path] = HOME_OPTION,
                as_json: bool = typer.Option(False, "--json", help="Print a JSON list."),
                intents: Optional[Path] = typer.Option(None, "--intents",
                                                       help="The intent file whose default model to mark "
                                                            "(default: the intents setting, else the starter set).")
                ) -> None:
    """List versions (the served one marked with *, the default model named, and with an
    intents setting, the versions trained on another intent set marked)."""
    cfg = load_config(home=home, intents=str(intents) if intents is not None else None)
    site = _site_of(cfg)
    reg = site.registry(models)
    vs = reg.versions()
    default = _default_name_or_none(cfg)
    sizes = {v.name: _bytes(v) for v in vs}
    fits = _fitting(site, reg, [v.name for v in vs if v.valid])
    if as_json:
        echo_json([{"version": v.name, "current": v.current, "default": v.name == default,
                    "created_at": v.created_at, "training_size": v.training_size, "valid": v.valid,
                    "metrics": v.metrics, "bytes": sizes[v.name][0], "blob_bytes": sizes[v.name][1],
                    "fits_intents": fits.get(v.name)} for v in vs])
        return
    if not vs:
        typer.echo(f"no model versions in {_where(reg)}")
        return
    width = max(32, *(len(v.name) for v in vs))   # a default-<file>-<digest> name is longer than v<time>
    for v in vs:
        acc = v.metrics.get("oof_top1_accuracy")
        typer.echo(f"{'*' if v.current else ' '} {v.name:{width}} {v.created_at:21} n={v.training_size:<7}"
                   + (f" cv-top1={acc:.3f}" if isinstance(acc, (int, float)) else "")
                   + f" {_mb(sizes[v.name][0])}" + (f" + {_mb(sizes[v.name][1])} shared" if sizes[v.name][1] else "")
                   + ("  (the default model)" if v.name == default else "")
                   + ("  (another intent set)" if fits.get(v.name) is False else "")
                   + ("" if v.valid else f"  INVALID: {v.problem}"))
    if default is not None and default not in {v.name for v in vs}:
        typer.echo("  (the default model: flywheel models rollback --to-default serves it again)" if cfg.intents
                   else "  (the default model is the starter set's: flywheel models rollback --to-default "
                        "--intents FILE serves your intent file's)")
    count, total = _blob_store(reg)
    if count:
        typer.echo(f"  shared encoder blobs: {count}, {_mb(total)}, stored once (each version: its own files "
                   f"+ the shared blobs it names; a replica downloads only the blobs it lacks)")


def _fitting(site: Site, reg: ListedRegistry, names: list[str]) -> dict[str, bool]:
    """Whether each version of ``names`` was trained on the configured intent set (empty
    without an ``intents`` setting, or when it cannot be read: nothing to mark)."""
    from flywheel.classifier.errors import IntentSetMismatch

    try:
        if site.contract().intents is None:
            return {}
    except FlywheelError:
        return {}
    out: dict[str, bool] = {}
    for name in names:
        try:
            site.check_move(reg, name, doing=f"list {name}")
            out[name] = True
        except IntentSetMismatch:
            out[name] = False
        except FlywheelError:   # unreadable: its INVALID mark says so
            continue
    return out


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _bytes(v: VersionInfo | BucketVersion) -> tuple[int, int]:
    """(own bytes, bytes of the shared blobs it names) of a listed version, local or in the bucket."""
    from flywheel.classifier.encoders.blobs import version_storage
    from flywheel.fleet.registry import BucketVersion

    if isinstance(v, BucketVersion):   # the bucket's: its listing counted them
        return v.bytes, v.blob_bytes
    st = version_storage(v.path)
    return st["own_bytes"], st["blob_bytes"]


def _blob_store(reg: Registry) -> tuple[int, int]:
    """How many shared blobs ``reg`` holds and their bytes."""
    from flywheel.classifier.encoders.blobs import BLOBS_DIR

    if isinstance(reg, ModelRegistry):
        files = [p for p in (reg.home / BLOBS_DIR).glob("*") if p.is_file() and not p.name.startswith(".")]
        return len(files), sum(p.stat().st_size for p in files)
    from flywheel.fleet.blobs import BLOBS_PREFIX
    from flywheel.fleet.registry import BucketRegistry

    if not isinstance(reg, BucketRegistry):
        return 0, 0
    infos = reg.objects.list(BLOBS_PREFIX + "/")
    return len(infos), sum(i.size for i in infos)


@models_app.command("promote")
def models_promote(version: Optional[str] = typer.Argument(None, help="The version to serve (or --from-shadow)."),
                   from_shadow: bool = typer.Option(False, "--from-shadow",
                                                    help="Promote the current shadow version (then clear it)."),
                   min_shadow: int = typer.Option(DEFAULT_MIN_SHADOW, "--min-shadow", min=0,
                                                  help="With --from-shadow: logged shadow answers it needs."),
                   force: bool = typer.Option(False, "--force", help="Skip the checks: --min-shadow (with "
                                                                     "--from-shadow) and the configured intent set."),
                   models: Optional[Path] = MODELS_OPTION,
                   home: Optional[Path] = HOME_OPTION) -> None:
    """Serve VERSION, or the shadow version with --from-shadow (checked before the switch;
    fleet-wide with a store)."""
    if from_shadow == (version is not None):
        raise InvalidInputError("give a VERSION or --from-shadow, not both and not neither")
    site = _site(home)
    reg = site.registry(models)
    if from_shadow:
        version = _ready_shadow(site, reg, min_shadow, force)
    assert version is not None, "a VERSION or --from-shadow, checked above"
    _, token = reg.current()
    if not force:
        site.check_move(reg, version, doing=f"promote {version}", fix=f"flywheel retrain trains the file; "
                        f"--force promotes {version} anyway (processes configured with the file refuse it)")
    reg.promote(version, expected=token)   # refused if another promotion lands meanwhile
    typer.echo(f"promoted {version} in {_where(reg)}")
    if from_shadow:
        try:
            reg.set_shadow(None, expected=version)   # a shadow set meanwhile stays
            typer.echo("shadow cleared (it is the served version now)")
        except FlywheelError as exc:
            typer.echo(f"flywheel: warning: the shadow was not cleared: {exc}", err=True)


def _ready_shadow(site: Site, reg: Registry, min_shadow: int, force: bool) -> str:
    """The shadow version, if it answered at least ``min_shadow`` logged decisions (or ``force``)."""
    from flywheel.training.stats.shadow import count_shadow

    name = reg.shadow()
    if name is None:
        raise ModelError(f"no shadow version in {_where(reg)} (set one with flywheel models shadow VERSION)")
    if force:
        return name
    n = count_shadow(site.open_log(), name)
    if n < min_shadow:
        raise InvalidInputError(f"shadow {name} has answered {counted(n, 'logged decision')}, fewer than --min-shadow "
                                f"{min_shadow}; wait for more traffic or pass --force")   # exit 2
    typer.echo(f"shadow {name}: {n:,} logged answers (>= {min_shadow:,})")
    return name


def _check_same_encoder(reg: Registry, version: str, current: Optional[str]) -> None:
    """A shadow scores the champion's vectors, or encodes its share itself with the encoder
    it carries: refuse one trained with another encoder that it does not carry."""
    if current is None:
        return
    shadow = reg.load(version)
    if shadow.encoder_dir is not None:
        return
    mine, theirs = shadow.manifest.encoder, reg.load(current).manifest.encoder
    if (mine.get("id"), mine.get("dim")) != (theirs.get("id"), theirs.get("dim")):
        raise InvalidInputError(f"{version} was trained with encoder {mine.get('id')!r} ({mine.get('dim')}-d), "
                                f"the served {current} with {theirs.get('id')!r} ({theirs.get('dim')}-d): a shadow "
                                f"scores the served version's vectors, so it must use the same encoder")


@models_app.command("shadow")
def models_shadow(version: Optional[str] = typer.Argument(
                      None, help="The version to score in shadow; none: print the current one."),
                  clear: bool = typer.Option(False, "--clear", help="Stop scoring a shadow version."),
                  models: Optional[Path] = MODELS_OPTION,
                  home: Optional[Path] = HOME_OPTION) -> None:
    """Score VERSION beside the served one on live traffic, enforcing nothing (fleet-wide
    with a store); --clear stops it. Without arguments, print the shadow version."""
    if clear and version is not None:
        raise InvalidInputError("give a VERSION or --clear, not both")
    reg = _site(home).registry(models)
    if clear:
        reg.set_shadow(None)
        typer.echo(f"shadow cleared in {_where(reg)}")
    elif version is None:
        typer.echo(reg.shadow() or "no shadow version")
    else:
        current = reg.current()[0]
        if version == current:
            raise InvalidInputError(f"{version} is the served version; shadow another one")
        _check_same_encoder(reg, version, current)
        reg.set_shadow(version)
        typer.echo(f"shadow set to {version} in {_where(reg)}")


@models_app.command("push")
def models_push(directory: Path = typer.Argument(..., help="A saved version directory (flywheel train --out)."),
                promote: bool = typer.Option(False, "--promote", help="Also promote it (compare-and-swap)."),
                models: Optional[Path] = MODELS_OPTION,
                home: Optional[Path] = HOME_OPTION) -> None:
    """Publish a locally trained version to the registry (create-only, manifest last)."""
    site = _site(home)
    reg = site.registry(models)
    if not Path(directory).is_dir():
        raise InvalidInputError(f"{directory}: not a directory")
    push_version(reg, Path(directory), promote=promote, check=lambda name: site.check_move(
        reg, name, doing=f"promote {name}", fix=f"it is pushed, not served; flywheel models promote {name} "
                                                 f"--force serves it anyway"))


def push_version(reg: Registry, directory: Path, *, promote: bool, say: bool = True,
                 check: Callable[[str], None] | None = None) -> str:
    """Publish the saved version ``directory`` to ``reg`` (create-only) and, with ``promote``,
    serve it through ``reg.promote`` (verified, compare-and-swap against the pointer as read
    after publishing), once ``check`` (the deployment's, :meth:`~fleet.site.Site.check_move`)
    let it; returns its name. ``models push`` and ``train --promote`` share it."""
    name = reg.publish(directory)
    if say:
        typer.echo(f"pushed {name} to {_where(reg)}")
    if promote and check is not None:
        check(name)
    if promote:
        _, token = reg.current()
        reg.promote(name, expected=token)
        if say:
            typer.echo(f"promoted {name}")
    return name


@models_app.command("rollback")
def models_rollback(to_default: bool = typer.Option(
                        False, "--to-default", help="Serve the default model again (the intents file, or the "
                                                    "starter set, trained as on first use)."),
                    intents: Optional[Path] = typer.Option(None, "--intents",
                                                           help="With --to-default: the intent file whose default "
                                                                "model to serve (default: the intents setting, "
                                                                "else the starter set)."),
                    force: bool = typer.Option(False, "--force",
                                               help="Switch to a version of another intent set than the "
                                                    "configured one (or, with --to-default and no intents "
                                                    "setting, to the starter set)."),
                    models: Optional[Path] = MODELS_OPTION,
                    home: Optional[Path] = HOME_OPTION) -> None:
    """Serve the previously promoted version again, checked as promote checks it, and
    refused when it was trained on another intent set than the configured one (fleet-wide
    with a store); --to-default serves the default model again."""
    if intents is not None and not to_default:
        raise InvalidInputError("--intents goes with --to-default (a plain rollback serves the version "
                                "promoted before; --force when that was trained on another intent set)")
    cfg = load_config(home=home, intents=str(intents) if intents is not None else None)
    site = _site_of(cfg)
    reg = site.registry(models)
    current, token = reg.current()
    if to_default:
        _rollback_to_default(cfg, reg, current, token, force)
        return
    if not force:
        _check_rollback(site, reg, current)
    new_token = reg.rollback(expected=token)   # the token is opaque (an etag in fleet mode): print the name
    name, now = reg.current()
    if now == new_token:
        typer.echo(f"rolled back to {name} in {_where(reg)}")
    else:
        typer.echo(f"rolled back in {_where(reg)}; another promotion has moved it on since, to "
                   f"{name or 'nothing'}")


def _check_rollback(site: Site, reg: ListedRegistry, current: Optional[str]) -> None:
    """Refuse a rollback to a version of another intent set than the configured one, naming
    the nearest earlier promoted version that fits (:meth:`Site.check_move`)."""
    from flywheel.classifier.errors import IntentSetMismatch
    from flywheel.classifier.versions.registry_policy import rollback_target

    target = rollback_target(reg.history(), current)
    if target is None:
        return   # the registry's rollback says there is nothing to roll back to
    prev, history = target
    try:
        site.check_move(reg, prev, doing=f"roll back to {prev}")
    except IntentSetMismatch as exc:
        nearest = _nearest_fit(site, reg, history[:-1])
        way = (f"the nearest earlier version trained on it is {nearest}: flywheel models promote {nearest}"
               if nearest else "no earlier promoted version was trained on it: flywheel retrain trains it")
        raise IntentSetMismatch(f"{exc}; {way}, or flywheel models rollback --force rolls back to {prev} "
                                f"anyway") from None


def _nearest_fit(site: Site, reg: Registry, history: list[str]) -> Optional[str]:
    """The latest of the promoted ``history`` (oldest first) that fits the configured set."""
    from flywheel.classifier.errors import IntentSetMismatch

    for name in reversed(history):
        try:
            site.check_move(reg, name, doing=f"roll back to {name}")
        except (IntentSetMismatch, ModelError):
            continue
        return name
    return None


def _rollback_to_default(cfg: Config, reg: ListedRegistry, current: Optional[str], token: Optional[str],
                         force: bool) -> None:
    name = default_version_name(cfg)
    if current == name:
        typer.echo(f"already serving the default model {name} in {_where(reg)}")
        return
    if current and not cfg.intents and not force:
        _check_starter_set(reg, current)
    default_version(cfg, reg)
    reg.promote(name, expected=token)   # checked as any promotion; refused if another one lands meanwhile
    typer.echo(f"rolled back to the default model {name} in {_where(reg)}"
               + (f" (was {current}; flywheel models rollback goes back to it)" if current else ""))


def _check_starter_set(reg: ListedRegistry, current: str) -> None:
    """With no intents setting the default model is the starter set's: refuse, before any
    switch, when the version served now was trained on another intent set."""
    from flywheel.classifier.errors import IntentSetMismatch
    from flywheel.classifier.settings.config import starter_intents_path
    from flywheel.classifier.settings.intents import load_intents
    from flywheel.classifier.versions.served import set_difference

    try:
        theirs = reg.load(current).intents
    except ModelError:
        return   # unloadable: the starter set is the way back
    starter = load_intents(starter_intents_path())
    if set_difference(starter, theirs, current) is None:
        return
    raise IntentSetMismatch(
        f"refusing to switch to the starter set: with no intents setting the default model is the starter "
        f"set's ({', '.join(starter.labels)}), and {current} serves another intent set "
        f"({', '.join(theirs.labels)}); flywheel models rollback --to-default --intents FILE serves your intent "
        f"file's default model (set intents in the config so every command uses it), --force switches to the "
        f"starter set anyway")


def _default_source(cfg: Config) -> Path:
    """The intent file the default model is trained from: the configured one, else the starter set."""
    from flywheel.classifier.settings.config import starter_intents_path

    return Path(cfg.intents).expanduser() if cfg.intents else starter_intents_path()


def default_version_name(cfg: Config) -> str:
    """The version name of the default model ``cfg`` serves before anything is promoted:
    :data:`DEFAULT_PREFIX` + its cache directory's name (the intent file's stem and a digest
    of its bytes and flywheel's version), so a changed intent file is another default.
    Reads the intent file's bytes only (:class:`~classifier.errors.IntentFileError` when it
    cannot be read); trains nothing."""
    from flywheel.classifier.versions.default import cached_model_dir

    cached = cached_model_dir(cfg, _default_source(cfg)).name
    return (DEFAULT_PREFIX + re.sub(r"[^A-Za-z0-9._+-]+", "_", cached))[:128]


def _default_name_or_none(cfg: Config) -> Optional[str]:
    try:
        return default_version_name(cfg)
    except FlywheelError:
        return None


def default_version(cfg: Config, reg: ListedRegistry) -> str:
    """Make the default model a version of ``reg`` (published, not promoted); its name.

    The default is what the home serves before any promotion
    (:func:`classifier.versions.default.default_model_dir`): the intent file trained into the cache,
    trained now if it is not there yet. A version of that name already in ``reg`` is used
    as it is; else the cached model is copied into ``reg``'s staging directory under the
    name (its manifest says so) and published (in fleet mode: uploaded to the bucket)."""
    from flywheel.classifier.versions.default import cached_model_dir, ensure_trained

    name = default_version_name(cfg)
    if name in {v.name for v in reg.versions()}:
        return name
    source = _default_source(cfg)
    cached = ensure_trained(source, cached_model_dir(cfg, source), cache_root=cfg.cache_root)
    staged = reg.staging_dir(name)
    if not (staged / MANIFEST).is_file():
        _copy_version(cached, staged)
    reg.publish(staged)
    return name


def _copy_version(src: Path, target: Path) -> None:
    """Copy the version ``src`` to ``target`` (created whole, by a rename), named after it."""
    from flywheel.classifier.versions.model import IntentModel

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.copy-{uuid.uuid4().hex[:8]}"
    try:
        shutil.copytree(src, tmp)
        doc = json.loads((tmp / MANIFEST).read_text(encoding="utf-8"))
        doc["version"] = target.name
        (tmp / MANIFEST).write_text(json.dumps(doc, indent=2), encoding="utf-8")
        IntentModel.load(tmp)
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@models_app.command("prune")
def models_prune(keep_promoted: int = typer.Option(5, "--keep-promoted",
                                                   help="Keep the last N promoted versions (rollback depth)."),
                 keep_recent: int = typer.Option(3, "--keep-recent",
                                                 help="Keep the N newest versions, promoted or not."),
                 dry_run: bool = typer.Option(False, "--dry-run", help="Only list what would be removed."),
                 local_only: bool = typer.Option(False, "--local-only",
                                                 help="With a store: prune only the local models home, "
                                                      "not the bucket."),
                 models: Optional[Path] = typer.Option(None, "--models", help=_LOCAL_MODELS_HELP),
                 home: Optional[Path] = HOME_OPTION) -> None:
    """Delete old versions (fleet-wide with a store: the bucket's, then the local home's);
    the served one, the shadow, the last promoted and the newest stay."""
    cfg = load_config(home=home)
    if cfg.store and not local_only:
        from flywheel.fleet.registry import BucketRegistry

        if keep_recent < 1:   # a retrain on another host may have published and not yet promoted it
            raise InvalidInputError("--keep-recent must be at least 1 with a store: the newest version may be "
                                    "one a retrain on another host has published and is about to promote")
        bucket = _site(home).registry(models)
        if not isinstance(bucket, BucketRegistry):   # open_site gives the bucket whenever a store is set
            raise FlywheelError(f"expected the fleet's registry with store {cfg.store}, got {bucket!r}")
        total = len(bucket.versions())
        _locked(bucket.local, dry_run, lambda: _report_pruned(
            bucket.prune(keep_promoted=keep_promoted, keep_recent=keep_recent, dry_run=dry_run), total, dry_run,
            _where(bucket)))
    reg = _registry(models, home)
    total = len(reg.versions())
    _locked(reg, dry_run, lambda: _report_pruned(
        reg.prune(keep_promoted=keep_promoted, keep_recent=keep_recent, dry_run=dry_run), total, dry_run,
        str(reg.home)))


def _locked(reg: ModelRegistry, dry_run: bool, run: "Callable[[], None]") -> None:
    """``run`` under the local home's retrain lock: never delete beside a running retrain
    (it saves, publishes, then promotes a new version); a dry run or a missing home needs none."""
    if dry_run or not reg.home.is_dir():
        run()
        return
    with reg.lock() as taken:
        if not taken:
            raise FlywheelError(f"a retrain is running ({reg.home / RETRAIN_LOCK} is held); "
                                "try again when it is done")
        run()


def _report_pruned(removed: list[str], total: int, dry_run: bool, where: str) -> None:
    verb = "would remove" if dry_run else "removed"
    for name in removed:
        typer.echo(f"{verb} {name}")
    typer.echo(f"{'dry run: ' if dry_run else ''}{verb} {len(removed)} of {total} versions, "
               f"{total - len(removed)} kept, in {where}")
