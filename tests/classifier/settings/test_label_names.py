"""One meaning for "out of scope": the one parser, used by every place a label arrives
as a string (declared types, feedback labels, teacher answers)."""

from __future__ import annotations

import pytest

from flywheel.classifier.errors import InvalidInputError, TeacherError, UnknownLabelError
from flywheel.classifier.settings.label_names import OUT_OF_SCOPE, label_name, parse_label, suggest_label
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


def test_an_unknown_label_suggests_the_intent_it_was_meant_to_be():
    """``hours`` is not ``HOURS``: it is refused, with the one intent it differs from only in
    case, or the closest name (issue 32); never accepted in another case."""
    labels = ("BOOK", "CANCEL", "HOURS")
    with pytest.raises(UnknownLabelError, match=r"unknown feedback label 'hours'; did you mean HOURS\?; known: "):
        parse_label("hours", labels, what="feedback label")
    with pytest.raises(UnknownLabelError, match=r"'cancle'; did you mean CANCEL\?"):
        parse_label("cancle", labels)
    with pytest.raises(UnknownLabelError) as ei:
        parse_label("weather", labels)
    assert "did you mean" not in str(ei.value)
    assert suggest_label(" Book ", labels) == "BOOK" and suggest_label("zzz", labels) is None


def test_a_declared_type_in_another_case_is_refused_with_a_suggestion():
    with pytest.raises(UnknownLabelError, match=r"unknown declared type 'platform'; did you mean PLATFORM\?"):
        make_classifier().classify("what is addvar", declared_type="platform")
