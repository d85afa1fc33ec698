"""One meaning for "out of scope": the one parser, used by every place a label arrives
as a string (declared types, feedback labels, teacher answers)."""

from __future__ import annotations

import pytest

from flywheel.classifier.errors import InvalidInputError, TeacherError, UnknownLabelError
from flywheel.classifier.label_names import OUT_OF_SCOPE, label_name, parse_label
from flywheel.classifier.teachers import OllamaTeacher
from tests.support.fakes import make_classifier

LABELS = ("RETRIEVAL", "PLATFORM")


@pytest.mark.parametrize("name", ["OUT_OF_SCOPE", "out_of_scope", "OOS", "oos", " none "])
def test_out_of_scope_names(name):
    assert parse_label(name, LABELS) is None


def test_labels_and_errors():
    assert parse_label(" PLATFORM ", LABELS) == "PLATFORM"
    assert parse_label("ANYTHING", None) == "ANYTHING"          # label set unknown
    with pytest.raises(UnknownLabelError, match=r"unknown feedback label 'BILLING'; known: .*OUT_OF_SCOPE"):
        parse_label("BILLING", LABELS, what="feedback label")
    for bad in ("", "  ", None, 3):
        with pytest.raises(InvalidInputError, match="must be a non-empty string"):
            parse_label(bad, LABELS)
    assert label_name(None) == OUT_OF_SCOPE and label_name("A") == "A"


def test_declared_type_uses_the_parser():
    clf = make_classifier()
    assert clf.classify("what is addvar", declared_type="oos").label is None
    assert clf.classify("what is addvar", declared_type=" PLATFORM").label == "PLATFORM"


def test_teacher_answer_uses_the_parser():
    parse = OllamaTeacher._parse
    assert parse('{"label": "RETRIEVAL"}', list(LABELS), True) == "RETRIEVAL"
    assert parse('{"label": "OUT_OF_SCOPE"}', list(LABELS), True) is None
    assert parse('{"label": "oos"}', list(LABELS), True) is None
    with pytest.raises(TeacherError, match="unknown_label"):
        parse('{"label": "OUT_OF_SCOPE"}', list(LABELS), False)   # not offered this time
    with pytest.raises(TeacherError, match="unknown_label"):
        parse('{"label": "BILLING"}', list(LABELS), True)
    with pytest.raises(TeacherError, match="unknown_label"):
        parse('{"label": ""}', list(LABELS), True)
