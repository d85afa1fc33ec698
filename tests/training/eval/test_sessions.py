"""Multi-turn test files for ``flywheel eval`` (issue 43, :mod:`training.eval.sessions`): each
turn is classified with its session's history (gold labels of the earlier turns, or the file's
``history`` column), the report gains ``followups`` (accuracy, served out of scope, by
language) and keeps every key a single-turn file gives, and a malformed file is one line that
names the line and the column. The encoder is a fake: nothing loads a model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flywheel.classifier.protocols import HistoryEntry
from flywheel.training.eval.loaders import DatasetError, load_labelled
from flywheel.training.eval.sessions import read_turns
from tests.support.docs import OOS_WORDS, TOPICS, topic_examples


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


W, M = topic_examples(TOPICS["weather"]), topic_examples(TOPICS["music"])
# two sessions, rows out of turn order; the follow-ups in English and German
SESSIONS = [
    {"session": "s1", "turn": 1, "text": "and that one?", "label": "weather", "lang": "en", "kind": "referential"},
    {"session": "s1", "turn": 0, "text": W[0], "label": "weather", "lang": "en", "kind": "self_contained"},
    {"session": "s2", "turn": 0, "text": M[0], "label": "music", "lang": "de", "kind": "self_contained"},
    {"session": "s2", "turn": 1, "text": "und das andere?", "label": "music", "lang": "de", "kind": "referential"},
    {"session": "s2", "turn": 2, "text": topic_examples(OOS_WORDS, 20)[15], "label": "oos", "lang": "de",
     "kind": "out_of_scope"},
]


def _turns(path: Path, size: int = 6):
    return read_turns(path, load_labelled(path), history_size=size)


def test_a_turn_has_its_sessions_earlier_turns_with_their_gold_labels(tmp_path):
    turns = _turns(_write_jsonl(tmp_path / "t.jsonl", SESSIONS))
    assert turns is not None and (turns.source, turns.sessions) == ("session", 2)
    assert turns.histories[1] == () and turns.histories[2] == ()
    assert turns.histories[0] == (HistoryEntry.of("weather", W[0]),)
    assert turns.histories[4] == (HistoryEntry.of("music", M[0]), HistoryEntry("music", "und das andere?"))
    assert turns.followup == [True, False, False, True, False]
    assert _turns(tmp_path / "t.jsonl", size=1).histories[4] == (HistoryEntry("music", "und das andere?"),)


def test_a_history_column_in_the_compact_form_is_used_as_it_is(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text('text,label,history\n"and that one?",weather,"[[""weather"", ""rain forecast""]]"\n'
                    f"{W[1]},weather,\n", encoding="utf-8")
    turns = _turns(path)
    assert turns is not None and (turns.source, turns.sessions, turns.followup) == ("history", None, None)
    assert turns.histories == [(HistoryEntry("weather", "rain forecast"),), ()]


def test_a_bad_history_cell_of_a_csv_names_its_line_and_column(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(f'text,label,history\n{W[1]},weather,\n"and that one?",weather,"[weather"\n', encoding="utf-8")
    with pytest.raises(DatasetError, match=r"t\.csv: line 3, column 'history': not valid JSON"):
        _turns(path)


def test_a_single_turn_file_has_no_turns(tmp_path):
    assert _turns(_write_jsonl(tmp_path / "t.jsonl", [{"text": W[0], "label": "weather"}])) is None


@pytest.mark.parametrize("rows, message", [
    ([{"session": "s", "text": "x", "label": "a"}], "a multi-turn file needs a 'turn' column beside 'session'"),
    ([{"turn": 0, "text": "x", "label": "a"}], "a multi-turn file needs a 'session' column beside 'turn'"),
    ([{"session": "s", "turn": "first", "text": "x", "label": "a"}],
     "t.jsonl: line 1: column 'turn' must be an integer (the turn's order), got 'first'"),
    ([{"session": "s", "turn": 0, "text": "x", "label": "a"}, {"session": "s", "turn": 0, "text": "y", "label": "a"}],
     "t.jsonl: line 2, column 'turn': turn 0 of session 's' appears twice"),
    ([{"session": None, "turn": 0, "text": "x", "label": "a"}],
     "t.jsonl: line 1: column 'session' must be a non-empty string or number, got None"),
    ([{"history": [["a"]], "text": "x", "label": "a"}], "t.jsonl: line 1, column 'history': history entry #1"),
    ([{"history": "oops", "text": "x", "label": "a"}], "t.jsonl: line 1, column 'history': not valid JSON"),
])
def test_a_malformed_multi_turn_file_is_one_line_naming_the_line_and_the_column(tmp_path, rows, message):
    path = _write_jsonl(tmp_path / "t.jsonl", rows)
    with pytest.raises(DatasetError) as err:
        _turns(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def _train(tmp_path: Path) -> Path:
    rows = [{"text": t, "label": name} for name, words in TOPICS.items() for t in topic_examples(words)]
    rows += [{"text": t, "label": "oos"} for t in topic_examples(OOS_WORDS)]
    return _write_jsonl(tmp_path / "train.jsonl", rows)


def test_cli_eval_reports_followups_by_language_and_keeps_every_single_turn_key(tmp_path, fake_encoder, capsys):
    from flywheel.cli import main

    train, multi = _train(tmp_path), _write_jsonl(tmp_path / "multi.jsonl", SESSIONS)
    single = _write_jsonl(tmp_path / "single.jsonl", [{k: r[k] for k in ("text", "label", "lang")} for r in SESSIONS])
    args = ["eval", "--train", str(train), "--json", "--quiet", "--latency-sample", "0"]
    reports = {}
    for name, path in (("multi", multi), ("single", single)):
        assert main([*args, "--test", str(path)]) == 0
        reports[name] = json.loads(capsys.readouterr().out)
    fu = reports["multi"]["followups"]
    assert (fu["source"], fu["history"], fu["sessions"], fu["turns"], fu["n"]) == ("kind", "gold", 2, 5, 2)
    assert fu["accuracy"] == 1.0 and fu["served_out_of_scope"] == 0.0     # resolved with the anchor's snippet
    assert fu["by_language"] == {"de": {"n": 1, "accuracy": 1.0, "served_out_of_scope": 0.0},
                                 "en": {"n": 1, "accuracy": 1.0, "served_out_of_scope": 0.0}}
    assert "followups" not in reports["single"]
    assert set(reports["single"]) <= set(reports["multi"])      # new keys only

    assert main(["eval", "--train", str(train), "--quiet", "--latency-sample", "0", "--test", str(multi)]) == 0
    text = capsys.readouterr().out
    assert "Follow-ups (2 sessions, 5 turns; history: gold labels of the earlier turns; follow-ups by the " \
           "file's kind column):" in text
    assert "  de            1    100.0%                 0.0%" in text


def test_without_a_kind_column_the_detector_says_which_turns_are_followups(tmp_path, fake_encoder):
    from flywheel.training.eval.run import EvalOptions, run_eval

    rows = [{k: v for k, v in r.items() if k != "kind"} for r in SESSIONS]
    run = run_eval(EvalOptions(_write_jsonl(tmp_path / "t.jsonl", rows), train=_train(tmp_path), latency_sample=0,
                               progress=False))
    fu = run.report["followups"]
    assert (fu["source"], fu["n"], sorted(fu["by_language"])) == ("detector", 2, ["de", "en"])


def test_a_malformed_multi_turn_file_fails_the_command_in_one_line(tmp_path, fake_encoder, capsys):
    from flywheel.cli import main

    bad = _write_jsonl(tmp_path / "bad.jsonl", [{**SESSIONS[0], "turn": "x"}])
    rc = main(["eval", "--train", str(_train(tmp_path)), "--test", str(bad), "--quiet", "--latency-sample", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and "bad.jsonl: line 1: column 'turn' must be an integer" in err and "Traceback" not in err
