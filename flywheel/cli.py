"""The ``flywheel`` command line: one root that registers every command explicitly.

The commands are thin functions over the library, defined next to the code they drive
(:mod:`service.cli` for serving, :mod:`training.cli` for the offline jobs).
Settings resolve flag > environment variable > config file > default (see
:mod:`classifier.settings.config`). Errors print one line ``flywheel: error: ...`` and exit
with the error's code (2 for bad input or files, 3 for model problems).

Help is click's plain text, wrapped to the terminal (at most 78 columns) instead of cut
with "…"; :class:`FlywheelGroup` gives every option that takes a value the same metavar
in every command (:data:`METAVARS`, else by type), every argument one by its name
(``DECISION_ID``, ``TEXT...``: no typer ``{DECISION_ID}``, ``<str>``) and every command its
whole first paragraph in the command lists.
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Optional

import typer
from typer.core import TyperArgument, TyperGroup

from flywheel.classifier.errors import FlywheelError
from flywheel.service.cli import classify_command, serve_command
from flywheel.training.cli.check import check_command
from flywheel.training.cli.models import models_app
from flywheel.training.cli.offline import (
    eval_command,
    feedback_command,
    label_command,
    prune_log_command,
    stats_command,
    train_command,
)
from flywheel.training.cli.retrain import retrain_command
from flywheel.training.cli.review import review_command, ui_command

__all__ = ["DISTRIBUTION", "FlywheelGroup", "METAVARS", "app", "build_app", "distribution_version", "main",
           "usage_error_line"]

DISTRIBUTION = "flywheel-intent"

#: The value an option takes, by option name: the same in every command that has it.
METAVARS = {
    "--intents": "FILE", "--train": "FILE", "--test": "FILE", "--calibration": "FILE", "--log-db": "FILE",
    "--tls-cert": "FILE", "--tls-key": "FILE", "--export-label-studio": "FILE", "--import-label-studio": "FILE",
    "--home": "DIR", "--models": "DIR", "--out": "DIR", "--save": "DIR", "--plots": "DIR",
    "--model": "PATH", "--uds": "PATH", "--address": "HOST:PORT", "--metrics-address": "HOST", "--host": "HOST",
    "--port": "PORT", "--metrics-port": "PORT", "--teacher-host": "URL", "--admin-token": "TOKEN",
    "--author": "NAME", "--intent": "INTENT", "--tier": "TIER", "--layer": "LAYER", "--reason": "REASON",
    "--session": "ID", "--history": "JSON", "--declared-type": "TYPE", "--days": "DAYS",
    "--teacher": "MODE", "--tune-calibration": "MODE", "--dataset-format": "FORMAT", "--tune-objective": "OBJECTIVE",
    "--window": "WINDOW", "--oos-label": "LABEL", "--text-column": "COLUMN", "--label-column": "COLUMN",
    "--lang-column": "COLUMN", "--grace": "SECONDS", "--tune-budget": "SECONDS",
    "texts": "TEXT",   # an argument, by its name (one value; FlywheelArgument adds "..."); else the name upper-cased
}
#: Otherwise by the value's type (typer would write ``<str>``, ``<int range>``, ``<list[str]>``).
TYPE_METAVARS = {str: "TEXT", int: "INTEGER", float: "NUMBER"}


class FlywheelGroup(TyperGroup):
    """The root command: on construction it sets the metavar of every option in the tree that
    takes a value and has none, and each command's short help to its whole first paragraph
    (click would cut it with "..." in the list of commands; the list wraps it instead)."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        _settle_help(self)


class FlywheelArgument(TyperArgument):
    """An argument shown as click shows one, by its metavar alone: ``DECISION_ID``, ``[VERSION]``,
    ``TEXT...`` (typer writes ``{DECISION_ID}`` in the usage line and ``DECISION_ID <str>``,
    ``TEXTS <list[str]>`` in the list of arguments)."""

    def _shown(self) -> str:
        return str(self.metavar) + ("..." if self.nargs != 1 else "")

    def get_usage_pieces(self, ctx: Any) -> list[str]:
        shown = str(self.metavar) if self.required else f"[{self.metavar}]"
        return [shown + ("..." if self.nargs != 1 else "")]

    def get_help_record(self, ctx: Any) -> tuple[str, str] | None:
        record = super().get_help_record(ctx)
        return None if record is None else (self._shown(), record[1])


def _settle_help(command: Any) -> None:
    for param in command.params:
        if type(param) is TyperArgument:
            param.__class__ = FlywheelArgument   # built by typer from the signature; only its rendering differs
        if getattr(param, "is_flag", False) or getattr(param, "count", False) or param.metavar is not None:
            continue
        param.metavar = _metavar(param)
    for sub in getattr(command, "commands", {}).values():
        if sub.short_help is None and sub.help:
            sub.short_help = " ".join(sub.help.split("\n\n", 1)[0].replace("\b", " ").split())
        _settle_help(sub)


def _metavar(param: Any) -> str | None:
    named = next((METAVARS[o] for o in getattr(param, "opts", ()) if o in METAVARS), None)
    if named is not None:
        return named
    if param.param_type_name != "option":
        return str(param.name).upper()   # an argument: DECISION_ID, as the docstrings name it
    desc = param.type_descriptor
    if desc.is_choice:
        return "|".join(str(c) for c in desc.choices or ())
    if desc.is_path:
        return "PATH"
    args = getattr(desc.annotation, "__args__", None)   # List[str]: what one value is
    return TYPE_METAVARS.get(args[0] if args else desc.annotation, "VALUE")


def distribution_version() -> str:
    """The installed distribution's version (``flywheel --version``)."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # a checkout run without installing it
        return "unknown (not installed)"


def _version_option(value: bool) -> None:
    if value:
        typer.echo(f"{DISTRIBUTION} {distribution_version()}")
        raise typer.Exit()


def _root(version_: Optional[bool] = typer.Option(None, "--version", is_eager=True, callback=_version_option,
                                                  help="Print the version and exit.")) -> None:
    """flywheel: an intent classifier that gets cheaper the longer it runs."""


def build_app() -> typer.Typer:
    """A typer app with every flywheel command."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True,
                      cls=FlywheelGroup, rich_markup_mode=None, callback=_root,
                      help="flywheel: an intent classifier that gets cheaper the longer it runs.")
    app.command("classify")(classify_command)
    app.command("serve")(serve_command)
    app.command("train")(train_command)
    app.command("eval")(eval_command)
    app.command("feedback")(feedback_command)
    app.command("label")(label_command)
    app.command("review")(review_command)
    app.command("ui")(ui_command)
    app.command("retrain")(retrain_command)
    app.command("stats")(stats_command)
    app.command("prune-log")(prune_log_command)
    app.command("check")(check_command)
    app.add_typer(models_app, name="models")
    return app


app = build_app()


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the app, mapping flywheel errors to one-line messages."""
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
    except typer.TyperException as exc:  # usage errors (typer's bundled click): bad values, missing arguments
        if type(exc).__name__ == "NoArgsIsHelpError":   # `flywheel`, `flywheel models`: the help, as asked
            exc.show()  # type: ignore[attr-defined]
        else:
            typer.echo(usage_error_line(exc, sys.argv[1:] if argv is None else argv), err=True)
        return int(getattr(exc, "exit_code", 2))
    return int(rv) if isinstance(rv, int) else 0


def usage_error_line(exc: Exception, argv: list[str]) -> str:
    """A usage error (bad option value, unknown option, missing argument) as the one line
    every flywheel error is: ``flywheel: error: <click's message> (see flywheel CMD --help)``,
    CMD read from ``argv`` (click's parser errors carry no context to read it from)."""
    fmt = getattr(exc, "format_message", None)
    message = " ".join(str(fmt() if fmt is not None else exc).split())   # one line, whatever click wrote
    words, group = ["flywheel"], typer.main.get_command(app)
    for arg in argv:   # the leading subcommand names: `models promote`
        sub = getattr(group, "commands", {}).get(arg)
        if sub is None:
            break
        words.append(arg)
        group = sub
    return f"flywheel: error: {message} (see {' '.join(words)} --help)"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
