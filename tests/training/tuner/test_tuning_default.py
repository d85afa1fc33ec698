"""Encoder tuning is on by default in ``flywheel retrain`` where the encoder can be tuned
(issue 34 item 3): which backends, the opt-outs (``embedder.tune: off``,
``--no-tune-encoder``, ``FLYWHEEL_TUNE_ENCODER``), what the report says, and the fallback
to the head-only challenger when the retrain cannot tune (budget spent, no torch).

tests/conftest.py sets ``FLYWHEEL_TUNE_ENCODER=off`` for every test (a real tuning takes
minutes); the tests of the default remove it. Nothing here tunes for real: the fallbacks
stop before the tuner starts (the end-to-end default tuning on a tiny BERT is in
tests/training/tuner/test_retrain_tuning.py)."""

from __future__ import annotations

import json
import sys

import pytest
import yaml
from typer.testing import CliRunner

from flywheel.classifier.settings.intents import (
    TUNED_BY_DEFAULT,
    EmbedderSettings,
    TuneSettings,
    load_intents,
    parse_intents,
    retrain_tuning,
)
from flywheel.classifier.versions.model import intents_to_doc
from flywheel.cli import build_app
from flywheel.training.cli import retrain as cli_retrain
from tests.support.fakes import HashEmbedder
from tests.support.worlds import INTENT_DOC, World


@pytest.mark.parametrize("settings, on, why", [
    (EmbedderSettings(backend="minilm"), True, "on by default (minilm"),
    (EmbedderSettings(backend="e5-multilingual"), True, "on by default (e5-multilingual"),
    (EmbedderSettings(backend="use-multilingual"), False, "off: use-multilingual cannot be tuned"),
    (EmbedderSettings(backend="bge-m3"), False, "off: bge-m3 cannot be tuned"),
    (EmbedderSettings(backend="minilm", layers=(3, 6)), False, "off: embedder.layers is set"),
    (EmbedderSettings(backend="minilm", tune_off=True), False, "off: the intent file says embedder.tune: off"),
    (EmbedderSettings(backend="use-multilingual", tune=TuneSettings(objective="adapter")), True,
     "on: the intent file's embedder.tune"),
])
def test_the_retrain_tunes_by_default_where_the_encoder_can_be_tuned(settings, on, why):
    tune, said = retrain_tuning(settings)
    assert (tune is not None) is on and said.startswith(why), said
    if on and settings.tune is None:
        assert tune == TuneSettings()
    assert set(TUNED_BY_DEFAULT) == {"minilm", "e5-multilingual"}


@pytest.mark.parametrize("value", [False, "off"])
def test_tune_off_in_the_file_survives_the_bundled_copy(value):
    doc = {**INTENT_DOC, "embedder": {"backend": "minilm", "tune": value}}
    intents = parse_intents(doc)
    assert intents.embedder.tune is None and intents.embedder.tune_off
    again = parse_intents(intents_to_doc(intents))          # what a saved version bundles
    assert again.embedder.tune_off and retrain_tuning(again.embedder)[0] is None
    left_out = parse_intents({**INTENT_DOC, "embedder": {"backend": "minilm"}})
    assert "tune" not in intents_to_doc(left_out)["embedder"]   # older replicas read it as before


def test_a_word_other_than_on_or_off_is_refused():
    with pytest.raises(Exception, match="embedder.tune must be on, off, or a mapping"):
        parse_intents({**INTENT_DOC, "embedder": {"tune": "sometimes"}})


def _retrain(world: World, tmp_path, *flags: str):
    intents_file = tmp_path / "intents.yaml"
    if not intents_file.exists():
        intents_file.write_text(yaml.safe_dump(INTENT_DOC))
    return CliRunner().invoke(build_app(), ["retrain", "--home", str(tmp_path / "home"), "--log-db",
                                            world.store.path, "--quiet", "--json", "--intents",
                                            str(intents_file), *flags])


@pytest.fixture()
def world(tmp_path, monkeypatch):
    monkeypatch.setattr(cli_retrain, "make_embedder", lambda settings, cache_root=None: HashEmbedder())
    monkeypatch.delenv("FLYWHEEL_TUNE_ENCODER")
    w = World(tmp_path)
    w.seed_traffic(n_teacher=120, n_human=10)
    return w


def test_without_torch_the_default_tuning_falls_back_to_the_head_only_challenger(world, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)     # an install without torch: `import torch` fails
    r = _retrain(world, tmp_path)
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    t = obj["encoder_tuning"]
    assert t["on"] and t["why"].startswith("on by default (minilm") and t["result"] == "head_only"
    assert "needs torch, which is not installed" in t["fallback"]
    assert obj["outcome"] == "promoted" and obj["challengers"]["put_forward"] == "head_only"
    assert any("only the head-only challenger was fitted" in n for n in obj["notes"])


def test_a_budget_the_export_alone_would_spend_skips_the_tuning_and_says_so(world, tmp_path):
    r = _retrain(world, tmp_path, "--tune-budget", "1")
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    t = obj["encoder_tuning"]
    assert t["result"] == "head_only" and t["fallback"].startswith("encoder tuning skipped: re-encoding")
    assert "whole 1 s budget" in t["fallback"] and "tuner" not in obj["tuning"]   # the tuner never ran
    assert obj["outcome"] == "promoted"
    md = (tmp_path / "home" / "models" / obj["version"] / "report.md").read_text()
    assert "- encoder tuning: on by default (minilm" in md and "the head-only challenger alone" in md


@pytest.mark.parametrize("how, why", [
    (["--no-tune-encoder"], "off: --no-tune-encoder"),
    ("env", "off: FLYWHEEL_TUNE_ENCODER"),
    ("file", "off: the intent file says embedder.tune: off"),
])
def test_each_opt_out_turns_the_default_off_and_the_report_says_which(world, tmp_path, monkeypatch, how, why):
    flags: list[str] = []
    if how == "env":
        monkeypatch.setenv("FLYWHEEL_TUNE_ENCODER", "off")
    elif how == "file":
        (tmp_path / "intents.yaml").write_text(yaml.safe_dump({**INTENT_DOC, "embedder": {"tune": "off"}}))
    else:
        flags = how
    r = _retrain(world, tmp_path, *flags)
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert obj["encoder_tuning"] == {"on": False, "why": why, "result": "off", "fallback": None}
    assert "tuning" not in obj and "challengers" not in obj
    if how == "file":   # the saved version bundles the opt-out, so a retrain on the bundled set stays off
        assert load_intents(tmp_path / "home" / "models" / obj["version"] / "intents.yaml").embedder.tune_off


def test_a_bad_flywheel_tune_encoder_is_one_line_naming_it(world, tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_TUNE_ENCODER", "sometimes")
    r = _retrain(world, tmp_path)
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "flywheel: error: tune_encoder must be true or false, got 'sometimes' (from env)" in r.output
