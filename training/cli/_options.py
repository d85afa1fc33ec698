"""The options several offline commands share, one object each (as :mod:`service.cli` shares
the serving commands'), so a flag says the same in every command that has it."""

from __future__ import annotations

from typing import Any

import typer

from flywheel.classifier.settings.config import HOME_HELP

__all__ = ["HOME_OPTION", "JSON_OPTION", "LOG_DB_OPTION", "MODELS_HELP", "MODELS_OPTION", "QUIET_OPTION",
           "TUNE_BUDGET_OPTION", "TUNE_DEFAULT_HELP", "tune_encoder_option"]

MODELS_HELP = "Local models home (default: <home>/models; with a store, the local copy of the fleet's)."
#: the one tuning default of train, eval and retrain (training.options.tune_for), as each command's help says it
TUNE_DEFAULT_HELP = ("default, the same for train, eval and retrain: the intent file's embedder.tune; left out, on "
                     "for minilm and e5-multilingual; embedder.tune: off, FLYWHEEL_TUNE_ENCODER=off or tune_encoder "
                     "= false in the config file turn it off")

HOME_OPTION = typer.Option(None, "--home", help=HOME_HELP)
LOG_DB_OPTION = typer.Option(None, "--log-db", help="Traffic log DuckDB file (default: <home>/log/flywheel.duckdb).")
MODELS_OPTION = typer.Option(None, "--models", help=MODELS_HELP)
JSON_OPTION = typer.Option(False, "--json", help="Print one JSON object.")
QUIET_OPTION = typer.Option(False, "--quiet", help="No progress bars or messages.")
TUNE_BUDGET_OPTION = typer.Option(None, "--tune-budget", help="Seconds the encoder tuning may take (default: "
                                                              "embedder.tune.budget_s, else 900).")


def tune_encoder_option(what: str) -> Any:
    """``--tune-encoder/--no-tune-encoder``: ``what`` it does in this command, then the
    default every command shares (:data:`TUNE_DEFAULT_HELP`)."""
    return typer.Option(None, "--tune-encoder/--no-tune-encoder", help=f"{what} ({TUNE_DEFAULT_HELP}).")
