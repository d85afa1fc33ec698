"""``flywheel eval``'s trade curves and ``--target-oos-recall``, and the retrain's gate at
the intent set's ``thresholds.target`` (issue 35 item 2), with encoders that load no model."""

from __future__ import annotations

import json

import pytest

from flywheel.classifier.settings.intents import parse_intents
from flywheel.classifier.versions.model import IntentModel
from tests.support.worlds import INTENT_DOC, VectorTextEmbedder, World, blob_split


@pytest.fixture()
def blob_files(tmp_path, monkeypatch):
    """Blob train and test files as JSON Lines, and every encoder the CLI makes the vector-text one."""
    import flywheel.classifier.encoders
    import flywheel.classifier.layer2.fitter

    emb = VectorTextEmbedder(16)
    monkeypatch.setattr(flywheel.classifier.layer2.fitter, "make_embedder", lambda *a, **k: emb)
    monkeypatch.setattr(flywheel.classifier.encoders, "make_embedder", lambda *a, **k: emb)
    tr, ytr, te, yte = blob_split(n_train=200, n_test=300, seed=2)
    for name, texts, labels in (("train", tr, ytr), ("test", te, yte)):
        rows = [{"text": t, "label": "oos" if y is None else y} for t, y in zip(texts, labels)]
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return ["eval", "--train", str(tmp_path / "train.jsonl"), "--test", str(tmp_path / "test.jsonl"), "--quiet",
            "--latency-sample", "0"]


def test_eval_reports_both_trades_and_cuts_at_target_oos_recall(blob_files, tmp_path, capsys):
    from flywheel.cli import main

    assert main([*blob_files, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    trade = plain["tradeoff"]
    assert {"cutoff", "in_scope_accuracy", "oos_recall"} <= set(trade["oos"][0])
    assert {"cutoff", "answered_share", "answered_accuracy", "llm_share"} <= set(trade["answered"][0])
    assert "operating_point" not in plain

    rc = main([*blob_files, "--json", "--target-oos-recall", "0.9", "--save", str(tmp_path / "v-cut")])
    out, err = capsys.readouterr()
    assert rc == 0, err
    op = json.loads(out)["operating_point"]
    assert op["target"] == {"oos_recall": 0.9} and op["cutoff"] == "oos"
    assert op["chosen"]["on"] == "out-of-fold training rows" and op["chosen"]["oos_recall"] >= 0.9
    assert op["test"]["n"] == 300 and op["value"] != 0.5
    saved = IntentModel.load(tmp_path / "v-cut")       # the target travels with the version
    assert saved.intents.thresholds.target == {"oos_recall": 0.9} and saved.manifest.thresholds["oos"] == op["value"]

    plots = tmp_path / "plots"
    assert main([*blob_files, "--target-oos-recall", "0.9", "--plots", str(plots)]) == 0
    text = capsys.readouterr().out
    assert "Out-of-scope trade" in text and "Teacher trade" in text and "<- served" in text
    assert f"Target oos_recall 90.0%: oos cutoff {op['value']:.3f}" in text and "of 300" in text
    assert (plots / "tradeoff_oos.png").read_bytes()[:4] == b"\x89PNG"
    assert (plots / "tradeoff_teacher.png").exists()


def test_eval_calibration_rows_place_the_target_and_say_how_sure(blob_files, tmp_path, capsys):
    from flywheel.classifier.layer2.operating_point import oos_cutoff_for_recall
    from flywheel.classifier.layer2.tiers import Thresholds

    _, _, cal_texts, cal_labels = blob_split(n_train=200, n_test=400, seed=2)     # the same intents, other draws
    cal = tmp_path / "cal.jsonl"
    cal.write_text("".join(json.dumps({"text": t, "label": "oos" if y is None else y}) + "\n"
                           for t, y in zip(cal_texts, cal_labels)), encoding="utf-8")
    saved = tmp_path / "v-oof"
    assert main_json(capsys, [*blob_files, "--target-oos-recall", "0.9", "--save", str(saved)])
    rc_out = main_json(capsys, [*blob_files, "--target-oos-recall", "0.9", "--calibration", str(cal)])
    op = rc_out["operating_point"]
    assert op["chosen"]["on"] == "held-out calibration rows" and op["chosen"]["n"] == cal_labels.count(None) == 400
    assert op["chosen"]["oos_recall"] >= 0.9 and op["chosen"]["tolerance"] < 0.05
    # the cut is the one the calibration rows give for 90% (the fitted model's scores, recomputed here)
    import flywheel.classifier.encoders

    m = IntentModel.load(saved)
    scores = m.head.scores(flywheel.classifier.encoders.make_embedder(m.intents.embedder).encode(cal_texts))
    want = oos_cutoff_for_recall(scores, [y is None for y in cal_labels], 0.9)
    assert op["value"] == pytest.approx(want) and Thresholds.for_model(m).oos != pytest.approx(want)

    # calibration rows without out of scope: the out-of-fold cut stays, and a warning says why
    inscope = tmp_path / "cal-in.jsonl"
    inscope.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in zip(cal_texts, cal_labels)
                               if y is not None), encoding="utf-8")
    from flywheel.cli import main

    assert main([*blob_files, "--json", "--target-oos-recall", "0.9", "--calibration", str(inscope)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["operating_point"]["chosen"]["on"] == "out-of-fold training rows"
    assert "cal-in.jsonl: no out-of-scope rows, so the oos_recall target keeps the cutoff chosen on the " \
           "out-of-fold training rows" in err


def test_eval_says_when_few_rows_place_the_target(blob_files, tmp_path, capsys):
    from flywheel.cli import main

    train = blob_files[blob_files.index("--train") + 1]
    rows = [json.loads(line) for line in open(train, encoding="utf-8")]
    few = [r for r in rows if r["label"] != "oos"] + [r for r in rows if r["label"] == "oos"][:30]
    small = tmp_path / "few-oos.jsonl"
    small.write_text("".join(json.dumps(r) + "\n" for r in few), encoding="utf-8")
    args = [*blob_files, "--target-oos-recall", "0.85"]
    args[args.index(train)] = str(small)
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "note: 30 rows place this cutoff only to ±" in text and "(--calibration)" in text


def test_train_prints_the_target_it_was_cut_at(blob_files, tmp_path, capsys):
    from flywheel.cli import main

    tr, ytr, _, _ = blob_split(n_train=200, n_test=0, seed=2)
    by: dict[str, list[str]] = {}
    for t, y in zip(tr, ytr):
        by.setdefault(y or "", []).append(t)
    doc = {"name": "blobs", "intents": [{"name": k, "description": k, "examples": v} for k, v in by.items() if k],
           "out_of_scope": {"examples": by[""][:40], "synthetic": 0},
           "thresholds": {"target": {"oos_recall": 0.85}}}
    intents = tmp_path / "blobs.json"
    intents.write_text(json.dumps(doc), encoding="utf-8")
    assert main(["train", "--intents", str(intents), "--out", str(tmp_path / "v-blobs"), "--quiet"]) == 0
    out = capsys.readouterr().out
    op = IntentModel.load(tmp_path / "v-blobs").manifest.metrics["operating_point"]
    assert (f"target oos_recall 85.0%: oos cutoff {op['value']:.3f}, chosen on 40 out-of-fold training rows: "
            f"{100 * op['oos_recall']:.1f}% ±{100 * op['tolerance']:.1f}") in out
    assert "note: 40 rows place this cutoff only to ±" in out and "wider than ±5" in out   # 40 rows: about ±11


def main_json(capsys, args):
    from flywheel.cli import main

    rc = main([*args, "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out)


@pytest.mark.parametrize("value, words", [("1.5", "oos_recall must be a number in (0, 1], got 1.5"),
                                          ("0", "oos_recall must be a number in (0, 1], got 0.0")])
def test_eval_refuses_a_bad_target_in_one_line(blob_files, capsys, value, words):
    from flywheel.cli import main

    assert main([*blob_files, "--target-oos-recall", value]) == 2
    err = capsys.readouterr().err
    assert f"flywheel: error: --target-oos-recall: {words}" in err and err.count("\n") == 1


def test_cli_refuses_a_bad_intent_file_target_with_exit_2(tmp_path, capsys):
    from flywheel.cli import main

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**INTENT_DOC, "thresholds": {"target": {"oos_recall": 0.8, "llm_share": 0.1}}}))
    assert main(["train", "--intents", str(bad), "--out", str(tmp_path / "v1")]) == 2
    err = capsys.readouterr().err
    assert "thresholds.target: give exactly one of" in err and err.count("\n") == 1


def test_the_retrain_gates_champion_and_challenger_at_the_same_target(tmp_path):
    w = World(tmp_path)
    w.seed_traffic(n_teacher=600, n_human=40)
    first = w.run(min_new_labels=1)
    assert first.outcome == "promoted" and "target" not in first.report["thresholds"]
    w.intents = parse_intents({**INTENT_DOC, "thresholds": {"target": {"oos_recall": 0.9}}}, source="t.yaml")
    w.seed_traffic(n_teacher=200, n_human=0, seed=1)
    second = w.run(min_new_labels=1, dry_run=True)
    section = second.report["thresholds"]["target"]
    assert section["target"] == {"oos_recall": 0.9}
    ch, cp = section["challenger"], section["champion"]
    assert ch["cutoff"] == "oos" and ch["on"] == "out-of-fold training rows" and ch["oos_recall"] >= 0.9
    assert second.report["thresholds"]["saved"]["oos"] == ch["value"]
    # the champion was fitted without the target: cut at it on held-out rows it never saw
    assert cp["how"] == "cut on held-out rows" and cp["cutoff"] == "oos" and cp["oos_recall"] >= 0.9
    assert any(n.startswith("gated at the target oos_recall 0.9: the challenger cut out of fold, the champion "
                            "cut on held-out rows (oos ") for n in second.report["notes"])
