"""The Python entry (flywheel/api.py): ``flywheel.classify`` and ``flywheel.open_classifier``
log every decision to the configured traffic log (what ``flywheel retrain`` learns from),
follow promotions and flush the log when they close; ``import flywheel`` stays cheap; the
entry points refuse a keyword they do not know, naming it."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

import flywheel
from flywheel import api
from flywheel.classifier.settings.config import load_config
from flywheel.classifier.versions.registry import ModelRegistry
from flywheel.logstore import LogStore
from tests.support.docs import ALWAYS_SURE, DOC
from tests.support.fakes import HashEmbedder
from tests.support.intent_sets import save_fitted
from tests.support.paths import ROOT

SURE_DOC = {**DOC, "thresholds": ALWAYS_SURE}   # layer 2 decides: no teacher needed
OPEN_CLASSIFIER = api.open_classifier             # as imported (a fixture below wraps it)


def _home(tmp_path) -> ModelRegistry:
    """A models home serving v1 of the tests' intent set (on the hash encoder)."""
    reg = ModelRegistry(tmp_path / "models")
    save_fitted(reg, SURE_DOC, "v1")
    reg.promote("v1")
    return reg


def _logged(store: LogStore, decision_id: str) -> str | None:
    """The logged text of ``decision_id`` (``None``: not in the log)."""
    rows = store.query("SELECT text FROM decisions WHERE decision_id = ?", [decision_id])
    return rows[0][0] if rows else None


def _wait_for(predicate, timeout_s: float = 10.0) -> bool:
    for _ in range(int(timeout_s / 0.01)):
        if predicate():
            return True
        threading.Event().wait(0.01)
    return predicate()


def test_open_classifier_logs_follows_promotions_and_flushes_when_it_closes(tmp_path):
    reg = _home(tmp_path)
    cfg = load_config(home=tmp_path, model=str(reg.home), teacher="off")
    with flywheel.open_classifier(cfg, progress=False, embedder=HashEmbedder()) as clf:
        assert isinstance(clf, flywheel.LoggedClassifier) and not clf.closed
        first = clf.classify("show my invoices", session_id="s1")
        assert first.model_version == "v1"
        save_fitted(reg, SURE_DOC, "v2")
        reg.promote("v2")                       # swapped in on the watcher's thread, no restart
        assert _wait_for(lambda: clf.model_version == "v2")
        many = clf.classify_many(["what is addvar", "cancel subscription"])
        last = clf.classify("explain addparam")
        assert {d.model_version for d in [*many, last]} == {"v2"}
    assert clf.closed and clf.classifier.watcher is not None and not clf.classifier.watcher.running
    store = LogStore(cfg.log_path)              # the file, read by another reader: the log was flushed
    assert {d.id: _logged(store, d.id) for d in [first, *many, last]} == {
        first.id: "show my invoices", many[0].id: "what is addvar", many[1].id: "cancel subscription",
        last.id: "explain addparam"}
    with pytest.raises(RuntimeError, match="closed"):
        clf.classify("show my invoices")
    clf.close()                                  # a second close does nothing


def test_open_classifier_without_the_log_logs_nothing(tmp_path):
    reg = _home(tmp_path)
    cfg = load_config(home=tmp_path, model=str(reg.home), teacher="off")
    with flywheel.open_classifier(cfg, log_decisions=False, progress=False, embedder=HashEmbedder()) as clf:
        d = clf.classify("show my invoices")
        assert clf.runtime.sink is None and clf.runtime.store is None
    assert d.label == "PLATFORM" and not cfg.log_path.exists()


@pytest.fixture
def default_home(tmp_path, monkeypatch):
    """The environment's configuration serves a models home on the hash encoder, and
    ``flywheel.classify`` opens its classifier with that encoder (what it opens is recorded)."""
    reg = _home(tmp_path)
    monkeypatch.setenv("FLYWHEEL_MODEL", str(reg.home))
    monkeypatch.setenv("FLYWHEEL_TEACHER", "off")
    opened: list[flywheel.LoggedClassifier] = []
    real = api.open_classifier

    def opening(cfg=None, **kwargs):
        clf = real(cfg, progress=False, embedder=HashEmbedder())
        opened.append(clf)
        return clf

    monkeypatch.setattr(api, "open_classifier", opening)
    yield reg, opened
    flywheel.close()


def test_flywheel_classify_opens_one_classifier_for_the_process_and_logs(default_home, monkeypatch):
    from flywheel.training.review.feedback import record_feedback

    reg, opened = default_home
    registered = []
    monkeypatch.setattr(api, "_at_exit", False)
    monkeypatch.setattr(api.atexit, "register", registered.append)
    flywheel.close()                             # nothing open: nothing happens
    d1 = flywheel.classify("show my invoices")
    d2 = flywheel.classify("what is addvar", session_id="s1")
    assert len(opened) == 1 and registered == [api.close]      # one for the process, closed at exit
    assert d1.model_version == "v1" and d2.label == "RETRIEVAL"
    flywheel.close()                             # flushes the log; the next call opens a new one
    assert opened[0].closed
    cfg = load_config()
    store = LogStore(cfg.log_path)
    assert (_logged(store, d1.id), _logged(store, d2.id)) == ("show my invoices", "what is addvar")
    # a person's label of a logged decision: what the next retrain distils (human labels win)
    assert record_feedback(cfg, d1.id, "RETRIEVAL", author="ana") == "RETRIEVAL"
    assert {r.decision_id: r.human_label for r in store.labelled_rows() if r.has_human_label} == {d1.id: "RETRIEVAL"}

    save_fitted(reg, SURE_DOC, "v2")
    reg.promote("v2")
    assert flywheel.classify("show my invoices").model_version == "v2"   # opened again, as configured now
    assert len(opened) == 2 and registered == [api.close]
    api._forget_in_child()                       # as after a fork: the child opens its own
    flywheel.classify("show my invoices")
    assert len(opened) == 3 and not opened[1].closed   # the parent's is the parent's to close
    opened[1].close()


def test_the_entry_refuses_an_unknown_keyword_naming_it(default_home):
    _, opened = default_home
    with pytest.raises(TypeError, match="unexpected keyword argument 'sesion_id'"):
        flywheel.classify("show my invoices", sesion_id="s1")
    assert opened == []                          # refused before anything was opened
    with pytest.raises(TypeError, match="unexpected keyword argument 'log'"):
        OPEN_CLASSIFIER(log=False)
    with pytest.raises(TypeError, match="unexpected keyword argument 'declared'"):
        flywheel.classifier.classify("show my invoices", declared="PLATFORM")


def test_the_package_exports_the_entry():
    assert sorted(flywheel.__all__) == ["LoggedClassifier", "classify", "close", "open_classifier"]
    assert all(name in dir(flywheel) for name in flywheel.__all__)
    assert flywheel.open_classifier is OPEN_CLASSIFIER and flywheel.classify is api.classify
    with pytest.raises(AttributeError, match="no attribute 'clasify'"):
        flywheel.clasify


@pytest.mark.slow   # a Python process
def test_import_flywheel_loads_no_model_and_no_log():
    code = ("import sys, flywheel; loaded = [m for m in ('flywheel.classifier', 'flywheel.logstore', 'duckdb', "
            "'pyarrow', 'numpy', 'sklearn', 'torch', 'onnxruntime') if m in sys.modules]; print(','.join(loaded))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


@pytest.mark.slow   # a Python process; trains the starter set on first use
def test_a_process_that_never_closes_flushes_its_log_at_exit(_isolated_home):
    """The default classifier is closed by atexit: a script that classifies and ends finds
    its decision in the log afterwards (the embedded default model, trained on first use)."""
    code = "import flywheel; print(flywheel.classify('Write an AVAP function that adds two numbers').id)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    decision_id = out.stdout.strip().splitlines()[-1]
    store = LogStore(load_config().log_path)
    assert _logged(store, decision_id) == "Write an AVAP function that adds two numbers"
