"""Layer 2 fitted on a tuned encoder (:mod:`training.tuner.fit`), the one way train, eval and
the retrain do it, and the one tuning default the three commands share
(:func:`training.options.tune_for`). The "tuned encoder" is a fake (a hash encoder and a
directory), so nothing is tuned here: the tuning itself is tested in test_finetune.py,
test_retrain_tuning.py and tests/flywheel/test_train_tuned.py."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import flywheel.classifier.layer2.fitter as fitter
from flywheel.classifier.settings.config import load_config
from flywheel.classifier.settings.intents import EmbedderSettings, TuneSettings, parse_intents
from flywheel.training.options import RetrainOptionError, tune_for
from flywheel.training.tuner.export import TunedEncoder
from flywheel.training.tuner.fit import HeadRows, fit_head, fit_intents, train_tuned
from tests.support.docs import DOC
from tests.support.fakes import HashEmbedder


@pytest.fixture()
def intents():
    return parse_intents(DOC)


@pytest.fixture()
def spy(monkeypatch):
    """Every fit_from_vectors call's keyword arguments (the fit itself runs)."""
    calls = []
    real = fitter.fit_from_vectors

    def record(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(fitter, "fit_from_vectors", record)
    return calls


def _tuned(tmp_path, fit_only, dim=64):
    export = tmp_path / "encoder"
    export.mkdir(exist_ok=True)
    return TunedEncoder(HashEmbedder(dim, "tuned:fake"), SimpleNamespace(path=export), {"steps": 3},
                        np.asarray(fit_only, bool))


def test_train_tuned_on_the_intent_examples_calibrates_only_on_rows_the_tuner_did_not_see(intents, tmp_path, spy):
    n = len(intents.training_pairs()[0])
    fit_only = np.arange(n) % 3 == 0
    tuned = _tuned(tmp_path, fit_only)
    model = train_tuned(intents, tuned, version="v-tuned")
    (call,) = spy
    assert call["encoder_id"] == "tuned:fake" and list(call["fit_only"]) == fit_only.tolist()
    assert model.encoder_dir == tmp_path / "encoder" and model.manifest.version == "v-tuned"
    assert model.manifest.metrics["encoder_tuning"] == {"steps": 3}
    assert model.manifest.encoder["id"] == "tuned:fake"


def test_train_tuned_on_rows_adds_the_tuned_rows_to_their_own_fit_only(intents, tmp_path, spy):
    texts, labels = intents.training_pairs()
    emb = HashEmbedder(64, "tuned:fake")
    own = np.zeros(len(labels), bool)
    own[0] = True                                        # a self-training row, say
    tuned_on = np.zeros(len(labels), bool)
    tuned_on[[1, 2]] = True
    rows = HeadRows(emb.encode(list(texts)), list(labels), sample_weight=[1.0] * len(labels), fit_only=own)
    model = train_tuned(intents, _tuned(tmp_path, tuned_on), rows=rows, version="v-rows", parent="v-0")
    (call,) = spy
    assert np.flatnonzero(call["fit_only"]).tolist() == [0, 1, 2]
    assert call["encoder_id"] == "tuned:fake" and call["parent"] == "v-0"
    assert model.encoder_dir == tmp_path / "encoder" and "encoder_tuning" not in model.manifest.metrics

    head_only = fit_head(intents, rows, encoder_id="fake:served", version="v-head")   # the retrain's other challenger
    assert np.flatnonzero(spy[-1]["fit_only"]).tolist() == [0] and head_only.encoder_dir is None
    no_fit_only = fit_head(intents, HeadRows(rows.vectors, rows.labels), encoder_id="fake:served")
    assert spy[-1]["fit_only"] is None and no_fit_only.manifest.encoder["id"] == "fake:served"


def test_fit_intents_tunes_only_with_tune_settings(intents, tmp_path, monkeypatch):
    fake = HashEmbedder(64)
    monkeypatch.setattr(fitter, "make_embedder", lambda *a, **k: fake)
    tuned = []
    import flywheel.training.tuner.fit as fit_mod

    def tune_intents(intent_set, tune, workdir, *, say=None, unlabelled=None):
        tuned.append((tune, unlabelled))
        return _tuned(tmp_path, np.zeros(len(intent_set.training_pairs()[0])))

    monkeypatch.setattr(fit_mod, "tune_intents", tune_intents)
    plain = fit_intents(intents, None, tmp_path, version="v-plain")
    assert tuned == [] and plain.encoder_dir is None and plain.manifest.encoder["id"] == fake.id
    model = fit_intents(intents, TuneSettings(budget_s=5), tmp_path, version="v-t", unlabelled=["a text"])
    assert tuned == [(TuneSettings(budget_s=5), ["a text"])] and model.encoder_dir == tmp_path / "encoder"


# ------------------------------------------------------------------ the one tuning default
@pytest.mark.parametrize("backend, env, flag, tuned, why", [
    ("minilm", None, None, True, "on by default (minilm can be tuned"),
    ("e5-multilingual", None, None, True, "on by default (e5-multilingual can be tuned"),
    ("use-multilingual", None, None, False, "off: use-multilingual cannot be tuned in place"),
    ("minilm", "off", None, False, "off: FLYWHEEL_TUNE_ENCODER"),
    ("minilm", "off", True, True, "on: --tune-encoder"),
    ("use-multilingual", None, True, True, "on: --tune-encoder"),
    ("minilm", None, False, False, "off: --no-tune-encoder")])
def test_train_eval_and_retrain_share_one_tuning_default(monkeypatch, backend, env, flag, tuned, why):
    if env is None:
        monkeypatch.delenv("FLYWHEEL_TUNE_ENCODER")     # tests/conftest.py turns the default off
    else:
        monkeypatch.setenv("FLYWHEEL_TUNE_ENCODER", env)
    tune, said = tune_for(EmbedderSettings(backend=backend), load_config(tune_encoder=flag))
    assert (tune == TuneSettings()) if tuned else tune is None
    assert said.startswith(why)


def test_the_intent_files_tune_settings_and_the_budget_flag(monkeypatch):
    monkeypatch.delenv("FLYWHEEL_TUNE_ENCODER")
    own = EmbedderSettings(backend="minilm", tune=TuneSettings(budget_s=30, epochs=2))
    tune, why = tune_for(own, load_config(), 60)
    assert (tune.budget_s, tune.epochs) == (60, 2) and why == "on: the intent file's embedder.tune"
    assert tune_for(EmbedderSettings(backend="minilm", tune_off=True), load_config())[0] is None
    with pytest.raises(RetrainOptionError, match="--tune-budget sets the budget of encoder tuning, which is off here"):
        tune_for(EmbedderSettings(backend="minilm"), load_config(tune_encoder=False), 60)


@pytest.fixture()
def tunes(monkeypatch):
    """The tuning settings each ``train``/``eval`` fit got (the fit itself is the plain one,
    on a hash encoder: nothing is tuned)."""
    import flywheel.classifier.encoders
    import flywheel.training.tuner.fit as fit_mod

    fake = HashEmbedder(64)
    monkeypatch.setattr(fitter, "make_embedder", lambda *a, **k: fake)
    monkeypatch.setattr(flywheel.classifier.encoders, "make_embedder", lambda *a, **k: fake)
    got = []

    def fit_intents(intent_set, tune, workdir, *, version=None, progress=False, say=None, unlabelled=None):
        got.append(tune)
        return fitter.fit_model(intent_set, version=version)

    monkeypatch.setattr(fit_mod, "fit_intents", fit_intents)
    return got


def test_train_and_eval_tune_by_default_where_retrain_does(tunes, tmp_path, monkeypatch, capsys):
    import json

    import yaml

    from flywheel.cli import main

    monkeypatch.delenv("FLYWHEEL_TUNE_ENCODER")     # tests/conftest.py turns the default off
    intents = tmp_path / "intents.yaml"
    intents.write_text(yaml.safe_dump(DOC))          # English: minilm, tuned by default
    test = tmp_path / "test.jsonl"
    test.write_text("".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in
                            [("what is addvar", "RETRIEVAL"), ("show my invoices", "PLATFORM")]))
    evaluate = ["eval", "--intents", str(intents), "--test", str(test), "--quiet", "--latency-sample", "0", "--json"]
    train = ["train", "--intents", str(intents), "--quiet", "--out"]
    assert main([*train, str(tmp_path / "v1")]) == 0
    assert main(evaluate) == 0
    assert tunes == [TuneSettings(), TuneSettings()]
    assert main([*train, str(tmp_path / "v2"), "--no-tune-encoder"]) == 0
    assert main([*evaluate, "--no-tune-encoder"]) == 0
    monkeypatch.setenv("FLYWHEEL_TUNE_ENCODER", "off")
    assert main([*evaluate, "--tune-budget", "30", "--tune-encoder"]) == 0
    assert tunes[2:] == [None, None, TuneSettings(budget_s=30)]
    capsys.readouterr()
    # a saved version is measured as it is: the default does not apply, the flag is refused
    assert main(["eval", "--model", str(tmp_path / "v1"), "--test", str(test), "--quiet", "--json"]) == 0
    assert main(["eval", "--model", str(tmp_path / "v1"), "--test", str(test), "--tune-encoder"]) == 2
    assert "--tune-encoder tunes on --train or --intents, not on a saved --model" in capsys.readouterr().err
    assert len(tunes) == 5
