"""The pipeline's stages (what the sidecar's micro-batcher drives) and intent metadata."""

from __future__ import annotations

import copy
import dataclasses
import time

import pytest

from flywheel.classifier import Classifier, Layer, Tier
from flywheel.classifier.encoders import CachedEmbedder, Runner, clear_loaded_models
from flywheel.classifier.encoders.embedders import _LazyEmbedder
from flywheel.classifier.errors import IntentFileError, UnknownLabelError
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.pipeline import Query
from flywheel.classifier.protocols import CachingEmbedder, LoadTimed
from flywheel.classifier.settings.intents import parse_intents
from flywheel.classifier.versions.model import IntentModel
from tests.support.docs import ALWAYS_SURE, ALWAYS_UNSURE, DOC
from tests.support.fakes import HashEmbedder, ListSink, ScriptedTeacher

META_DOC = copy.deepcopy(DOC)
META_DOC["intents"][0]["metadata"] = {"rag": "true", "model_slot": "retrieval"}
META_DOC["intents"][1]["metadata"] = {"rag": "false", "model_slot": "platform"}


def make(thresholds, doc=META_DOC, **kw):
    d = copy.deepcopy(doc)
    d["thresholds"] = thresholds
    emb = HashEmbedder()
    return Classifier(fit_model(parse_intents(d), embedder=emb), embedder=emb, **kw)


def test_queries_carry_their_own_context():
    clf = make(ALWAYS_SURE)
    a, b, c = clf.classify_queries([Query("what is addvar"), Query("anything", declared_type="PLATFORM"),
                                    Query("how much quota is left")])
    assert (a.layer, b.layer, c.layer) == (Layer.EMBEDDING, Layer.DECLARED, Layer.RULES)
    with pytest.raises(UnknownLabelError, match=r"text #2: unknown declared type 'NOPE'"):
        clf.classify_queries([Query("x"), Query("y", declared_type="NOPE")])


def test_stages_one_encoder_pass_and_teacher_separately():
    emb = HashEmbedder()
    teacher = ScriptedTeacher()
    d = copy.deepcopy(META_DOC)
    d["thresholds"] = ALWAYS_UNSURE
    sink = ListSink()
    clf = Classifier(fit_model(parse_intents(d), embedder=emb), embedder=emb, teacher=teacher, log_sink=sink)
    calls = []
    inner = emb.encode
    emb.encode = lambda texts, **kw: calls.append(list(texts)) or inner(texts, **kw)
    pending = [clf.begin(Query(t)) for t in ("what is addvar", "show my invoices", "what types exist")]
    clf.score(pending)
    assert calls == [["what is addvar", "show my invoices", "what types exist"]]   # one pass
    assert all(p.decision is None and p.layer2 is not None for p in pending)    # all unsure
    assert teacher.requests == []                                                # not asked yet
    asked = clf.finish(pending[0], clf.ask_teacher(pending[0]))
    skipped = clf.finish(pending[1], clf.without_teacher(pending[1], "request deadline too short"))
    assert asked.layer is Layer.LLM and len(teacher.requests) == 1
    assert skipped.layer is Layer.EMBEDDING and skipped.tier is Tier.WEAK
    assert "llm skipped: request deadline too short" in skipped.reason
    logged = {r.decision.id: r for r in sink.records}
    assert logged[skipped.id].pending and not logged[asked.id].pending
    assert logged[skipped.id].layer2.label == pending[1].layer2.label       # layer 2's own answer


def test_preset_vector_skips_encoding():
    clf = make(ALWAYS_SURE)
    p = clf.begin(Query("what is addvar"))
    p.vector = clf.embedder.encode(["what is addvar"])[0]
    clf.embedder.encode = lambda *a, **k: pytest.fail("encoded a query whose vector was given")
    clf.score([p])
    assert p.decision is not None and p.decision.layer is Layer.EMBEDDING


def test_metadata_comes_with_every_decision_for_the_label(tmp_path):
    clf = make(ALWAYS_SURE)
    by_rule = clf.classify("how much quota is left")
    declared = clf.classify("x", declared_type="RETRIEVAL")
    oos = clf.classify("x", declared_type="OUT_OF_SCOPE")
    assert by_rule.metadata == {"rag": "false", "model_slot": "platform"}
    assert declared.metadata == {"rag": "true", "model_slot": "retrieval"}
    assert oos.metadata == {} and by_rule.to_dict()["metadata"] == by_rule.metadata
    saved = IntentModel.load(clf.model.save(tmp_path / "v1"))         # survives save and load
    assert dict(saved.intents.intent("PLATFORM").metadata) == {"rag": "false", "model_slot": "platform"}


@pytest.mark.parametrize("meta, problem", [
    ({"rag": False}, "metadata.rag must be a string"),
    ({"": "x"}, "metadata keys must be non-empty strings"),
    (["rag"], "metadata must be a mapping of strings"),
])
def test_bad_metadata_is_refused_naming_the_intent(meta, problem):
    doc = copy.deepcopy(DOC)
    doc["intents"][0]["metadata"] = meta
    with pytest.raises(IntentFileError, match=problem) as err:
        parse_intents(doc)
    assert err.value.intent == "RETRIEVAL"


def test_starter_intents_carry_the_routes():
    from flywheel.classifier.settings.config import starter_intents_path
    from flywheel.classifier.settings.intents import load_intents

    meta = {i.name: dict(i.metadata) for i in load_intents(starter_intents_path()).intents}
    assert meta["PLATFORM"]["rag"] == "false" and meta["CONVERSATIONAL"]["rag"] == "false"
    assert meta["RETRIEVAL"]["rag"] == "true" and all("model_slot" in m for m in meta.values())


class _HashRunner(Runner):
    """HashEmbedder's vectors behind the runner interface."""

    def __init__(self) -> None:
        self.inner = HashEmbedder()
        self.dim = self.inner.dim
        self.model = object()

    def encode_batch(self, texts):
        return self.inner.encode(list(texts))


class _SlowLoadingHash(_LazyEmbedder):
    """A lazily loaded encoder whose loading takes 0.3 s."""

    @property
    def id(self) -> str:
        return HashEmbedder().id

    def _key(self):
        return ("slow-loading-hash",)

    def _load(self):
        time.sleep(0.3)
        return _HashRunner()


def test_loading_is_reported_apart_from_query_latency():
    clear_loaded_models()
    emb = CachedEmbedder(_SlowLoadingHash(batch_size=8, device="cpu", max_chars=None))
    d = copy.deepcopy(META_DOC)
    d["thresholds"] = ALWAYS_SURE
    clf = Classifier(fit_model(parse_intents(d), embedder=HashEmbedder()), embedder=emb)
    first = clf.classify("what is addvar")           # loads the encoder
    second = clf.classify("show my invoices")        # does not
    assert first.latency_ms["load"] >= 300.0
    assert first.latency_ms["embedding"] < 300.0      # the query's own share, without loading
    assert first.latency_ms["total"] >= first.latency_ms["load"]
    assert "load" not in second.latency_ms
    assert "load" not in clf.classify("how much quota is left").latency_ms   # rules: nothing loaded
    clear_loaded_models()


def test_the_first_decision_reports_a_load_paid_before_it():
    """The default model is trained on first use: its training loads the encoder (another
    embedder of the same model) before the first query, which then loads nothing. That load is
    reported on the first decision all the same, once (issue 44: it showed no ``load``)."""
    clear_loaded_models()
    d = copy.deepcopy(META_DOC)
    d["thresholds"] = ALWAYS_SURE
    trainer = _SlowLoadingHash(batch_size=8, device="cpu", max_chars=None)
    model = fit_model(parse_intents(d), embedder=trainer)            # loads the encoder while training
    clf = Classifier(model, embedder=CachedEmbedder(_SlowLoadingHash(batch_size=8, device="cpu", max_chars=None)))
    first = clf.classify("what is addvar")
    assert first.latency_ms["load"] >= 300.0 and 0.0 < first.latency_ms["embedding"] < 300.0   # not taken off
    assert "load" not in clf.classify("show my invoices").latency_ms     # once
    assert trainer.pop_load_ms() == 0.0          # the trainer's own count is not reported a second time
    other = Classifier(model, embedder=_SlowLoadingHash(batch_size=8, device="cpu", max_chars=None))
    assert "load" not in other.classify("what is addvar").latency_ms    # once per process
    clear_loaded_models()


def test_a_decision_is_built_once_and_never_changed():
    """Each stage builds its decision with every field it knows (degraded, pending); ``finish``
    returns it completed (language, total latency) as a new frozen decision with the same id."""
    clf = make(ALWAYS_UNSURE, teacher=ScriptedTeacher())
    p = clf.begin(Query("show my invoices"))
    clf.score([p])
    made = clf.without_teacher(p, "request deadline too short", reason="pool_full")
    assert (made.degraded, made.pending, made.tier) == ("pool_full", True, Tier.WEAK)
    assert made.language is None and "total" not in made.latency_ms
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.reason = "changed"   # type: ignore[misc]
    done = clf.finish(p, made)
    assert done is not made and done.id == made.id and p.decision is done
    assert done.language is not None and "total" in done.latency_ms
    assert made.language is None and "total" not in made.latency_ms          # the stage's copy is as it was
    assert dataclasses.replace(done, language=None).to_dict().keys() == done.to_dict().keys()


def test_no_teacher_keeps_layer_2s_tier_and_says_why():
    clf = make(ALWAYS_UNSURE)
    d = clf.classify("what is addvar")
    assert (d.layer, d.degraded, d.pending) == (Layer.EMBEDDING, "no_teacher", False)
    assert d.tier in (Tier.AMBIGUOUS, Tier.WEAK) and "no LLM teacher configured" in d.reason


def test_the_encoder_capabilities_are_typed_protocols():
    """The pipeline asks an embedder for a cached vector or its loading time through
    ``isinstance`` of :class:`CachingEmbedder` / :class:`LoadTimed`, never a ``getattr``; an
    embedder that is neither (HashEmbedder) is served as well, and checking never loads a model."""
    lazy = _SlowLoadingHash(batch_size=8, device="cpu", max_chars=None)
    cached = CachedEmbedder(lazy)
    assert isinstance(cached, CachingEmbedder) and isinstance(cached, LoadTimed) and isinstance(lazy, LoadTimed)
    assert not isinstance(lazy, CachingEmbedder) and not lazy.is_loaded          # isinstance read no `dim`
    plain = HashEmbedder()
    assert not isinstance(plain, CachingEmbedder) and not isinstance(plain, LoadTimed)
    assert CachedEmbedder(plain).pop_load_ms() == 0.0                            # a wrapper passes on 0.0
    clf = make(ALWAYS_SURE)                                                      # a HashEmbedder
    assert clf.cached_vector("what is addvar") is None
    assert clf.classify("what is addvar").layer is Layer.EMBEDDING
    d = copy.deepcopy(META_DOC)
    d["thresholds"] = ALWAYS_SURE
    cached_clf = Classifier(fit_model(parse_intents(d), embedder=HashEmbedder()),
                            embedder=CachedEmbedder(HashEmbedder()))
    cached_clf.classify("what is addvar")
    assert cached_clf.cached_vector("what is addvar") is not None
