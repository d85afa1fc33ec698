"""Shadow versions: the scorer, the SHADOW pointer, the runtime, the CLI and the metrics."""

from __future__ import annotations

import copy
import random
import threading
import time

import pytest

from flywheel.classifier.decision import Layer
from flywheel.classifier.errors import ModelError
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.layer2.tiers import Thresholds, assign_tier
from flywheel.classifier.settings.config import load_config
from flywheel.classifier.settings.intents import parse_intents
from flywheel.classifier.shadow import ShadowAnswer, ShadowScorer, ShadowSink
from flywheel.classifier.versions.registry import SHADOW, ModelRegistry, ModelWatcher, PromotionConflict
from flywheel.cli import main
from flywheel.logstore import LogStore, SpoolSink
from flywheel.service.metrics import ServerMetrics
from flywheel.service.runtime import open_runtime
from tests.support.docs import ALWAYS_SURE, ALWAYS_UNSURE, DOC
from tests.support.fakes import HashEmbedder, ListSink

QUERIES = ["show my invoices", "what is addvar", "upgrade my plan please", "explain addparam now",
           "my billing history", "how do loops work in avap"]


def fitted(name: str, thresholds: dict, emb=None):
    d = copy.deepcopy(DOC)
    d["thresholds"] = thresholds
    return fit_model(parse_intents(d), embedder=emb or HashEmbedder(), version=name)


def home_with(tmp_path, champion=ALWAYS_UNSURE, shadow=ALWAYS_SURE):
    """A models home serving v1 with v2 published beside it."""
    reg = ModelRegistry(tmp_path / "models")
    for name, th in (("v1", champion), ("v2", shadow)):
        fitted(name, th).save(reg.version_dir(name))
    reg.promote("v1")
    return reg


def wait_for(cond, timeout_s=10.0):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:          # bounded in time
        if cond():
            return True
        time.sleep(0.01)
    return cond()


# ------------------------------------------------------------------ the scorer
def test_scorer_answers_as_the_shadow_model_would():
    emb, model = HashEmbedder(), fitted("v2", ALWAYS_SURE)
    got: list[ShadowAnswer] = []
    scorer = ShadowScorer(got.append)
    scorer.set_model(model)
    vectors = emb.encode(QUERIES)
    for i, v in enumerate(vectors):
        scorer.offer(f"d{i}", v, champion_version="v1")
    scorer.close()
    s = model.head.scores(vectors)
    th = Thresholds.for_model(model)
    want = [assign_tier(s.probs[j], model.manifest.labels, float(s.oos_class[j]), float(s.p_oos[j]), th)
            for j in range(len(QUERIES))]
    assert [a.decision_id for a in got] == [f"d{i}" for i in range(len(QUERIES))]
    assert [(a.label, a.tier, a.sure) for a in got] == [(w.label, w.tier.value, w.sure) for w in want]
    assert all(a.version == "v2" for a in got)
    assert scorer.counts["scored"] == len(QUERIES) and scorer.counts["busy"] == 0


def test_scorer_skips_the_champion_itself_and_nothing_without_a_model():
    got = []
    scorer = ShadowScorer(got.append)
    v = HashEmbedder().encode(["x"])[0]
    scorer.offer("d0", v)                              # no shadow loaded: nothing happens
    scorer.set_model(fitted("v1", ALWAYS_SURE))
    scorer.offer("d1", v, champion_version="v1")       # the shadow is the champion
    scorer.close()
    assert got == [] and sum(scorer.counts.values()) == 0


def test_scorer_samples_a_fraction():
    got = []
    scorer = ShadowScorer(got.append, fraction=0.25, rng=random.Random(7))
    scorer.set_model(fitted("v2", ALWAYS_SURE))
    v = HashEmbedder().encode(["x"])[0]
    for i in range(400):
        scorer.offer(f"d{i}", v)
    scorer.close()
    assert scorer.counts["scored"] + scorer.counts["sampled_out"] == 400
    assert 60 <= scorer.counts["scored"] <= 140 and len(got) == scorer.counts["scored"]


def test_a_busy_worker_skips_and_counts_instead_of_blocking():
    release = threading.Event()

    def slow(answer):
        release.wait(10)

    scorer = ShadowScorer(slow, max_pending=2, batch=1)
    scorer.set_model(fitted("v2", ALWAYS_SURE))
    v = HashEmbedder().encode(["x"])[0]
    t0 = time.perf_counter()
    for i in range(50):
        scorer.offer(f"d{i}", v)
    offered_s = time.perf_counter() - t0
    release.set()
    scorer.close()
    assert scorer.counts["busy"] >= 45              # one in the worker, two queued, the rest skipped
    assert scorer.counts["scored"] + scorer.counts["busy"] == 50
    assert offered_s < 5.0                          # never waited for the worker (it was held for 10 s)


def test_a_failing_shadow_is_counted_never_raised():
    def broken(answer):
        raise RuntimeError("boom")

    scorer = ShadowScorer(broken)
    scorer.set_model(fitted("v2", ALWAYS_SURE))
    for i, v in enumerate(HashEmbedder().encode(QUERIES)):
        scorer.offer(f"d{i}", v)
    scorer.close()
    assert scorer.counts["error"] == len(QUERIES) and scorer.counts["scored"] == 0


def test_a_shadow_with_another_encoder_is_refused():
    other = fitted("v9", ALWAYS_SURE, emb=HashEmbedder(dim=64, id="fake:hash-64"))
    champion = fitted("v1", ALWAYS_SURE)

    def check(model):
        model.check_encoder("fake:hash-256", 256)

    scorer = ShadowScorer(lambda a: None, check_encoder=check)
    with pytest.raises(ModelError, match="encoder"):
        scorer.set_model(other)
    assert scorer.version is None
    scorer.set_model(champion)
    assert scorer.version == "v1"
    scorer.close()


# ------------------------------------------------------------------ the pointer
def test_shadow_pointer_set_clear_and_compare(tmp_path):
    reg = home_with(tmp_path)
    assert reg.shadow() is None
    reg.set_shadow("v2")
    assert (reg.home / SHADOW).read_text().strip() == "v2" and reg.shadow_name() == "v2"
    with pytest.raises(PromotionConflict):
        reg.set_shadow(None, expected="v1")          # the shadow is not v1: nothing changes
    assert reg.shadow() == "v2"
    reg.set_shadow(None, expected="v2")
    assert reg.shadow() is None
    with pytest.raises(ModelError, match="no version 'v7'"):
        reg.set_shadow("v7")
    with pytest.raises(ModelError, match="invalid version name"):
        reg.version_dir(SHADOW)


def test_prune_keeps_the_shadow(tmp_path):
    reg = home_with(tmp_path)
    fitted("v3", ALWAYS_SURE).save(reg.version_dir("v3"))
    reg.set_shadow("v2")
    removed = reg.prune(keep_promoted=0, keep_recent=0)
    assert removed == ["v3"] and {v.name for v in reg.versions()} == {"v1", "v2"}


def test_the_shadow_watcher_loads_refuses_and_clears(tmp_path):
    reg = home_with(tmp_path)
    seen, events = [], []
    w = ModelWatcher(reg, seen.append, 0.0, pointer=SHADOW)
    w.listeners.append(lambda name, err: events.append((name, err is None)))
    assert w.poll(force=True) is False and seen == []          # no shadow yet
    reg.set_shadow("v2")
    assert w.poll(force=True) is True and seen[-1].version == "v2"
    fitted("v3", ALWAYS_SURE).save(reg.version_dir("v3"))
    reg.set_shadow("v3")
    (reg.home / "v3" / "head.npz").write_bytes(b"corrupt")
    assert w.poll(force=True) is False and "v3" in w.refused   # refused, counted, v2 keeps being scored
    assert events[-1] == ("v3", False)
    reg.set_shadow(None)
    assert w.poll(force=True) is True and seen[-1] is None


# ------------------------------------------------------------------ runtime and log
def test_the_runtime_logs_shadow_answers_beside_the_champions(tmp_path):
    reg = home_with(tmp_path)
    reg.set_shadow("v2")
    cfg = load_config(home=tmp_path, teacher="off", model=str(reg.home))
    rt = open_runtime(cfg, progress=False, embedder=HashEmbedder())
    assert rt.shadow is not None and rt.shadow.version == "v2"
    decisions = [rt.classifier.classify(q) for q in QUERIES + ["my quota please"]]   # the last one: a rule
    assert all(d.model_version == "v1" for d in decisions)           # the shadow enforces nothing
    rt.close()
    assert rt.shadow.counts["scored"] == len(QUERIES)
    rows = LogStore(cfg.log_path).query(
        "SELECT l.decision_id, l.model, l.label, l.tier, l.sure, d.l2_label, d.layer FROM labels l "
        "JOIN decisions d USING (decision_id) WHERE l.source = 'shadow' ORDER BY d.created_at")
    assert [r[0] for r in rows] == [d.id for d in decisions if d.layer is Layer.EMBEDDING]
    assert {r[1] for r in rows} == {"v2"} and all(r[4] for r in rows)   # the ALWAYS_SURE shadow is always sure
    assert LogStore(cfg.log_path).count_new_labels(None) == 0            # never a training label


class _TakingSink(ListSink):
    """A caller's own sink that also takes shadow answers (a :class:`ShadowSink`)."""

    def __init__(self) -> None:
        super().__init__()
        self.shadow: list[ShadowAnswer] = []

    def add_shadow_answer(self, answer: ShadowAnswer) -> None:
        self.shadow.append(answer)


def test_a_callers_own_sink_gets_shadow_answers_only_when_it_takes_them(tmp_path):
    assert issubclass(SpoolSink, ShadowSink)                              # the sink a site opens takes them
    reg = home_with(tmp_path)
    reg.set_shadow("v2")
    cfg = load_config(home=tmp_path, teacher="off", model=str(reg.home))
    plain = ListSink()
    rt = open_runtime(cfg, progress=False, embedder=HashEmbedder(), log_sink=plain)
    assert not isinstance(plain, ShadowSink) and rt.shadow is None      # no shadow answers: no shadow scored
    rt.close()
    taking = _TakingSink()
    rt = open_runtime(cfg, progress=False, embedder=HashEmbedder(), log_sink=taking)
    assert isinstance(taking, ShadowSink) and rt.shadow is not None
    d = rt.classifier.classify("show my invoices")
    rt.close()
    assert [(a.decision_id, a.version) for a in taking.shadow] == [(d.id, "v2")]


def test_no_shadow_without_a_fraction(tmp_path):
    reg = home_with(tmp_path)
    reg.set_shadow("v2")
    cfg = load_config(home=tmp_path, teacher="off", model=str(reg.home), shadow_fraction=0.0)
    rt = open_runtime(cfg, progress=False, embedder=HashEmbedder())
    assert rt.shadow is None and rt.classifier.shadow is None
    rt.classifier.classify("show my invoices")
    rt.close()


def test_a_shadow_that_fails_to_load_is_refused_and_the_champion_serves(tmp_path):
    reg = home_with(tmp_path)
    reg.set_shadow("v2")
    (reg.home / "v2" / "head.npz").write_bytes(b"corrupt")
    cfg = load_config(home=tmp_path, teacher="off", model=str(reg.home))
    rt = open_runtime(cfg, progress=False, embedder=HashEmbedder())
    assert rt.shadow.version is None and rt.shadow.loads == {"ok": 0, "refused": 1}
    assert rt.classifier.classify("show my invoices").model_version == "v1"
    rt.close()


# ------------------------------------------------------------------ metrics
def test_serving_metrics_expose_shadow_audits_and_last_retrain(tmp_path):
    reg = home_with(tmp_path)
    m = ServerMetrics()

    class Clf:
        audit_outcomes = {"agree": 3, "disagree": 1, "failed": 0}
        teacher = teacher_cache = None

    scorer = ShadowScorer(lambda a: None)
    scorer.set_model(fitted("v2", ALWAYS_SURE))
    scorer.counts.update(scored=5, busy=2)
    scorer.count_load("v2", None)
    m.bind_serving(classifier=Clf(), shadow=scorer, registry=reg)
    get = m.registry.get_sample_value
    assert get("flywheel_shadow_decisions_total", {"outcome": "scored"}) == 5
    assert get("flywheel_shadow_decisions_total", {"outcome": "busy"}) == 2
    assert get("flywheel_shadow_decisions_total", {"outcome": "error"}) == 0
    assert get("flywheel_shadow_loads_total", {"outcome": "ok"}) == 1
    assert get("flywheel_shadow_info", {"version": "v2"}) == 1
    assert get("flywheel_audit_answers_total", {"outcome": "disagree"}) == 1
    assert get("flywheel_last_retrain_timestamp_seconds") is None        # no retrain has run
    reg.record_retrain({"finished_at": 1_700_000_000.5, "outcome": "kept"})
    assert get("flywheel_last_retrain_timestamp_seconds") == 1_700_000_000.5
    scorer.set_model(None)
    assert get("flywheel_shadow_info", {"version": "v2"}) is None
    scorer.close()


# ------------------------------------------------------------------ the CLI
def test_cli_shadow_and_promote_from_shadow(tmp_path, capsys, monkeypatch):
    reg = home_with(tmp_path)
    home = ["--home", str(tmp_path)]
    assert main(["models", "shadow", *home]) == 0 and "no shadow version" in capsys.readouterr().out
    assert main(["models", "shadow", "v1", *home]) == 2
    assert "served version" in capsys.readouterr().err
    assert main(["models", "shadow", "v2", *home]) == 0 and reg.shadow() == "v2"
    assert main(["models", "shadow", *home]) == 0 and capsys.readouterr().out.strip().endswith("v2")
    assert main(["models", "promote", *home]) == 2            # neither a version nor --from-shadow
    capsys.readouterr()

    # too few shadow answers in the log: refused, with the count
    cfg = load_config(home=tmp_path, teacher="off", model=str(reg.home))
    rt = open_runtime(cfg, progress=False, embedder=HashEmbedder())
    for q in QUERIES:
        rt.classifier.classify(q)
    rt.close()
    assert main(["models", "promote", "--from-shadow", "--min-shadow", "10", *home]) == 2   # bad input
    err = capsys.readouterr().err
    assert f"answered {len(QUERIES)} logged decisions, fewer than --min-shadow 10" in err
    assert reg.current_name() == "v1"
    assert main(["models", "promote", "--from-shadow", "--min-shadow", str(len(QUERIES)), *home]) == 0
    assert reg.current_name() == "v2" and reg.shadow() is None
    out = capsys.readouterr().out
    assert "promoted v2" in out and "shadow cleared" in out
    assert main(["models", "promote", "--from-shadow", *home]) == 3   # nothing to promote, like "no version"
    assert "no shadow version" in capsys.readouterr().err


def test_cli_refuses_a_shadow_with_another_encoder(tmp_path, capsys):
    reg = home_with(tmp_path)
    fitted("v9", ALWAYS_SURE, emb=HashEmbedder(dim=64, id="fake:hash-64")).save(reg.version_dir("v9"))
    assert main(["models", "shadow", "v9", "--home", str(tmp_path)]) == 2
    assert "must use the same encoder" in capsys.readouterr().err and reg.shadow() is None


def test_cli_promote_from_shadow_force_and_clear(tmp_path, capsys):
    reg = home_with(tmp_path)
    home = ["--home", str(tmp_path)]
    reg.set_shadow("v2")
    assert main(["models", "shadow", "--clear", *home]) == 0 and reg.shadow() is None
    reg.set_shadow("v2")
    assert main(["models", "promote", "--from-shadow", "--force", *home]) == 0
    assert reg.current_name() == "v2" and reg.shadow() is None
    assert reg.history()[-1] == "v2"
