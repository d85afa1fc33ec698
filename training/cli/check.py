"""``flywheel check``: what is served, what is configured, whether they agree (exit 0 / 1),
for a deploy step to run before it starts or rolls out the sidecar
(:func:`fleet.deployment.check_deployment`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from flywheel.classifier.settings.config import load_config
from flywheel.classifier.settings.output import echo_json
from flywheel.training.cli._options import HOME_OPTION, JSON_OPTION

__all__ = ["check_command"]


def check_command(intents: Optional[str] = typer.Option(None, "--intents", help="Intent file (default: the "
                                                                                 "intents setting)."),
                  model: Optional[str] = typer.Option(None, "--model", help="A version directory or models "
                                                                             "home (default: the model setting)."),
                  as_json: bool = JSON_OPTION,
                  home: Optional[Path] = HOME_OPTION) -> None:
    """Say what this deployment serves and what it is configured for; exit 1 when they
    disagree (a version of another intent set is served or named by CURRENT, or none fits)."""
    from flywheel.fleet.deployment import check_deployment
    from flywheel.fleet.site import open_site

    result = check_deployment(open_site(load_config(home=home, intents=intents, model=model)))
    if as_json:
        echo_json(result.to_dict())
    else:
        for line in result.lines():
            typer.echo(line)
    raise typer.Exit(0 if result.agree else 1)
