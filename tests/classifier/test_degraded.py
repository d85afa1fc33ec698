"""Degraded decisions: layer 2 was unsure and the teacher did not answer (the coverage SLO)."""

from __future__ import annotations

import copy

from flywheel.classifier.decision import DEGRADED_REASONS, Layer, Tier
from flywheel.classifier.errors import TeacherError
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.pipeline import Classifier, Query
from flywheel.classifier.settings.intents import parse_intents
from flywheel.logstore import LogStore
from flywheel.service.metrics import ServerMetrics
from flywheel.training.stats.traffic import convergence, format_table
from tests.support.docs import ALWAYS_SURE, ALWAYS_UNSURE, DOC
from tests.support.fakes import HashEmbedder, ScriptedTeacher


def clf(thresholds, **kw):
    d = copy.deepcopy(DOC)
    d["thresholds"] = thresholds
    return Classifier(fit_model(parse_intents(d), embedder=HashEmbedder()), embedder=HashEmbedder(), **kw)


class Raising:
    model = "raising"

    def label(self, request):
        raise ValueError("a third-party teacher bug")


def test_each_way_of_missing_the_teacher_has_its_reason():
    assert clf(ALWAYS_SURE, teacher=ScriptedTeacher()).classify("show my invoices").degraded is None
    ok = clf(ALWAYS_UNSURE, teacher=ScriptedTeacher()).classify("show my invoices")
    assert ok.layer is Layer.LLM and ok.degraded is None
    down = clf(ALWAYS_UNSURE, teacher=ScriptedTeacher(error=TeacherError("unavailable", "refused"))).classify("x y")
    assert (down.degraded, down.tier, down.pending) == ("unavailable", Tier.WEAK, True)
    bad = clf(ALWAYS_UNSURE, teacher=ScriptedTeacher(error=TeacherError("malformed", "not JSON"))).classify("x y")
    assert bad.degraded == "malformed"
    assert clf(ALWAYS_UNSURE, teacher=Raising()).classify("x y").degraded == "error"
    none = clf(ALWAYS_UNSURE).classify("show my invoices")
    assert none.degraded == "no_teacher" and none.tier is not Tier.CONFIDENT
    assert none.to_dict()["degraded"] == "no_teacher"                       # log and metrics only
    c = clf(ALWAYS_UNSURE, teacher=ScriptedTeacher())
    p = c.begin(Query("show my invoices"))
    c.score([p])
    assert c.without_teacher(p, "all teacher workers are busy", reason="pool_full").degraded == "pool_full"
    assert {"unavailable", "malformed", "error", "no_teacher", "pool_full"} <= set(DEGRADED_REASONS)


def test_the_metric_counts_by_reason_from_zero():
    m = ServerMetrics()
    get = m.registry.get_sample_value
    assert all(get("flywheel_degraded_decisions_total", {"reason": r}) == 0 for r in DEGRADED_REASONS)
    c = clf(ALWAYS_UNSURE, teacher=ScriptedTeacher(error=TeacherError("timeout", "slow")))
    for text in ("x y", "a b", "show my invoices"):
        m.observe_decision(c.classify(text))
    m.observe_decision(clf(ALWAYS_SURE).classify("show my invoices"))
    assert get("flywheel_degraded_decisions_total", {"reason": "timeout"}) == 3
    assert sum(get("flywheel_degraded_decisions_total", {"reason": r}) for r in DEGRADED_REASONS) == 3


def test_stats_show_the_degraded_share_per_window(tmp_path):
    store = LogStore(tmp_path / "log.duckdb")
    sink = store.open_sink()
    healthy = clf(ALWAYS_UNSURE, teacher=ScriptedTeacher(), log_sink=sink)
    broken = clf(ALWAYS_UNSURE, teacher=ScriptedTeacher(error=TeacherError("unavailable", "down")), log_sink=sink)
    for i in range(6):
        healthy.classify(f"show my invoices {i}")
    for i in range(3):
        broken.classify(f"show my invoices {i}")
    Classifier(broken.model, embedder=broken.embedder, log_sink=sink).classify("what is addvar")   # no teacher
    sink.close()
    stats = convergence(store, window=5)
    assert stats["degraded"] == 4 and stats["degraded_share"] == 0.4
    assert stats["degraded_reasons"] == {"no_teacher": 1, "unavailable": 3}
    assert [w["degraded_share"] for w in stats["windows"]] == [0.0, 0.8]
    assert [w["degraded_reasons"] for w in stats["windows"]] == [{}, {"no_teacher": 1, "unavailable": 3}]
    table = format_table(stats)
    assert "degraded: 40.0% of decisions did not get the layer they needed (no_teacher 1, unavailable 3)" in table


def test_the_tier_table_says_what_the_pipeline_serves_without_a_teacher_answer():
    """The docs' "Results come in tiers" (docs/guides/decisions.md) and the pipeline say one thing (issue 32): a teacher
    that does not answer makes layer 2's unsure answer ``weak`` (its prediction set kept as
    the alternatives); with no teacher configured layer 2's tier stays."""
    import re

    from tests.support.paths import ROOT

    slow = ScriptedTeacher(error=TeacherError("timeout", "slow"))
    down = clf(ALWAYS_UNSURE, teacher=slow).classify("show my invoices")
    alone = clf(ALWAYS_UNSURE).classify("show my invoices")
    assert (alone.tier, alone.degraded) == (Tier.AMBIGUOUS, "no_teacher")   # ratio 0.0: every intent close
    assert (down.tier, down.degraded) == (Tier.WEAK, "timeout")
    assert down.alternatives == alone.alternatives and down.alternatives[0].label == down.label
    readme = (ROOT / "docs" / "guides" / "decisions.md").read_text(encoding="utf-8")
    section = " ".join(readme.split("## Results come in tiers", 1)[1].split("\n## ", 1)[0].split())
    assert "served with its tier" not in section
    assert f"tier `{down.tier.value}` even where layer 2 said `{alone.tier.value}`" in section
    assert f"its tier is kept and `degraded` is `{alone.degraded}`" in section
    assert re.search(r"`alternatives` is empty for a sure answer and, for an unsure one, "
                     r"starts with the served `label`", section)


def test_every_reason_prints_its_numbers_with_the_same_decimals():
    """Layer 2's, the teacher's (which quote layer 2), the unsure teacher's and the degraded
    paths' reasons in one run: every probability, confidence, cutoff and ratio with the same
    number of decimals (issue 44: a run printed 6, 5 and 2)."""
    import re

    from flywheel.classifier.layer2.tiers import PROB_DIGITS

    sure = {"confident": 0.0, "ambiguous_ratio": 1.0, "oos": 1.0}
    weak = {"confident": 0.99999, "ambiguous_ratio": 1.0, "oos": 1.0}       # a cutoff near 1, layer 2 unsure
    ambiguous = {"confident": 1.0, "ambiguous_ratio": 0.0, "oos": 1.0}      # every intent close
    decisions = [
        clf(sure).classify("show my invoices"),
        clf(weak, teacher=ScriptedTeacher()).classify("show my invoices"),
        clf(weak, teacher=ScriptedTeacher(lambda req: [o.name for o in req.options[:2]])).classify("x y"),
        clf(weak, teacher=ScriptedTeacher(error=TeacherError("timeout", "slow"))).classify("show my invoices"),
        clf(ambiguous, teacher=ScriptedTeacher(error=TeacherError("malformed", "not JSON"))).classify("x y"),
        clf(weak).classify("show my invoices"),
        clf(ambiguous).classify("x y"),
    ]
    assert {d.layer for d in decisions} == {Layer.EMBEDDING, Layer.LLM}
    assert {d.degraded for d in decisions} >= {None, "timeout", "malformed", "no_teacher"}
    decimals = {len(m) for d in decisions for m in re.findall(r"\d\.(\d+)", d.reason)}
    assert decimals == {PROB_DIGITS}, [d.reason for d in decisions]
