"""The options several offline commands share (:mod:`training.cli._options`) say the same in
every command that has them: they had drifted in about 20 copies ("flywheel home.",
"Traffic log database."). And the tuning default train, eval and retrain share is in each
one's ``--tune-encoder`` help."""

from __future__ import annotations

import typer

from flywheel.classifier.settings.config import HOME_HELP
from flywheel.cli import app
from flywheel.training.cli._options import LOG_DB_OPTION, MODELS_HELP, TUNE_DEFAULT_HELP

#: a command whose option says something else on purpose
OWN_HELP = {("models prune", "--models")}


def _commands() -> dict[str, object]:
    root = typer.main.get_command(app)
    out = {}
    for name, cmd in root.commands.items():
        out[name] = cmd
        for sub, subcmd in getattr(cmd, "commands", {}).items():
            out[f"{name} {sub}"] = subcmd
    return out


def _help_of(cmd: object, flag: str) -> str | None:
    return next((p.help for p in getattr(cmd, "params", []) if flag in getattr(p, "opts", ())), None)


def test_shared_options_say_the_same_in_every_command():
    want = {"--home": HOME_HELP, "--log-db": LOG_DB_OPTION.help, "--models": MODELS_HELP}
    seen = {flag: [] for flag in want}
    for name, cmd in _commands().items():
        for flag, text in want.items():
            got = _help_of(cmd, flag)
            if got is None or (name, flag) in OWN_HELP:
                continue
            seen[flag].append(name)
            assert got == text, f"flywheel {name} {flag}: {got!r}"
    # the rule sees the commands (so a clean result means something)
    assert {"train", "eval", "retrain", "feedback", "stats", "models promote", "check"} <= set(seen["--home"])
    assert {"retrain", "label", "review", "ui", "prune-log"} <= set(seen["--log-db"])
    assert {"train", "retrain", "models list", "models push"} <= set(seen["--models"])


def test_train_eval_and_retrain_state_the_one_tuning_default():
    commands = _commands()
    for name in ("train", "eval", "retrain"):
        text = _help_of(commands[name], "--tune-encoder")
        assert text is not None and TUNE_DEFAULT_HELP in text, name
        option = next(p for p in commands[name].params if "--tune-encoder" in p.opts)
        assert option.secondary_opts == ["--no-tune-encoder"], name
