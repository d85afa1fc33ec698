"""The ``flywheel`` command line: a thin typer layer over the library.

Settings resolve flag > environment variable > config file > default (see
:mod:`classifier.config`). Errors print one line ``flywheel: error: ...`` and exit
with the error's code (2 for bad input or files, 3 for model problems).
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any, List, Optional

import typer

from classifier.config import Config, load_config
from classifier.errors import FlywheelError

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True,
                  help="flywheel: an intent classifier that gets cheaper the longer it runs.")

HomeOpt = typer.Option(None, "--home", help="flywheel home (default: $FLYWHEEL_HOME or the user data dir)")


def _config(**flags: Any) -> Config:
    return load_config(**flags)


def _echo_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
    sys.stdout.flush()


@app.command()
def classify(
    texts: List[str] = typer.Argument(None, help="Queries to classify; '-' or none reads one per line from stdin."),
    model: Optional[str] = typer.Option(None, "--model", help="Model version dir or models home with CURRENT."),
    intents: Optional[str] = typer.Option(None, "--intents", help="Intent file for the default model."),
    declared_type: Optional[str] = typer.Option(None, "--declared-type", help="Caller-declared type: bypasses the layers."),
    session: Optional[str] = typer.Option(None, "--session", help="Session id: keeps a compact history."),
    history: Optional[str] = typer.Option(None, "--history", help='JSON list of {"label","text"} earlier turns.'),
    teacher: Optional[str] = typer.Option(None, "--teacher", help="ollama | off"),
    ollama_host: Optional[str] = typer.Option(None, "--ollama-host"),
    log: bool = typer.Option(True, "--log/--no-log", help="Log decisions to the DuckDB traffic log."),
    log_db: Optional[str] = typer.Option(None, "--log-db"),
    home: Optional[Path] = HomeOpt,
) -> None:
    """Classify queries; prints one JSON decision per line."""
    from training.serving import open_classifier

    cfg = _config(home=home, model=model, intents=intents, teacher=teacher, ollama_host=ollama_host, log_db=log_db)
    hist = None
    if history is not None:
        try:
            hist = json.loads(history)
        except json.JSONDecodeError as exc:
            raise typer.BadParameter(f"--history is not valid JSON: {exc}") from None
    items = [t for t in (texts or []) if t != "-"]
    from_stdin = not texts or "-" in texts
    served = open_classifier(cfg, log_decisions=log)
    clf = served.classifier
    try:
        # stdin is read line by line: each decision is printed as soon as it is made
        lines = (ln.rstrip("\n") for ln in sys.stdin if ln.strip()) if from_stdin else iter(())
        for text in itertools.chain(items, lines):
            d = clf.classify(text, history=hist, declared_type=declared_type, session_id=session)
            _echo_json(d.to_dict())
    finally:
        served.close()


@app.command()
def train(
    intents: Path = typer.Option(..., "--intents", help="Intent definition file (YAML or TOML)."),
    out: Path = typer.Option(..., "--out", help="Directory to write the model version into."),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bars."),
) -> None:
    """Fit layer 2 from an intent file and save a model version."""
    from classifier.intents import load_intents
    from classifier.trainer import fit_model

    intent_set = load_intents(intents)
    model = fit_model(intent_set, version=out.name, progress=not quiet)
    model.save(out)
    m = model.manifest
    if as_json:
        from dataclasses import asdict

        _echo_json(asdict(m))
        return
    typer.echo(f"saved {m.version} to {out}")
    typer.echo(f"  intents: {len(m.labels)} ({', '.join(m.labels)}); training examples: {m.training_size}")
    typer.echo(f"  encoder: {m.encoder['id']} ({m.encoder['dim']}-d)")
    typer.echo("  thresholds (learned by cross-validation): "
               + ", ".join(f"{k}={v:.3f}" for k, v in m.thresholds.items()))
    met = m.metrics
    typer.echo(f"  cross-validated: top-1 {met['oof_top1_accuracy']:.3f}, in-scope accuracy "
               f"{met['oof_in_scope_accuracy']:.3f}, ECE {met['oof_ece_raw']:.3f} -> {met['oof_ece']:.3f} "
               f"after temperature {met['temperature']:.2f}"
               + (f", out-of-scope recall {met['oof_oos_recall']:.3f}" if "oof_oos_recall" in met else ""))


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the typer app, mapping flywheel errors to one-line messages."""
    from typer._click import exceptions as click_exc  # typer bundles its own click

    _register_optional_commands()
    try:
        rv = app(args=argv, standalone_mode=False)
    except FlywheelError as exc:
        typer.echo(f"flywheel: error: {exc}", err=True)
        return exc.exit_code
    except typer.Exit as exc:
        return int(getattr(exc, "exit_code", 0) or 0)
    except typer.Abort:
        typer.echo("flywheel: aborted", err=True)
        return 130
    except KeyboardInterrupt:
        typer.echo("flywheel: interrupted", err=True)
        return 130
    except click_exc.ClickException as exc:  # usage errors: bad option values, missing arguments
        exc.show()
        return exc.exit_code
    return int(rv) if isinstance(rv, int) else 0


def _register_optional_commands() -> None:
    """Commands defined in sibling modules (eval, retrain, ...) register themselves here."""
    from training import cli_commands

    cli_commands.register(app)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
