"""The unlabelled stage of encoder tuning (issue 35 item 1): SimCSE on a tiny random BERT
(tests/support/tiny_encoder.py), the pool of texts, the stage inside ``tune_and_export``'s
budget, the log's query texts, the unlabelled file reader and the eval flags."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from flywheel.classifier.encoders.backends import TuningRecipe
from flywheel.classifier.errors import NotFittedError, TuneSettingsError
from flywheel.classifier.settings.intents import EmbedderSettings, TuneSettings, parse_intents
from flywheel.cli import main
from flywheel.logstore import LogStore
from flywheel.training.eval.loaders import DatasetError, load_unlabelled
from flywheel.training.options import resolve_tune
from flywheel.training.tuner import finetune
from flywheel.training.tuner.finetune import EncoderTuner, TuningError
from flywheel.training.tuner.unlabelled import (
    MIN_STAGE_ROWS,
    STAGE_WORD_DELETION,
    ContrastivePretrainer,
    delete_words,
    stage_pool,
)
from tests.support.tiny_encoder import build_tiny_bert
from tests.support.worlds import INTENT_DOC, record, write

POOL = [f"{verb} my {thing} {n}" for n, (verb, thing) in enumerate(
    (v, t) for v in ("cancel", "reset", "show", "change", "find", "send") for t in ("order", "password", "card",
                                                                             "plan", "invoice"))]
FAST = dict(batch_size=8, learning_rate=1e-3, max_length=32, seed=0, num_threads=1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_bert(tmp_path_factory.mktemp("models") / "tiny-bert", extra_texts=POOL)


@pytest.fixture(scope="module")
def staged(tiny):
    return ContrastivePretrainer(tiny, epochs=4, budget_s=120, **FAST).fit(POOL)


def _weights(model) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


# ------------------------------------------------------------------------ the pool
def test_the_pool_is_distinct_non_blank_texts_and_a_seeded_draw_of_them():
    texts = ["a", "b", "", "   ", None, "a", "c", "d", "e"]
    assert stage_pool(texts, 10) == ["a", "b", "c", "d", "e"]      # erased ('') and blank rows never used
    drawn = stage_pool(texts, 3, seed=1)
    assert len(drawn) == 3 and set(drawn) <= {"a", "b", "c", "d", "e"}
    assert stage_pool(texts, 3, seed=1) == drawn                   # the same seed, the same draw
    assert {tuple(stage_pool(POOL, 5, seed=s)) for s in range(5)} != {tuple(drawn)}
    with pytest.raises(TuningError, match="row limit must be at least 1"):
        stage_pool(texts, 0)


# ------------------------------------------------------------------------ the stage
def test_the_stage_learns_its_objective_and_reports_it(staged, tiny):
    r = staged.report_
    assert r["objective"] == "simcse" and r["rows"] == len(POOL) and r["stopped_early"] is False
    assert r["steps"] == r["steps_planned"] == 4 * -(-len(POOL) // 8) and r["loss_last"] < r["loss_first"]
    assert not staged.model_.training
    base = ContrastivePretrainer(tiny, **FAST)
    assert not hasattr(base, "model_")                               # __init__ only stores parameters
    json.dumps(r)


def test_the_stage_is_deterministic_and_changes_the_encoder(staged, tiny):
    from transformers import AutoModel

    again = ContrastivePretrainer(tiny, epochs=4, budget_s=120, **FAST).fit(POOL)
    a, b = _weights(staged.model_), _weights(again.model_)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    before = _weights(AutoModel.from_pretrained(str(tiny), local_files_only=True))
    assert any(not np.allclose(a[k], before[k]) for k in a)


def test_the_saved_stage_is_where_the_supervised_tuner_starts(staged, tmp_path):
    start = staged.save(tmp_path / "stage")
    assert (start / "config.json").is_file() and (start / "model.safetensors").is_file()
    labels = [text.split()[0] for text in POOL]
    tuner = EncoderTuner(start, epochs=1, batch_size=8, learning_rate=1e-3, max_length=32, num_threads=1,
                         budget_s=60).fit(POOL, labels)
    assert tuner.report_["steps"] > 0 and tuner.report_["base_model"] == str(start)


def test_the_budget_stops_the_stage_between_steps(tiny):
    stopped = ContrastivePretrainer(tiny, epochs=50, budget_s=1.0, **FAST).fit(POOL)
    r = stopped.report_
    assert r["stopped_early"] is True and r["steps"] < r["steps_planned"]


def test_word_deletion_makes_a_harder_second_view():
    rng = np.random.default_rng(0)
    text = "query: please cancel my last order today"
    views = [delete_words(text, 0.5, rng, keep="query: ") for _ in range(50)]
    assert all(v.startswith("query: ") and len(v) > len("query: ") for v in views)   # the prefix stays, a word too
    assert any(len(v.split()) < len(text.split()) for v in views)
    assert all(set(v.split()) <= set(text.split()) for v in views)
    assert delete_words(text, 0.0, rng) == text and delete_words("hello", 0.9, rng) == "hello"
    assert delete_words("a b c d", 0.99, np.random.default_rng(1)) in {"a", "b", "c", "d"}


def test_the_stage_with_word_deletion_learns_and_reports_it(tiny):
    staged = ContrastivePretrainer(tiny, epochs=4, budget_s=120, word_deletion=0.3, **FAST).fit(POOL)
    r = staged.report_
    assert r["word_deletion"] == 0.3 and r["steps"] == r["steps_planned"] and r["loss_last"] < r["loss_first"]
    with pytest.raises(TuningError, match="word_deletion must be in"):
        ContrastivePretrainer(tiny, word_deletion=1.0).fit(POOL)


def test_frozen_word_embeddings_stay_as_loaded(tiny):
    staged = ContrastivePretrainer(tiny, epochs=1, budget_s=60, freeze_word_embeddings=True, **FAST).fit(POOL)
    from transformers import AutoModel

    before = AutoModel.from_pretrained(str(tiny), local_files_only=True).get_input_embeddings().weight
    np.testing.assert_array_equal(staged.model_.get_input_embeddings().weight.detach().numpy(),
                                  before.detach().numpy())


def test_bad_input_is_one_clear_error(tiny, tmp_path):
    with pytest.raises(TuningError, match=f"needs at least {MIN_STAGE_ROWS} distinct texts, got 3"):
        ContrastivePretrainer(tiny, **FAST).fit(["a", "b", "c", "a", ""])
    with pytest.raises(TuningError, match="batch_size must be at least 2"):
        ContrastivePretrainer(tiny, batch_size=1).fit(POOL)
    with pytest.raises(TuningError, match="temperature must be a positive number"):
        ContrastivePretrainer(tiny, temperature=0.0).fit(POOL)
    with pytest.raises(TuningError, match="not a Hugging Face model directory"):
        ContrastivePretrainer(tmp_path, **FAST).fit(POOL)
    with pytest.raises(NotFittedError):
        ContrastivePretrainer(tiny).save(tmp_path / "out")


# ---------------------------------------------------------- inside tune_and_export
def _settings(tiny) -> EmbedderSettings:
    return EmbedderSettings(backend="minilm", num_threads=1)


@pytest.mark.slow
def test_tune_and_export_runs_the_stage_first_within_the_budget(tiny, tmp_path, monkeypatch):
    from flywheel.training.tuner.export import tune_and_export

    monkeypatch.setattr(finetune, "tunable_base", lambda settings: tiny)
    labels = [text.split()[0] for text in POOL]
    tune = TuneSettings(budget_s=60.0, epochs=2, batch_size=8, learning_rate=1e-3, max_length=32,
                        calibration="holdout", unlabelled=0.25, unlabelled_rows=20)
    lines: list[str] = []
    out = tune_and_export(POOL, labels, _settings(tiny), tune, tmp_path / "work", progress=lines.append,
                          unlabelled=POOL + ["", "  "])
    stage = out.report["unlabelled_stage"]
    assert stage["rows"] == 20 and stage["steps"] > 0 and stage["budget_s"] == pytest.approx(15.0)
    # the supervised tuning started from the stage's encoder, with what the stage left of the budget
    assert out.report["base_model"] != str(tiny) and out.report["budget_s"] <= 60.0 - stage["seconds"] + 0.5
    assert any(line.startswith("unlabelled stage (SimCSE, 15% of the second view's words deleted) on 20 texts")
               for line in lines)
    assert stage["word_deletion"] == STAGE_WORD_DELETION
    assert not [p for p in (tmp_path / "work").iterdir() if p.name.startswith("stage-")]   # removed once loaded


def test_no_stage_without_texts_or_share_and_a_small_pool_is_said(tiny, tmp_path, monkeypatch):
    from flywheel.training.tuner.export import unlabelled_stage

    recipe = TuningRecipe()   # no prefix, nothing frozen, no notice
    on = TuneSettings(unlabelled=0.3)
    assert unlabelled_stage(None, tiny, recipe, _settings(tiny), on, tmp_path) is None
    assert unlabelled_stage(POOL, tiny, recipe, _settings(tiny), TuneSettings(), tmp_path) is None
    lines: list[str] = []
    assert unlabelled_stage(POOL[:5], tiny, recipe, _settings(tiny), on, tmp_path, progress=lines.append) is None
    assert lines == [f"no unlabelled stage: 5 distinct unlabelled texts, it needs {MIN_STAGE_ROWS}"]


def test_the_stage_settings_are_checked_where_they_are_read():
    with pytest.raises(TuneSettingsError, match="unlabelled must be between 0.0 and 0.5"):
        TuneSettings(unlabelled=0.9)
    with pytest.raises(TuneSettingsError, match="unlabelled_rows must be an integer >= 1"):
        TuneSettings(unlabelled_rows=0)
    with pytest.raises(TuneSettingsError, match="--tune-unlabelled"):
        resolve_tune(None, True, unlabelled=-0.1)
    assert resolve_tune(None, True, unlabelled=0.2).unlabelled == 0.2
    doc = {**INTENT_DOC, "embedder": {"backend": "minilm", "tune": {"unlabelled": 0.2, "unlabelled_rows": 500}}}
    tune = parse_intents(doc, source="t.yaml").embedder.tune
    assert tune is not None and (tune.unlabelled, tune.unlabelled_rows) == (0.2, 500)
    with pytest.raises(Exception, match="embedder.tune.unlabelled must be between"):
        parse_intents({**doc, "embedder": {"backend": "minilm", "tune": {"unlabelled": 2}}}, source="t.yaml")


# ------------------------------------------------------------------ the log's texts
def test_the_log_gives_distinct_texts_a_seeded_draw_never_erased_ones(tmp_path):
    store = LogStore(tmp_path / "traffic.duckdb")
    old = [record(f"old query {i}", true="billing", created_at=time.time() - 86_400) for i in range(5)]
    new = [record(f"new query {i % 30}", true="billing", created_at=time.time() - 60 + i)
           for i in range(40)]   # 30 distinct, some twice
    write(store, old + new)
    assert store.forget_text(time.time() - 3_600) == 5
    every = store.query_texts(1000)
    assert sorted(every) == sorted(f"new query {i}" for i in range(30))
    some = store.query_texts(10, seed=3)
    assert len(some) == 10 and set(some) <= set(every) and store.query_texts(10, seed=3) == some
    assert store.query_texts(10, seed=4) != some
    with pytest.raises(ValueError, match="limit must be at least 1"):
        store.query_texts(0)


# ------------------------------------------------------------------ the file reader
def test_unlabelled_files_read_as_texts(tmp_path):
    (tmp_path / "a.txt").write_text("first query\n\n  second query  \n", encoding="utf-8")
    assert load_unlabelled(tmp_path / "a.txt") == ["first query", "second query"]
    (tmp_path / "b.jsonl").write_text('"one"\n{"text": "two", "label": "x"}\n', encoding="utf-8")
    assert load_unlabelled(tmp_path / "b.jsonl") == ["one", "two"]
    (tmp_path / "c.json").write_text('["uno", "dos"]', encoding="utf-8")
    assert load_unlabelled(tmp_path / "c.json") == ["uno", "dos"]


@pytest.mark.parametrize("name, body, problem", [
    ("d.json", '{"text": "x"}', "is a list of strings, got dict"),
    ("e.jsonl", '{"query": "x"}\n', "line 1: text must be a string, got null"),
    ("f.jsonl", "not json\n", "line 1: not valid JSON"),
    ("g.csv", "text\nx\n", "not '.csv'"),
    ("h.txt", "\n \n", "no texts in the file"),
    ("missing.txt", None, "file not found")])
def test_a_bad_unlabelled_file_is_one_error_naming_it(tmp_path, name, body, problem):
    if body is not None:
        (tmp_path / name).write_text(body, encoding="utf-8")
    with pytest.raises(DatasetError, match=problem) as info:
        load_unlabelled(tmp_path / name)
    assert name in str(info.value)


# ------------------------------------------------------------------ the eval flags
def test_eval_refuses_unlabelled_texts_without_tuning_or_a_share_without_texts(tmp_path, capsys):
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"text": t, "label": t.split()[0]}) + "\n" for t in POOL), encoding="utf-8")
    (tmp_path / "pool.txt").write_text("\n".join(POOL), encoding="utf-8")
    args = ["eval", "--train", str(train), "--test", str(train), "--quiet"]
    assert main([*args, "--unlabelled", str(tmp_path / "pool.txt")]) == 2
    assert "add --tune-encoder" in capsys.readouterr().err
    assert main([*args, "--tune-encoder", "--tune-unlabelled", "0.2"]) == 2
    assert "needs texts: give them with --unlabelled FILE" in capsys.readouterr().err
    assert main([*args, "--tune-encoder", "--unlabelled", str(tmp_path / "nope.txt")]) == 2
    err = capsys.readouterr().err
    assert "nope.txt: file not found" in err and "Traceback" not in err
