"""The adapter trainer (issue 22 item 5): an identity-started affine map on frozen vectors,
fitted with the tuner's cosine-softmax objective, bounded by its budget; and the retrain's
``objective: adapter`` step, which writes it beside a version like a tuned encoder."""

from __future__ import annotations

import numpy as np
import pytest

import flywheel.classifier.encoders as encoders
import flywheel.classifier.encoders.factory as factory
from flywheel.classifier.encoders.adapter import AdaptedEmbedder
from flywheel.classifier.settings.intents import EmbedderSettings, TuneSettings
from flywheel.training.tuner.adapter_trainer import AdapterTrainer
from flywheel.training.tuner.export import adapt_and_export, tune_and_export
from flywheel.training.tuner.finetune import TuningError
from tests.support.fakes import HashEmbedder


def _blobs(n_per: int = 20, dim: int = 16, seed: int = 0) -> tuple[np.ndarray, list[str | None]]:
    """Three close intents and some out-of-scope rows on the unit sphere."""
    rng = np.random.default_rng(seed)
    centres = np.eye(dim, dtype=np.float32)[:3] * 0.3 + rng.standard_normal((1, dim)).astype(np.float32)
    x, y = [], []
    for k, label in enumerate(["a", "b", "c"]):
        x.append(centres[k] + 0.25 * rng.standard_normal((n_per, dim)).astype(np.float32))
        y += [label] * n_per
    x.append(rng.standard_normal((6, dim)).astype(np.float32))
    y += [None] * 6
    v = np.concatenate(x)
    return v / np.linalg.norm(v, axis=1, keepdims=True), y


def _nearest_centroid_accuracy(v: np.ndarray, y: list[str | None]) -> float:
    labels = sorted({t for t in y if t is not None})
    rows = [i for i, t in enumerate(y) if t is not None]
    cent = np.stack([v[[i for i in rows if y[i] == c]].mean(axis=0) for c in labels])
    pred = (v[rows] @ cent.T).argmax(axis=1)
    return float(np.mean([labels[p] == y[i] for p, i in zip(pred, rows)]))


def test_the_adapter_starts_at_the_identity_and_separates_the_intents():
    v, y = _blobs()
    untrained = AdapterTrainer(epochs=1, learning_rate=1e-9).fit(v, y)
    np.testing.assert_allclose(untrained.weight_, np.eye(v.shape[1]), atol=1e-6)
    trained = AdapterTrainer(epochs=300, learning_rate=1e-2, identity_decay=0.01).fit(v, y)
    assert trained.report_["loss_last"] < trained.report_["loss_first"]
    assert trained.report_["identity_distance"] > 0 and trained.report_["steps"] == 300
    assert _nearest_centroid_accuracy(trained.transform(v), y) >= _nearest_centroid_accuracy(v, y)
    np.testing.assert_allclose(np.linalg.norm(trained.transform(v), axis=1), 1.0, atol=1e-5)


def test_the_identity_decay_keeps_the_map_near_the_identity():
    v, y = _blobs()
    loose = AdapterTrainer(epochs=200, learning_rate=1e-2, identity_decay=0.0).fit(v, y)
    tight = AdapterTrainer(epochs=200, learning_rate=1e-2, identity_decay=10.0).fit(v, y)
    assert tight.report_["identity_distance"] < loose.report_["identity_distance"]


def test_the_budget_stops_it_between_steps_and_says_so():
    v, y = _blobs()
    fit = AdapterTrainer(epochs=10_000_000, budget_s=0.3).fit(v, y)
    assert fit.report_["stopped_early"] is True and 0 < fit.report_["steps"] < 10_000_000


def test_it_is_seeded_and_checks_its_inputs():
    v, y = _blobs()
    a = AdapterTrainer(epochs=20).fit(v, y)
    b = AdapterTrainer(epochs=20).fit(v, y)
    np.testing.assert_array_equal(a.weight_, b.weight_)
    with pytest.raises(TuningError, match="two intents"):
        AdapterTrainer().fit(v[:5], ["a"] * 5)
    with pytest.raises(TuningError, match="one vector per label"):
        AdapterTrainer().fit(v, y[:-1])
    with pytest.raises(TuningError, match="epochs"):
        AdapterTrainer(epochs=0).fit(v, y)
    with pytest.raises(TuningError, match="not fitted"):
        AdapterTrainer().transform(v)


@pytest.fixture
def hash_base(monkeypatch):
    base = HashEmbedder(64, id="fake:hash-64")
    monkeypatch.setattr(encoders, "make_embedder", lambda settings, cache=True, **kw: base)
    monkeypatch.setattr(factory, "make_embedder", lambda settings, cache=True, **kw: base)
    return base


def test_objective_adapter_writes_an_adapter_and_holds_out_rows_to_calibrate(tmp_path, hash_base):
    texts = [f"{word} number {i}" for word in ("invoice", "python", "hello") for i in range(10)] + ["weather today"]
    labels: list[str | None] = [w for w in ("RETRIEVAL", "CODE", "CHAT") for _ in range(10)] + [None]
    tune = TuneSettings(objective="adapter", epochs=1, holdout=0.2)
    out = tune_and_export(texts, labels, EmbedderSettings(backend="use-multilingual"), tune, tmp_path)
    assert isinstance(out.embedder, AdaptedEmbedder) and out.export.id.startswith("adapted:")
    assert (tmp_path / "encoder" / "adapter.npz").is_file()
    r = out.report
    assert r["objective"] == "adapter" and r["base_encoder"] == "fake:hash-64" and r["steps"] == 50
    assert r["held_out_rows"] == 6 and r["held_out_intents"] == 3
    # the head calibrates on the 6 held-out rows and the out-of-scope row, never on adapted rows
    assert int(out.fit_only.sum()) == 24 and not out.fit_only[-1]
    assert out.embedder.encode(texts[:2]).shape == (2, 64)


def test_an_adapter_needs_two_intents(tmp_path, hash_base):
    with pytest.raises(TuningError, match="two intents"):
        adapt_and_export(["a", "b", "c"], ["X", "X", None], EmbedderSettings(), TuneSettings(objective="adapter"),
                         tmp_path)


def test_candidate_pairs_count_every_pair_of_a_set_and_hard_pairs_keep_the_champions_first():
    from flywheel.training.tuner.step import candidate_pairs, hard_pairs_of

    pairs = candidate_pairs([("B", "A"), ("A", "B"), ("A", None, "C")], k=3)
    assert pairs[0] == {"pair": ["A", "B"], "sets": 2} and len(pairs) == 3
    assert {"pair": ["A", None], "sets": 1} in pairs and {"pair": ["A", "C"], "sets": 1} in pairs
    merged = hard_pairs_of([{"pair": ["A", "C"], "errors": 4}], pairs)
    assert merged[0] == ("A", "C") and merged.count(("A", "C")) == 1 and ("A", "B") in merged
