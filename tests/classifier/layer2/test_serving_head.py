"""The numpy-only serving head: same scores as the scikit-learn estimator, saved without
pickle, served by default, and a serving process that never imports scikit-learn."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

from flywheel.classifier.errors import ModelError
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.layer2.head import IntentHead
from flywheel.classifier.layer2.scoring import Head, ServingHead
from flywheel.classifier.settings.intents import parse_intents
from flywheel.classifier.versions.model import SERVING_HEAD_FILE, IntentModel
from tests.support.docs import DOC
from tests.support.fakes import HashEmbedder
from tests.support.paths import ROOT

QUERIES = ["what is addvar", "write a function that sums", "hello there", "weather tomorrow", "zzzz"]


@pytest.fixture(params=["with out-of-scope examples", "without"])
def model(request) -> IntentModel:
    doc = dict(DOC)
    if request.param == "without":
        doc = {**DOC, "out_of_scope": {"examples": [], "synthetic": 0}}
    return fit_model(parse_intents(doc), embedder=HashEmbedder())


def _same(a, b) -> None:
    for field in ("probs", "oos_class", "p_oos", "similarity"):
        np.testing.assert_allclose(getattr(a, field), getattr(b, field), rtol=1e-5, atol=1e-6)


def _sklearn_reference(head: IntentHead, X: np.ndarray) -> dict[str, np.ndarray]:
    """The head's scores computed with scikit-learn's own calls (not classifier.layer2.scoring)."""
    from flywheel.classifier.layer2.scoring import gate_features, normalise_rows, softmax

    Xn = normalise_rows(X)
    z = head.lr_.decision_function(Xn)
    z = np.column_stack([-z / 2, z / 2]) if z.ndim == 1 else z
    probs = softmax(z, head.temperature_)
    n_in = len(head.classes_)
    sim = (Xn @ head.ref_.astype(np.float32).T).max(axis=1)
    if head.gate_ is not None:
        p_oos = head.gate_.predict_proba(gate_features(probs, sim, n_in))[:, 1]
    else:
        p_oos = 1 - np.interp(sim, head.sim_quantiles_, np.linspace(0, 1, len(head.sim_quantiles_)))
    return {"probs": probs[:, :n_in], "oos_class": probs[:, n_in] if head.has_oos_ else np.zeros(len(X)),
            "p_oos": p_oos, "similarity": sim}


def test_serving_head_scores_like_sklearn(model, tmp_path):
    X = HashEmbedder().encode(QUERIES)
    serving = model.head.serving_head()
    ref = _sklearn_reference(model.head, X)
    got = serving.scores(X)
    for field, expected in ref.items():
        np.testing.assert_allclose(getattr(got, field), expected, rtol=1e-5, atol=1e-6, err_msg=field)
    _same(serving.scores(X), model.head.scores(X))
    assert list(serving.classes_) == list(model.head.classes_)
    assert serving.thresholds_ == model.head.thresholds_ and serving.n_features_in_ == model.head.n_features_in_
    np.testing.assert_array_equal(serving.predict(X), model.head.predict(X))
    serving.save(tmp_path / "head.npz")
    _same(ServingHead.load(tmp_path / "head.npz").scores(X), model.head.scores(X))


def test_a_saved_version_serves_the_numpy_head_and_can_give_the_estimator(model, tmp_path):
    d = model.save(tmp_path / "v1")
    served = IntentModel.load(d)
    assert isinstance(served.head, ServingHead) and served.manifest.serving_head_sha256
    assert isinstance(IntentModel.load(d, estimator=True).head, IntentHead)
    X = HashEmbedder().encode(QUERIES)
    _same(served.head.scores(X), model.head.scores(X))


def test_both_heads_are_the_head_protocol_a_version_serves_and_saves(model, tmp_path):
    """IntentModel.head is a Head: the fitted estimator and the numpy head alike (typed access,
    no probing), and a version served from head.npz saves its head.npz again."""
    served = IntentModel.load(model.save(tmp_path / "v1"))
    for head in (model.head, served.head):
        assert isinstance(head, Head) and isinstance(head.serving_head(), ServingHead)
        assert list(head.classes_) == served.manifest.labels and head.n_features_in_ == HashEmbedder().dim
        assert dict(head.thresholds_) == dict(model.head.thresholds_)
    assert served.head.serving_head() is served.head
    assert not isinstance(IntentHead(), Head)                    # not fitted: no classes_, no cutoffs
    again = IntentModel(served.intents, served.head, dataclasses.replace(served.manifest, version="v2"))
    reloaded = IntentModel.load(again.save(tmp_path / "v2"))
    X = HashEmbedder().encode(QUERIES)
    _same(reloaded.head.scores(X), model.head.scores(X))


def test_a_head_file_that_is_not_a_head_is_refused(model, tmp_path):
    import hashlib

    import joblib

    d = model.save(tmp_path / "v1")
    joblib.dump({"classes_": ["PLATFORM", "RETRIEVAL"]}, d / "head.joblib")
    manifest = json.loads((d / "manifest.json").read_text())
    manifest["head_sha256"] = hashlib.sha256((d / "head.joblib").read_bytes()).hexdigest()
    (d / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelError, match="head.joblib: not a fitted layer-2 head"):
        IntentModel.load(d, estimator=True)


def test_a_version_without_a_serving_head_loads_its_estimator(model, tmp_path):
    d = model.save(tmp_path / "v1")
    (d / SERVING_HEAD_FILE).unlink()
    manifest = json.loads((d / "manifest.json").read_text())
    manifest.pop("serving_head_sha256")
    (d / "manifest.json").write_text(json.dumps(manifest))
    assert isinstance(IntentModel.load(d).head, IntentHead)


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / SERVING_HEAD_FILE).write_bytes(b"corrupt"), "checksum does not match"),
    (lambda d: (d / SERVING_HEAD_FILE).unlink(), "head.npz is missing"),
    (lambda d: (d / "head.joblib").write_bytes(b"corrupt"), "head.joblib: checksum does not match"),
])
def test_a_damaged_version_is_refused(model, tmp_path, damage, message):
    d = model.save(tmp_path / "v1")
    damage(d)
    with pytest.raises(ModelError, match=message):
        IntentModel.load(d)


def test_an_unreadable_serving_file_names_what_is_wrong(tmp_path):
    np.savez(tmp_path / "bad.npz", meta=np.asarray("{}"), coef=np.zeros((2, 3)))
    with pytest.raises(ModelError, match="missing intercept, ref, classes"):
        ServingHead.load(tmp_path / "bad.npz")


@pytest.mark.slow   # a Python process
def test_serving_a_saved_version_imports_neither_sklearn_nor_scipy(model, tmp_path):
    d = model.save(tmp_path / "v1")
    code = (
        "import sys, numpy as np\n"
        "from flywheel.classifier.versions.model import IntentModel\n"
        f"m = IntentModel.load({str(d)!r})\n"
        "m.head.scores(np.ones((1, m.head.n_features_in_), dtype=np.float32))\n"
        "bad = sorted(k for k in sys.modules if k.split('.')[0] in ('sklearn', 'scipy', 'joblib'))\n"
        "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
