"""The per-language gate (issue 34 item 5; rule 6 of :mod:`training.gate`): a challenger better
overall but worse in one language with enough gate rows is kept, and the reason names the
language; a language with fewer rows is listed, not gated; one language behaves as none."""

from __future__ import annotations

import numpy as np
import pytest

from flywheel.training.gate import MIN_GATE_ROWS, decide
from flywheel.training.report import gate_by_language, gate_language_markdown
from flywheel.training.rows import LabelledSet
from tests.support.gates import gate_metrics as metrics
from tests.support.gates import heads_that_disagree


@pytest.fixture(scope="module")
def pair():
    """Two heads that disagree on some queries, and their predictions on 1,500 queries."""
    return heads_that_disagree()


def lang_set(pair, spec: list[tuple[str | None, int, int, int]]) -> tuple[LabelledSet, list[str | None]]:
    """Gate rows and their languages from ``spec``: per part ``(language, n, worse, better)``,
    labelled so that the challenger is wrong on ``worse`` the champion gets right, right on
    ``better`` the champion gets wrong, and both right on the rest; no query used twice."""
    _, _, texts, X, p_cp, p_ch = pair
    agree = iter([i for i in range(len(texts)) if p_cp[i] == p_ch[i]])
    differ = iter([i for i in range(len(texts)) if p_cp[i] != p_ch[i]])
    idx: list[int] = []
    labels: list[str | None] = []
    langs: list[str | None] = []
    for lang, n, worse, better in spec:
        for k in range(n):
            i = next(differ) if k < worse + better else next(agree)
            idx.append(i)
            labels.append(p_ch[i] if worse <= k < worse + better else p_cp[i])
            langs.append(lang)
    rows = LabelledSet([texts[i] for i in idx], labels, X[idx], ["teacher"] * len(idx), [None] * len(idx))
    return rows, langs


def gate(pair, data: LabelledSet, langs: list[str | None] | None):
    champion, challenger = pair[0], pair[1]
    ch, cp = metrics(challenger, data), metrics(champion, data)
    ch["llm_share"] = cp["llm_share"]        # on accuracy alone (the weak head defers far more)
    notes: list[str] = []
    outcome, reason, checks = decide(challenger, champion, ch, cp, data, "eval", 0.01, notes,
                                     langs=langs, declared=("en", "es"))
    return outcome, reason, checks, notes


def test_a_challenger_better_overall_but_worse_in_spanish_is_kept_and_the_reason_names_spanish(pair):
    # English: 20 better of 200; Spanish: 6 worse of 30 (1.000 -> 0.800); intent-file rows: no language
    data, langs = lang_set(pair, [("en", 200, 0, 20), ("es", 30, 6, 0), (None, 40, 0, 0)])
    assert gate(pair, data, None)[0] == "promoted"          # judged on all rows: 6 worse, 20 better
    outcome, reason, checks, _ = gate(pair, data, langs)
    assert outcome == "kept", reason
    assert reason.startswith("accuracy in language es 0.800 < champion 1.000 - tolerance 0.01") \
        and "n=30 es eval queries: 6 worse, 0 better" in reason
    by = gate_by_language(checks)["by_language"]
    assert list(by) == ["en", "es"]                          # the intent-file rows count only overall
    assert (by["en"]["n"], by["en"]["better"], by["en"]["ok"]) == (200, 20, True)
    assert (by["es"]["n"], by["es"]["worse"], by["es"]["gated"], by["es"]["ok"]) == (30, 6, True, False)
    assert checks[0]["n"] == 270 and "language" not in checks[0]      # the overall check stays first
    md = "\n".join(gate_language_markdown({"gate": {"set": "eval", "by_language": by}}))
    assert "| es | 30 | 1.000 | 0.800 | 6 | 0 | **failed** |" in md and "| en | 200 |" in md


def test_too_few_spanish_rows_are_listed_not_gated_and_the_challenger_is_promoted(pair):
    n_es = MIN_GATE_ROWS - 1
    data, langs = lang_set(pair, [("en", 200, 0, 20), ("es", n_es, 6, 0)])
    outcome, reason, checks, notes = gate(pair, data, langs)
    assert outcome == "promoted", reason
    by = gate_by_language(checks)["by_language"]
    assert (by["es"]["n"], by["es"]["gated"], by["es"]["note"]) == (n_es, False, "not gated (n < 20)")
    assert any(n.startswith(f"accuracy in language es not gated: {n_es} eval queries (< 20)") for n in notes)
    md = "\n".join(gate_language_markdown({"gate": {"set": "eval", "by_language": by}}))
    assert f"| es | {n_es} | 1.000 | 0.684 | 6 | 0 | not gated (n < 20) |" in md
    assert "language" not in reason                          # the promoted reason is the overall one


def test_one_language_only_gates_as_before(pair):
    data, _ = lang_set(pair, [("es", 200, 0, 20), ("es", 30, 6, 0)])
    before = gate(pair, data, None)
    for langs in (["es"] * len(data), ["es"] * 200 + [None] * 30):
        assert gate(pair, data, langs) == before             # same outcome, reason, checks and notes
    assert before[0] == "promoted" and not gate_by_language(before[2])


class _Log:
    """The one TrafficLog method the gate's languages read: decision id -> logged language."""

    def __init__(self, logged: dict[str, str]) -> None:
        self.logged = logged

    def decision_languages(self, ids):
        return {d: self.logged[d] for d in ids if d in self.logged}


@pytest.mark.parametrize("declared, expected", [
    (("en", "es"), ["es", "en", "fr-logged", None, None]),
    (("en",), [None, None, "fr-logged", None, None]),
])
def test_gate_rows_without_a_logged_language_get_the_detected_one(declared, expected):
    """Held-out intent examples carry no logged language: in a set declaring two languages
    the gate detects theirs, so an English-heavy log cannot hide what a challenger costs the
    Spanish examples (issue 34 item 5). A logged language always wins; an erased text or a
    one-language set gets none."""
    from types import SimpleNamespace

    from flywheel.classifier.settings.intents import parse_intents
    from flywheel.training.retrain import _gate_languages
    from tests.support.worlds import INTENT_DOC

    texts = ["¿Cómo puedo crear una función nueva en AVAP?", "How do I reset the password of my account?",
             "logged row", "", "123"]
    rows = LabelledSet(texts, ["A"] * 5, np.zeros((5, 2)), ["intent_example"] * 5, [None, None, "d1", None, None])
    job = SimpleNamespace(store=_Log({"d1": "fr-logged"}),
                          intents=parse_intents({**INTENT_DOC, "languages": list(declared)}))
    assert _gate_languages(job, rows) == expected
