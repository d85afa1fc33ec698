"""Tests of the convergence statistics (training.stats.traffic) on a hand-built traffic log.

The log (10 decisions over two UTC days) and every expected number:

====  =====  =========  ========  =========  ====================  ==================================
id    day    layer      label     tier       layer 2 (l2_label)    flags / labels
====  =====  =========  ========  =========  ====================  ==================================
d01   1      declared   billing   confident  -
d02   1      rules      refund    confident  -                     human: billing (a correction)
d03   1      embedding  billing   confident  billing               audit; teacher billing (agrees);
                                                                   human refund, then billing
d04   1      embedding  refund    confident  refund                audit; teacher refund, then
                                                                   shipping (latest: disagrees)
d05   1      llm        shipping  confident  refund (its own)      inline teacher shipping; human
                                                                   shipping (no correction)
d06   1      embedding  billing   weak       billing               pending (inline teacher failed)
d07   2      embedding  shipping  confident  shipping              audit; only an invalid teacher label
d08   2      llm        None      no_match   refund (its own)      inline teacher: out of scope
d09   2      embedding  refund    ambiguous  refund                pending, resolved
d10   2      embedding  None      no_match   None                  pending, teacher billing back-filled
====  =====  =========  ========  =========  ====================  ==================================
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from typer.testing import CliRunner

from flywheel.classifier.decision import Decision, Layer, Layer2Answer, TeacherCall, Tier
from flywheel.classifier.errors import InvalidInputError
from flywheel.classifier.protocols import DecisionRecord
from flywheel.logstore import LabelRecord, LogStore, LogStoreError, label_records_to_table
from flywheel.training.stats.traffic import convergence, empty_stats, format_table, parse_window

T0 = datetime(2024, 5, 1, tzinfo=timezone.utc).timestamp()
DAY = 86400.0


def rec(did: str, day: int, hour: int, layer: Layer, label: str | None, tier: Tier = Tier.CONFIDENT, *,
        teacher: TeacherCall | None = None, alts=(), audit: bool = False,
        pending: bool = False, l2: Layer2Answer | None = None) -> DecisionRecord:
    d = Decision(label=label, confidence=0.9, tier=tier, layer=layer, reason="test",
                 alternatives=list(alts), model_version="v1", teacher=teacher, id=did)
    if l2 is None and layer is Layer.EMBEDDING:  # layer 2 decided: its answer is the decision
        l2 = Layer2Answer(label, d.confidence, tier)
    return DecisionRecord(decision=d, text=f"text of {did}", created_at=T0 + day * DAY + hour * 3600,
                          audit=audit, pending=pending, layer2=l2)


def fill(store: LogStore) -> None:
    E, L = Layer.EMBEDDING, Layer.LLM
    records = [
        rec("d01", 0, 1, Layer.DECLARED, "billing"),
        rec("d02", 0, 2, Layer.RULES, "refund"),
        rec("d03", 0, 3, E, "billing", audit=True),
        rec("d04", 0, 4, E, "refund", audit=True),
        rec("d05", 0, 5, L, "shipping", teacher=TeacherCall("m", "shipping", True, 300.0),
            l2=Layer2Answer("refund", 0.4, Tier.AMBIGUOUS)),
        rec("d06", 0, 6, E, "billing", Tier.WEAK, pending=True,
            teacher=TeacherCall("m", None, False, 5000.0, "timeout: no answer")),
        rec("d07", 1, 1, E, "shipping", audit=True),
        rec("d08", 1, 2, L, None, Tier.NO_MATCH, teacher=TeacherCall("m", None, True, 280.0),
            l2=Layer2Answer("refund", 0.3, Tier.WEAK)),
        rec("d09", 1, 3, E, "refund", Tier.AMBIGUOUS, pending=True),
        rec("d10", 1, 4, E, None, Tier.NO_MATCH, pending=True),
    ]
    sink = store.open_sink(ingest_interval_s=None, fsync=False)
    for r in records:
        sink.write(r)
    sink.flush()
    sink.close()
    store.add_human_label("d02", "billing", author="ann")   # through the API ...
    store.add_teacher_label("d10", "billing", "m", True)
    store.mark_resolved(["d09"])
    # ... and the rest in one statement (each API call opens and checkpoints the file)
    labels = [  # decision, source, label, valid, minute (later wins)
        ("d03", "human", "refund", True, 1),
        ("d03", "human", "billing", True, 2),       # later: wins, agrees with what was served
        ("d05", "human", "shipping", True, 1),
        ("d03", "teacher", "billing", True, 1),
        ("d04", "teacher", "refund", True, 1),
        ("d04", "teacher", "shipping", True, 2),    # later: wins
        ("d07", "teacher", "refund", False, 1),     # invalid: not a teacher label
        ("zz-elsewhere", "human", "billing", True, 1),     # labels of a decision not in (yet):
        ("zz-elsewhere", "teacher", "refund", True, 1),    # another replica's; counted nowhere
    ]
    t0 = datetime(2024, 5, 3, tzinfo=timezone.utc).timestamp()
    records = [LabelRecord(d, src, lab, model="m" if src == "teacher" else None, valid=ok, created_at=t0 + 60 * m)
               for d, src, lab, ok, m in labels]
    store.insert_objects([("test-labels", "labels", label_records_to_table(records))])


@pytest.fixture(scope="module")
def log_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("stats") / "log" / "flywheel.duckdb"
    fill(LogStore(path))
    return path


@pytest.fixture(scope="module")
def daily(log_path):
    return convergence(LogStore(log_path), window="day")


def test_totals(daily):
    s = daily
    assert s["total"] == 10 and s["window"] == "day"
    assert s["layer_share"] == {"declared": 0.1, "rules": 0.1, "embedding": 0.6, "llm": 0.2}
    assert s["layer_counts"] == {"declared": 1, "rules": 1, "embedding": 6, "llm": 2}
    assert s["tier_share"] == {"confident": 0.6, "ambiguous": 0.1, "weak": 0.1, "no_match": 0.2}
    assert s["llm_share"] == 0.2
    assert (s["audited"], s["audit_labelled"], s["audit_agree"], s["audit_agreement"]) == (3, 2, 1, 0.5)
    assert (s["pending_flagged"], s["pending"]) == (3, 1)
    assert s["teacher_calls"] == 3          # d05, d06 (failed), d08
    assert s["teacher_labelled"] == 5       # d03, d04, d05, d08, d10
    assert (s["human_labelled"], s["human_corrected"]) == (3, 1)
    assert s["confused_l2_teacher"] == [
        {"layer2": "refund", "teacher": "shipping", "n": 2},   # d04, d05
        {"layer2": "refund", "teacher": None, "n": 1},         # d08
        {"layer2": None, "teacher": "billing", "n": 1},        # d10
    ]
    assert s["confused_human_served"] == [{"served": "refund", "human": "billing", "n": 1}]
    assert s["first"] == "2024-05-01T01:00:00Z" and s["last"] == "2024-05-02T04:00:00Z"
    assert s["n_windows"] == 2


def test_open_pending_matches_logstore(log_path):
    store = LogStore(log_path)
    assert [p[0] for p in store.pending()] == ["d06"]


def test_daily_windows(daily):
    w1, w2 = daily["windows"]
    assert (w1["index"], w1["start"], w1["end"]) == (0, "2024-05-01T00:00:00Z", "2024-05-02T00:00:00Z")
    assert (w1["first"], w1["last"], w1["n"]) == ("2024-05-01T01:00:00Z", "2024-05-01T06:00:00Z", 6)
    assert w1["layer_counts"] == {"declared": 1, "rules": 1, "embedding": 3, "llm": 1}
    assert w1["layer_share"]["embedding"] == 0.5 and w1["llm_share"] == round(1 / 6, 6)
    assert w1["tier_share"] == {"confident": round(5 / 6, 6), "ambiguous": 0.0,
                                "weak": round(1 / 6, 6), "no_match": 0.0}
    assert (w1["audited"], w1["audit_labelled"], w1["audit_agree"], w1["audit_agreement"]) == (2, 2, 1, 0.5)
    assert (w1["pending_flagged"], w1["pending"], w1["teacher_calls"]) == (1, 1, 2)
    assert w1["confused_l2_teacher"] == [{"layer2": "refund", "teacher": "shipping", "n": 2}]
    assert w1["confused_human_served"] == [{"served": "refund", "human": "billing", "n": 1}]

    assert (w2["start"], w2["end"], w2["n"]) == ("2024-05-02T00:00:00Z", "2024-05-03T00:00:00Z", 4)
    assert w2["layer_counts"] == {"declared": 0, "rules": 0, "embedding": 3, "llm": 1}
    assert w2["tier_share"] == {"confident": 0.25, "ambiguous": 0.25, "weak": 0.0, "no_match": 0.5}
    assert (w2["audited"], w2["audit_labelled"], w2["audit_agreement"]) == (1, 0, None)
    assert (w2["pending_flagged"], w2["pending"], w2["teacher_labelled"]) == (2, 0, 2)
    assert w2["confused_l2_teacher"] == [{"layer2": "refund", "teacher": None, "n": 1},
                                         {"layer2": None, "teacher": "billing", "n": 1}]
    assert w2["confused_human_served"] == []


def test_windows_of_n_decisions(log_path):
    s = convergence(LogStore(log_path), window=4, top=1)
    assert s["total"] == 10 and s["window"] == 4
    assert [w["n"] for w in s["windows"]] == [4, 4, 2]
    a, b, c = s["windows"]
    assert (a["start"], a["end"]) == ("2024-05-01T01:00:00Z", "2024-05-01T04:00:00Z")
    assert (b["start"], b["end"]) == ("2024-05-01T05:00:00Z", "2024-05-02T02:00:00Z")
    assert a["layer_counts"] == {"declared": 1, "rules": 1, "embedding": 2, "llm": 0}
    assert b["layer_counts"] == {"declared": 0, "rules": 0, "embedding": 2, "llm": 2}
    assert (a["audited"], a["audit_agreement"], b["audited"], b["audit_agreement"]) == (2, 0.5, 1, None)
    assert [(w["pending_flagged"], w["pending"]) for w in s["windows"]] == [(0, 0), (1, 1), (2, 0)]
    # top=1: one pair per list; ties broken by name with out of scope last
    assert b["confused_l2_teacher"] == [{"layer2": "refund", "teacher": "shipping", "n": 1}]
    assert s["confused_l2_teacher"] == [{"layer2": "refund", "teacher": "shipping", "n": 2}]
    last = convergence(LogStore(log_path), window="4", last=1)
    assert last["n_windows"] == 3 and [w["index"] for w in last["windows"]] == [2]
    assert last["total"] == 10 and last["audited"] == 3
    one = convergence(LogStore(log_path), window=1)
    assert len(one["windows"]) == 10 and all(w["n"] == 1 for w in one["windows"])


def test_empty_log_and_bad_windows(tmp_path):
    s = convergence(LogStore(tmp_path / "empty.duckdb"))
    assert s["total"] == 0 and s["windows"] == [] and s["audit_agreement"] is None
    assert s["layer_share"] == {"declared": 0.0, "rules": 0.0, "embedding": 0.0, "llm": 0.0}
    assert s == empty_stats("day") | {"n_windows": 0}
    assert "empty" in format_table(s)
    for bad in ("fortnight", 0, -3, "0", True):
        with pytest.raises(InvalidInputError):
            parse_window(bad)
    assert parse_window(" Day ") == "day" and parse_window("25") == 25


def test_format_table(daily, log_path):
    text = format_table(daily)
    assert "10 decisions" in text
    assert "embedding 60.0%" in text and "llm 20.0%" in text
    assert "agreement with layer 2 50.0% (1/2)" in text
    assert "1 open (3 flagged" in text
    lines = text.splitlines()
    header = next(ln for ln in lines if ln.strip().startswith("day "))
    i = lines.index(header)
    day1, day2 = lines[i + 2], lines[i + 3]
    assert day1.split()[:2] == ["2024-05-01", "6"] and day2.split()[:2] == ["2024-05-02", "4"]
    assert "1/2 50.0%" in day1 and day2.split()[-2:] == ["0", "0.0%"]
    # columns line up: every cell of a row ends where its header ends (right-aligned numbers)
    assert header.index("embed") + len("embed") == day1.index("50.0%") + len("50.0%")
    pairs = [ln.split() for ln in lines if " -> " in ln and ":" not in ln]
    assert pairs == [["refund", "->", "shipping", "2"], ["refund", "->", "OUT_OF_SCOPE", "1"],
                     ["OUT_OF_SCOPE", "->", "billing", "1"], ["refund", "->", "billing", "1"]]
    by_n = format_table(convergence(LogStore(log_path), window=4, last=2))
    assert "per window of 4 decisions, last 2 of 3" in by_n
    rows = [ln.split() for ln in by_n.splitlines() if ln.strip()[:2] in ("2 ", "3 ")]
    assert [r[:6] for r in rows] == [["2", "2024-05-01", "05:00", "2024-05-02", "02:00", "4"],
                                     ["3", "2024-05-02", "03:00", "2024-05-02", "04:00", "2"]]


# --------------------------------------------------------------------------- the command

@pytest.fixture
def app():
    from flywheel.cli import build_app

    a = build_app()
    assert [c.name for c in a.registered_commands].count("stats") == 1
    return a


def test_cli_json(app, log_path):
    r = CliRunner().invoke(app, ["stats", "--json", "--log-db", str(log_path)])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["total"] == 10 and len(s["windows"]) == 2
    assert s["layer_share"]["embedding"] == 0.6 and s["missing"] is False
    r = CliRunner().invoke(app, ["stats", "--json", "--window", "4", "--last", "2",
                                 "--log-db", str(log_path)])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert [w["n"] for w in s["windows"]] == [4, 2] and s["n_windows"] == 3


def test_cli_table_and_home(app, log_path, tmp_path):
    import shutil

    home = tmp_path / "home"
    (home / "log").mkdir(parents=True)
    shutil.copy(log_path, home / "log" / "flywheel.duckdb")
    r = CliRunner().invoke(app, ["stats", "--home", str(home), "--window", "5"])
    assert r.exit_code == 0, r.output
    assert "10 decisions" in r.stdout and "per window of 5 decisions" in r.stdout


def test_cli_missing_log_and_errors(app, tmp_path):
    missing = tmp_path / "nope" / "log.duckdb"
    r = CliRunner().invoke(app, ["stats", "--json", "--log-db", str(missing)])
    assert r.exit_code == 0
    s = json.loads(r.stdout)
    assert s["total"] == 0 and s["missing"] is True and s["windows"] == [] and "layer_share" in s
    assert "no traffic log" in r.stderr
    assert not missing.exists() and not missing.parent.exists()  # never created
    r = CliRunner().invoke(app, ["stats", "--log-db", str(missing)])
    assert r.exit_code == 0 and "0 decisions" in r.stdout

    # errors are FlywheelErrors with exit code 2 (the command line prints them as one line)
    for args, exc_type, text in ((["--window", "fortnight"], InvalidInputError, "fortnight"),
                                 (["--last", "x"], InvalidInputError, "--last"),
                                 (["--top", "-1"], InvalidInputError, "--top"),
                                 (["--log-db", str(tmp_path)], LogStoreError, "directory")):
        if "--log-db" not in args:
            args = args + ["--log-db", str(missing)]
        r = CliRunner().invoke(app, ["stats", *args])
        assert isinstance(r.exception, exc_type) and text in str(r.exception), (args, r.output)
        assert r.exception.exit_code == 2


def test_through_flywheel_main(log_path, tmp_path, capsys, monkeypatch):
    from flywheel.cli import main

    assert main(["stats", "--json", "--window", "5", "--log-db", str(log_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["total"] == 10 and [w["n"] for w in out["windows"]] == [5, 5]
    assert main(["stats", "--log-db", str(tmp_path / "none.duckdb")]) == 0
    captured = capsys.readouterr()
    assert "0 decisions" in captured.out and "no traffic log" in captured.err
    assert main(["stats", "--window", "0", "--log-db", str(log_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flywheel: error: window") and "Traceback" not in err
