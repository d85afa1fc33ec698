"""Every command's ``--help`` reads whole in an 80-column terminal, and ``--version`` says
which distribution this is (issue 32, item 10). Rendered in process through
:func:`flywheel.cli.main`, the way a user's ``flywheel CMD --help`` runs."""

from __future__ import annotations

import re
from importlib.metadata import version

import pytest
import typer

from flywheel.cli import build_app, main

WIDTH = 80          # the terminal
TEXT_WIDTH = 78     # click's help text: the terminal less its 2-column margin


def command_paths() -> list[tuple[list[str], object]]:
    """Every command of the tree, the root and the groups included, with its click object."""
    out: list[tuple[list[str], object]] = []

    def walk(cmd: object, path: list[str]) -> None:
        out.append((path, cmd))
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(build_app()), [])
    return out


PATHS = command_paths()


def render(capsys, monkeypatch, *args: str) -> str:
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    monkeypatch.delenv("LINES", raising=False)
    rc = main([*args, "--help"])
    out, err = capsys.readouterr()
    assert rc == 0 and err == "", err
    return out


def paragraphs(help_text: str) -> list[list[str]]:
    """The description's paragraphs (between the usage line and the first section)."""
    body = help_text.split("\n\n")
    out = []
    for block in body[1:]:
        if re.match(r"^[A-Z][a-z]+:$", block.splitlines()[0]):   # Options:, Arguments:, Commands:
            break
        out.append(block.splitlines())
    return out


@pytest.mark.parametrize("path", [p for p, _ in PATHS], ids=lambda p: " ".join(p) or "flywheel")
def test_help_reads_whole_at_80_columns(path, capsys, monkeypatch):
    out = render(capsys, monkeypatch, *path)
    assert out.startswith("Usage: ")
    long = [line for line in out.splitlines() if len(line) > WIDTH]
    assert not long, long
    assert "…" not in out                                                # nothing cut by a table
    assert not [ln for ln in out.splitlines() if ln.rstrip().endswith("...") and not ln.startswith("Usage")]
    assert "<bool>" not in out and not re.search(r"--[\w-]+ <", out)   # flags take no value; no <str>
    # nor typer's look for arguments: {DECISION_ID} in the usage line, DECISION_ID <str>, TEXTS <list[str]>
    assert not re.search(r"<(str|int|float|bool|path|list\[[^>]*\]|[a-z]+ range)>", out), out
    assert "<list[" not in out and not re.search(r"\{[A-Z][A-Z_]*\}", out), out
    assert not re.search(r"\b(training|classifier|service|logstore|fleet)\.[a-z_]+\b", out), out   # modules


@pytest.mark.parametrize("path", [p for p, _ in PATHS], ids=lambda p: " ".join(p) or "flywheel")
def test_descriptions_are_wrapped_at_the_width_not_where_the_docstring_broke(path, capsys, monkeypatch):
    out = render(capsys, monkeypatch, *path)
    paras = paragraphs(out)
    assert paras, out                                  # every command has a description
    for para in paras:
        assert all(len(line) <= TEXT_WIDTH + 2 for line in para), para   # within the width (2-column margin)
        for line, nxt in zip(para, para[1:]):
            # greedy wrapping: the next line's first word would not have fitted on this one
            assert len(line) + 1 + len(nxt.split()[0]) > TEXT_WIDTH, (line, nxt)


def test_the_command_lists_give_each_command_its_whole_first_paragraph(capsys, monkeypatch):
    for path, cmd in PATHS:
        subs = getattr(cmd, "commands", {})
        if not subs:
            continue
        out = render(capsys, monkeypatch, *path)
        listed = " ".join(out.split("Commands:\n", 1)[1].split())
        for name, sub in subs.items():
            first = " ".join(sub.help.split("\n\n", 1)[0].split())
            assert f"{name} {first}" in listed, (name, first)


def test_an_option_takes_the_same_metavar_in_every_command(capsys, monkeypatch):
    seen: dict[str, set[str]] = {}
    for path, _ in PATHS:
        for m in re.finditer(r"^  (--[\w-]+)(?:, --[\w-]+)* ([A-Z][A-Z:_|]*)\b", render(capsys, monkeypatch, *path),
                             re.M):
            seen.setdefault(m.group(1), set()).add(m.group(2))
    assert seen["--intents"] == {"FILE"} and seen["--home"] == {"DIR"} and seen["--log-db"] == {"FILE"}
    assert seen["--model"] == {"PATH"} and seen["--teacher-host"] == {"URL"}
    assert {k: v for k, v in seen.items() if len(v) > 1} == {}


def test_arguments_read_like_options_one_metavar_by_name(capsys, monkeypatch):
    feedback = render(capsys, monkeypatch, "feedback")
    assert feedback.splitlines()[0].endswith(" feedback [OPTIONS] DECISION_ID LABEL"), feedback
    assert re.search(r"^  DECISION_ID +The decision's id", feedback, re.M), feedback
    assert re.search(r"^  LABEL +The right label", feedback, re.M), feedback
    classify = render(capsys, monkeypatch, "classify")
    assert classify.splitlines()[0].endswith(" classify [OPTIONS] [TEXT]..."), classify
    assert re.search(r"^  TEXT\.\.\. +Queries to classify", classify, re.M), classify
    promote = render(capsys, monkeypatch, "models", "promote")
    assert promote.splitlines()[0].endswith(" models promote [OPTIONS] [VERSION]"), promote


def test_eval_names_every_tune_calibration_and_ui_no_module(capsys, monkeypatch):
    text = " ".join(render(capsys, monkeypatch, "eval").split())
    assert "--tune-calibration MODE auto | holdout | crossfit" in text and "else auto" in text
    assert "(training.review.app)" not in render(capsys, monkeypatch, "ui")


def test_version_prints_the_distributions_version(capsys):
    assert main(["--version"]) == 0
    out, err = capsys.readouterr()
    assert out == f"flywheel-intent {version('flywheel-intent')}\n" and err == ""
