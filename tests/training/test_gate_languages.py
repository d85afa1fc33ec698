"""The retrain's gate rows carry the logged language (issue 34 items 4 and 5): the per-language
check of :func:`training.gate.pick_challenger` judges real languages, not all rows together."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from flywheel.classifier.settings.intents import parse_intents
from flywheel.logstore import LogStore
from flywheel.training.retrain import _gate_languages
from flywheel.training.rows import LabelledSet
from tests.support.records import review_record
from tests.support.worlds import INTENT_DOC, write


def _rows(ids):
    return LabelledSet([f"t{i}" for i in range(len(ids))], ["PLATFORM"] * len(ids),
                       np.zeros((len(ids), 4), np.float32), ["teacher"] * len(ids), list(ids))


def test_gate_rows_carry_the_logged_language(tmp_path):
    store = LogStore(tmp_path / "log.duckdb")
    write(store, [review_record("a" * 32, "hola", "PLATFORM", language="es"),
                  review_record("b" * 32, "hello", "PLATFORM", language="en"),
                  review_record("c" * 32, "before the column", "PLATFORM")])
    assert store.decision_languages(["a" * 32, "c" * 32, "z" * 32]) == {"a" * 32: "es"}
    # one declared language: nothing is detected, the logged languages alone (test_gate_by_language.py
    # has a two-language set, whose rows without one get the detected language)
    job = SimpleNamespace(store=store, intents=parse_intents(INTENT_DOC))
    langs = _gate_languages(job, _rows(["b" * 32, None, "a" * 32, "c" * 32, "z" * 32]))
    assert langs == ["en", None, "es", None, None]     # an intent-file example, an old row, one not logged
    assert _gate_languages(job, _rows([None, "c" * 32])) is None    # no language at all: judged on all rows
