"""Serving commands of the ``flywheel`` command line (registered in :mod:`flywheel.cli`)."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from classifier.config import HOME_HELP, load_config
from service.runtime import open_runtime

__all__ = ["classify_command"]


def _echo_json(obj: object) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def classify_command(
    texts: List[str] = typer.Argument(None,
                                      help="Queries to classify; '-' or none reads one per line from stdin."),
    model: Optional[str] = typer.Option(None, "--model", help="Model version dir or models home with CURRENT."),
    intents: Optional[str] = typer.Option(None, "--intents", help="Intent file for the default model."),
    declared_type: Optional[str] = typer.Option(None, "--declared-type",
                                                help="Caller-declared type: bypasses the layers."),
    session: Optional[str] = typer.Option(None, "--session", help="Session id: keeps a compact history."),
    history: Optional[str] = typer.Option(None, "--history", help='JSON list of {"label","text"} earlier turns.'),
    teacher: Optional[str] = typer.Option(None, "--teacher", help="ollama | off"),
    ollama_host: Optional[str] = typer.Option(None, "--ollama-host"),
    log: bool = typer.Option(True, "--log/--no-log", help="Log decisions to the DuckDB traffic log."),
    log_db: Optional[str] = typer.Option(None, "--log-db"),
    home: Optional[Path] = typer.Option(None, "--home", help=HOME_HELP),
) -> None:
    """Classify queries; prints one JSON decision per line."""
    cfg = load_config(home=home, model=model, intents=intents, teacher=teacher, ollama_host=ollama_host,
                      log_db=log_db)
    hist = None
    if history is not None:
        try:
            hist = json.loads(history)
        except json.JSONDecodeError as exc:
            raise typer.BadParameter(f"--history is not valid JSON: {exc}") from None
    items = [t for t in (texts or []) if t != "-"]
    from_stdin = not texts or "-" in texts
    runtime = open_runtime(cfg, log_decisions=log)
    clf = runtime.classifier
    try:
        # stdin is read line by line: each decision is printed as soon as it is made
        lines = (ln.rstrip("\n") for ln in sys.stdin if ln.strip()) if from_stdin else iter(())
        for text in itertools.chain(items, lines):
            d = clf.classify(text, history=hist, declared_type=declared_type, session_id=session)
            _echo_json(d.to_dict())
    finally:
        runtime.close()
