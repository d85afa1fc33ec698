"""A background audit asks the teacher what layer 3 would have asked for the same query
(issue 24 item 1): layer 2's top candidates with the decided label among them, in the
same prompt order, not the decided label and its alphabetical neighbours."""

from __future__ import annotations

import pytest

from flywheel.classifier.decision import Layer, Tier
from flywheel.classifier.pipeline import Query
from flywheel.classifier.protocols import LabelOption
from flywheel.classifier.teachers import build_messages, offered_options
from tests.support.docs import ALWAYS_SURE
from tests.support.fakes import ScriptedTeacher, make_classifier

K = 6
# 20 intents, more than max_candidates: the offered options are a choice
DOC20 = {"intents": [{"name": f"I{i}", "description": f"topic {i}",
                      "examples": [f"topic{i} alpha", f"topic{i} beta", f"about topic{i}"]} for i in range(20)],
         "teacher": {"max_candidates": K}}
TEXTS = ["topic7 alpha", "about topic13 beta", "topic2 beta alpha"]


def layer3_options(clf, text):
    """What layer 3 offers for ``text``: layer 2's top K of the served model, through the
    pipeline's own stages (and, independently, the request back-fill builds)."""
    p = clf.begin(Query(text))
    clf.score([p])
    top = [c.label for c in p.layer2.candidates if c.label is not None][:K]
    return top, p.layer2.label


@pytest.mark.parametrize("text", TEXTS)
def test_an_audit_offers_what_layer_3_would_for_the_same_query(text):
    teacher = ScriptedTeacher(answer=lambda req: req.options[0].name)
    audited = []
    clf = make_classifier(ALWAYS_SURE, teacher=teacher, doc=DOC20, audit_rate=1.0,
                          audit_callback=lambda rec, call: audited.append(rec))
    d = clf.classify(text)
    clf.close()
    assert (d.layer, d.tier) == (Layer.EMBEDDING, Tier.CONFIDENT) and len(teacher.requests) == 1
    audit_req = teacher.requests[0]
    top, l2_label = layer3_options(clf, text)
    assert d.label == l2_label
    names = [o.name for o in audit_req.options]
    assert names == top                                          # layer 2's top K, best first
    assert d.label in names
    labels = sorted(clf.model.manifest.labels)
    alphabetical = ([d.label] + [n for n in labels if n != d.label])[:K]
    assert names != alphabetical                                 # what audits offered before issue 24
    # the request layer 3 (and `flywheel label`'s back-fill) builds: equal, and so is the prompt
    [layer3_req] = clf.teacher_requests([text])
    assert layer3_req.options == audit_req.options
    assert build_messages(layer3_req) == build_messages(audit_req)


def test_the_decided_label_is_always_offered():
    opts = {f"I{i}": LabelOption(f"I{i}", "") for i in range(20)}
    ranking = [f"I{i}" for i in range(19, -1, -1)]
    assert [o.name for o in offered_options(opts, ranking, K)] == ranking[:K]
    got = [o.name for o in offered_options(opts, ranking, K, decided="I0")]
    assert got == ranking[:K - 1] + ["I0"] and len(got) == K
    assert [o.name for o in offered_options(opts, [None, *ranking], K, decided=None)] == ranking[:K]
    # with at most K intents every intent is offered, in the served order
    few = {n: LabelOption(n, "") for n in ("B", "A", "C")}
    assert [o.name for o in offered_options(few, ["C", "A", "B"], K, decided="A")] == ["B", "A", "C"]


def test_a_small_label_set_audits_with_every_intent():
    teacher = ScriptedTeacher(answer=lambda req: "PLATFORM")
    clf = make_classifier(ALWAYS_SURE, teacher=teacher, audit_rate=1.0)
    clf.classify("show my invoices")
    clf.close()
    assert [o.name for o in teacher.requests[0].options] == list(clf.model.manifest.labels)
