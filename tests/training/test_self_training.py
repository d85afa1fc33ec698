"""Self-training: layer 2's own confident decisions as extra, lower-weight training rows
that never fit the gate or the cutoffs (IntentHead.fit's ``sample_weight`` and
``fit_only``, LogStore.confident_layer2, build_training_set, retrain --self-training)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from flywheel.classifier.decision import Candidate, Decision, Layer, Tier
from flywheel.classifier.layer2.head import IntentHead
from flywheel.classifier.protocols import DecisionRecord
from flywheel.classifier.text import normalise_key
from flywheel.classifier.versions.model import IntentModel
from flywheel.cli import build_app
from flywheel.training import retrain as retrain_mod
from flywheel.training.cli import retrain as cli_retrain
from flywheel.training.trainset import build_training_set
from tests.support.fakes import HashEmbedder
from tests.support.worlds import ENC, INTENT_DOC, World, blobs, record, sample, write

# ------------------------------------------------------------------ the head


def test_fit_only_rows_train_the_regression_but_not_the_cutoffs():
    X, y, centres = blobs(n_per=30)
    rng = np.random.default_rng(1)
    # 200 easy rows right at the centres: fit-only
    Xe = np.repeat(centres, 50, axis=0) + 0.01 * rng.standard_normal((200, X.shape[1]))
    ye = [f"L{i}" for i in range(4) for _ in range(50)]
    head = IntentHead(cv=3).fit(np.vstack([X, Xe]), list(y) + ye, fit_only=np.r_[np.zeros(len(X), bool),
                                                                              np.ones(200, bool)])
    assert head.metrics_["cv_samples"] == len(X)            # out-of-fold rows: the labelled ones only
    assert head.metrics_["fit_only_rows"] == 200
    assert len(head.ref_) == 120 + 200                        # but they are nearest-example references
    both = IntentHead(cv=3).fit(np.vstack([X, Xe]), list(y) + ye)     # without the flag they are
    assert both.metrics_["cv_samples"] == len(X) + 200 and both.metrics_["fit_only_rows"] == 0


def test_a_label_seen_only_in_fit_only_rows_is_still_learned():
    X, y, centres = blobs(n_per=30, with_oos=False)
    keep = [i for i, v in enumerate(y) if v != "L3"]
    extra = [i for i, v in enumerate(y) if v == "L3"]
    Xa = np.vstack([X[keep], X[extra]])
    ya = [y[i] for i in keep] + [y[i] for i in extra]
    fo = np.r_[np.zeros(len(keep), bool), np.ones(len(extra), bool)]
    head = IntentHead(cv=3).fit(Xa, ya, fit_only=fo)
    assert list(head.classes_) == ["L0", "L1", "L2", "L3"]
    assert head.predict(centres[3:4])[0] == "L3"
    assert head.metrics_["cv_samples"] == len(keep)


def test_out_of_scope_rows_only_in_fit_only_fall_back_to_the_similarity_gate():
    X, y, centres = blobs(n_per=30)
    fo = np.array([v is None for v in y])
    head = IntentHead(cv=3).fit(X, y, fit_only=fo)
    assert head.has_oos_ and head.gate_ is None and head.sim_quantiles_ is not None
    far = -5.0 * centres.mean(axis=0, keepdims=True)
    assert head.predict(far)[0] is None and list(head.predict(centres)) == ["L0", "L1", "L2", "L3"]
    assert head.thresholds_["oos_confident"] > 1.0       # never sure of out of scope without a gate


def test_sample_weight_reaches_the_regression():
    X, y, centres = blobs(n_per=30, with_oos=False)
    Xw = np.vstack([X, centres[:1]])             # the centre of L0, labelled L1
    yw = list(y) + ["L1"]
    light = IntentHead(cv=3).fit(Xw, yw, sample_weight=np.r_[np.ones(len(X)), 1e-3])
    heavy = IntentHead(cv=3).fit(Xw, yw, sample_weight=np.r_[np.ones(len(X)), 1e3])
    assert light.predict(centres[:1])[0] == "L0"
    assert heavy.predict(centres[:1])[0] == "L1"


@pytest.mark.parametrize("make_kw, msg", [
    (lambda n: {"sample_weight": [1.0, 2.0]}, "sample_weight must be one positive finite number per row"),
    (lambda n: {"sample_weight": -np.ones(n)}, "sample_weight must be one positive finite number per row"),
    (lambda n: {"fit_only": [True]}, "fit_only must have one flag per row"),
    (lambda n: {"fit_only": np.ones(n, bool)}, "fit_only leaves no rows to cross-validate"),
])
def test_bad_weights_and_flags_are_named(make_kw, msg):
    X, y, _ = blobs(n_per=10, with_oos=False)
    with pytest.raises(ValueError, match=msg):
        IntentHead(cv=3).fit(X, y, **make_kw(len(X)))


# ------------------------------------------------------------------ the log and the dataset

def layer2_record(text: str, label: str | None, tier: Tier = Tier.CONFIDENT, *, embed: bool = True,
                  created_at: float | None = None) -> DecisionRecord:
    d = Decision(label=label, confidence=0.97, tier=tier, layer=Layer.EMBEDDING, reason="test",
                 alternatives=[Candidate(label or "RETRIEVAL", 0.97)], model_version="v1",
                 latency_ms={"embedding": 1.0})
    return DecisionRecord(decision=d, text=text, created_at=created_at if created_at is not None else time.time(),
                          encoder_id=ENC.id if embed else None,
                          embedding=ENC.encode([text])[0] if embed else None)


@pytest.fixture()
def logged(tmp_path):
    """A log with teacher-labelled traffic plus layer-2 decisions of every kind."""
    from flywheel.logstore import LogStore

    store = LogStore(tmp_path / "traffic.duckdb")
    items = sample(260, 7)
    teacher, conf = items[:200], items[200:]
    t0 = time.time() - 600
    recs = [record(t, true=y, embed=True) for t, y in teacher]
    conf_in = [(t, y) for t, y in conf if y is not None][:40]
    recs += [layer2_record(t, y, created_at=t0 + i) for i, (t, y) in enumerate(conf_in)]
    odd = {
        "weak": layer2_record("how do i call addvar hmm", "RETRIEVAL", Tier.WEAK, created_at=t0 + 100),
        "oos": layer2_record("weather in lima on friday", None, Tier.CONFIDENT, created_at=t0 + 101),
        "no_vector": layer2_record("show my invoice again", "PLATFORM", embed=False, created_at=t0 + 102),
        "removed": layer2_record("book a table for two", "BOOKING", created_at=t0 + 103),
        "labelled": layer2_record(teacher[0][0], "PLATFORM" if teacher[0][1] != "PLATFORM" else "RETRIEVAL",
                                  created_at=t0 + 104),
        "dup_old": layer2_record("Explain   the AddVar function", "PLATFORM", created_at=t0 + 105),
        "dup_new": layer2_record("explain the addvar function", "RETRIEVAL", created_at=t0 + 106),
    }
    write(store, recs + list(odd.values()))
    return store, conf_in, odd, teacher


def test_confident_layer2_reads_confident_in_scope_decisions_with_vectors(logged):
    store, conf_in, odd, _ = logged
    ids, texts, labels, X = store.confident_layer2(ENC.id, 1000)
    got = set(texts)
    assert {t for t, _ in conf_in} <= got
    assert odd["weak"].text not in got and odd["oos"].text not in got and odd["no_vector"].text not in got
    assert texts[0] == odd["dup_new"].text                 # newest first
    assert len(X) == len(ids) and all(v.shape == (ENC.dim,) for v in X)
    assert np.allclose(X[0], ENC.encode([texts[0]])[0])
    assert None not in labels
    assert store.confident_layer2(ENC.id, 3)[1] == texts[:3]
    assert store.confident_layer2("other-encoder", 10)[0] == []


def test_training_set_adds_self_training_rows_only_when_asked(logged):
    from flywheel.classifier.settings.intents import parse_intents

    store, conf_in, odd, teacher = logged
    intents = parse_intents(INTENT_DOC, source="synthetic.yaml")
    plain = build_training_set(store, intents, embedder=HashEmbedder())
    assert plain.counts()["layer2"] == 0 and plain.report["self_training"]["rows"] == 0

    ts = build_training_set(store, intents, embedder=HashEmbedder(), self_training_max=1000)
    info = ts.report["self_training"]
    rows = {normalise_key(t): y for t, y, s in zip(ts.texts, ts.labels, ts.sources) if s == "layer2"}
    assert info["rows"] == len(rows) == ts.counts()["layer2"] == len(conf_in) + 1
    assert all(rows[normalise_key(t)] == y for t, y in conf_in)
    # the newest of two decisions on the same normalised text wins
    assert rows[normalise_key("explain the addvar function")] == "RETRIEVAL"
    assert info["duplicates_merged"] == 1
    # a text with a teacher label keeps the teacher's label and is not a layer-2 row
    assert normalise_key(teacher[0][0]) not in rows and info["skipped_labelled"] >= 1
    assert info["dropped_unknown_intent"] == 1
    # layer-2 rows are neither evaluation rows nor "training texts" for the budget sample
    assert not set(rows) & {normalise_key(t) for t in ts.eval.texts + ts.recent.texts}
    assert not set(rows) & set(ts.train_keys)

    capped = build_training_set(store, intents, embedder=HashEmbedder(), self_training_max=5)
    assert capped.counts()["layer2"] <= 5 and capped.report["self_training"]["read"] == 5
    with pytest.raises(ValueError, match="self_training_max"):
        build_training_set(store, intents, embedder=HashEmbedder(), self_training_max=-1)


# ------------------------------------------------------------------ the job

def test_retrain_self_training_weight_and_report(world_st, monkeypatch):
    import flywheel.classifier.layer2.fitter

    world = world_st
    seen: list[dict] = []
    real_fit = flywheel.classifier.layer2.fitter.fit_from_vectors

    def spy(*args, **kw):
        seen.append(kw)
        return real_fit(*args, **kw)

    monkeypatch.setattr(flywheel.classifier.layer2.fitter, "fit_from_vectors", spy)
    base = world.run()
    assert base.outcome == "promoted"
    assert base.report["dataset"]["self_training"]["rows"] == 0
    assert seen[-1]["sample_weight"] is None and seen[-1]["fit_only"] is None   # off: plain fit
    res = world.run(self_training=0.3, tolerance=1.0)
    # the weight and the fit-only flag reach the fit for the layer-2 rows, and only for them
    kw = seen[-1]
    n_layer2 = res.report["dataset"]["self_training"]["rows"]
    flags, weights = [bool(f) for f in kw["fit_only"]], [float(w) for w in kw["sample_weight"]]
    assert sum(flags) == n_layer2
    assert sorted(set(zip(flags, weights))) == [(False, 1.0), (True, 0.3)]
    assert res.outcome in ("promoted", "kept")
    ds = res.report["dataset"]
    assert ds["self_training"]["rows"] > 0 and ds["train"]["by_source"]["layer2"] == ds["self_training"]["rows"]
    saved = IntentModel.load(world.registry.version_dir(res.version))
    assert saved.head.metrics_["fit_only_rows"] >= ds["self_training"]["rows"]
    assert saved.head.metrics_["cv_samples"] == ds["train"]["n"] - saved.head.metrics_["fit_only_rows"]
    with pytest.raises(retrain_mod.RetrainError, match="self_training must be between 0 and 1"):
        world.run(self_training=1.5)
    with pytest.raises(retrain_mod.RetrainError, match="self_training_max must be >= 0"):
        world.run(self_training=0.3, self_training_max=-1)


@pytest.fixture()
def world_st(tmp_path):
    w = World(tmp_path)
    w.seed_traffic(n_teacher=300, n_human=10, seed=3)
    conf = [(t, y) for t, y in sample(400, 11) if y is not None][:150]
    write(w.store, [layer2_record(t, y) for t, y in conf])
    return w


def test_cli_self_training_flag(world_st, tmp_path, monkeypatch):
    monkeypatch.setattr(cli_retrain, "make_embedder", lambda settings, cache_root=None: HashEmbedder())
    intents_file = tmp_path / "intents.yaml"
    intents_file.write_text(yaml.safe_dump(INTENT_DOC))
    common = ["--home", str(tmp_path / "home"), "--log-db", world_st.store.path, "--quiet",
              "--intents", str(intents_file)]
    runner = CliRunner()
    r = runner.invoke(build_app(), ["retrain", *common, "--json", "--self-training", "0.3",
                                   "--self-training-max", "50"])
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    report = json.loads((tmp_path / "home" / "models" / obj["version"] / "report.json").read_text())
    assert 0 < report["dataset"]["self_training"]["rows"] <= 50
    r = runner.invoke(build_app(), ["retrain", *common, "--self-training", "2"])
    assert r.exit_code == 2 and "--self-training" in r.output and "Traceback" not in r.output


def test_self_training_rows_with_unusable_vectors_are_dropped_and_counted(tmp_path):
    from flywheel.classifier.settings.intents import parse_intents
    from flywheel.logstore import LogStore

    store = LogStore(tmp_path / "traffic.duckdb")
    good = layer2_record("how do i call addvar today", "RETRIEVAL")
    bad = layer2_record("how do i call getlist today", "RETRIEVAL")
    bad = DecisionRecord(decision=bad.decision, text=bad.text, created_at=bad.created_at, encoder_id=ENC.id,
                         embedding=np.full(ENC.dim, np.nan, dtype=np.float32))
    short = layer2_record("where can i find my receipt today", "PLATFORM")
    short = DecisionRecord(decision=short.decision, text=short.text, created_at=short.created_at,
                           encoder_id=ENC.id, embedding=short.embedding[:-1])
    write(store, [good, bad, short])
    ts = build_training_set(store, parse_intents(INTENT_DOC, source="synthetic.yaml"), embedder=HashEmbedder(),
                            self_training_max=10)
    info = ts.report["self_training"]
    assert info["read"] == 3 and info["rows"] == 1 and info["dropped_bad_vector"] == 2
    assert [t for t, s in zip(ts.texts, ts.sources) if s == "layer2"] == [good.text]
