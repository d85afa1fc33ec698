"""training.tuner.finetune: the encoder tuner on a tiny random BERT (tests/support/tiny_encoder.py),
never the real weights: determinism, separation, the budget, save -> MeanPoolRunner, the
in-process embedder, hard pairs, the batch plan, and errors for bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flywheel.classifier.errors import NotFittedError, TrainingError
from flywheel.training.tuner.finetune import CHUNK, EncoderTuner, TuningError, plan_batches, tunable_base

CANCEL = ["cancel my order", "cancel the order", "cancel my last order", "please cancel order",
          "cancel orders", "cancel my orders now"]
RESET = ["reset my password", "how do i reset the password", "password reset", "reset password please",
         "my password reset", "reset the password now"]
OTHER = ["hello there", "what is it"]
TEXTS = CANCEL + RESET + OTHER
LABELS = ["cancel"] * len(CANCEL) + ["reset"] * len(RESET) + [None] * len(OTHER)
# tiny-model settings: a random 32-d BERT needs a larger step than MiniLM
FAST = dict(epochs=12, batch_size=8, learning_rate=1e-3, head_learning_rate=1e-2, max_length=32, seed=0, num_threads=1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.support.tiny_encoder import build_tiny_bert

    return build_tiny_bert(tmp_path_factory.mktemp("models") / "tiny-bert", extra_texts=TEXTS)


@pytest.fixture(scope="module")
def tuned(tiny):
    return EncoderTuner(tiny, **FAST).fit(TEXTS, LABELS)


def _between_minus_within(v: np.ndarray) -> tuple[float, float]:
    a, b = v[: len(CANCEL)], v[len(CANCEL): len(CANCEL) + len(RESET)]
    n = len(a)
    within = ((a @ a.T).sum() - n + (b @ b.T).sum() - n) / (2 * n * (n - 1))
    return float((a @ b.T).mean()), float(within)


# ------------------------------------------------------------------------------ fitting
def test_fit_sets_the_fitted_attributes_and_report(tuned, tiny):
    r = tuned.report_
    assert tuned.classes_ == ["cancel", "reset", None]
    assert r["objective"] == "cross_entropy" and r["device"] == "cpu" and r["n_rows"] == len(TEXTS)
    assert r["n_labels"] == 3 and r["epochs_done"] == FAST["epochs"] and r["steps"] == r["steps_planned"] > 0
    assert r["stopped_early"] is False and tuned.stopped_early_ is False
    assert r["loss_last"] < r["loss_first"]
    assert not tuned.model_.training and next(tuned.model_.parameters()).device.type == "cpu"
    assert tuned.encoder_id_.startswith("tuned:") and len(tuned.encoder_id_) == len("tuned:") + 12
    json.dumps(r)  # the eval command puts it in its JSON


def test_fit_is_deterministic_with_a_seed(tuned, tiny):
    again = EncoderTuner(tiny, **FAST).fit(TEXTS, LABELS)
    np.testing.assert_array_equal(again.embedder().encode(TEXTS), tuned.embedder().encode(TEXTS))
    assert again.encoder_id_ == tuned.encoder_id_
    other = EncoderTuner(tiny, **{**FAST, "seed": 1}).fit(TEXTS, LABELS)
    assert other.encoder_id_ != tuned.encoder_id_


def test_tuning_separates_two_intents(tuned, tiny):
    from flywheel.classifier.encoders.torch_runner import MeanPoolRunner

    before = MeanPoolRunner(tiny, "cpu", False, False, FAST["max_length"], False, None).encode_batch(TEXTS)
    after = tuned.embedder().encode(TEXTS)
    between0, within0 = _between_minus_within(before)
    between1, within1 = _between_minus_within(after)
    assert between1 < between0 - 0.05            # the two intents move apart
    assert within1 - between1 > within0 - between0 + 0.05


def test_contrastive_objective_separates_too(tiny):
    t = EncoderTuner(tiny, objective="contrastive", **{**FAST, "epochs": 20}).fit(TEXTS, LABELS)
    assert t.report_["objective"] == "contrastive" and t.report_["steps"] > 0
    between, within = _between_minus_within(t.embedder().encode(TEXTS))
    b0, w0 = _between_minus_within(EncoderTuner(tiny, **{**FAST, "epochs": 1, "learning_rate": 1e-12,
                                                          "head_learning_rate": 1e-12}).fit(TEXTS, LABELS)
                                   .embedder().encode(TEXTS))
    assert within - between > w0 - b0


def test_the_budget_stops_it_cleanly(tiny):
    lines: list[str] = []
    # 4 s: loading the tiny model on a busy 2-core machine has taken over 1.5 s (0 steps)
    t = EncoderTuner(tiny, **{**FAST, "epochs": 10_000, "budget_s": 4.0, "progress": lines.append}).fit(TEXTS, LABELS)
    r = t.report_
    assert t.stopped_early_ is True and r["stopped_early"] is True
    assert 0 < r["steps"] < r["steps_planned"] and r["epochs_done"] < 10_000
    assert r["seconds"] < 4.0 + 2.0    # stops between steps, near the budget
    assert any(line.startswith("epoch ") and ", loss " in line for line in lines)
    assert "stopped by its budget" in lines[-1]
    v = t.embedder().encode(TEXTS)     # a consistent model
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)


def test_hard_pairs_are_used_and_unknown_ones_skipped(tiny):
    t = EncoderTuner(tiny, **{**FAST, "epochs": 1, "hard_pairs": [("cancel", "reset"), ("cancel", "nope")]})
    t.fit(TEXTS, LABELS)
    assert t.report_["hard_pairs_used"] == 1 and t.report_["hard_pairs_skipped"] == [["cancel", "nope"]]
    plain = EncoderTuner(tiny, **{**FAST, "epochs": 1}).fit(TEXTS, LABELS)
    assert t.report_["steps"] > plain.report_["steps"]   # the pair's rows come once more


# ----------------------------------------------------------------- embedder and save
def test_the_embedder_satisfies_the_protocol(tuned):
    from flywheel.classifier.protocols import Embedder

    emb = tuned.embedder()
    assert isinstance(emb, Embedder)
    assert emb.id == tuned.encoder_id_ and emb.dim == 32
    v = emb.encode(TEXTS)
    assert v.dtype == np.float32 and v.shape == (len(TEXTS), 32) and v.flags["C_CONTIGUOUS"]
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert emb.encode([]).shape == (0, 32)
    np.testing.assert_allclose(emb.encode(TEXTS[:3], batch_size=1), v[:3], atol=1e-5)


def test_save_loads_in_mean_pool_runner_with_the_same_vectors(tuned, tmp_path):
    from flywheel.classifier.encoders.torch_runner import MeanPoolRunner

    out = tuned.save(tmp_path / "encoder")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "sentence_bert_config.json", "modules.json",
                 "1_Pooling/config.json", "tuning.json"):
        assert (out / name).is_file(), name
    assert json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"] == FAST["max_length"]
    assert json.loads((out / "tuning.json").read_text())["report"]["encoder_id"] == tuned.encoder_id_
    runner = MeanPoolRunner(out, "cpu", False, False, FAST["max_length"], False, None)
    np.testing.assert_allclose(runner.encode_batch(TEXTS), tuned.embedder().encode(TEXTS), atol=1e-5)


def test_before_fit_there_is_nothing_to_use(tiny, tmp_path):
    with pytest.raises(NotFittedError):
        EncoderTuner(tiny).embedder()
    with pytest.raises(NotFittedError):
        EncoderTuner(tiny).save(tmp_path / "x")


# ------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("texts, labels, kwargs, words", [
    ([], [], {}, "no texts"),
    (TEXTS, LABELS[:-1], {}, "14 texts but 13 labels"),
    (CANCEL, ["cancel"] * len(CANCEL), {}, "at least two classes"),
    (OTHER, [None, None], {}, "no in-scope examples"),
    (TEXTS[:2] + [3], ["a", "b", "a"], {}, "sequence of strings"),
    ("cancel my order", ["a"] * 15, {}, "sequence of strings"),
    (TEXTS, LABELS, {"sample_weight": [1.0] * 3}, "sample_weight"),
    (TEXTS, LABELS, {"sample_weight": [0.0] * len(TEXTS)}, "sample_weight"),
])
def test_bad_data_gives_clear_errors(tiny, texts, labels, kwargs, words):
    with pytest.raises(TuningError, match=words) as info:
        EncoderTuner(tiny).fit(texts, labels, **kwargs)
    assert isinstance(info.value, ValueError) and isinstance(info.value, TrainingError)


@pytest.mark.parametrize("params, words", [
    ({"objective": "setfit"}, "objective must be one of"),
    ({"epochs": 0}, "epochs"),
    ({"batch_size": 1}, "batch_size"),
    ({"learning_rate": -1.0}, "learning_rate"),
    ({"budget_s": 0}, "budget_s"),
])
def test_bad_parameters_give_clear_errors(tiny, params, words):
    with pytest.raises(TuningError, match=words):
        EncoderTuner(tiny, **params).fit(TEXTS, LABELS)


def test_a_directory_without_a_model_is_refused(tmp_path):
    with pytest.raises(TuningError, match="not a Hugging Face model directory"):
        EncoderTuner(tmp_path).fit(TEXTS, LABELS)


def test_only_mean_pooling_transformers_can_be_tuned(tiny):
    from flywheel.classifier.settings.intents import EmbedderSettings

    with pytest.raises(TuningError, match="cannot be fine-tuned in place"):
        tunable_base(EmbedderSettings(backend="use-multilingual"))
    with pytest.raises(TuningError, match="last layer only"):
        tunable_base(EmbedderSettings(backend="minilm", layers=(3, 6)))
    with pytest.raises(TuningError, match="not a mean-pooling"):
        tunable_base(EmbedderSettings(backend="sentence-transformers", model=str(tiny)))  # no 1_Pooling


# ------------------------------------------------------------------------- batch plan
def test_cross_entropy_batches_cover_every_row_once():
    y = np.array([0] * 7 + [1] * 5 + [2] * 3)
    batches = plan_batches(y, 2, 4, "cross_entropy", [], np.random.default_rng(0))
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(y)))
    assert all(1 <= len(b) <= 4 for b in batches)


def test_contrastive_batches_keep_chunks_of_one_intent_together():
    y = np.array([0] * 8 + [1] * 8 + [2] * 4)
    batches = plan_batches(y, 2, 8, "contrastive", [], np.random.default_rng(0))
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(y)))
    for b in batches:   # every in-scope row has a partner of its intent in its batch
        labels = y[b].tolist()
        assert all(labels.count(c) >= 2 for c in set(labels) if c != 2)


def test_hard_pairs_meet_in_batches():
    y = np.array([0] * 8 + [1] * 8 + [2] * 8)
    plain = plan_batches(y, None, 2 * CHUNK, "cross_entropy", [], np.random.default_rng(0))
    paired = plan_batches(y, None, 2 * CHUNK, "cross_entropy", [(0, 2)], np.random.default_rng(0))
    extra = sum(len(b) for b in paired) - sum(len(b) for b in plain)
    assert extra == 2 * 8    # every row of both intents once more
    # each pair chunk (CHUNK rows of each) fills a batch of its own
    pair_batches = [b for b in paired if sorted(y[b].tolist()) == [0] * CHUNK + [2] * CHUNK]
    assert len(pair_batches) >= 8 // CHUNK


def test_plan_is_seeded():
    y = np.arange(30) % 3
    a = plan_batches(y, None, 8, "contrastive", [(0, 1)], np.random.default_rng(5))
    b = plan_batches(y, None, 8, "contrastive", [(0, 1)], np.random.default_rng(5))
    assert [x.tolist() for x in a] == [x.tolist() for x in b]


# ------------------------------------------------------------------------ the command line
@pytest.mark.slow   # the whole eval command: synthetic negatives, cross-validated head, scoring
def test_eval_tune_encoder_reports_the_tuned_model(tuned, tmp_path, capsys):
    """``flywheel eval --train --tune-encoder`` tunes the intent file's encoder (here a tuned tiny
    sentence-transformers directory, as save() writes one), fits the head on the tuned vectors and
    adds the tuning report to the JSON."""
    from flywheel.cli import main

    base = tuned.save(tmp_path / "st-tiny")
    (tmp_path / "intents.yaml").write_text(
        "version: 1\nname: tiny\nlanguages: [en]\n"
        f"embedder: {{backend: sentence-transformers, model: '{base}', runtime: torch}}\n"
        "intents:\n  - {name: cancel, examples: ['cancel my order']}\n", encoding="utf-8")
    rows = [{"text": t, "label": label} for t, label in zip(TEXTS, LABELS)]
    for name in ("train.jsonl", "test.jsonl"):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    rc = main(["eval", "--intents", str(tmp_path / "intents.yaml"), "--train", str(tmp_path / "train.jsonl"),
               "--test", str(tmp_path / "test.jsonl"), "--json", "--quiet", "--latency-sample", "0",
               "--tune-encoder", "--tune-budget", "60", "--tune-epochs", "2"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    rep = json.loads(out)
    assert rep["tuning"]["objective"] == "cross_entropy" and rep["tuning"]["epochs_done"] == 2
    # the tuner saw the intent examples only: the out-of-scope rows stay honest evidence for the gate
    assert rep["tuning"]["n_rows"] == len(CANCEL) + len(RESET) and rep["tuning"]["n_labels"] == 2
    assert rep["tuning"]["base_model"] == str(base)
    assert rep["encoder"].startswith("tuned:") and rep["n"] == len(TEXTS)
    rc = main(["eval", "--model", str(tmp_path), "--test", str(tmp_path / "test.jsonl"), "--tune-encoder"])
    assert rc == 2 and "not on a saved --model" in capsys.readouterr().err


@pytest.mark.slow   # exports the tuned tiny encoder to ONNX
def test_tune_and_export_keeps_out_of_scope_rows_out_of_the_tuning(tiny, tmp_path, monkeypatch):
    from flywheel.classifier.layer2.fitter import fit_model
    from flywheel.classifier.settings.intents import EmbedderSettings, Intent, IntentSet, TuneSettings
    from flywheel.training.tuner import finetune
    from flywheel.training.tuner.export import intent_pairs, tune_and_export

    monkeypatch.setattr(finetune, "tunable_base", lambda settings: tiny)
    intents = (Intent("cancel", "cancel", tuple(CANCEL)), Intent("reset", "reset", tuple(RESET)))
    iset = IntentSet(name="tiny", intents=intents, oos_examples=tuple(OTHER), synthetic_negatives=0)
    settings = EmbedderSettings(num_threads=1)
    tune = TuneSettings(epochs=2, batch_size=FAST["batch_size"], calibration="holdout")
    tuned = tune_and_export(*intent_pairs(iset), settings, tune, tmp_path / "a")
    model = fit_model(iset, embedder=tuned.embedder)
    assert tuned.report["n_rows"] == len(CANCEL) + len(RESET) and tuned.report["n_labels"] == 2
    assert model.manifest.encoder["id"] == tuned.export.id and model.manifest.training_size == len(TEXTS)
    assert model.head.has_oos_      # the head still learns out of scope from them
    assert tuned.report["held_out_rows"] == 0 and not tuned.fit_only.any()   # 6 rows an intent: too few to hold out
    one = IntentSet(name="one", intents=(Intent("cancel", "cancel", tuple(CANCEL)),), oos_examples=tuple(OTHER))
    with pytest.raises(TuningError, match="at least two intents"):
        tune_and_export(*intent_pairs(one), settings, tune, tmp_path / "b")


def test_tune_and_export_holds_rows_out_to_calibrate_the_head(tiny, tmp_path, monkeypatch):
    # issue 22 (BENCHMARKS 14.2): cutoffs cross-validated on rows the encoder memorised are
    # overconfident; the head calibrates on held-out rows only and still trains on them
    from dataclasses import replace

    from flywheel.classifier.layer2.fitter import fit_model
    from flywheel.classifier.settings.intents import EmbedderSettings, Intent, IntentSet, TuneSettings
    from flywheel.training.tuner import finetune
    from flywheel.training.tuner.export import intent_pairs, tune_and_export

    monkeypatch.setattr(finetune, "tunable_base", lambda settings: tiny)
    intents = (Intent("cancel", "cancel", tuple(CANCEL)), Intent("reset", "reset", tuple(RESET)))
    iset = IntentSet(name="tiny", intents=intents, oos_examples=tuple(OTHER), synthetic_negatives=0)
    tune = TuneSettings(epochs=2, batch_size=FAST["batch_size"], holdout=0.34,    # 2 of each intent's 6
                        calibration="holdout")
    texts, labels = intent_pairs(iset)
    tuned = tune_and_export(texts, labels, EmbedderSettings(num_threads=1), tune, tmp_path / "a")
    assert tuned.report["n_rows"] == 8 and tuned.report["held_out_rows"] == 4
    assert tuned.report["held_out_intents"] == 2
    fo = tuned.fit_only
    assert fo.sum() == 8 and not any(fo[i] for i, y in enumerate(labels) if y is None)
    model = fit_model(iset, embedder=tuned.embedder, examples_fit_only=fo)
    assert model.head.metrics_["fit_only_rows"] == 8 and model.head.metrics_["cv_samples"] == 4 + len(OTHER)
    assert model.manifest.training_size == len(TEXTS)        # the held-out rows still train the regression
    with pytest.raises(ValueError, match="examples_fit_only has 3 values"):
        fit_model(iset, embedder=tuned.embedder, examples_fit_only=[True] * 3)
    # the same seed holds out the same rows
    again = tune_and_export(texts, labels, EmbedderSettings(num_threads=1), replace(tune, epochs=1),
                            tmp_path / "b")
    assert (again.fit_only == fo).all()


def test_crossfit_calibrates_every_row_on_the_half_encoder_that_never_saw_it(tiny, tmp_path, monkeypatch):
    # issue 22 (BENCHMARKS 14.8, 14.12): the served encoder tunes on every row; two more, each
    # tuned on one half, encode the rows so that each half is calibrated by the encoder of the other
    from flywheel.classifier.layer2.fitter import fit_model
    from flywheel.classifier.settings.intents import EmbedderSettings, Intent, IntentSet, TuneSettings
    from flywheel.training.tuner import finetune
    from flywheel.training.tuner.export import crossfit_folds, intent_pairs, tune_and_export

    monkeypatch.setattr(finetune, "tunable_base", lambda settings: tiny)
    intents = (Intent("cancel", "cancel", tuple(CANCEL)), Intent("reset", "reset", tuple(RESET)))
    iset = IntentSet(name="tiny", intents=intents, oos_examples=tuple(OTHER), synthetic_negatives=4)
    tune = TuneSettings(epochs=2, batch_size=FAST["batch_size"], calibration="crossfit")
    texts, labels = intent_pairs(iset)
    tuned = tune_and_export(texts, labels, EmbedderSettings(num_threads=1), tune, tmp_path / "a")
    r = tuned.report
    assert r["calibration"] == "crossfit" and r["held_out_rows"] == 0 and not tuned.fit_only.any()
    assert r["n_rows"] == len(CANCEL) + len(RESET)              # the served encoder: every in-scope row
    assert [h["rows"] for h in r["crossfit_halves"]] == [6, 6]   # each half encoder: the other half's 6
    assert all(h["steps"] > 0 for h in r["crossfit_halves"])
    fold = crossfit_folds(labels, tune.seed)
    assert len(tuned.views) == 2
    for half, view in enumerate(tuned.views):
        assert view.X.shape == (len(texts), tuned.embedder.dim) and (view.predict == (fold == half)).all()
    # the two half encoders are not the served one: their vectors of the same rows differ
    served = tuned.embedder.encode(texts)
    assert not np.allclose(tuned.views[0].X, served, atol=1e-3)
    model = fit_model(iset, embedder=tuned.embedder, cv_views=tuned.views)
    m = model.head.metrics_
    assert m["cv_folds"] == 2 and m["cv_samples"] == len(texts)     # every row calibrated once, negatives none
    assert m["fit_only_rows"] == 4 and model.manifest.training_size == len(TEXTS)


def test_auto_calibration_cross_fits_few_rows_and_holds_out_many():
    from flywheel.training.tuner.export import CROSSFIT_MAX_ROWS, resolve_calibration

    assert resolve_calibration("auto", 1500) == "crossfit"
    assert resolve_calibration("auto", CROSSFIT_MAX_ROWS) == "crossfit"
    assert resolve_calibration("auto", CROSSFIT_MAX_ROWS + 1) == "holdout"
    assert resolve_calibration("holdout", 10) == "holdout" and resolve_calibration("crossfit", 10**6) == "crossfit"


def test_crossfit_folds_deal_each_label_to_both_halves():
    from flywheel.training.tuner.export import crossfit_folds

    labels = ["a"] * 7 + ["b"] * 2 + [None] * 5 + ["c"]
    fold = crossfit_folds(labels, seed=1)
    for y, want in (("a", (3, 4)), ("b", (1, 1)), (None, (2, 3)), ("c", (0, 1))):
        got = int(sum(f for f, v in zip(fold, labels) if v == y))
        n = sum(v == y for v in labels)
        assert got == want[0] and n - got == want[1], y
    assert (crossfit_folds(labels, seed=1) == fold).all()
    assert any((crossfit_folds(labels, seed=s) != fold).any() for s in range(2, 6))


def test_an_adapter_refuses_crossfit_calibration(tmp_path):
    from flywheel.classifier.settings.intents import EmbedderSettings, TuneSettings
    from flywheel.training.tuner.export import tune_and_export

    with pytest.raises(TuningError, match="crossfit applies to a tuned encoder"):
        tune_and_export(TEXTS, LABELS, EmbedderSettings(), TuneSettings(objective="adapter", calibration="crossfit"),
                        tmp_path)


def test_the_intent_file_names_a_bad_calibration():
    from flywheel.classifier.errors import IntentFileError
    from flywheel.classifier.settings.intents import parse_intents

    doc = {"version": 1, "name": "x", "embedder": {"tune": {"calibration": "crossfit"}},
           "intents": [{"name": "a", "examples": ["a b"]}, {"name": "b", "examples": ["c d"]}]}
    assert parse_intents(doc).embedder.tune.calibration == "crossfit"
    doc["embedder"]["tune"] = True
    assert parse_intents(doc).embedder.tune.calibration == "auto"
    doc["embedder"]["tune"] = {"calibration": "both"}
    with pytest.raises(IntentFileError, match="embedder.tune.calibration must be one of auto, holdout, crossfit"):
        parse_intents(doc)


def test_calibration_holdout_takes_a_share_of_each_intent():
    from flywheel.training.tuner.export import MIN_HELD_OUT, calibration_holdout

    labels = ["a"] * 20 + ["b"] * 10 + ["c"] * 4 + [None] * 30
    held = calibration_holdout(labels, 0.2, seed=3)
    counts = {y: int(sum(h for h, v in zip(held, labels) if v == y)) for y in ("a", "b", "c", None)}
    assert counts == {"a": 4, "b": 2, "c": 0, None: 0}      # c: round(0.8) = 1 < MIN_HELD_OUT
    assert MIN_HELD_OUT == 2
    assert (calibration_holdout(labels, 0.2, seed=3) == held).all()
    assert (calibration_holdout(labels, 0.2, seed=4) != held).any()
    assert not calibration_holdout(labels, 0.0).any()


def test_centroids_start_from_at_most_a_bounded_sample_of_each_class():
    from flywheel.training.tuner.finetune import centroid_rows

    y = np.array([0] * 100 + [1] * 3 + [2] * 70)
    rows = centroid_rows(y, 64, np.random.default_rng(0))
    counts = np.bincount(y[rows])
    assert list(counts) == [64, 3, 64] and len(set(rows.tolist())) == len(rows) and list(rows) == sorted(rows)
    again = centroid_rows(y, 64, np.random.default_rng(0))
    assert np.array_equal(rows, again)                      # seeded
