"""classifier/assembly.py: a classifier built from the configuration (logging nothing), the
process-wide default behind ``flywheel.classifier.classify``, and the keywords they take."""

from __future__ import annotations

import ast

import pytest

import flywheel.classifier.assembly as assembly
from flywheel.classifier.assembly import build_classifier
from flywheel.classifier.pipeline import Classifier
from flywheel.classifier.settings.config import load_config
from flywheel.classifier.versions.registry import ModelRegistry
from tests.support.docs import DOC
from tests.support.fakes import HashEmbedder, ScriptedTeacher
from tests.support.intent_sets import save_fitted
from tests.support.paths import ROOT


def _home(tmp_path) -> ModelRegistry:
    reg = ModelRegistry(tmp_path / "models")
    save_fitted(reg, DOC, "v1")
    reg.promote("v1")
    return reg


def test_build_classifier_joins_the_configured_parts_and_logs_nothing(tmp_path):
    reg = _home(tmp_path)
    cfg = load_config(home=tmp_path, model=str(reg.home))
    emb = HashEmbedder()
    clf = build_classifier(cfg, progress=False, embedder=emb)
    try:
        assert isinstance(clf, Classifier) and clf.model_version == "v1" and clf.embedder is emb
        assert clf.teacher is not None                              # the configured one (no connection yet)
        assert clf.log_sink is None and clf.watcher is not None    # no log; follows the models home
    finally:
        clf.close()
        clf.teacher.close()
    teacher = ScriptedTeacher()
    given = build_classifier(load_config(home=tmp_path, model=str(reg.home), teacher="off"), progress=False,
                             embedder=emb, teacher=teacher)
    assert given.teacher is teacher                                 # the caller's, used as it is
    off = build_classifier(load_config(home=tmp_path, model=str(reg.home), teacher="off"), progress=False,
                           embedder=emb)
    assert off.teacher is None                                      # teacher = off: none built


def test_build_classifier_refuses_an_unknown_keyword_before_it_builds_anything(tmp_path, monkeypatch):
    def served_model(*a, **k):
        raise AssertionError("nothing is resolved for a refused call")

    monkeypatch.setattr(assembly, "served_model", served_model)
    with pytest.raises(TypeError, match="unexpected keyword argument 'embeder'"):
        build_classifier(load_config(home=tmp_path), embeder=HashEmbedder())
    with pytest.raises(TypeError, match="unexpected keyword argument 'audit_rate'"):
        build_classifier(load_config(home=tmp_path), audit_rate=1.0)   # a Classifier keyword: no longer passed on


def test_reset_default_closes_the_default_classifier_and_its_teacher(monkeypatch):
    closed: list[str] = []

    class Teacher(ScriptedTeacher):                  # a ManagedTeacher: what reset_default closes
        def close(self) -> None:
            closed.append("teacher")

    class Clf:
        teacher = Teacher()

        def close(self) -> None:
            closed.append("classifier")

    assembly.reset_default()
    monkeypatch.setattr(assembly, "build_classifier", lambda: Clf())
    assert isinstance(assembly.default_classifier(), Clf)
    assert assembly.default_classifier() is assembly.default_classifier()   # one for the process
    assembly.reset_default()
    assert closed == ["classifier", "teacher"]       # whoever opened it closes it, in order
    assembly.reset_default()                            # nothing left to close
    assert closed == ["classifier", "teacher"]


def _imported(path) -> set[str]:
    """Every module an import statement in ``path`` names (also inside functions)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return out


def test_the_versions_wing_builds_no_classifier():
    """What is served is the versions wing's answer; joining it with a pipeline and a teacher
    is the assembly's (and the serving runtime's), so the wing imports neither."""
    assembling = ("flywheel.classifier.pipeline", "flywheel.classifier.teachers", "flywheel.classifier.assembly",
                  "flywheel.classifier.shadow", "flywheel.classifier.audit")
    files = sorted((ROOT / "classifier" / "versions").glob("*.py"))
    assert {p.stem for p in files} >= {"default", "model", "registry", "served"}
    bad = {p.name: sorted(m for m in _imported(p) if m.startswith(assembling)) for p in files}
    assert {name: found for name, found in bad.items() if found} == {}
    assert {m for m in _imported(ROOT / "classifier" / "assembly.py") if m.startswith(assembling)} >= {
        "flywheel.classifier.pipeline", "flywheel.classifier.teachers.factory"}
