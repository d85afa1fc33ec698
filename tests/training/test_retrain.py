"""Tests of the retrain job (training.retrain) and its data (training.trainset), with the
fake HashEmbedder and synthetic traffic logs written through the real LogStore sink."""

from __future__ import annotations

import copy
import itertools
import json
import random
import threading
import time

import numpy as np
import pytest
import yaml
from filelock import FileLock
from typer.testing import CliRunner

from flywheel.classifier.decision import Decision, Layer, Tier
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.protocols import DecisionRecord
from flywheel.classifier.settings.intents import parse_intents
from flywheel.classifier.text import normalise_key
from flywheel.classifier.versions.model import intents_to_doc
from flywheel.classifier.versions.registry import UNCHECKED, ModelRegistry
from flywheel.cli import build_app
from flywheel.training import retrain as retrain_mod
from flywheel.training.cli import retrain as cli_retrain
from flywheel.training.layer2 import layer2_predict
from flywheel.training.retrain import RetrainOptions, retrain
from flywheel.training.teacher_noise import NoiseEstimate, check_training_set
from flywheel.training.trainset import RECENT_HOLDOUT_SHARE, build_training_set, split_role, split_value
from tests.support.fakes import HashEmbedder
from tests.support.worlds import (
    CLOCK,
    ENC,
    INTENT_DOC,
    PREFIXES,
    SUFFIXES,
    World,
    human_labels,
    record,
    sample,
    write,
)


@pytest.fixture()
def world(tmp_path) -> World:
    return World(tmp_path)


def find(ts, text: str):
    """(set name, label, source) of ``text`` in a training set, or None."""
    key = normalise_key(text)
    for name, part in (("train", ts), ("eval", ts.eval), ("recent", ts.recent)):
        for t, y, s in zip(part.texts, part.labels, part.sources):
            if normalise_key(t) == key:
                return name, y, s
    return None


# ----------------------------------------------------------------------- the job
def test_first_run_promotes_and_reuses_logged_embeddings(world):
    recs, _ = world.seed_traffic()
    n_logged_vectors = sum(r.embedding is not None for r in recs)
    res = world.run()
    assert res.outcome == "promoted", res.reason
    assert res.version and world.registry.current_name() == res.version
    assert res.champion is None and res.summary_line().startswith(f"promoted {res.version} (first model")
    d = world.registry.home / res.version
    report = json.loads((d / "report.json").read_text())
    assert report["promoted"] is True and report["outcome"] == "promoted"
    assert (d / "report.md").read_text().startswith("# flywheel retrain: promoted")
    assert res.report_path == d / "report.json"
    # every logged vector was reused; everything else was embedded in ONE call
    emb = report["dataset"]["embeddings"]
    assert emb["reused"] == n_logged_vectors
    assert world.embedder.calls == 1
    assert len(world.embedder.texts) == emb["computed"] == len(set(world.embedder.texts))
    logged = {normalise_key(r.text) for r in recs if r.embedding is not None}
    assert not logged & {normalise_key(t) for t in world.embedder.texts}
    # the saved model bundles the full intent set and is what the registry serves
    model = world.registry.load_current()
    assert intents_to_doc(model.intents)["intents"] == intents_to_doc(world.intents)["intents"]
    assert model.manifest.metrics["eval_split"] == "flywheel-hash-v1"
    assert report["challenger"]["eval"]["accuracy"] > 0.8
    assert report["challenger"]["recent"]["n"] >= 50
    assert report["timing"]["fit_seconds"] > 0 and "per_intent" in report["challenger"]["eval"]
    assert report["thresholds"]["tuning"]["method"].startswith("target_precision")
    # every retrain reports the deferral model's calibration on the recent labelled slice
    assert 0.0 <= report["thresholds"]["tuning"]["risk_ece_recent"] <= 1.0
    assert 0.0 <= model.manifest.metrics["oof_risk_ece"] <= 1.0


def test_shadow_run_publishes_the_winner_as_the_shadow_and_records_every_run(world):
    world.seed_traffic(n_teacher=200, n_human=10)
    first = world.run()
    assert first.outcome == "promoted" and world.registry.last_retrain()["outcome"] == "promoted"
    world.seed_traffic(n_teacher=200, n_human=10, seed=1)
    res = world.run(shadow=True, promote_untested=True)   # a small world: fewer than 20 gate rows
    assert res.outcome == "shadowed", res.reason
    assert world.registry.current_name() == first.version           # still serving the champion
    assert world.registry.shadow() == res.version != first.version
    report = json.loads((world.registry.home / res.version / "report.json").read_text())
    assert report["outcome"] == "shadowed" and report["promoted"] is False
    assert "published as the shadow version" in res.reason
    assert res.summary_line().startswith(f"shadowed {res.version} (passed the gate")
    status = world.registry.last_retrain()
    assert status["outcome"] == "shadowed" and status["version"] == res.version
    assert time.time() - status["finished_at"] < 600
    skipped = world.run(min_new_labels=10_000)
    assert skipped.outcome == "skipped" and world.registry.last_retrain()["outcome"] == "skipped"
    world.run(dry_run=True)
    assert world.registry.last_retrain()["outcome"] == "skipped"     # a dry run records nothing


def test_second_run_without_new_labels_skips(world):
    recs, _ = world.seed_traffic(n_teacher=200, n_human=10)
    first = world.run()
    assert first.outcome == "promoted"
    again = world.run(min_new_labels=1)
    assert again.outcome == "skipped" and again.version is None
    assert again.reason.startswith("0 new labels since " + first.version)
    assert again.summary_line().startswith("skipped: 0 new labels")
    assert [v.name for v in world.registry.versions()] == [first.version]
    champion = world.registry.load_current()
    since = champion.manifest.metrics["log_until"]
    assert retrain_mod.count_new_labels(world.store, since) == 0
    world.store.add_human_label(recs[0].decision.id, "PLATFORM")
    world.store.add_teacher_label(recs[1].decision.id, "PLATFORM", "fake-llm", valid=True)
    world.store.add_teacher_label(recs[2].decision.id, None, "fake-llm", valid=False)   # not a label
    write(world.store, [record("hi what does addvar do asap", teacher="RETRIEVAL", created_at=time.time())])
    assert retrain_mod.count_new_labels(world.store, since) == 3
    assert world.run(min_new_labels=4).outcome == "skipped"


@pytest.mark.parametrize("edit", [
    lambda doc: doc["out_of_scope"].update(synthetic=12),
    lambda doc: doc["intents"][0].update(metadata={"rag": "false"}),
    lambda doc: doc["intents"][0]["examples"].append("one more example of the first intent"),
])
def test_an_intent_set_change_retrains_without_new_labels(world, edit):
    world.seed_traffic(n_teacher=200, n_human=10)
    assert world.run().outcome == "promoted"
    assert world.run(min_new_labels=1).outcome == "skipped"
    doc = copy.deepcopy(INTENT_DOC)
    edit(doc)
    world.intents = parse_intents(doc, source="synthetic.yaml")
    res = world.run(min_new_labels=1, tolerance=1.0)
    assert res.outcome != "skipped", res.reason
    assert "the intent set changed since the champion was trained" in res.report["notes"]


def test_poisoned_human_labels_are_kept_not_promoted(world):
    recs, items = world.seed_traffic()
    champ = world.run()
    assert champ.outcome == "promoted"
    swap = {"RETRIEVAL": "PLATFORM", "PLATFORM": "RETRIEVAL", None: "RETRIEVAL"}
    # wrong human labels on texts that train (never on evaluation rows)...
    poison = [(r.decision.id, swap[y]) for r, (t, y) in zip(recs, items) if split_role(t, "human") == "train"]
    # ... and a second batch of new traffic, all of it wrongly labelled by a human
    used = {t for t, _ in items}
    new = [(t, y) for t, y in sample(900, 1, used) if split_role(t, "human") == "train"]
    new_recs = [record(t, true=y) for t, y in new]
    write(world.store, new_recs)
    poison += [(r.decision.id, swap[y]) for r, (_, y) in zip(new_recs, new)]
    human_labels(world.store, poison)
    res = world.run()
    assert res.outcome == "kept", res.summary_line()
    assert res.reason.startswith("accuracy ") and "< champion" in res.reason
    assert res.summary_line().startswith(f"kept {champ.version}, challenger {res.version} not promoted: accuracy")
    assert world.registry.current_name() == champ.version
    report = json.loads((world.registry.home / res.version / "report.json").read_text())
    assert report["promoted"] is False and report["outcome"] == "kept"
    assert "NOT promoted" in (world.registry.home / res.version / "report.md").read_text()
    assert report["challenger"]["accuracy"] < report["champion"]["accuracy"] - 0.01
    assert report["dataset"]["conflicts"]["human_over_teacher"] >= len(poison) // 2


def test_lock_held_skips(world):
    world.registry.home.mkdir(parents=True)
    lock = FileLock(str(world.registry.home / ".retrain.lock"))
    lock.acquire()
    try:
        res = world.run()
    finally:
        lock.release()
    assert res.outcome == "skipped" and res.reason == "another retrain is running"
    assert world.registry.current_name() is None and world.embedder.calls == 0


def test_dry_run_writes_nothing(world):
    world.seed_traffic(n_teacher=200, n_human=10)
    res = world.run(dry_run=True)
    # a dry run promotes nothing, so it never says "promoted"
    assert res.outcome == "would_promote" and res.version is None and res.report_path is None
    assert not res.promoted and res.report["promoted"] is False and res.to_dict()["outcome"] == "would_promote"
    assert res.summary_line().startswith("would_promote (dry run)")
    assert res.summary_line().endswith(res.reason) and res.reason == "no usable champion: first model"
    assert not world.registry.home.exists()
    assert res.markdown.startswith("# flywheel retrain: would_promote (dry run)")
    # (a dry run next to a served champion: see test_cli_retrain)


def test_retrain_while_another_thread_keeps_logging(world):
    world.seed_traffic(n_teacher=300, n_human=10)
    n0 = world.store.count()
    sink = world.store.open_sink(flush_interval_s=0.02, ingest_interval_s=0.05, fsync=False)
    stop = threading.Event()
    written: list[int] = []
    errors: list[BaseException] = []

    def writer():
        try:
            for i, (t, y) in enumerate(itertools.cycle(sample(200, 7))):
                if stop.is_set() and i >= 50:
                    break
                sink.write(record(t, true=y, created_at=time.time()))
                written.append(1)
                time.sleep(0.002)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    th = threading.Thread(target=writer)
    th.start()
    try:
        res = world.run()
    finally:
        stop.set()
        th.join()
        sink.flush()
        sink.close()
    assert not errors
    assert res.outcome == "promoted"
    assert world.store.count() == n0 + len(written)


# ---------------------------------------------------------------------- the data
def test_human_label_beats_teacher_majority_and_ties_drop(world):
    text = "hey show my invoice please"          # teacher says RETRIEVAL twice, a human says PLATFORM
    recs = [record(text, teacher="RETRIEVAL"), record("Hey  SHOW my invoice please", teacher="RETRIEVAL"),
            record(text, teacher="PLATFORM")]
    tie = [record("quick question cancel my plan", teacher="PLATFORM"),
           record("quick question cancel my plan", teacher="RETRIEVAL")]
    majority = [record("hi update my plan", teacher=lab) for lab in ("PLATFORM", "PLATFORM", "RETRIEVAL")]
    write(world.store, recs + tie + majority)
    world.store.add_human_label(recs[1].decision.id, "PLATFORM")
    ts = build_training_set(world.store, world.intents, embedder=world.embedder)
    where = find(ts, text)
    assert where is not None and where[1:] == ("PLATFORM", "human")
    assert where[0] == ("eval" if split_value(text) < 0.5 else "train")
    assert find(ts, "quick question cancel my plan") is None
    assert find(ts, "hi update my plan")[1:] == ("PLATFORM", "teacher")
    c = ts.report["conflicts"]
    assert c["human_over_teacher"] == 1 and c["teacher_tie_dropped"] == 1 and c["teacher_majority"] == 1
    assert ts.report["duplicates_merged"] >= 5


def test_invalid_teacher_answers_never_become_labels(world):
    bad = record("hi show my receipt thanks", teacher="PLATFORM", valid=False)
    ok = record("hey what does addvar do", teacher="RETRIEVAL")
    write(world.store, [bad, ok])
    world.store.add_teacher_label(ok.decision.id, "PLATFORM", "fake-llm", valid=False)
    rows = {r.decision_id: r for r in world.store.labelled_rows()}
    assert bad.decision.id not in rows                              # the store filters them...
    assert rows[ok.decision.id].teacher_labels == ("RETRIEVAL",)
    ts = build_training_set(world.store, world.intents, embedder=world.embedder)
    assert find(ts, bad.text) is None                               # ...and so does the dataset
    assert find(ts, ok.text)[1] == "RETRIEVAL"
    assert ts.report["invalid_teacher_answers_ignored"] == 2
    assert all(s in ("intent_example", "teacher", "human") for s in ts.sources)


def test_labels_of_removed_intents_are_dropped_and_counted(world):
    recs = [record(f"hi old billing question {i}", teacher="OLD_BILLING") for i in range(3)]
    recs.append(record("hey legacy thing", teacher="LEGACY"))
    write(world.store, recs)
    world.store.add_human_label(recs[3].decision.id, "OLD_BILLING")
    ts = build_training_set(world.store, world.intents, embedder=world.embedder)
    assert ts.report["dropped_unknown_intent"] == {"total": 4, "by_label": {"OLD_BILLING": 4}}
    assert all(find(ts, r.text) is None for r in recs)
    assert set(ts.labels) | set(ts.eval.labels) <= {"RETRIEVAL", "PLATFORM", None}


def test_noisy_teacher_guard_drops_contradicting_teacher_labels_only(world):
    champion = fit_model(world.intents, embedder=HashEmbedder())
    examples = {normalise_key(t) for t in world.intents.training_pairs()[0]}
    cands = [p + base + s for base in ("show my invoice", "cancel my subscription", "update my plan")
             for p in PREFIXES for s in SUFFIXES if normalise_key(p + base + s) not in examples]
    X = HashEmbedder().encode(cands)
    pred = layer2_predict(champion, X)
    sure = [t for t, lab, ok in zip(cands, pred.labels, pred.sure) if ok and lab == "PLATFORM"]
    teacher_text = next(t for t in sure if split_role(t, "teacher") == "train")
    human_text = next(t for t in sure if split_role(t, "human") == "train" and t != teacher_text)
    agree_text = next(t for t in sure if split_role(t, "teacher") == "train" and t not in (teacher_text, human_text))
    recs = [record(teacher_text, teacher="RETRIEVAL"), record(human_text, teacher="RETRIEVAL"),
            record(agree_text, teacher="PLATFORM")]
    write(world.store, recs)
    world.store.add_human_label(recs[1].decision.id, "RETRIEVAL")
    built = build_training_set(world.store, world.intents, embedder=world.embedder)
    assert find(built, teacher_text) is not None and "noisy_teacher" not in built.report   # the filter step drops it
    ts, info = check_training_set(built, NoiseEstimate(), champion=champion, encoder_id=world.embedder.id,
                                  enabled=False)
    guard = info["guard"]     # one step, one section: the guard applies whether the evidence rules are on or off
    assert info["dropped"]["noisy_teacher"] == 1 and info["checked"] == 2
    assert ts.report["train"]["by_source"]["teacher"] == built.report["train"]["by_source"]["teacher"] - 1
    assert normalise_key(teacher_text) in built.train_keys and normalise_key(teacher_text) not in ts.train_keys
    assert guard["active"] and guard["checked"] == 2 and guard["dropped"] == 1
    assert "champion" in guard["reason"] and "nearest intent examples" in guard["reason"]
    assert guard["by_label"] == {"RETRIEVAL -> PLATFORM": 1}
    assert guard["examples"][0]["text"] == teacher_text
    assert find(ts, teacher_text) is None
    assert find(ts, human_text) == ("train", "RETRIEVAL", "human")   # a human label is never dropped
    assert find(ts, agree_text) == ("train", "PLATFORM", "teacher")
    # without a champion the guard is off
    off, info = check_training_set(built, NoiseEstimate(), encoder_id=world.embedder.id)
    assert not info["guard"]["active"] and info["dropped"]["noisy_teacher"] == 0 and find(off, teacher_text) is not None


def test_fixed_split_is_deterministic_and_disjoint(world):
    recs, items = world.seed_traffic(n_teacher=300, n_human=60)
    a = build_training_set(world.store, world.intents, embedder=world.embedder)
    b = build_training_set(world.store, world.intents, embedder=HashEmbedder())
    assert a.texts == b.texts and a.eval.texts == b.eval.texts and a.recent.texts == b.recent.texts
    train = {normalise_key(t) for t in a.texts}
    assert not train & {normalise_key(t) for t in a.eval.texts}
    assert not train & {normalise_key(t) for t in a.recent.texts}
    assert a.eval.counts()["teacher"] == 0 and set(a.recent.sources) <= {"teacher"}
    assert all(split_value(t) < RECENT_HOLDOUT_SHARE for t in a.recent.texts)
    held = [t for t, s in zip(a.eval.texts, a.eval.sources) if s == "intent_example"]
    assert held and a.report["intent_examples_held_out"] == len(held)
    fit_examples = {normalise_key(t) for t in a.fit_intents.training_pairs()[0]}
    assert not fit_examples & {normalise_key(t) for t in held}
    for t, s in zip(a.eval.texts, a.eval.sources):
        assert split_value(t) < (0.2 if s == "intent_example" else 0.5)
    assert a.vectors.dtype == np.float32 and a.vectors.shape == (len(a.texts), 256)
    extra = a.extra()
    assert "intent_example" not in extra.sources and len(extra) == len(a) - len(fit_examples)


def test_confident_cutoff_retuned_for_precision_or_llm_budget(world):
    from flywheel.training.cutoffs import TrafficSample, with_thresholds
    from flywheel.training.cutoffs import retune as _retune
    from flywheel.training.gate import evaluate_layer2
    from flywheel.training.rows import LabelledSet

    model = fit_model(world.intents, embedder=HashEmbedder())
    items = sample(300, 3)
    rng = random.Random(0)          # a noisy teacher: 20% of its labels are random
    labels = [y if rng.random() < 0.8 else rng.choice(["RETRIEVAL", "PLATFORM", None]) for _, y in items]
    recent = LabelledSet([t for t, _ in items], labels, HashEmbedder().encode([t for t, _ in items]),
                         ["teacher"] * len(items), [None] * len(items))
    cv = model.head.thresholds_["confident"]
    info, th = _retune(model, recent, 0.95, None)
    prec = with_thresholds(model, th)
    assert info["method"] == "target_precision" and info["cv_confident"] == cv
    assert th["confident"] == prec.manifest.thresholds["confident"] == info["confident"]
    sure_share = 1 - evaluate_layer2(prec, recent)["llm_share"]
    for budget in (0.5, 0.2):
        info, th = _retune(model, recent, 0.95, budget)
        m = with_thresholds(model, th)
        assert info["budget_reachable"] and info["confident"] == min(info["precision_cutoff"], info["budget_cutoff"])
        assert evaluate_layer2(m, recent)["llm_share"] <= budget + 1e-9
        assert m.manifest.thresholds["confident"] == info["confident"]
    # the target is relative to what a noisy (80%-right) teacher lets layer 2 measure, so it
    # does not send most traffic to the LLM (an absolute 0.95 would have: unreachable)
    assert sure_share > 0.8
    before = evaluate_layer2(model, recent)["llm_share"]
    info, th = _retune(model, recent, 0.95, 0.0)   # the cutoff alone cannot: ambiguous and out-of-scope escalations
    m = with_thresholds(model, th)
    assert info["budget_reachable"] is False and info["confident"] == 0.0
    # ... so the surest of those are decided at layer 2 too
    assert evaluate_layer2(m, recent)["llm_share"] <= min(0.05, before / 4)
    # the budget is a share of all traffic: measured on the latest logged decisions when given
    traffic_items = sample(200, 11)
    traffic = HashEmbedder().encode([t for t, _ in traffic_items])
    info, th = _retune(model, recent, 0.95, 0.1, TrafficSample(traffic, np.ones(200), 200, 200, 0, 0, 0))
    m = with_thresholds(model, th)
    assert info["budget_on"].startswith("latest 200 logged decisions: 200 unlabelled")
    unlabelled = LabelledSet([t for t, _ in traffic_items], [None] * 200, traffic, ["traffic"] * 200, [None] * 200)
    assert evaluate_layer2(m, unlabelled)["llm_share"] <= 0.1 + 1e-9
    info, th = _retune(model, recent.select(range(49)), 0.95, 0.2)
    small = with_thresholds(model, th)
    assert info["method"] == "cross-validation" and small.manifest.thresholds["confident"] == cv


def test_retune_returns_new_thresholds_and_never_changes_the_fitted_model(world):
    import copy

    from flywheel.classifier.layer2.tiers import Thresholds
    from flywheel.training.cutoffs import retune, with_thresholds
    from flywheel.training.rows import LabelledSet

    model = fit_model(world.intents, embedder=HashEmbedder())
    head_th = copy.deepcopy(model.head.thresholds_)           # right after fit
    manifest_th = copy.deepcopy(model.manifest.thresholds)
    items = sample(1500, 3)
    X = HashEmbedder().encode([t for t, _ in items])
    recent = LabelledSet([t for t, _ in items], [y for _, y in items], X, ["teacher"] * len(items),
                         [None] * len(items))
    for budget in (None, 0.2, 0.0):
        info, tuned = retune(model, recent, 0.95, budget)
        # the fitted model is untouched: neither its head nor its manifest
        assert model.head.thresholds_ == head_th and model.manifest.thresholds == manifest_th
        assert tuned is not model.head.thresholds_ and tuned is not model.manifest.thresholds
        assert Thresholds.for_model(model).confident == head_th["confident"]
        # the returned model serves the tuned values; its head is the same fitted object
        served = with_thresholds(model, tuned)
        assert served.head is model.head and served.manifest is not model.manifest
        assert Thresholds.for_model(served).confident == info["confident"] == tuned["confident"]
    # a budget of 0: the cutoff alone cannot meet it, so escalation thresholds are relaxed too;
    # they are served from the manifest, and the head keeps what it learned
    assert info["budget_reachable"] is False and info["confident"] != head_th["confident"]
    relaxed = [k for k in ("oos", "oos_confident", "ambiguous_ratio") if k in info]
    assert relaxed
    served_th = Thresholds.for_model(with_thresholds(model, tuned)).to_dict()
    for k in relaxed:
        assert served_th[k] == tuned[k] == info[k] != head_th[k]
    assert model.head.thresholds_ == head_th


def test_retrain_serves_tuned_thresholds_from_the_manifest(world, monkeypatch):
    from flywheel.classifier.bundle import ModelBundle
    from flywheel.classifier.layer2.tiers import Thresholds

    returned = []
    real_retune = retrain_mod.retune

    def retune(model, *args):      # the real tuning, plus a marker value to follow through the job
        info, tuned = real_retune(model, *args)
        returned.append({**tuned, "ambiguous_ratio": 0.77})
        return info, returned[-1]

    monkeypatch.setattr(retrain_mod, "retune", retune)
    world.seed_traffic()
    res = world.run()
    th = res.report["thresholds"]
    assert th["tuning"]["method"].startswith("target_precision")
    assert th["saved"] == returned[0] and th["cross_validation"]["ambiguous_ratio"] != 0.77
    saved = world.registry.load_current()
    # the head is saved as fitted (its cross-validation cutoffs); the manifest has what is served
    assert saved.head.thresholds_ == th["cross_validation"]
    assert saved.manifest.thresholds == th["saved"]
    # what retrain evaluated is what the loaded model serves, in the pipeline too
    assert Thresholds.for_model(saved).ambiguous_ratio == res.challenger["thresholds"]["ambiguous_ratio"] == 0.77
    assert Thresholds.for_model(saved).to_dict() == res.challenger["thresholds"]
    assert ModelBundle.build(saved, HashEmbedder()).thresholds == Thresholds.for_model(saved)


def test_challenger_is_fitted_on_the_training_set_vectors_without_encoding_again(world, monkeypatch):
    import flywheel.classifier.layer2.fitter

    world.seed_traffic()
    built, fits = [], []
    real_build, real_fit = retrain_mod.build_training_set, flywheel.classifier.layer2.fitter.fit_from_vectors

    def build(*args, **kw):
        ts = real_build(*args, **kw)
        built.append((ts, world.embedder.calls))
        return ts

    def fit(intents, X, labels, **kw):
        fits.append((X, list(labels), kw, world.embedder.calls))
        return real_fit(intents, X, labels, **kw)

    monkeypatch.setattr(retrain_mod, "build_training_set", build)
    monkeypatch.setattr(flywheel.classifier.layer2.fitter, "fit_from_vectors", fit)
    res = world.run()
    assert res.outcome == "promoted"
    [(ts, calls_after_data)] = built
    [(X, labels, kw, calls_at_fit)] = fits
    # the data step embedded the misses in one call; nothing was encoded after it
    assert calls_after_data == calls_at_fit == world.embedder.calls == 1
    assert len(world.embedder.texts) == ts.report["embeddings"]["computed"]
    # the head gets the training rows as they are: intent examples first, then logged rows
    assert np.array_equal(X, ts.vectors) and labels == list(ts.labels)
    n_ex = ts.counts()["intent_example"]
    assert ts.sources[:n_ex] == ["intent_example"] * n_ex and "intent_example" not in ts.sources[n_ex:]
    assert ts.texts[:n_ex] == ts.fit_intents.training_pairs()[0]
    assert kw["encoder_id"] == world.embedder.id and kw["sample_weight"] is None and kw["fit_only"] is None


def test_fit_from_vectors_is_fit_model_without_the_encoding(world):
    from flywheel.classifier.layer2.fitter import fit_from_vectors

    emb = HashEmbedder()
    extra = sample(100, 4)
    weights, flags = [0.5] * 50 + [1.0] * 50, [True] * 50 + [False] * 50
    a = fit_model(world.intents, embedder=emb, extra_texts=[t for t, _ in extra],
                  extra_labels=[y for _, y in extra], extra_weights=weights, extra_fit_only=flags)
    texts, labels = world.intents.training_pairs()
    n = len(texts)
    b = fit_from_vectors(world.intents, emb.encode(texts + [t for t, _ in extra]), labels + [y for _, y in extra],
                         encoder_id=emb.id, sample_weight=np.r_[np.ones(n), weights],
                         fit_only=np.r_[np.zeros(n, bool), flags])
    assert np.array_equal(a.head.lr_.coef_, b.head.lr_.coef_)
    assert a.head.thresholds_ == b.head.thresholds_ and a.manifest.thresholds == b.manifest.thresholds
    assert a.manifest.encoder == b.manifest.encoder and a.manifest.training_size == b.manifest.training_size
    assert a.manifest.labels == b.manifest.labels
    with pytest.raises(ValueError, match="rows for"):
        fit_from_vectors(world.intents, emb.encode(texts), labels[:-1], encoder_id=emb.id)


def test_retrain_options_are_checked_in_one_place():
    from flywheel.training.retrain import RetrainError, RetrainOptions

    assert RetrainOptions().tolerance == 0.01
    for kw, msg in (({"tolerance": 2.0}, "tolerance must be between 0 and 1"),
                    ({"llm_budget": -0.1}, "llm_budget must be between 0 and 1"),
                    ({"target_precision": 0.0}, r"target_precision must be in \(0, 1\]"),
                    ({"min_new_labels": -1}, "min_new_labels must be >= 0"),
                    ({"self_training": 1.5}, "self_training must be between 0 and 1"),
                    ({"self_training_max": -1}, "self_training_max must be >= 0")):
        with pytest.raises(RetrainError, match=msg):
            RetrainOptions(**kw)


def test_champions_not_trained_by_retrain(world):
    world.seed_traffic(n_teacher=150, n_human=40)
    # trained with another encoder: cannot be evaluated on these embeddings -> no champion
    other = fit_model(world.intents, embedder=HashEmbedder(dim=128, id="fake:hash-128"))
    other.save(world.registry.version_dir("v-other"))
    world.registry.promote("v-other")
    res = world.run(dry_run=True)
    assert res.outcome == "would_promote" and res.champion is None
    assert any("fake:hash-128" in n and "no champion" in n for n in res.report["notes"])
    # same encoder but trained on every intent example (e.g. `flywheel train`): it may have
    # seen the held-out examples, so the gate compares on traffic only
    starter = fit_model(world.intents, embedder=HashEmbedder())
    starter.save(world.registry.version_dir("v-starter"))
    world.registry.promote("v-starter")
    res = world.run(dry_run=True)
    assert res.champion["version"] == starter.version and res.report["gate"]["set"] == "eval_traffic"
    assert res.challenger["gate_set"] == "eval_traffic" and res.challenger["n"] >= 20
    assert res.challenger["n"] == res.challenger["eval_traffic"]["n"] < res.challenger["eval"]["n"] + \
        res.challenger["recent"]["n"]
    assert any("not trained by retrain" in n for n in res.report["notes"])


def test_serving_thresholds_fixed_values_win_over_learned_ones(world):
    from flywheel.classifier.bundle import ModelBundle
    from flywheel.classifier.layer2.tiers import Thresholds

    doc = dict(INTENT_DOC, thresholds={"oos": 0.4, "confident": 0.0, "per_intent": {"PLATFORM": 0.7}})
    model = fit_model(parse_intents(doc), embedder=HashEmbedder())
    th = Thresholds.for_model(model)
    learned = model.head.thresholds_
    assert th.oos == 0.4 and th.confident == 0.0  # the intent file's values, 0.0 included
    assert th.ambiguous_ratio == learned["ambiguous_ratio"] and th.oos_confident == learned["oos_confident"]
    assert th.per_intent == {"PLATFORM": 0.7}
    # what retrain evaluates is what the pipeline serves
    assert ModelBundle.build(model, HashEmbedder()).thresholds == th


# ----------------------------------------------------------------------- the CLI
def test_cli_retrain(world, tmp_path, monkeypatch):
    monkeypatch.setattr(cli_retrain, "make_embedder", lambda settings, cache_root=None: HashEmbedder())
    world.seed_traffic(n_teacher=200, n_human=10)
    intents_file = tmp_path / "intents.yaml"
    intents_file.write_text(yaml.safe_dump(INTENT_DOC))
    home = tmp_path / "home"
    common = ["--home", str(home), "--log-db", world.store.path, "--quiet"]
    runner = CliRunner()
    app = build_app()
    r = runner.invoke(app, ["retrain", *common, "--intents", str(intents_file)])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0].startswith("promoted v") and any("report:" in ln for ln in lines)
    assert lines[0].endswith("): no usable champion: first model")        # the gate's reason, on the line
    assert ModelRegistry(home / "models").current_name() is not None
    # second run: the champion's bundled intent set is used; nothing new -> skipped
    r = runner.invoke(app, ["retrain", *common, "--json", "--min-new-labels", "1"])
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert {"outcome", "version", "challenger", "champion", "reason", "summary"} <= set(obj)
    assert obj["outcome"] == "skipped" and obj["version"] is None
    models = home / "models"
    before = sorted(p.name for p in models.iterdir())
    current = ModelRegistry(models).current_name()
    r = runner.invoke(app, ["retrain", *common, "--json", "--dry-run", "--llm-budget", "0.2"])
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    # a dry run promotes nothing and never says so
    assert obj["outcome"] in ("would_promote", "kept") and obj["version"] is None and obj["dry_run"] is True
    assert obj["summary"].startswith(obj["outcome"]) and obj["summary"].endswith(obj["reason"])
    assert obj["reason"].startswith("not worse than the champion" if obj["outcome"] == "would_promote" else "")
    assert obj["challenger"]["eval"]["n"] > 0 and obj["champion"]["version"] == current
    assert sorted(p.name for p in models.iterdir()) == before       # the dry run wrote nothing
    assert ModelRegistry(models).current_name() == current
    # an error: one line, an error exit code, no traceback
    r = runner.invoke(app, ["retrain", *common, "--intents", str(tmp_path / "missing.yaml")])
    assert r.exit_code == 2 and "flywheel: error:" in r.output and "Traceback" not in r.output


def served_default(world, home, intents_file):
    """The model ``classify()`` serves from a fresh home's cache (trained from the intent
    file on first use), saved where :func:`classifier.versions.default.existing_model_dir` finds it."""
    from flywheel.classifier.settings.config import load_config
    from flywheel.classifier.versions.default import cached_model_dir, existing_model_dir

    intents_file.write_text(yaml.safe_dump(INTENT_DOC))
    cfg = load_config(home=home, intents=str(intents_file))
    path = cached_model_dir(cfg, intents_file)
    fit_model(world.intents, embedder=HashEmbedder(), version=path.name).save(path)
    assert existing_model_dir(cfg) == path
    return path


def test_the_first_retrain_gates_against_the_served_default_model(world, tmp_path):
    world.seed_traffic(n_teacher=300, n_human=20)
    path = served_default(world, tmp_path / "home", tmp_path / "intents.yaml")
    res = retrain(store=world.store, registry=world.registry, intents=world.intents, embedder=world.embedder,
                  options=RetrainOptions(), served_default=path)
    # not "no champion": the starter model being served is the champion like any other
    assert res.champion is not None and res.champion["version"] == path.name
    assert res.report["champion_version"] == path.name and res.report["gate"]["set"] == "eval_traffic"
    assert any(n.startswith(f"nothing promoted yet: the served default model {path.name}")
               for n in res.report["notes"])
    assert res.outcome == "promoted", res.reason          # better than the starter: promoted from no pointer
    assert res.reason.startswith("not worse than the champion") and res.summary_line().endswith(res.reason)
    assert world.registry.current_name() == res.version
    assert world.registry.load_current().manifest.parent == path.name


def test_cli_first_retrain_keeps_the_served_default_over_a_worse_challenger_and_says_why(world, tmp_path,
                                                                                        monkeypatch):
    monkeypatch.setattr(cli_retrain, "make_embedder", lambda settings, cache_root=None: HashEmbedder())
    recs, items = world.seed_traffic()
    # wrong human labels on texts that train (never on evaluation rows): a worse challenger
    swap = {"RETRIEVAL": "PLATFORM", "PLATFORM": "RETRIEVAL", None: "RETRIEVAL"}
    human_labels(world.store, [(r.decision.id, swap[y]) for r, (t, y) in zip(recs, items)
                               if split_role(t, "human") == "train"])
    intents_file = tmp_path / "intents.yaml"
    home = tmp_path / "home"
    path = served_default(world, home, intents_file)
    common = ["retrain", "--home", str(home), "--log-db", world.store.path, "--quiet", "--intents", str(intents_file)]
    r = CliRunner().invoke(build_app(), common)
    assert r.exit_code == 0, r.output
    first = r.stdout.splitlines()[0]
    assert first.startswith(f"kept {path.name}, challenger v") and " not promoted: " in first, first
    assert first.endswith("keeping the champion")                   # the gate's one-line reason
    assert not (home / "models" / "CURRENT").exists()
    r = CliRunner().invoke(build_app(), [*common, "--json", "--dry-run"])
    obj = json.loads(r.stdout)
    assert obj["outcome"] == "kept" and obj["champion"]["version"] == path.name and obj["summary"] == \
        f"kept {path.name}, challenger (dry run) not promoted: {obj['reason']}"


def layer2_record(text: str, label: str | None) -> DecisionRecord:
    """A decision layer 2 made on its own (no teacher), with its logged embedding."""
    d = Decision(label=label, confidence=0.97, tier=Tier.CONFIDENT, layer=Layer.EMBEDDING, reason="test",
                 alternatives=[], model_version="v0", latency_ms={"embedding": 1.0})
    return DecisionRecord(decision=d, text=text, created_at=time.time() - 60 + next(CLOCK) * 1e-3,
                          encoder_id=ENC.id, embedding=ENC.encode([text])[0])


def test_budget_sample_leaves_out_training_rows_and_reweights_held_out_labels(world):
    from flywheel.training.cutoffs import traffic_sample

    items = sample(600, 20)
    write(world.store, [record(t, true=y, embed=True) for t, y in items])
    seen = {t for t, _ in items}
    easy = sample(300, 21, exclude=seen)
    write(world.store, [layer2_record(t, y) for t, y in easy])
    ts = build_training_set(world.store, world.intents, embedder=world.embedder)
    s = traffic_sample(world.store, ENC.id, ts, n=2000)
    # the teacher-labelled decisions (most of them training rows) are represented by the
    # held-out recent slice, reweighted to their count; layer-2 decisions count as themselves
    assert s.n_decisions == 900 and s.n_labelled == 600 and s.n_unlabelled == 300
    assert s.n_held_out == len(ts.recent) and 0 < len(ts.recent) < 120
    assert len(s) == 300 + len(ts.recent)
    assert s.weights.sum() == pytest.approx(900.0)
    assert np.allclose(s.weights[300:], 600 / len(ts.recent)) and np.all(s.weights[:300] == 1.0)
    # no vector of a training row is in the sample
    train_vecs = {v.tobytes() for v in ts.vectors}
    assert not any(v.tobytes() in train_vecs for v in s.vectors)
    # a window with few labelled decisions: measured on the newest held-out rows
    # (older escalations were made by weaker champions), at least min_held of them
    s = traffic_sample(world.store, ENC.id, ts, n=400, min_held=20)
    assert s.n_labelled == 100 and s.n_held_out == 20 and len(s) == 300 + 20
    newest = ts.recent.vectors[-20:]
    assert np.array_equal(s.vectors[300:], newest)
    # only the latest n decisions: the 300 layer-2 ones are the newest
    s = traffic_sample(world.store, ENC.id, ts, n=300)
    assert s.n_decisions == 300 and s.n_labelled == 0 and np.all(s.weights == 1.0)
    assert traffic_sample(world.store, "other-encoder", ts) is None


def test_weighted_budget_counts_heavy_rows(world):
    from flywheel.training.cutoffs import TrafficSample, retune, with_thresholds
    from flywheel.training.rows import LabelledSet

    model = fit_model(world.intents, embedder=HashEmbedder())
    items = sample(300, 3)
    X = HashEmbedder().encode([t for t, _ in items])
    recent = LabelledSet([t for t, _ in items], [y for _, y in items], X, ["teacher"] * 300, [None] * 300)
    conf = model.head.scores(X).probs.max(axis=1)
    # weight the least sure half 5x: the budget must count them 5x, so fewer fit under it
    w = np.where(conf <= np.median(conf), 5.0, 1.0)
    budget = 0.3
    cut = {}
    for name, weights in (("flat", np.ones(300)), ("heavy", w)):
        info, _ = retune(model, recent, 0.95, budget, TrafficSample(X, weights, 300, 300, 0, 0, 0))
        assert info["budget_reachable"]
        cut[name] = info["budget_cutoff"]
    assert cut["heavy"] < cut["flat"]

    def weighted_share(cutoff):
        from flywheel.training.layer2 import layer2_predict
        m = with_thresholds(model, {**model.manifest.thresholds, "confident": cutoff})
        sure = layer2_predict(m, X).sure
        return float(w[~sure].sum() / w.sum())

    assert weighted_share(cut["heavy"]) <= budget + 1e-9
    assert weighted_share(cut["flat"]) > budget   # tuned as if unweighted, it overshoots the weighted budget


def _escalations(world):
    """A fitted model, 3,000 sampled queries and layer 2's view of them: the rows it
    rejects without being sure (``unsure``) are the escalations the budget may relax."""
    from flywheel.classifier.layer2.tiers import Thresholds
    from flywheel.training.cutoffs import layer2_state

    model = fit_model(world.intents, embedder=HashEmbedder())
    items = sample(3000, 3)
    X = HashEmbedder().encode([t for t, _ in items])
    th = Thresholds.for_model(model)
    classes = np.array([str(c) for c in model.manifest.labels], dtype=object)
    s, conf, second, rejected, close, top = layer2_state(model, th, classes, X)
    unsure = rejected & (s.oos_confidence < th.oos_confident)
    return model, items, X, th, s, conf, second, top, unsure


def test_budget_never_hands_layer2_escalations_it_mostly_gets_wrong(world):
    from flywheel.training.cutoffs import retune, with_thresholds
    from flywheel.training.gate import evaluate_layer2
    from flywheel.training.rows import LabelledSet

    model, items, X, th, s, conf, second, top, unsure_reject = _escalations(world)
    movable = unsure_reject & (s.oos_class < conf)
    assert unsure_reject.sum() >= 10 and movable.sum() >= 10
    truth = [y for _, y in items]
    other = {"RETRIEVAL": "PLATFORM", "PLATFORM": "RETRIEVAL"}
    # the teacher says those queries are in scope, but never layer 2's top intent
    wrong = [(other[t] if u else y) for u, t, y in zip(unsure_reject, top, truth)]
    # the teacher says they are in scope and layer 2's top intent is right
    in_scope = [(t if u else y) for u, t, y in zip(unsure_reject, top, truth)]
    # the teacher says they are out of scope
    out_of_scope = [(None if u else y) for u, y in zip(unsure_reject, truth)]
    before = dict(model.manifest.thresholds)
    for labels, mode in ((out_of_scope, "reject"), (wrong, None), (in_scope, "accept")):
        recent = LabelledSet([t for t, _ in items], labels, X, ["teacher"] * len(items), [None] * len(items))
        info, after = retune(model, recent, 0.95, 0.0)
        m = with_thresholds(model, after)
        assert info["budget_reachable"] is False
        kind = info["relaxed_escalations"]["out_of_scope"]
        assert kind["n"] == int(unsure_reject.sum()) and kind["relaxed"] == mode
        if mode is None:       # those rejections still go to the LLM
            assert kind["accuracy"] == 0.0 and kind["top_intent_accuracy"] == 0.0
            assert after["oos_confident"] == before["oos_confident"] and after["oos"] == before["oos"]
        elif mode == "reject":  # the surest are served as out of scope
            assert kind["accuracy"] == 1.0
            assert after["oos_confident"] < before["oos_confident"] and after["oos"] == before["oos"]
        else:                   # the least out-of-scope-like are served as their top intent
            assert kind["top_intent_accuracy"] == 1.0
            assert after["oos"] > before["oos"] and after["oos_confident"] == before["oos_confident"]
            served = evaluate_layer2(m, recent)
            assert served["llm_share"] < evaluate_layer2(model, recent)["llm_share"]


def test_relaxed_budget_holds_with_weights(world):
    """A positive budget the cutoff alone cannot meet, weighted traffic, both kinds of
    escalation relaxable: the weighted LLM share lands within the budget plus the rows
    no threshold can move (rejected by the out-of-scope class, or near-ties once accepted)."""
    from flywheel.training.cutoffs import TrafficSample, retune, with_thresholds
    from flywheel.training.layer2 import layer2_predict
    from flywheel.training.rows import LabelledSet

    model, items, X, th, s, conf, second, top, unsure = _escalations(world)
    labels = [(t if u else y) for u, t, (_, y) in zip(unsure, top, items)]   # accepting them is right
    recent = LabelledSet([t for t, _ in items], labels, X, ["teacher"] * len(items), [None] * len(items))
    w = np.random.default_rng(0).uniform(0.5, 3.0, len(items))
    budget = 0.06
    info, tuned = retune(model, recent, 0.95, budget, TrafficSample(X, w, len(items), len(items), 0, 0, 0))
    m = with_thresholds(model, tuned)
    assert info["budget_reachable"] is False
    assert info["relaxed_escalations"]["out_of_scope"]["relaxed"] == "accept"
    # escalated whatever the thresholds: rejected by the out-of-scope class, or a
    # near-tie once accepted (a higher oos cutoff would not take them off the LLM)
    stuck = unsure & ~((s.oos_class < conf) & (second / np.clip(conf, 1e-12, None) < th.ambiguous_ratio))
    share = float(w[~layer2_predict(m, X).sure].sum() / w.sum())
    before = float(w[~layer2_predict(model, X).sure].sum() / w.sum())
    stuck_share = float(w[stuck].sum() / w.sum())
    assert stuck_share < budget < before      # the budget binds, and can be met
    assert share <= budget + 1e-9


def test_the_challenger_trains_on_synthetic_negatives(world):
    """The retrain fit adds the intent set's synthetic negatives as fit-only out-of-scope
    rows, embedded in the training set's one encode call (and counted there), and the
    report's training rows do not count them."""
    world.intents = parse_intents({**INTENT_DOC, "out_of_scope": {**INTENT_DOC["out_of_scope"], "synthetic": 24}})
    world.seed_traffic(n_teacher=200, n_human=10)
    res = world.run()
    assert res.outcome == "promoted", res.reason
    model = world.registry.load_current()
    assert model.manifest.metrics["n_synthetic_negatives"] == 24
    assert model.manifest.training_size == res.report["dataset"]["train"]["n"]
    assert model.head.metrics_["fit_only_rows"] >= 24
    from flywheel.classifier.layer2.negatives import synthetic_negatives

    assert set(synthetic_negatives(24)) <= set(world.embedder.texts)
    assert world.embedder.calls == 1  # with everything else the training set embeds
    assert res.report["dataset"]["embeddings"]["computed"] == len(set(world.embedder.texts))


def test_the_latest_human_label_wins_by_its_own_time_not_its_decisions(world):
    """Two decisions of one text: the newer decision is labelled first, the older one
    later; the later *label* is the text's label."""
    text = "what does the addparam command return to me"
    old, new = record(text, created_at=1000.0), record(text, created_at=time.time() - 10)
    write(world.store, [old, new])
    world.store.add_human_label(new.decision.id, "RETRIEVAL")
    time.sleep(0.05)
    world.store.add_human_label(old.decision.id, "PLATFORM")
    ts = build_training_set(world.store, world.intents, embedder=world.embedder)
    assert find(ts, text)[1:] == ("PLATFORM", "human")


# ------------------------------------------------------- the champion moves during the run
class MovedDuringTheRun(ModelRegistry):
    """A real registry on which someone else promotes ``others``, one before each of the
    retrain's compare-and-swap promotions, until they run out."""

    def __init__(self, home, others) -> None:
        super().__init__(home)
        self.others = list(others)
        self.calls: list[tuple[str, str | None]] = []

    def promote(self, name, *, expected=UNCHECKED, verify=True):
        if expected is not UNCHECKED:
            self.calls.append((name, expected))
            if self.others:
                super().promote(self.others.pop(0))
        return super().promote(name, expected=expected, verify=verify)


def _by_hand(world, *names):
    """Versions trained outside retrain (``flywheel train``), saved but not promoted."""
    for name in names:
        fit_model(world.intents, embedder=HashEmbedder(), version=name).save(world.registry.version_dir(name))


def _saved_report(world, res):
    return json.loads((world.registry.home / res.version / "report.json").read_text())


def test_a_champion_promoted_meanwhile_is_gated_against_then_replaced_by_compare_and_swap(world):
    world.seed_traffic(n_teacher=200, n_human=10)
    first = world.run()
    _by_hand(world, "v-by-hand")
    world.registry = MovedDuringTheRun(world.registry.home, ["v-by-hand"])
    res = world.run(tolerance=1.0, promote_untested=True)
    assert res.outcome == "promoted", res.reason
    # the first promotion was refused (the pointer moved), the second compared against the new champion
    assert world.registry.calls == [(res.version, first.version), (res.version, "v-by-hand")]
    assert world.registry.history() == [first.version, "v-by-hand", res.version]
    assert res.champion["version"] == "v-by-hand" and res.report["champion_version"] == "v-by-hand"
    moved = f"the champion moved during the run (expected {first.version}, found v-by-hand)"
    assert any(n.startswith(moved) for n in res.report["notes"])
    assert any("not trained by retrain" in n for n in res.report["notes"])   # the gate against v-by-hand
    saved = _saved_report(world, res)
    assert saved["champion_version"] == "v-by-hand" and saved["promoted"] is True


def test_a_champion_that_keeps_moving_is_never_overwritten(world):
    world.seed_traffic(n_teacher=200, n_human=10)
    first = world.run()
    _by_hand(world, "v-a", "v-b", "v-c")
    world.registry = MovedDuringTheRun(world.registry.home, ["v-a", "v-b", "v-c"])
    res = world.run(tolerance=1.0, promote_untested=True)
    assert res.outcome == "kept"
    assert res.reason == "champion moved during the run (expected v-b, found v-c); not overwritten"
    assert [e for _, e in world.registry.calls] == [first.version, "v-a", "v-b"]   # PROMOTE_TRIES tries
    assert world.registry.current_name() == "v-c"
    assert world.registry.history() == [first.version, "v-a", "v-b", "v-c"]
    assert res.summary_line().startswith(f"kept v-c, challenger {res.version} not promoted: champion moved")
    moves = [n for n in res.report["notes"] if n.startswith("the champion moved")]
    assert len(moves) == 3 and "expected v-b, found v-c" in moves[-1]
    saved = _saved_report(world, res)
    assert saved["outcome"] == "kept" and saved["promoted"] is False and saved["reason"] == res.reason
    assert "NOT promoted" in (world.registry.home / res.version / "report.md").read_text()


def test_a_champion_moved_to_another_retrain_of_it_is_kept(world, tmp_path):
    """Another host retrained the same champion on the same log and promoted first."""
    world.seed_traffic(n_teacher=200, n_human=10)
    first = world.run()
    other = ModelRegistry(tmp_path / "host2")
    other.publish(world.registry.version_dir(first.version))
    other.promote(first.version)
    sibling = retrain(store=world.store, registry=other, intents=world.intents, embedder=HashEmbedder(),
                      options=RetrainOptions(tolerance=1.0, promote_untested=True))
    assert sibling.outcome == "promoted"
    world.registry.publish(other.version_dir(sibling.version))
    world.registry = MovedDuringTheRun(world.registry.home, [sibling.version])
    res = world.run(tolerance=1.0, promote_untested=True)
    assert res.outcome == "kept"
    assert res.reason == (f"champion moved during the run (expected {first.version}, found {sibling.version}), "
                          f"to another retrain of {first.version}; not overwritten")
    assert world.registry.current_name() == sibling.version and len(world.registry.calls) == 1
    assert _saved_report(world, res)["promoted"] is False


def test_a_champion_moved_before_saving_is_gated_against_before_publishing(world, monkeypatch):
    """The pointer moved while the challenger trained: the published report already names
    the new champion, and the promotion goes through on its token."""
    world.seed_traffic(n_teacher=200, n_human=10)
    first = world.run()
    _by_hand(world, "v-by-hand")
    real_gate, published = retrain_mod._gate, []

    def gate(job, trial, champion):
        if champion.name == first.version:       # someone promotes while the first gate runs
            world.registry.promote("v-by-hand")
        return real_gate(job, trial, champion)

    class Recording(ModelRegistry):
        def publish(self, directory):
            published.append(json.loads((directory / "report.json").read_text())["champion_version"])
            return super().publish(directory)

    monkeypatch.setattr(retrain_mod, "_gate", gate)
    world.registry = Recording(world.registry.home)
    res = world.run(tolerance=1.0, promote_untested=True)
    assert res.outcome == "promoted" and published == ["v-by-hand"]
    assert world.registry.history() == [first.version, "v-by-hand", res.version]


def test_two_retrains_on_one_home_one_runs_the_other_says_so(world):
    """The retrain lock: the second run, started while the first holds it, is skipped."""
    world.seed_traffic(n_teacher=200, n_human=10)
    inside, released = threading.Event(), threading.Event()

    class Held(ModelRegistry):
        def current(self):               # called with the retrain lock held
            inside.set()
            released.wait(timeout=60)
            return super().current()

    results = {}

    def run(name, registry):
        results[name] = retrain(store=world.store, registry=registry, intents=world.intents,
                                embedder=HashEmbedder())

    first = threading.Thread(target=run, args=("first", Held(world.registry.home)))
    first.start()
    try:
        assert inside.wait(timeout=60)
        run("second", ModelRegistry(world.registry.home))
    finally:
        released.set()
        first.join(timeout=120)
    assert results["first"].outcome == "promoted"
    assert results["second"].outcome == "skipped" and results["second"].reason == "another retrain is running"
    assert world.registry.history() == [results["first"].version]


def test_two_retrains_racing_without_a_shared_lock_one_promotes_the_other_says_so(world):
    """Two hosts (each with its own retrain lock) share one pointer: both gate against the
    same champion and promote at the same moment; one wins, the other is kept and says why."""
    from contextlib import contextmanager

    world.seed_traffic(n_teacher=200, n_human=10)
    first = world.run()
    both_gated = threading.Barrier(2)

    class Host(ModelRegistry):
        @contextmanager
        def lock(self, *, create=True):
            yield True

        def promote(self, name, *, expected=UNCHECKED, verify=True):
            if expected is not UNCHECKED and not both_gated.broken:
                both_gated.wait(timeout=120)
            return super().promote(name, expected=expected, verify=verify)

    results = []

    def run():
        results.append(retrain(store=world.store, registry=Host(world.registry.home), intents=world.intents,
                               embedder=HashEmbedder(), options=RetrainOptions(tolerance=1.0, promote_untested=True)))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert len(results) == 2
    won = [r for r in results if r.outcome == "promoted"]
    lost = [r for r in results if r.outcome != "promoted"]
    assert len(won) == 1 and len(lost) == 1, [r.summary_line() for r in results]
    assert lost[0].outcome == "kept"
    assert lost[0].reason == (f"champion moved during the run (expected {first.version}, found {won[0].version}), "
                              f"to another retrain of {first.version}; not overwritten")
    assert world.registry.current_name() == won[0].version
    assert world.registry.history() == [first.version, won[0].version]


def test_decisions_whose_text_retention_removed_train_on_their_logged_vectors(world):
    from flywheel.training.trainset import build_training_set

    items = sample(90, seed=7)
    recs = [record(t, true=y, embed=(i % 3 != 0)) for i, (t, y) in enumerate(items)]   # 60 with vectors
    write(world.store, recs)
    before = build_training_set(world.store, world.intents, embedder=world.embedder)
    assert before.report["text_removed"] == {"labelled_rows": 0, "trained": 0}
    assert world.store.forget_text(time.time() + 1) == 90
    after = build_training_set(world.store, world.intents, embedder=world.embedder)
    removed = after.report["text_removed"]
    assert removed["labelled_rows"] == 90
    with_vec = {r.decision.id: y for r, (_, y) in zip(recs, items) if r.embedding is not None}
    assert removed["trained"] == len(with_vec) == 60   # each on its own row, never merged into one
    rows = {d: (y, s) for d, y, s, t in zip(after.decision_ids, after.labels, after.sources, after.texts) if t == ""}
    assert {d: y for d, (y, _) in rows.items()} == with_vec
    assert all(s == "teacher" for _, s in rows.values())
    assert "" not in {normalise_key(t) for t in after.eval.texts + after.recent.texts}   # training only
    assert world.run().outcome in ("promoted", "kept")   # the job runs on them


def test_cli_summary_gives_every_figure_its_n_and_a_dry_run_prints_where_the_report_is(world, tmp_path,
                                                                                      monkeypatch):
    # issue 32: "LLM share 100% -> 0%" was measured on 2 rows and said nothing of it; a dry
    # run printed the whole report.md after the summary
    monkeypatch.setattr(cli_retrain, "make_embedder", lambda settings, cache_root=None: HashEmbedder())
    world.seed_traffic(n_teacher=30, n_human=4)
    intents_file = tmp_path / "intents.yaml"
    intents_file.write_text(yaml.safe_dump(INTENT_DOC))
    common = ["retrain", "--home", str(tmp_path / "home"), "--log-db", world.store.path, "--quiet",
              "--intents", str(intents_file)]
    app = build_app()
    assert CliRunner().invoke(app, common).exit_code == 0
    world.seed_traffic(n_teacher=20, n_human=4, seed=3)
    r = CliRunner().invoke(app, [*common, "--dry-run", "--promote-untested"])   # a tie on few rows: promoted
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    res = json.loads(CliRunner().invoke(app, [*common, "--dry-run", "--json", "--promote-untested"]).stdout)
    n_eval, n_recent = res["challenger"]["n"], res["challenger"]["llm_share_n"]
    assert 0 < n_eval < 20 and 0 < n_recent < 20
    below = "below the gate's minimum of 20"
    assert f"n={n_eval} eval queries, {below}" in lines[0] and f"n={n_recent} recent queries, {below}" in lines[0]
    figures = [ln for ln in lines if ln.lstrip().startswith(("challenger", "champion"))]
    assert len(figures) == 2
    for ln in figures:
        for name in ("accuracy", "in-scope", "oos recall", "LLM share"):
            assert name in ln
        assert ln.count("n=") == 4 and ln.count(below) == 4, ln
    # the summary and where the report is, never the report itself
    assert not any(ln.startswith("#") or ln.startswith("|") for ln in lines), r.stdout
    where = [ln for ln in lines if ln.lstrip().startswith("report: ")]
    assert len(where) == 1 and "dry run" in where[0]
    md = where[0].split("report: ", 1)[1].split(" (", 1)[0]
    assert md.endswith("report.md") and open(md).read().startswith("# flywheel retrain:")
    assert res["report_path"].endswith("report.json")


HOURS = {"name": "HOURS", "description": "opening hours",
         "examples": ["when are you open", "what are your opening hours", "are you open on sunday",
                      "what time do you close"]}


def test_an_edited_intent_file_moves_to_the_new_set_with_the_logged_labels(world, tmp_path, monkeypatch, capsys):
    # issue 32: after an edit, classify refused (exit 2) and advised `flywheel retrain --intents
    # FILE`, which kept the old champion, so classify still refused
    import flywheel.classifier.encoders

    monkeypatch.setattr(cli_retrain, "make_embedder", lambda settings, cache_root=None: HashEmbedder())
    monkeypatch.setattr(flywheel.classifier.encoders, "make_embedder", lambda *a, **k: HashEmbedder())
    monkeypatch.setenv("FLYWHEEL_TEACHER", "off")
    world.seed_traffic(n_teacher=30, n_human=6, seed=0)
    intents_file = tmp_path / "intents.yaml"
    intents_file.write_text(yaml.safe_dump(INTENT_DOC))
    home = ["--home", str(tmp_path / "home"), "--log-db", world.store.path]
    retrain_cmd = ["retrain", *home, "--quiet", "--intents", str(intents_file)]
    app = build_app()
    first = CliRunner().invoke(app, retrain_cmd)
    assert first.exit_code == 0 and first.stdout.startswith("promoted"), first.output
    champion = ModelRegistry(tmp_path / "home" / "models").current_name()
    # edit: PLATFORM removed, HOURS added
    doc = copy.deepcopy(INTENT_DOC)
    doc["intents"] = [doc["intents"][0], HOURS]
    intents_file.write_text(yaml.safe_dump(doc))
    classify = ["classify", *home, "--no-log", "--intents", str(intents_file), "what does addvar do"]
    from flywheel.cli import main

    assert main(classify) == 2                                      # refused, in one line naming the command
    err = capsys.readouterr().err
    assert f"run flywheel retrain --intents {intents_file} to train it on the labels already logged" in err
    moved = CliRunner().invoke(app, [*retrain_cmd, "--json"])      # the command the error names
    assert moved.exit_code == 0, moved.output
    res = json.loads(moved.stdout)
    assert res["outcome"] == "promoted", res["reason"]
    dropped = res["dataset"]["dropped_unknown_intent"]
    assert dropped["total"] > 0 and set(dropped["by_label"]) == {"PLATFORM"}
    assert res["reason"].startswith(f"intent set changed (added HOURS; removed PLATFORM ({dropped['total']} logged "
                                    f"labels dropped)); not measurably worse on the ")
    report = json.loads(open(res["report_path"]).read())
    change = report["intent_change"]
    assert change["added"] == ["HOURS"] and change["removed"] == ["PLATFORM"] and change["shared"] == ["RETRIEVAL"]
    assert change["labels_dropped_total"] == dropped["total"]
    # the gate compared the two only on the rows both sets know: RETRIEVAL and out of scope
    assert report["gate"]["set"] == "shared" and report["gate"]["n"] == change["gate_rows"] > 0
    per = report["challenger"]["shared"]["per_intent"]
    assert {k for k, v in per.items() if v["support"]} == {"RETRIEVAL", "OUT_OF_SCOPE"}
    # the teacher's and humans' labels of the kept intents trained it, not the file alone
    assert res["dataset"]["train"]["by_source"]["teacher"] > 0
    assert ModelRegistry(tmp_path / "home" / "models").current_name() not in (None, champion)
    assert main(classify) == 0
    assert json.loads(capsys.readouterr().out)["label"] == "RETRIEVAL"


def test_a_changed_intent_set_is_gated_on_shared_rows_the_champion_never_trained_on(world):
    # "when do you open tomorrow" hashes into the eval share; with 2 examples HOURS keeps it for
    # training, with 3 it is held out: the champion trained on it, so it must not gate
    assert split_value("when do you open tomorrow") < 0.2
    doc = copy.deepcopy(INTENT_DOC)
    doc["intents"].append({"name": "HOURS", "description": "opening hours",
                           "examples": ["when do you open tomorrow", "when are you open"]})
    world.intents = parse_intents(doc, source="v1.yaml")
    world.seed_traffic(n_teacher=200, n_human=20)
    first = world.run()
    assert first.outcome == "promoted"
    doc["intents"][-1]["examples"].append("what time do you close")           # one example more
    world.intents = parse_intents(doc, source="v2.yaml")
    ts = build_training_set(world.store, world.intents, embedder=HashEmbedder())
    rows = ts.eval.concat(ts.recent)
    assert "when do you open tomorrow" in ts.eval.texts
    res = world.run()
    assert res.outcome == "promoted", res.reason
    assert res.reason.startswith("intent set changed (same intents, other examples, rules or settings); not "
                                 "measurably worse on the ")
    change = res.report["intent_change"]
    assert change["added"] == change["removed"] == [] and change["labels_dropped_total"] == 0
    assert res.report["gate"]["set"] == "shared" and change["gate_rows"] == len(rows) - 1   # that example left out
    assert any(n.startswith("the intent set changed since champion") for n in res.report["notes"])
