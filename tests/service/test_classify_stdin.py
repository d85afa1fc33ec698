"""``flywheel classify`` with no query reads stdin; when a person types at it (stdin is a
terminal) it says so on stderr first, instead of waiting without a word (issue 44)."""

from __future__ import annotations

import io
import json
import os
from types import SimpleNamespace

import pytest

from flywheel.cli import main
from flywheel.service.cli import STDIN_HINT


class _Decision:
    def __init__(self, text: str) -> None:
        self.text = text

    def to_dict(self) -> dict:
        return {"text": self.text}


@pytest.fixture
def runtime(monkeypatch):
    """A stand-in for the served runtime (no model is loaded): it answers with the text."""
    import flywheel.service.runtime as rt

    seen: list[str] = []

    def classify(text, **_):
        seen.append(text)
        return _Decision(text)

    monkeypatch.setattr(rt, "open_runtime", lambda *a, **k: SimpleNamespace(
        classifier=SimpleNamespace(classify=classify), close=lambda: None))
    return seen


def _terminal(monkeypatch, text: str) -> tuple[int, io.TextIOWrapper]:
    """stdin as a pseudo-terminal holding ``text`` (then end of input)."""
    leader, follower = os.openpty()
    os.write(leader, text.encode() + b"\x04")          # Ctrl-D: end of input on a terminal
    stdin = os.fdopen(follower, "r")
    monkeypatch.setattr("sys.stdin", stdin)
    return leader, stdin


def test_classify_with_no_query_at_a_terminal_says_it_reads_stdin(runtime, monkeypatch, capsys):
    leader, stdin = _terminal(monkeypatch, "where is my parcel\n")
    try:
        assert stdin.isatty()
        assert main(["classify", "--no-log"]) == 0
    finally:
        stdin.close()
        os.close(leader)
    out, err = capsys.readouterr()
    assert err == STDIN_HINT + "\n" and "one per line" in err and "Ctrl-D" in err
    assert [json.loads(x) for x in out.splitlines()] == [{"text": "where is my parcel"}]   # stdout: decisions only
    assert runtime == ["where is my parcel"]


@pytest.mark.parametrize("args, stdin", [(["hello"], io.StringIO("")), ([], io.StringIO("hello\n")),
                                         (["-"], io.StringIO("hello\n"))])
def test_a_query_given_or_piped_gets_no_hint(runtime, monkeypatch, capsys, args, stdin):
    monkeypatch.setattr("sys.stdin", stdin)
    assert main(["classify", "--no-log", *args]) == 0
    out, err = capsys.readouterr()
    assert err == "" and json.loads(out) == {"text": "hello"}
