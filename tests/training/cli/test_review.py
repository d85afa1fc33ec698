"""``flywheel review`` (issue 25): the queue as JSON, and the keystroke walk whose labels
are human labels (held back one key so that ``u`` can take the last one back)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from flywheel.cli import build_app
from flywheel.logstore import LogStore
from flywheel.training.cli.review import Reviewer, show, walk
from flywheel.training.review.queue import review_queue
from tests.support.records import NOW, review_record, teacher_call
from tests.support.worlds import write

IDS = ("a" * 32, "b" * 32, "c" * 32)


@pytest.fixture
def logged(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    path = tmp_path / "log.duckdb"
    store = LogStore(path)
    write(store, [
        review_record(IDS[0], "docs or my plan?", "RETRIEVAL",
             teacher=teacher_call(None, False, candidates=("RETRIEVAL", "PLATFORM"))),
        review_record(IDS[1], "show my quota", "PLATFORM", teacher=teacher_call("PLATFORM")),
        review_record(IDS[2], "<b>bold</b> question", "PLATFORM", teacher=teacher_call("PLATFORM"), age_days=3),
    ])
    return path


def _human(path) -> dict:
    return {r.decision_id: r.human_label for r in LogStore(path).labelled_rows() if r.has_human_label}


def test_review_json_lists_the_queue(logged):
    res = CliRunner().invoke(build_app(), ["review", "--json", "--log-db", str(logged)])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["n"] == 3 and doc["items"][0]["decision_id"] == IDS[0]
    assert doc["items"][0]["reasons"] == ["unsure"] and doc["items"][0]["choices"][:2] == ["RETRIEVAL", "PLATFORM"]


def test_review_json_lists_every_intent_a_label_may_be_once(logged, tmp_path):
    from flywheel.training.cli.review import intents

    res = CliRunner().invoke(build_app(), ["review", "--json", "--log-db", str(logged)])
    doc = json.loads(res.output)
    # the starter intents are served: all of them, CONVERSATIONAL too though no item offers it, then out of scope
    assert doc["intents"] == ["RETRIEVAL", "CODE_GENERATION", "CONVERSATIONAL", "PLATFORM", "OUT_OF_SCOPE"]
    assert not any("CONVERSATIONAL" in it["choices"] for it in doc["items"])
    assert set(doc) == {"items", "n", "intents"} and "choices" in doc["items"][0]
    items = review_queue(LogStore(logged), now=NOW)
    served = ("BOOK", "PLATFORM", "HOURS", "RETRIEVAL", "CODE_GENERATION")
    assert intents(items, served) == [*served, "OUT_OF_SCOPE"]       # the served set whole, the items' or not
    assert intents(items, None) == ["RETRIEVAL", "PLATFORM", "CODE_GENERATION", "OUT_OF_SCOPE"]   # unknown: choices


def test_keystrokes_label_skip_and_undo(logged):
    # item 1: pick 2 (PLATFORM); item 2: out of scope, then undo it and skip; item 3: pick 1
    res = CliRunner().invoke(build_app(), ["review", "--log-db", str(logged), "--author", "ana"], input="2ous1q")
    assert res.exit_code == 0, res.output
    assert "labelled PLATFORM" in res.output and "undone" in res.output and "skipped" in res.output
    assert "labelled 2, skipped 1, 0 left" in res.output
    assert _human(logged) == {IDS[0]: "PLATFORM", IDS[2]: "PLATFORM"}    # the undone label never reached the log
    # labelled items leave the queue
    assert [it.decision_id for it in review_queue(LogStore(logged), now=NOW)] == [IDS[1]]


def test_end_of_input_writes_the_held_label(logged):
    res = CliRunner().invoke(build_app(), ["review", "--log-db", str(logged)], input="o")
    assert res.exit_code == 0, res.output
    assert _human(logged) == {IDS[0]: None}


def test_a_bad_filter_is_one_line(logged, capsys):
    from flywheel.cli import main

    assert main(["review", "--json", "--reason", "nope", "--log-db", str(logged)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flywheel: error: unknown review reason(s) 'nope'") and err.count("\n") == 1


def _item(did: str, choices=("PLATFORM", "RETRIEVAL")):
    from flywheel.training.review.queue import ReviewItem

    return ReviewItem(did, NOW, "text", "PLATFORM", 0.5, "weak", "llm", "PLATFORM", "PLATFORM", None, None, (),
                      ("teacher_vs_l2",), 1.0, choices)


def test_the_reviewer_holds_the_last_label_back_until_the_next_key():
    written = []
    r = Reviewer([_item("1"), _item("2"), _item("3")], lambda d, lab: written.append((d, lab)))
    assert r.press("u") == "nothing to undo"
    assert r.press("2") == "labelled RETRIEVAL" and written == []          # held back
    assert r.press("9").startswith("unknown key") and r.position == 1       # only 2 choices
    assert r.press("o") == "labelled OUT_OF_SCOPE" and written == [("1", "RETRIEVAL")]
    assert r.press("u") == "undone" and r.position == 1 and r.labelled == 1
    assert r.press("u") == "nothing to undo"                                # one step back only
    assert r.press("s") == "skipped" and r.press("1") == "labelled PLATFORM" and r.done
    assert r.press("1") == "the queue is done"
    r.close()
    assert written == [("1", "RETRIEVAL"), ("3", "PLATFORM")] and (r.labelled, r.skipped) == (2, 1)


def test_walk_stops_on_q_and_writes_what_it_holds():
    written = []
    r = Reviewer([_item("1"), _item("2")], lambda d, lab: written.append((d, lab)))
    walk(r, getchar=iter(["1", "q"]).__next__)
    assert written == [("1", "PLATFORM")]
    empty = Reviewer([], lambda d, lab: written.append((d, lab)))
    walk(empty, getchar=iter([]).__next__)       # an empty queue reads no key
    assert written == [("1", "PLATFORM")]


def test_show_prints_text_as_text():
    from flywheel.training.review.queue import ReviewItem

    item = ReviewItem("x" * 32, NOW, "<script>alert(1)</script>", "PLATFORM", 0.5, "weak", "llm", "PLATFORM",
                      None, "RETRIEVAL", None, ("PLATFORM", None), ("unsure",), 1.0, ("PLATFORM", "RETRIEVAL"))
    out = show(item, 0, 1)
    assert "'<script>alert(1)</script>'" in out and "shadow: RETRIEVAL" in out
    assert "1) PLATFORM  2) RETRIEVAL  o) OUT_OF_SCOPE" in out and "teacher: PLATFORM, OUT_OF_SCOPE" in out


def test_the_walk_shows_layer_2s_own_answer_where_it_differs_from_the_served_one(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    path = tmp_path / "log.duckdb"
    write(LogStore(path), [
        review_record(IDS[0], "show my quota", "PLATFORM", l2="RETRIEVAL", teacher=teacher_call("PLATFORM")),
        review_record(IDS[1], "tell me a joke", "PLATFORM", l2=None, teacher=teacher_call("PLATFORM"), age_days=1),
        review_record(IDS[2], "my plan", "PLATFORM", l2="PLATFORM", teacher=teacher_call("CODE_GENERATION"),
                      age_days=2),
    ])
    res = CliRunner().invoke(build_app(), ["review", "--log-db", str(path)], input="sssq")
    assert res.exit_code == 0, res.output
    items = res.output.split("[")[1:]
    assert "layer 2: RETRIEVAL (0.50)" in items[0] and "teacher: PLATFORM" in items[0]
    assert "layer 2: OUT_OF_SCOPE (0.50)" in items[1]
    assert "layer 2:" not in items[2]            # the same as the served answer: said once
    doc = json.loads(CliRunner().invoke(build_app(), ["review", "--json", "--log-db", str(path)]).output)
    assert [it["l2_confidence"] for it in doc["items"]] == [0.5, 0.5, 0.5]


SERVED = ("RETRIEVAL", "PLATFORM", "CODE_GENERATION", "CONVERSATIONAL", "BILLING_DISPUTE_ESCALATION",
          "ACCOUNT_RECOVERY", "OUT_OF_OFFICE_HOURS", "DATA_EXPORT", "TEAM_MANAGEMENT", "SSO_SETUP")


@pytest.mark.parametrize("width", [80, 60])
def test_the_walk_fits_the_terminal_and_never_splits_a_name_or_a_key_hint(logged, width):
    from flywheel.training.cli.review import KEY_HINTS

    res = CliRunner().invoke(build_app(), ["review", "--log-db", str(logged)], input="xq",
                             env={"COLUMNS": str(width)})
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert all(len(line) <= width for line in lines if not line.startswith("[")), res.output   # the text aside
    for hint in KEY_HINTS:      # the header and the unknown key's answer: every hint whole on one line
        assert sum(hint in line for line in lines) == 2, (hint, res.output)
    assert any("o) OUT_OF_SCOPE" in line for line in lines) and any("/) find any intent" in line for line in lines)
    # many long intent names: each numbered choice whole on one line
    item = review_queue(LogStore(logged), now=NOW, labels=SERVED)[0]
    out = show(item, 0, 1, SERVED, width=width).splitlines()
    assert all(len(line) <= width for line in out[1:]), out
    for n, name in enumerate([*item.choices, *(s for s in SERVED if s not in item.choices)][:9], 1):
        assert any(f"{n}) {name}" in line for line in out), (name, out)
    assert any("o) OUT_OF_SCOPE" in line for line in out) and any("/) find any intent" in line for line in out)


def test_label_studio_round_trip(logged, tmp_path, capsys):
    from flywheel.cli import main

    out = tmp_path / "tasks.json"
    assert main(["review", "--export-label-studio", str(out), "--log-db", str(logged)]) == 0
    tasks = json.loads(out.read_text())
    assert [t["data"]["decision_id"] for t in tasks] == list(IDS)
    pre = tasks[0]["predictions"][0]
    assert pre["result"][0]["value"]["choices"] == ["RETRIEVAL"] and pre["score"] == 0.9
    assert tasks[0]["data"]["candidates"] == "RETRIEVAL, PLATFORM"
    config = out.with_suffix(".xml").read_text()
    assert '<Choices name="intent" toName="text"' in config and '<Choice value="OUT_OF_SCOPE"/>' in config
    # what Label Studio's JSON export gives back: annotations on the tasks (one cancelled, one task left undone)
    tasks[0]["annotations"] = [{"id": 1, "completed_by": 7, "was_cancelled": False, "updated_at": "2026-11-27T10:00",
                                "result": [{"from_name": "intent", "to_name": "text", "type": "choices",
                                            "value": {"choices": ["PLATFORM"]}}]}]
    tasks[1]["annotations"] = [{"id": 2, "was_cancelled": True, "result": []}]
    tasks[2]["annotations"] = [{"id": 3, "completed_by": {"email": "ana@example.com"}, "updated_at": "2026-11-27",
                                "result": [{"from_name": "intent", "to_name": "text", "type": "choices",
                                            "value": {"choices": ["OUT_OF_SCOPE"]}}]}]
    done = tmp_path / "export.json"
    done.write_text(json.dumps(tasks))
    capsys.readouterr()
    assert main(["review", "--import-label-studio", str(done), "--log-db", str(logged)]) == 0
    assert "recorded 2 human label(s)" in capsys.readouterr().out
    assert _human(logged) == {IDS[0]: "PLATFORM", IDS[2]: None}
    authors = {r.decision_id: r.human_author for r in LogStore(logged).labelled_rows() if r.has_human_label}
    assert authors == {IDS[0]: "label-studio:7", IDS[2]: "label-studio:ana@example.com"}


@pytest.mark.parametrize("tasks, words", [
    ({"not": "a list"}, "a JSON list of tasks"),
    ([{"data": {"text": "x"}}], "task 0: data.decision_id is missing"),
    ([{"id": 9, "data": {"decision_id": IDS[0]}, "annotations": [{"result": [
        {"from_name": "intent", "value": {"choices": ["NOPE"]}}]}]}], "task 0 (id 9): unknown choice 'NOPE'"),
    ([{"data": {"decision_id": IDS[0]}, "annotations": [{"result": [
        {"from_name": "intent", "value": {"choices": ["PLATFORM", "RETRIEVAL"]}}]}]}], "exactly one choice"),
    ([{"data": {"decision_id": IDS[0]}, "annotations": [{"result": [
        {"from_name": "intent", "value": {"choices": ["PLATFORM"]}}]}]},
      {"data": {"decision_id": "f" * 32}, "annotations": [{"result": [
          {"from_name": "intent", "value": {"choices": ["PLATFORM"]}}]}]}], "not in the log"),
])
def test_a_malformed_label_studio_import_names_the_task_and_writes_nothing(logged, tmp_path, capsys, tasks, words):
    from flywheel.cli import main

    path = tmp_path / "bad.json"
    path.write_text(json.dumps(tasks))
    assert main(["review", "--import-label-studio", str(path), "--log-db", str(logged)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flywheel: error: ") and words in err and err.count("\n") == 1, err
    assert _human(logged) == {}


# issue 32: any intent of the served set, merged identical texts, out of scope shown as such,
# no terminal, undo after a skip, long texts clipped

def _labels_of(path) -> list:
    return sorted((r.decision_id, r.human_label) for r in LogStore(path).labelled_rows() if r.has_human_label)


def test_an_intent_outside_the_items_choices_reaches_the_log_from_the_terminal(logged):
    # the starter intents are served; CONVERSATIONAL is none of the first item's choices
    items = review_queue(LogStore(logged), now=NOW, labels=("RETRIEVAL", "CODE_GENERATION", "CONVERSATIONAL",
                                                            "PLATFORM"))
    assert items[0].decision_id == IDS[0] and "CONVERSATIONAL" not in items[0].choices
    res = CliRunner().invoke(build_app(), ["review", "--log-db", str(logged)], input="/conv\n/quo\x7f\x7f\x7fret\nq",
                             env={"COLUMNS": "200"})     # a wide terminal: the choices on one line
    assert res.exit_code == 0, res.output
    assert "find 'conv': CONVERSATIONAL; Enter picks CONVERSATIONAL" in res.output
    assert _human(logged) == {IDS[0]: "CONVERSATIONAL", IDS[1]: "RETRIEVAL"}
    # the numbers go on past the likely ones into the rest of the served set
    assert "1) RETRIEVAL  2) PLATFORM  3) CODE_GENERATION  |  4) CONVERSATIONAL  o) OUT_OF_SCOPE" in res.output


def test_the_reviewer_picks_any_served_intent():
    written = []
    served = ("BOOK", "CANCEL", "HOURS", "PLATFORM", "RETRIEVAL")
    r = Reviewer([_item("1"), _item("2"), _item("3")], lambda d, lab: written.append((d, lab)), served)
    assert r.numbered(r.current) == ("PLATFORM", "RETRIEVAL", "BOOK", "CANCEL", "HOURS")
    assert r.press("5") == "labelled HOURS"
    assert r.press("/").startswith("find '': PLATFORM, RETRIEVAL, BOOK, CANCEL, HOURS, OUT_OF_SCOPE")
    assert r.press("q").startswith("find 'q': no intent matches") and r.finding      # q is a letter here
    assert r.press("\x08") and r.press("H") == "find 'H': HOURS; Enter picks HOURS, Esc cancels"
    assert r.press("\r") == "labelled HOURS" and not r.finding
    assert r.press("/") and r.press("\x1b") == "find cancelled" and r.position == 2
    assert r.press("/") and r.press("scope") and r.press("\n") == "labelled OUT_OF_SCOPE"
    r.close()
    assert written == [("1", "HOURS"), ("2", "HOURS"), ("3", None)]


def test_find_puts_the_exact_name_first_then_the_ones_it_starts():
    from flywheel.training.cli.review import find

    names = ["PHONE_HOURS", "HOURS", "HOURS_HOLIDAY", "BOOK"]
    assert find("hours", names) == ["HOURS", "HOURS_HOLIDAY", "PHONE_HOURS"]
    assert find("phone hours", names) == ["PHONE_HOURS"] and find("", names) == names


@pytest.fixture
def repeated(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    path = tmp_path / "log.duckdb"
    write(LogStore(path), [
        review_record(IDS[0], "what are your hours", "RETRIEVAL", teacher=teacher_call("PLATFORM")),
        review_record(IDS[1], "what are your hours ", "RETRIEVAL", teacher=teacher_call("PLATFORM"), age_days=1),
        review_record(IDS[2], "what are your hours", "RETRIEVAL", teacher=teacher_call("PLATFORM"), age_days=2),
        review_record("d" * 32, "tell me a joke", "RETRIEVAL", teacher=teacher_call(None), age_days=3),
    ])
    return path


def test_identical_texts_are_labelled_once_for_all_of_them(repeated):
    res = CliRunner().invoke(build_app(), ["review", "--log-db", str(repeated)], input="1q")
    assert res.exit_code == 0, res.output
    assert "2 items to review" in res.output
    assert "3 decisions with this text: one label answers them all" in res.output
    assert "labelled PLATFORM (3 decisions with this text)" in res.output
    assert "labelled 1 (3 decisions), skipped 0, 1 left" in res.output
    assert _labels_of(repeated) == [(did, "PLATFORM") for did in IDS]
    # undone before the next key: nothing of it reaches the log
    res = CliRunner().invoke(build_app(), ["review", "--log-db", str(repeated)], input="1uq")
    assert _labels_of(repeated) == [(did, "PLATFORM") for did in IDS]


def test_the_teachers_out_of_scope_answer_shows_as_such(repeated, tmp_path, capsys):
    from flywheel.cli import main

    res = CliRunner().invoke(build_app(), ["review", "--json", "--log-db", str(repeated)])
    items = {it["text"]: it for it in json.loads(res.output)["items"]}
    assert items["tell me a joke"]["teacher_label"] == "OUT_OF_SCOPE" and items["tell me a joke"]["teacher_answered"]
    assert items["what are your hours"]["count"] == 3 and items["what are your hours"]["decision_ids"] == list(IDS)
    res = CliRunner().invoke(build_app(), ["review", "--log-db", str(repeated)], input="s")
    assert "teacher: OUT_OF_SCOPE" in res.output
    # Label Studio: the teacher column says so too, and one annotation labels every decision with the text
    out = tmp_path / "tasks.json"
    assert main(["review", "--export-label-studio", str(out), "--log-db", str(repeated)]) == 0
    tasks = json.loads(out.read_text())
    assert [t["data"]["teacher"] for t in tasks] == ["PLATFORM", "OUT_OF_SCOPE"]
    assert tasks[0]["data"]["decision_ids"] == list(IDS) and tasks[0]["data"]["count"] == 3
    tasks[0]["annotations"] = [{"id": 1, "result": [{"from_name": "intent", "to_name": "text", "type": "choices",
                                                     "value": {"choices": ["CONVERSATIONAL"]}}]}]
    done = tmp_path / "export.json"
    done.write_text(json.dumps(tasks))
    capsys.readouterr()
    assert main(["review", "--import-label-studio", str(done), "--log-db", str(repeated)]) == 0
    assert "recorded 3 human label(s)" in capsys.readouterr().out
    assert _labels_of(repeated) == [(did, "CONVERSATIONAL") for did in IDS]


@pytest.mark.slow   # starts flywheel as a process
def test_without_a_terminal_review_says_so_in_one_line(logged, tmp_path):
    import os
    import subprocess
    import sys

    # stdin from /dev/null and a new session: no controlling terminal, so /dev/tty cannot be opened
    res = subprocess.run([sys.executable, "-m", "flywheel", "review", "--log-db", str(logged)],
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
                         start_new_session=True, env={**os.environ, "FLYWHEEL_HOME": str(tmp_path / "home")})
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("flywheel: error: ") and res.stderr.count("\n") == 1, res.stderr
    assert "--json" in res.stderr and "flywheel ui" in res.stderr
    assert _human(logged) == {}


def test_undo_after_a_skip_goes_back_to_the_skipped_item(logged):
    r = Reviewer([_item("1"), _item("2")], lambda d, lab: None)
    assert r.press("s") == "skipped" and r.press("u") == "undone: back to the skipped item"
    assert (r.position, r.skipped) == (0, 0) and r.press("u") == "nothing to undo"
    res = CliRunner().invoke(build_app(), ["review", "--log-db", str(logged)], input="su1q")
    assert res.exit_code == 0, res.output
    assert _human(logged) == {IDS[0]: "RETRIEVAL"} and "labelled 1, skipped 0, 2 left" in res.output


def test_an_unknown_key_answers_in_one_line_and_a_long_text_is_clipped(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    path = tmp_path / "log.duckdb"
    long = "please " + "x" * 4_000 + " END"
    write(LogStore(path), [review_record(IDS[0], long, "RETRIEVAL", teacher=teacher_call("PLATFORM"))])
    res = CliRunner().invoke(build_app(), ["review", "--log-db", str(path)], input="xzfq")
    assert res.exit_code == 0, res.output
    assert res.output.count("'please xxx") == 2                # shown once, and once more in full for f
    assert res.output.count(" END'") == 1 and "(+3,711 characters: f shows all)" in res.output
    assert res.output.count("unknown key 'x'") == 1 and res.output.count("served RETRIEVAL") == 1
    assert max(len(line) for line in res.output.splitlines() if "END" not in line) < 400
