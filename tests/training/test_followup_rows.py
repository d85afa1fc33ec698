"""The flywheel learns follow-ups in the form layer 2 scores them (issue 43): a session is
classified and logged through the pipeline, the (fake) teacher labels its follow-up, and the
retrain's training set holds that follow-up as its anchor's snippet plus the query (the text
:func:`classifier.followup.resolved_text` makes), while self-contained queries keep their own
text however misleading their history (RC-03)."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from flywheel.classifier.followup import FollowupDetector, resolved_text
from flywheel.classifier.layer2.fitter import fit_from_vectors, fit_model
from flywheel.classifier.pipeline import Classifier
from flywheel.classifier.protocols import HistoryEntry
from flywheel.classifier.settings.intents import parse_intents
from flywheel.classifier.text import normalise_key
from flywheel.logstore import LogStore
from flywheel.training.trainset import build_training_set
from tests.support.docs import ALWAYS_SURE, ALWAYS_UNSURE
from tests.support.fakes import HashEmbedder, ScriptedTeacher
from tests.support.paths import ROOT

SUPPORT = ROOT / "benchmarks/data/followups/support_intents.yaml"
ANCHOR = ("Wo ist meine Bestellung 12345?", "ORDER_STATUS")
FOLLOWUP = ("und wann kommt sie an?", "ORDER_STATUS")
SELF_CONTAINED = [("I cannot log into my account since yesterday", "ACCOUNT"),   # after the follow-up
                  ("Tell me a joke about penguins", None)]
ANSWERS = dict([ANCHOR, FOLLOWUP, *SELF_CONTAINED])


def _intents(followups: str, thresholds: dict | None = None):
    doc = yaml.safe_load(SUPPORT.read_text(encoding="utf-8"))
    doc["followups"] = followups
    if thresholds is not None:
        doc["thresholds"] = thresholds
    return parse_intents(doc, source=str(SUPPORT))


def _log_session(tmp_path, emb: HashEmbedder) -> LogStore:
    """One logged session: the anchor, the follow-up and the self-contained turns, every one
    asked of the teacher (``defer``, thresholds under which layer 2 always asks)."""
    store = LogStore(tmp_path / "traffic.duckdb")
    model = fit_model(_intents("defer", ALWAYS_UNSURE), embedder=emb)
    teacher = ScriptedTeacher(lambda req: ANSWERS[req.text] or "OUT_OF_SCOPE")
    clf = Classifier(model, embedder=emb, teacher=teacher, teacher_cache=None,
                     log_sink=store.open_sink(ingest_interval_s=None, fsync=False))
    for text, _ in [ANCHOR, FOLLOWUP, *SELF_CONTAINED]:
        d = clf.classify(text, session_id="s1")
        assert d.label == ANSWERS[text], (text, d.reason)
    assert teacher.requests[1].history == (HistoryEntry.of(*reversed(ANCHOR)),)
    clf.close()
    return store


def _rows(ts) -> dict[str, tuple[str | None, np.ndarray]]:
    """Every row of the training set and its evaluation slices, by normalised text."""
    out = {}
    for part in (ts, ts.eval, ts.recent):
        for t, y, v in zip(part.texts, part.labels, part.vectors):
            out[normalise_key(t)] = (y, v)
    return out


@pytest.fixture()
def logged(tmp_path):
    emb = HashEmbedder()
    return _log_session(tmp_path, emb), emb


def test_a_logged_followup_trains_on_its_anchor_snippet_and_self_contained_rows_on_their_text(logged):
    store, emb = logged
    ts = build_training_set(store, _intents("defer"), embedder=emb)
    rows = _rows(ts)
    f = FollowupDetector().detect(FOLLOWUP[0], [HistoryEntry.of(ANCHOR[1], ANCHOR[0])])
    assert f is not None
    resolved = resolved_text(f, FOLLOWUP[0])
    assert resolved == f"{ANCHOR[0]} {FOLLOWUP[0]}"
    label, vec = rows[normalise_key(resolved)]
    assert label == "ORDER_STATUS"
    np.testing.assert_allclose(vec, emb.encode([resolved])[0], atol=1e-6)   # not the query-alone vector
    assert normalise_key(FOLLOWUP[0]) not in rows
    for text, y in [SELF_CONTAINED[0], ANCHOR]:   # the history never joins a self-contained text
        assert rows[normalise_key(text)][0] == y, text
    assert [k for k in rows if k.endswith(normalise_key(SELF_CONTAINED[1][0])) and k != normalise_key(
        SELF_CONTAINED[1][0])] == []
    assert ts.report["followups"] == {"rows": 1, "by_language": {"de": 1}}


def test_under_followups_off_a_followup_trains_on_its_own_words(logged):
    store, emb = logged
    ts = build_training_set(store, _intents("off"), embedder=emb)
    rows = _rows(ts)
    assert rows[normalise_key(FOLLOWUP[0])][0] == "ORDER_STATUS"
    assert not any(k.startswith(normalise_key(ANCHOR[0]) + " ") for k in rows)
    assert ts.report["followups"] == {"rows": 0, "by_language": {}}


def test_the_retrained_head_resolves_the_followup_without_the_teacher(logged):
    """Distilled: a head fitted on the training set serves the follow-up from layer 2
    (``resolve``, no teacher) with the label the teacher gave it."""
    store, emb = logged
    intents = _intents("resolve")
    ts = build_training_set(store, intents, embedder=emb)
    model = fit_from_vectors(ts.fit_intents, ts.vectors, ts.labels, encoder_id=emb.id)
    clf = Classifier(model, embedder=emb, followups="resolve")
    d = clf.classify(FOLLOWUP[0], history=[(ANCHOR[1], ANCHOR[0])])
    assert d.label == "ORDER_STATUS" and "follow-up" in d.reason and d.layer.value == "embedding", d.reason


def test_a_confident_layer2_followup_is_never_a_self_training_row(tmp_path):
    """Its logged vector is of the query alone, not what layer 2 scored: self-training skips it."""
    emb = HashEmbedder()
    store = LogStore(tmp_path / "traffic.duckdb")
    model = fit_model(_intents("resolve", ALWAYS_SURE), embedder=emb)
    clf = Classifier(model, embedder=emb, log_sink=store.open_sink(ingest_interval_s=None, fsync=False))
    decided = [clf.classify(text, session_id="s1") for text in (ANCHOR[0], FOLLOWUP[0], SELF_CONTAINED[0][0])]
    assert all(d.layer.value == "embedding" and d.tier.value == "confident" for d in decided)
    assert "follow-up" in decided[1].reason
    clf.close()
    ts = build_training_set(store, _intents("resolve"), embedder=emb, self_training_max=10)
    layer2 = {normalise_key(t) for t, s in zip(ts.texts, ts.sources) if s == "layer2"}
    assert normalise_key(FOLLOWUP[0]) not in layer2 and normalise_key(SELF_CONTAINED[0][0]) in layer2
    assert ts.report["self_training"]["skipped_followup"] == 1
    assert store.decision_histories([decided[0].id, decided[1].id, "nope"]) == {
        decided[0].id: (), decided[1].id: (HistoryEntry.of(ANCHOR[1], ANCHOR[0]),)}
