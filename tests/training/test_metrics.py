"""The label metrics the promotion gate and ``flywheel eval`` share (:mod:`training.metrics`),
checked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from flywheel.classifier.settings.label_names import OUT_OF_SCOPE as OOS_NAME
from flywheel.training.metrics import classification_metrics, language_slices


def test_metric_definitions_by_hand():
    true = ["a", "a", "a", "b", "b", None, None, None, None]
    pred = ["a", "a", None, "b", "a", None, None, "b", None]
    m = classification_metrics(true, pred)
    assert m["n"] == 9 and m["n_in_scope"] == 5 and m["n_out_of_scope"] == 4
    assert m["accuracy"] == pytest.approx(6 / 9, abs=1e-6)
    # CLINC150: right intent and not rejected, over in-scope queries; the rejected "a" is wrong.
    assert m["in_scope_accuracy"] == pytest.approx(3 / 5, abs=1e-6)
    assert m["oos_recall"] == pytest.approx(3 / 4, abs=1e-6)
    assert m["oos_precision"] == pytest.approx(3 / 4, abs=1e-6)
    # a: P 2/3 R 2/3; b: P 1/2 R 1/2; OOS: P 3/4 R 3/4 -> F1 equal to P=R
    assert m["per_intent"]["a"] == {"precision": pytest.approx(2 / 3, abs=1e-6),
                                    "recall": pytest.approx(2 / 3, abs=1e-6),
                                    "f1": pytest.approx(2 / 3, abs=1e-6), "support": 3}
    assert m["per_intent"][OOS_NAME]["support"] == 4
    assert m["macro_f1"] == pytest.approx((2 / 3 + 1 / 2 + 3 / 4) / 3, abs=1e-6)
    assert sorted(map(tuple, m["confused_pairs"])) == sorted([("a", OOS_NAME, 1), ("b", "a", 1), (OOS_NAME, "b", 1)])
    assert m["confusion"]["labels"] == ["a", "b", OOS_NAME]
    assert m["confusion"]["matrix"] == [[2, 0, 1], [1, 1, 0], [0, 1, 3]]


def test_metrics_without_out_of_scope_and_top_pairs_order():
    true = ["a"] * 5 + ["b"] * 3
    pred = ["b"] * 3 + ["a"] * 2 + ["a", "b", "b"]
    m = classification_metrics(true, pred)
    assert m["oos_recall"] is None and m["oos_precision"] is None
    assert m["in_scope_accuracy"] == m["accuracy"] == pytest.approx(4 / 8)
    assert m["confused_pairs"][0] == ["a", "b", 3]
    assert OOS_NAME not in m["per_intent"]


def test_confusion_subset_for_many_labels():
    labels = [f"l{i:03d}" for i in range(60)]
    true = labels * 2
    pred = list(labels) + [labels[(i + 1) % 60] if i < 25 else labels[i] for i in range(60)]
    m = classification_metrics(true, pred, confusion_labels=20)
    conf = m["confusion"]
    assert len(conf["labels"]) == 20 and not conf["complete"] and conf["n_labels"] == 60
    assert np.array(conf["matrix"]).shape == (20, 20)
    assert len(m["confused_pairs"]) == 10


def test_language_slices_by_hand():
    true = ["a", "a", None, "b", "b", "a", None, "b"]
    pred = ["a", None, None, "b", "a", "a", "b", "b"]
    langs = ["en", "en", "en", "es", "es", "es", "es", None]
    s = language_slices(true, pred, langs)
    assert list(s) == ["en", "es", "unknown"]
    assert s["en"] == {"n": 3, "n_in_scope": 2, "n_out_of_scope": 1, "accuracy": pytest.approx(2 / 3, abs=1e-6),
                       "in_scope_accuracy": 0.5, "oos_recall": 1.0, "oos_precision": 0.5,
                       "macro_f1": pytest.approx(2 / 3, abs=1e-6)}
    assert s["es"]["n"] == 4 and s["es"]["accuracy"] == 0.5
    assert s["es"]["in_scope_accuracy"] == pytest.approx(2 / 3, abs=1e-6) and s["es"]["oos_recall"] == 0.0
    assert s["unknown"] == {"n": 1, "n_in_scope": 1, "n_out_of_scope": 0, "accuracy": 1.0, "in_scope_accuracy": 1.0,
                            "oos_recall": None, "oos_precision": None, "macro_f1": 1.0}
    assert language_slices(true, pred, None) == {} == language_slices(true, pred, [None] * 8)
    with pytest.raises(ValueError, match="languages"):
        language_slices(true, pred, ["en"])
