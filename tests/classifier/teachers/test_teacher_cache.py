"""The teacher answer cache (classifier.teachers.cache, issue 24 item 5): one LLM call per
question, also for repeats in one batch or at the same time; bounded by size and TTL;
never stale across an intent-set or teacher-model change; a hit is an ``llm`` decision
with a ``cached`` reason and never a second teacher label; hits and misses are metrics."""

from __future__ import annotations

import copy
import threading

import pytest

from flywheel.classifier.decision import Layer, Tier
from flywheel.classifier.errors import IntentFileError, TeacherError
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.pipeline import Classifier
from flywheel.classifier.protocols import HistoryEntry, LabelOption, TeacherAnswer, TeacherRequest
from flywheel.classifier.settings.config import load_config
from flywheel.classifier.settings.intents import TeacherSettings, parse_intents
from flywheel.classifier.teachers import CircuitBreaker, OllamaTeacher, TeacherCache
from flywheel.classifier.teachers.cache import DEFAULT_MAX_ENTRIES, DEFAULT_TTL_S, intent_set_revision
from flywheel.classifier.versions.model import IntentModel, intents_to_doc
from flywheel.logstore import LogStore
from flywheel.service.client import FlywheelClient
from flywheel.service.metrics import ServerMetrics
from flywheel.service.server import ServerOptions, create_server
from tests.support.docs import ALWAYS_UNSURE, DOC
from tests.support.fakes import HashEmbedder, ListSink, ScriptedTeacher, make_classifier
from tests.support.simulated_ollama import SimulatedOllama

OPTS = (LabelOption("RETRIEVAL", "docs"), LabelOption("PLATFORM", "account"))


class Clock:
    """A settable clock: ``clock()`` is ``clock.t``."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def answer(label: str | None, model: str = "m") -> TeacherAnswer:
    return TeacherAnswer(label, model, 1.0)


def key(text: str = "what is addvar", *, revision: str = "r1", model: str = "m", history=(), options=OPTS) -> str:
    return TeacherCache.key(TeacherRequest(text, options, tuple(history)), revision=revision, model=model)


def unsure(teacher=None, **kw) -> Classifier:
    return make_classifier(ALWAYS_UNSURE, teacher=teacher, **kw)


# ------------------------------------------------------------------ the cache itself
def test_the_key_covers_text_revision_model_history_and_options():
    base = key()
    assert key("  What IS   addVar ") == base                  # normalised text: case and spaces do not count
    assert key(options=tuple(reversed(OPTS))) == base           # the same options in another order
    assert key("what is addparam") != base
    assert key(revision="r2") != base                           # another intent set
    assert key(model="other") != base                           # another teacher model
    assert key(history=[HistoryEntry("PLATFORM", "show my invoices")]) != base
    assert key(history=[HistoryEntry("RETRIEVAL", "show my invoices")]) != \
        key(history=[HistoryEntry("PLATFORM", "show my invoices")])
    assert key(options=OPTS[:1]) != base                        # another question: other intents offered


def test_ttl_expiry_with_an_injected_clock():
    clock = Clock(100.0)
    cache = TeacherCache(max_entries=10, ttl_s=60.0, clock=clock)
    cache.put("k", answer("RETRIEVAL"))
    clock.t = 159.9
    assert cache.get("k").label == "RETRIEVAL"                  # a hit does not renew the TTL
    clock.t = 160.0
    assert cache.get("k") is None and len(cache) == 0
    assert (cache.hits, cache.misses, cache.expired) == (1, 1, 1)


def test_the_size_bound_evicts_the_least_recently_used():
    cache = TeacherCache(max_entries=2, ttl_s=60.0, clock=Clock())
    cache.put("a", answer("A"))
    cache.put("b", answer("B"))
    assert cache.get("a").label == "A"                          # a is now the most recently used
    cache.put("c", answer("C"))
    assert len(cache) == 2 and cache.evicted == 1
    assert cache.get("b") is None
    assert cache.get("a").label == "A" and cache.get("c").label == "C"


@pytest.mark.parametrize("kw", [{"max_entries": 0}, {"max_entries": True}, {"max_entries": 2.5}, {"ttl_s": 0}])
def test_bad_bounds_are_refused(kw):
    with pytest.raises(ValueError):
        TeacherCache(**kw)


def test_concurrent_askers_of_one_question_ask_once():
    cache = TeacherCache(clock=Clock())
    release, calls, out = threading.Event(), [], []

    def ask():
        calls.append(1)
        release.wait(5.0)
        return answer("RETRIEVAL")

    threads = [threading.Thread(target=lambda: out.append(cache.answer("k", ask))) for _ in range(4)]
    for t in threads:
        t.start()
    while cache.misses == 0:        # the first has started asking
        pass
    release.set()
    for t in threads:
        t.join(5.0)
    assert len(calls) == 1
    assert sorted(c for _, c in out) == [False, True, True, True]
    assert cache.counts == {"hit": 3, "miss": 1}


def test_a_failure_is_not_cached_and_waiting_askers_ask_for_themselves():
    cache = TeacherCache(clock=Clock())
    first_started, release, calls = threading.Event(), threading.Event(), []

    def failing():
        calls.append("first")
        first_started.set()
        release.wait(5.0)
        raise TeacherError("timeout", "slow")

    def ok():
        calls.append("other")
        return answer("PLATFORM")

    errors, results = [], []

    def leader():
        try:
            cache.answer("k", failing)
        except TeacherError as exc:
            errors.append(exc.kind)

    lead = threading.Thread(target=leader)
    lead.start()
    assert first_started.wait(5.0)
    waiters = [threading.Thread(target=lambda: results.append(cache.answer("k", ok))) for _ in range(2)]
    for t in waiters:
        t.start()
    release.set()
    for t in (lead, *waiters):
        t.join(5.0)
    assert errors == ["timeout"]
    assert calls.count("first") == 1 and 1 <= calls.count("other") <= 2   # the second waiter may hit the first's
    assert all(a.label == "PLATFORM" for a, _ in results)
    assert cache.answer("k", failing)[1] is True                          # the valid answer is cached now


# ------------------------------------------------------------------ the pipeline
def test_a_repeat_is_answered_without_a_call_and_logged_as_a_cached_llm_decision():
    sink = ListSink()
    t = ScriptedTeacher(answer=lambda req: "RETRIEVAL")
    clf = unsure(t, log_sink=sink)
    first = clf.classify("explain addparam")
    again = clf.classify("  Explain   ADDPARAM")                 # the same question, normalised
    assert len(t.requests) == 1
    assert (first.layer, first.label, first.tier) == (Layer.LLM, "RETRIEVAL", Tier.CONFIDENT)
    assert (again.layer, again.label, again.tier) == (Layer.LLM, "RETRIEVAL", Tier.CONFIDENT)
    assert "cached" not in first.reason and first.teacher is not None and first.teacher.valid
    assert again.reason.startswith("llm fake-llm chose RETRIEVAL (cached; layer 2: ")
    assert again.teacher is None                                  # no call: no teacher call is logged
    assert "llm_cache" in again.latency_ms and "llm" not in again.latency_ms
    assert again.confidence == first.confidence and again.degraded is None and not again.pending
    assert [r.decision.teacher is None for r in sink.records] == [False, True]
    assert clf.teacher_cache.counts == {"hit": 1, "miss": 1}


def test_an_out_of_scope_answer_is_cached_too():
    t = ScriptedTeacher(answer=lambda req: None)
    clf = unsure(t)
    clf.classify("what does addresult return")
    d = clf.classify("what does addresult return")
    assert len(t.requests) == 1
    assert (d.label, d.tier, d.layer) == (None, Tier.NO_MATCH, Layer.LLM) and "(cached; layer 2:" in d.reason


def test_repeats_in_one_batch_ask_once():
    t = ScriptedTeacher(answer=lambda req: "PLATFORM")
    clf = unsure(t)
    ds = clf.classify_many(["show my invoices", "what is addvar", "show my invoices", "SHOW my invoices"])
    assert sorted(r.text for r in t.requests) == ["show my invoices", "what is addvar"]
    assert [("cached" in d.reason) for d in ds] == [False, False, True, True]
    assert clf.teacher_cache.counts == {"hit": 2, "miss": 2}


def test_repeats_at_the_same_time_ask_once():
    t = ScriptedTeacher(answer=lambda req: "PLATFORM", delay_s=0.3)
    clf = unsure(t)
    barrier, out = threading.Barrier(4), []

    def go():
        barrier.wait(5.0)
        out.append(clf.classify("show my invoices"))

    threads = [threading.Thread(target=go) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(10.0)
    assert len(t.requests) == 1
    assert len(out) == 4 and all(d.layer is Layer.LLM and d.label == "PLATFORM" for d in out)
    assert sum("cached" in d.reason for d in out) == 3


def test_a_failed_call_is_asked_again():
    t = ScriptedTeacher(answer=lambda req: "RETRIEVAL", error=TeacherError("unavailable", "down"))
    clf = unsure(t)
    assert clf.classify("explain addparam").degraded == "unavailable"
    t.error = None
    d = clf.classify("explain addparam")
    assert len(t.requests) == 2 and d.layer is Layer.LLM and "cached" not in d.reason
    assert "cached" in clf.classify("explain addparam").reason


def test_another_history_is_another_question():
    t = ScriptedTeacher(answer=lambda req: "RETRIEVAL")
    clf = unsure(t)
    clf.classify("and that one?", history=[("RETRIEVAL", "what is addvar")])
    clf.classify("and that one?", history=[("PLATFORM", "show my invoices")])
    clf.classify("and that one?", history=[("PLATFORM", "show my invoices")])
    assert len(t.requests) == 2


def test_a_changed_intent_set_is_never_served_a_stale_answer():
    t = ScriptedTeacher(answer=lambda req: "RETRIEVAL")
    emb = HashEmbedder()
    clf = make_classifier(ALWAYS_UNSURE, teacher=t, embedder=emb)
    clf.classify("explain addparam")
    # a retrain on the same intent set: same revision, the answer still holds
    clf.swap_model(fit_model(clf.intents, embedder=emb, version="same-intents"))
    assert "cached" in clf.classify("explain addparam").reason and len(t.requests) == 1
    # one description changed: another intent set, the teacher is asked again
    d = copy.deepcopy(DOC)
    d["thresholds"] = ALWAYS_UNSURE
    d["intents"][0]["description"] = "the AVAP language documentation"
    changed = fit_model(parse_intents(d), embedder=emb, version="changed-intents")
    assert intent_set_revision(changed.intents) != intent_set_revision(clf.intents)
    clf.swap_model(changed)
    after = clf.classify("explain addparam")
    assert len(t.requests) == 2 and "cached" not in after.reason
    assert t.requests[-1].options[0].description == "the AVAP language documentation" or \
        t.requests[-1].options[1].description == "the AVAP language documentation"


def test_a_changed_teacher_model_is_never_served_a_stale_answer():
    old = ScriptedTeacher(answer=lambda req: "RETRIEVAL", model="small-llm")
    before = unsure(old)
    before.classify("explain addparam")
    new = ScriptedTeacher(answer=lambda req: "PLATFORM", model="big-llm")   # the same cache, another teacher
    clf = Classifier(before.model, embedder=before.embedder, teacher=new, teacher_cache=before.teacher_cache)
    d = clf.classify("explain addparam")
    assert (len(old.requests), len(new.requests)) == (1, 1)
    assert (d.label, d.teacher.model) == ("PLATFORM", "big-llm") and "cached" not in d.reason
    assert clf.classify("explain addparam").reason.startswith("llm big-llm chose PLATFORM (cached;")


def test_the_revision_is_a_content_hash():
    a, b = parse_intents(copy.deepcopy(DOC)), parse_intents(copy.deepcopy(DOC))
    assert a is not b and intent_set_revision(a) == intent_set_revision(b)
    d = copy.deepcopy(DOC)
    d["intents"][1]["examples"].append("refund my last payment")
    assert intent_set_revision(parse_intents(d)) != intent_set_revision(a)


def test_a_saved_version_keeps_its_revision_and_cache_settings(tmp_path):
    d = copy.deepcopy(DOC)
    d["teacher"] = {"cache_size": 50, "cache_ttl_s": 600}
    model = fit_model(parse_intents(d), embedder=HashEmbedder())
    loaded = IntentModel.load(model.save(tmp_path / "v1"))
    assert intent_set_revision(loaded.intents) == intent_set_revision(model.intents)
    c = Classifier(loaded, embedder=HashEmbedder())
    assert (c.teacher_cache.max_entries, c.teacher_cache.ttl_s) == (50, 600.0)


# ------------------------------------------------------------------ settings
def test_the_cache_is_on_by_default_with_sane_bounds():
    ts = parse_intents(copy.deepcopy(DOC)).teacher
    assert (ts.cache_size, ts.cache_ttl_s) == (DEFAULT_MAX_ENTRIES, DEFAULT_TTL_S) == (10_000, 86_400.0)
    assert (TeacherSettings().cache_size, TeacherSettings().cache_ttl_s) == (10_000, 86_400.0)
    c = make_classifier()
    assert (c.teacher_cache.max_entries, c.teacher_cache.ttl_s) == (10_000, 86_400.0)
    assert "cache_size" not in intents_to_doc(c.intents)["teacher"]     # a default is not written


def test_cache_size_zero_turns_it_off():
    t = ScriptedTeacher(answer=lambda req: "RETRIEVAL")
    d = copy.deepcopy(DOC)
    d["thresholds"] = ALWAYS_UNSURE
    d["teacher"] = {"cache_size": 0}
    clf = make_classifier(teacher=t, doc=d)
    assert clf.teacher_cache is None
    clf.classify("explain addparam")
    d2 = clf.classify("explain addparam")
    assert len(t.requests) == 2 and "cached" not in d2.reason
    explicit_off = unsure(ScriptedTeacher(), teacher_cache=None)
    assert explicit_off.teacher_cache is None


@pytest.mark.parametrize("section, names", [
    ({"cache_size": -1}, "teacher.cache_size"), ({"cache_size": 1.5}, "teacher.cache_size"),
    ({"cache_size": "big"}, "teacher.cache_size"), ({"cache_ttl_s": 0}, "teacher.cache_ttl_s"),
    ({"cache_ttl_s": "1d"}, "teacher.cache_ttl_s"), ({"cache_ttl_s": True}, "teacher.cache_ttl_s")])
def test_bad_cache_settings_name_the_key(section, names):
    d = copy.deepcopy(DOC)
    d["teacher"] = section
    with pytest.raises(IntentFileError, match=names.replace(".", r"\.")):
        parse_intents(d)


def test_an_injected_cache_with_a_clock_expires():
    clock = Clock()
    t = ScriptedTeacher(answer=lambda req: "RETRIEVAL")
    clf = unsure(t, teacher_cache=TeacherCache(max_entries=1, ttl_s=30.0, clock=clock))
    clf.classify("explain addparam")
    clock.t = 29.0
    assert "cached" in clf.classify("explain addparam").reason
    clock.t = 30.0
    assert "cached" not in clf.classify("explain addparam").reason
    clf.classify("what is addvar")                                   # evicts the one entry (size 1)
    clf.classify("explain addparam")
    assert len(t.requests) == 4 and clf.teacher_cache.evicted == 2


# ------------------------------------------------------------------ never a second training label
def test_a_hit_is_not_a_second_teacher_label(tmp_path):
    store = LogStore(tmp_path / "log.duckdb")
    t = ScriptedTeacher(answer=lambda req: "RETRIEVAL")
    clf = unsure(t, log_sink=store.open_sink(fsync=False))
    for _ in range(3):
        clf.classify("explain addparam")
    clf.close()
    rows = store.query("SELECT layer, label, teacher_valid, reason FROM decisions ORDER BY created_at")
    assert [(r[0], r[1]) for r in rows] == [("llm", "RETRIEVAL")] * 3
    assert [r[2] for r in rows] == [True, None, None]               # the hits have no teacher call
    assert sum("cached" in r[3] for r in rows) == 2
    labelled = store.labelled_rows()
    assert [(r.text, r.teacher_label, r.has_teacher_label) for r in labelled] == [
        ("explain addparam", "RETRIEVAL", True)]
    assert store.count_new_labels(None) == 1


# ------------------------------------------------------------------ metrics
def test_hits_and_misses_are_metrics():
    m = ServerMetrics()
    get = m.registry.get_sample_value
    clf = unsure(ScriptedTeacher(answer=lambda req: "RETRIEVAL"))
    m.bind_serving(classifier=clf)
    assert get("flywheel_teacher_cache_total", {"outcome": "hit"}) == 0            # there from the start
    assert get("flywheel_teacher_cache_total", {"outcome": "miss"}) == 0
    for text in ("explain addparam", "explain addparam", "what is addvar", "explain addparam"):
        clf.classify(text)
    assert get("flywheel_teacher_cache_total", {"outcome": "hit"}) == 2
    assert get("flywheel_teacher_cache_total", {"outcome": "miss"}) == 2
    assert get("flywheel_teacher_cache_entries") == 2
    off = ServerMetrics()
    off.bind_serving(classifier=unsure(ScriptedTeacher(), teacher_cache=None))
    assert off.registry.get_sample_value("flywheel_teacher_cache_total", {"outcome": "hit"}) == 0


def test_the_sidecar_serves_repeats_in_one_batch_with_one_call(tmp_path):
    d = copy.deepcopy(DOC)
    d["thresholds"] = ALWAYS_UNSURE
    model_dir = fit_model(parse_intents(d), embedder=HashEmbedder(), version="unsure-v1").save(tmp_path / "v1")
    inner = ScriptedTeacher(answer=lambda req: "RETRIEVAL")
    inner.breaker = CircuitBreaker()
    server = create_server(load_config(teacher="off", model=str(model_dir)), ServerOptions(address="127.0.0.1:0"),
                           log_decisions=False, embedder=HashEmbedder(), teacher=inner)
    try:
        server.start()
        fw = FlywheelClient(server.target, timeout_s=5.0)
        batch = fw.classify_batch(["explain addparam", "what is addvar", "explain addparam"])
        fw.close()
        assert [x.layer for x in batch] == [Layer.LLM] * 3
        assert ["cached" in x.reason for x in batch] == [False, False, True]
        assert len(inner.requests) == 2
        get = server.metrics.registry.get_sample_value
        assert get("flywheel_teacher_cache_total", {"outcome": "hit"}) == 1
        assert get("flywheel_teacher_cache_total", {"outcome": "miss"}) == 2
        assert get("flywheel_teacher_calls_total", {"outcome": "ok"}) == 2     # a hit is not a teacher call
    finally:
        server.stop(grace_s=1.0)


# ------------------------------------------------------------------ through a (simulated) Ollama server
def test_the_ollama_teacher_is_called_once_for_repeats():
    truth = {"explain addparam": "RETRIEVAL", "show my invoices": "PLATFORM"}
    with SimulatedOllama(truth, accuracy=1.0, latency_scale=0.0) as sim:
        teacher = OllamaTeacher("sim-model:1b", host=sim.url, timeout_s=5.0)
        clf = unsure(teacher)
        texts = ["explain addparam", "show my invoices", "explain addparam", "Explain addparam ", "show my invoices"]
        ds = clf.classify_many(texts)
        teacher.close()
        assert sim.requests == 2
        assert [d.label for d in ds] == ["RETRIEVAL", "PLATFORM", "RETRIEVAL", "RETRIEVAL", "PLATFORM"]
        assert clf.teacher_cache.counts == {"hit": 3, "miss": 2}
