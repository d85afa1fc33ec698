"""The ``flywheel`` command line: one root that registers every command explicitly.

The commands are thin functions over the library, defined next to the code they drive
(:mod:`service.cli` for serving, :mod:`training.cli` and friends for the offline jobs).
Settings resolve flag > environment variable > config file > default (see
:mod:`classifier.config`). Errors print one line ``flywheel: error: ...`` and exit
with the error's code (2 for bad input or files, 3 for model problems).
"""

from __future__ import annotations

import sys

import typer

from flywheel.classifier.errors import FlywheelError
from flywheel.service.cli import classify_command, serve_command
from flywheel.training.cli import (
    eval_command,
    feedback_command,
    label_command,
    prune_log_command,
    stats_command,
    train_command,
)
from flywheel.training.cli_models import models_app
from flywheel.training.cli_retrain import retrain_command
from flywheel.training.cli_review import review_command, ui_command

__all__ = ["app", "build_app", "main", "usage_error_line"]


def build_app() -> typer.Typer:
    """A typer app with every flywheel command."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True,
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
