"""``flywheel models``: list, push, promote, roll back and prune model versions.

With a store configured (fleet mode) ``list``, ``push``, ``promote`` and ``rollback`` act on
the fleet's registry in the bucket (``promote``/``rollback`` switch ``models/CURRENT`` by
compare-and-swap, and every replica follows); ``prune`` always cleans the local models home."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from classifier.config import load_config
from classifier.errors import FlywheelError, InvalidInputError
from classifier.output import echo_json
from classifier.registry import RETRAIN_LOCK, ModelRegistry

__all__ = ["models_app"]


models_app = typer.Typer(help="Model versions: list, promote, rollback, prune.", no_args_is_help=True)


def _registry(models: Optional[Path], home: Optional[Path]) -> ModelRegistry:
    return ModelRegistry(models or load_config(home=home).models_dir)


def _fleet_or_local(models: Optional[Path], home: Optional[Path]) -> Any:
    from training.fleetlog import open_registry

    return open_registry(load_config(home=home), models)


def _where(reg: Any) -> str:
    return str(getattr(reg, "home", None) or reg)


@models_app.command("list")
def models_list(models: Optional[Path] = typer.Option(None, "--models"),
                home: Optional[Path] = typer.Option(None, "--home"),
                as_json: bool = typer.Option(False, "--json")) -> None:
    """List versions (the served one marked with *)."""
    reg = _fleet_or_local(models, home)
    vs = reg.versions()
    if as_json:
        echo_json([{"version": v.name, "current": v.current, "created_at": v.created_at,
                     "training_size": v.training_size, "valid": v.valid, "metrics": v.metrics} for v in vs])
        return
    if not vs:
        typer.echo(f"no model versions in {_where(reg)}")
        return
    for v in vs:
        acc = v.metrics.get("oof_top1_accuracy")
        typer.echo(f"{'*' if v.current else ' '} {v.name:32} {v.created_at:21} n={v.training_size:<7}"
                   + (f" cv-top1={acc:.3f}" if isinstance(acc, (int, float)) else "")
                   + ("" if v.valid else f"  INVALID: {v.problem}"))


@models_app.command("promote")
def models_promote(version: str = typer.Argument(...),
                   models: Optional[Path] = typer.Option(None, "--models"),
                   home: Optional[Path] = typer.Option(None, "--home")) -> None:
    """Serve VERSION (checked before the switch; fleet-wide with a store)."""
    reg = _fleet_or_local(models, home)
    _, token = reg.current()
    reg.promote(version, expected=token)   # refused if another promotion lands meanwhile
    typer.echo(f"promoted {version} in {_where(reg)}")


@models_app.command("push")
def models_push(directory: Path = typer.Argument(..., help="A saved version directory (flywheel train --out)."),
                promote: bool = typer.Option(False, "--promote", help="Also promote it (compare-and-swap)."),
                models: Optional[Path] = typer.Option(None, "--models"),
                home: Optional[Path] = typer.Option(None, "--home")) -> None:
    """Publish a locally trained version to the registry (create-only, manifest last)."""
    reg = _fleet_or_local(models, home)
    if not Path(directory).is_dir():
        raise InvalidInputError(f"{directory}: not a directory")
    name = reg.publish(Path(directory))
    typer.echo(f"pushed {name} to {_where(reg)}")
    if promote:
        _, token = reg.current()
        reg.promote(name, expected=token)
        typer.echo(f"promoted {name}")


@models_app.command("rollback")
def models_rollback(models: Optional[Path] = typer.Option(None, "--models"),
                    home: Optional[Path] = typer.Option(None, "--home")) -> None:
    """Serve the previously promoted version again (fleet-wide with a store)."""
    reg = _fleet_or_local(models, home)
    _, token = reg.current()
    typer.echo(f"rolled back to {reg.rollback(expected=token)}")


@models_app.command("prune")
def models_prune(keep_promoted: int = typer.Option(5, "--keep-promoted",
                                                   help="Keep the last N promoted versions (rollback depth)."),
                 keep_recent: int = typer.Option(3, "--keep-recent",
                                                 help="Keep the N newest versions, promoted or not."),
                 dry_run: bool = typer.Option(False, "--dry-run", help="Only list what would be removed."),
                 models: Optional[Path] = typer.Option(None, "--models"),
                 home: Optional[Path] = typer.Option(None, "--home")) -> None:
    """Delete old versions; the served one, the last promoted and the newest stay."""
    reg = _registry(models, home)
    total = len(reg.versions())
    if dry_run or not reg.home.is_dir():
        removed = reg.prune(keep_promoted=keep_promoted, keep_recent=keep_recent, dry_run=dry_run)
    else:  # never delete beside a running retrain (it saves, then promotes, a new version)
        with reg.lock() as taken:
            if not taken:
                raise FlywheelError(f"a retrain is running ({reg.home / RETRAIN_LOCK} is held); "
                                    "try again when it is done")
            removed = reg.prune(keep_promoted=keep_promoted, keep_recent=keep_recent)
    verb = "would remove" if dry_run else "removed"
    for name in removed:
        typer.echo(f"{verb} {name}")
    typer.echo(f"{'dry run: ' if dry_run else ''}{verb} {len(removed)} of {total} versions, "
               f"{total - len(removed)} kept, in {reg.home}")
