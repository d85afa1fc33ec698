"""One ``flywheel eval`` run (:mod:`training.eval.run`), through the command and the library:
the out-of-scope spellings and the rows a model does not know, the per-language slices, the
options checked once (:class:`EvalOptions`), and the tuning default the command shares with
train and retrain. The encoders are fakes: nothing loads a model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.docs import OOS_WORDS, TOPICS, topic_examples, toy_embedder
from tests.support.fakes import HashEmbedder


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def test_cli_eval_scores_oos_spellings_as_out_of_scope_and_leaves_unknown_labels_out(tmp_path, monkeypatch,
                                                                                     capsys):
    import flywheel.classifier.encoders
    import flywheel.classifier.layer2.fitter
    from flywheel.cli import main

    fake = toy_embedder()
    monkeypatch.setattr(flywheel.classifier.layer2.fitter, "make_embedder", lambda *a, **k: fake)
    monkeypatch.setattr(flywheel.classifier.encoders, "make_embedder", lambda *a, **k: fake)
    train = [{"text": t, "label": name} for name, words in TOPICS.items() for t in topic_examples(words)]
    train += [{"text": t, "label": "oos"} for t in topic_examples(OOS_WORDS)]
    oos = topic_examples(OOS_WORDS, 20)[12:]
    test = [{"text": topic_examples(TOPICS["weather"])[0], "label": "weather"},
            {"text": oos[0], "label": "OUT_OF_SCOPE"}, {"text": oos[1], "label": "OOS"},
            {"text": oos[2], "label": "NONE"}, {"text": oos[3], "label": "none"},
            {"text": "dance the tango", "label": "dance"}, {"text": "dance a waltz", "label": "dance"},
            {"text": "tap dance", "label": "tap"}]
    for name, rows in (("train", train), ("test", test)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    args = ["eval", "--train", str(tmp_path / "train.jsonl"), "--test", str(tmp_path / "test.jsonl"),
            "--json", "--quiet", "--latency-sample", "0"]
    rc = main(args)
    out, err = capsys.readouterr()
    assert rc == 0, err
    report = json.loads(out)
    assert (report["n"], report["n_out_of_scope"], report["n_in_scope"]) == (5, 4, 1)
    assert report["oos_recall"] is not None and report["unknown_labels"] == []
    assert report["skipped_unknown_labels"] == {"dance": 2, "tap": 1}
    assert "warning" in err and "3 row(s) with labels the model does not know: dance (2), tap (1)" in err

    rc = main([*args, "--strict"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and "Traceback" not in err
    assert "test.jsonl: 3 row(s) with labels the model does not know: dance (2), tap (1)" in err


def test_cli_eval_json_shows_both_language_slices(tmp_path, monkeypatch, capsys):
    import flywheel.classifier.encoders
    import flywheel.classifier.layer2.fitter
    from flywheel.cli import main

    fake = HashEmbedder()
    monkeypatch.setattr(flywheel.classifier.layer2.fitter, "make_embedder", lambda *a, **k: fake)
    monkeypatch.setattr(flywheel.classifier.encoders, "make_embedder", lambda *a, **k: fake)
    train = [{"text": t, "label": name} for name, words in TOPICS.items() for t in topic_examples(words)]
    train += [{"text": t, "label": "oos"} for t in topic_examples(OOS_WORDS)]
    _write_jsonl(tmp_path / "train.jsonl", train)
    w, m, b = (topic_examples(words) for words in TOPICS.values())
    test = [{"text": w[0], "label": "weather", "lang": "en"}, {"text": m[0], "label": "music", "lang": "en"},
            {"text": b[0], "label": "banking", "lang": "en"}, {"text": w[1], "label": "weather", "lang": "en"},
            {"text": w[2], "label": "weather", "lang": "es"}, {"text": m[1], "label": "music", "lang": "es"},
            {"text": b[1], "label": "music", "lang": "es"}]  # mislabelled: the model says banking
    _write_jsonl(tmp_path / "test.jsonl", test)
    rc = main(["eval", "--train", str(tmp_path / "train.jsonl"), "--test", str(tmp_path / "test.jsonl"),
               "--json", "--quiet", "--latency-sample", "0"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    report = json.loads(out)
    by = report["by_language"]
    assert list(by) == ["en", "es"]
    assert (by["en"]["n"], by["en"]["accuracy"], by["en"]["in_scope_accuracy"]) == (4, 1.0, 1.0)
    assert (by["es"]["n"], by["es"]["accuracy"]) == (3, pytest.approx(2 / 3, abs=1e-6))
    assert by["en"]["oos_recall"] is None and by["es"]["oos_recall"] is None
    assert report["n"] == 7 and report["accuracy"] == pytest.approx(6 / 7, abs=1e-6)


# ------------------------------------------------------------------ the library: EvalOptions in, EvalRun out
@pytest.fixture()
def toy_files(tmp_path, monkeypatch):
    """Toy train and test files (the test one with a label the model does not know), and
    every encoder the run makes the toy hash encoder."""
    import flywheel.classifier.encoders
    import flywheel.classifier.layer2.fitter

    fake = toy_embedder()
    monkeypatch.setattr(flywheel.classifier.layer2.fitter, "make_embedder", lambda *a, **k: fake)
    monkeypatch.setattr(flywheel.classifier.encoders, "make_embedder", lambda *a, **k: fake)
    train = [{"text": t, "label": name} for name, words in TOPICS.items() for t in topic_examples(words)]
    train += [{"text": t, "label": "oos"} for t in topic_examples(OOS_WORDS)]
    test = [{"text": topic_examples(TOPICS["weather"])[0], "label": "weather"},
            {"text": topic_examples(OOS_WORDS, 20)[15], "label": "oos"}, {"text": "tap dance", "label": "tap"}]
    return _write_jsonl(tmp_path / "train.jsonl", train), _write_jsonl(tmp_path / "test.jsonl", test)


def test_eval_options_are_checked_once():
    from flywheel.classifier.errors import InvalidInputError
    from flywheel.training.eval.run import EvalOptions

    with pytest.raises(InvalidInputError, match="give --train, --intents or --model"):
        EvalOptions(Path("test.jsonl"))
    with pytest.raises(InvalidInputError, match="not on a saved --model"):
        EvalOptions(Path("test.jsonl"), model=Path("v1"), tune_encoder=True)
    with pytest.raises(InvalidInputError, match="a saved --model keeps the cutoffs it was trained with"):
        EvalOptions(Path("test.jsonl"), model=Path("v1"), target_oos_recall=0.9)
    # tuning is off for a saved model whatever the default: --no-tune-encoder is no error
    assert EvalOptions(Path("test.jsonl"), model=Path("v1"), tune_encoder=False).tune_encoder is False


def test_run_eval_returns_the_report_and_its_warnings(toy_files, tmp_path):
    from flywheel.training.eval.render import eval_text
    from flywheel.training.eval.run import EvalOptions, run_eval

    train, test = toy_files
    said: list[str] = []
    run = run_eval(EvalOptions(test, train=train, latency_sample=0, progress=False, save=tmp_path / "v-saved",
                               plots=tmp_path / "plots"), say=said.append)
    report = run.report
    assert (report["n"], report["skipped_unknown_labels"]) == (2, {"tap": 1}) and "tuning" not in report
    assert run.warnings == [f"{test}: 1 row(s) with labels the model does not know: tap (1); left out of the scores"]
    assert [Path(p).name for p in report["plots"]] == ["reliability.png", "confusion.png", "tradeoff_oos.png",
                                                       "tradeoff_teacher.png"]
    assert list(report)[-2:] == ["skipped_unknown_labels", "plots"]    # the keys the command always printed last
    assert said == [] and (tmp_path / "v-saved" / "manifest.json").is_file()
    assert eval_text(report).startswith(f"Model {report['model_version']} (3 intents")

    saved = run_eval(EvalOptions(test, model=tmp_path / "v-saved", latency_sample=0, progress=False))
    assert saved.report["model_version"] == report["model_version"] and saved.report["n"] == 2


def test_unlabelled_texts_need_tuning_on(toy_files, tmp_path):
    from flywheel.classifier.errors import InvalidInputError
    from flywheel.training.eval.run import EvalOptions, run_eval

    train, test = toy_files     # tests/conftest.py: FLYWHEEL_TUNE_ENCODER=off
    with pytest.raises(InvalidInputError, match=r"which is off here \(off: FLYWHEEL_TUNE_ENCODER\): add --tune-enc"):
        run_eval(EvalOptions(test, train=train, unlabelled=train, progress=False))
    with pytest.raises(InvalidInputError, match=r"off here \(off: --no-tune-encoder\)"):
        run_eval(EvalOptions(test, train=train, tune_unlabelled=0.2, tune_encoder=False, progress=False))


def test_unlabelled_texts_feed_the_tunings_stage_at_the_default_share(toy_files, tmp_path, monkeypatch):
    import flywheel.training.tuner.fit as fit_mod
    from flywheel.classifier.layer2.fitter import fit_model
    from flywheel.training.eval.run import EvalOptions, run_eval
    from flywheel.training.options import DEFAULT_UNLABELLED_SHARE

    got = []

    def fit_intents(intent_set, tune, workdir, *, version=None, progress=False, say=None, unlabelled=None):
        got.append((tune, unlabelled))          # nothing is tuned: the plain fit on the toy encoder
        return fit_model(intent_set, version=version)

    monkeypatch.setattr(fit_mod, "fit_intents", fit_intents)
    pool = tmp_path / "pool.txt"
    pool.write_text("first logged query\nsecond logged query\n", encoding="utf-8")
    train, test = toy_files
    for share in (None, 0.1):
        run_eval(EvalOptions(test, train=train, unlabelled=pool, tune_unlabelled=share, tune_encoder=True,
                             tune_budget=30, latency_sample=0, progress=False))
    assert [(t.unlabelled, t.budget_s) for t, _ in got] == [(DEFAULT_UNLABELLED_SHARE, 30), (0.1, 30)]
    assert got[0][1] == ["first logged query", "second logged query"]
