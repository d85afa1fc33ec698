"""``flywheel stats`` per language (issue 34 item 4): each logged language's share, LLM
share and layer 2's agreement with the teacher; rows logged before the column are ``none``."""

from __future__ import annotations

from flywheel.classifier.decision import Layer, TeacherCall
from flywheel.logstore import LogStore
from flywheel.training.stats.traffic import convergence, empty_stats, format_table
from tests.support.records import review_record


def _fill(store: LogStore) -> None:
    sink = store.open_sink()
    call = TeacherCall("llm", "PLATFORM", True, 10.0)
    for r in (review_record("en1", "show my plan", "RETRIEVAL", layer=Layer.EMBEDDING, l2="RETRIEVAL",
                            language="en"),
              review_record("en2", "my invoices", "RETRIEVAL", layer=Layer.EMBEDDING, l2="RETRIEVAL",
                            language="en"),
              review_record("es1", "mis facturas", "PLATFORM", l2="RETRIEVAL", teacher=call, language="es"),
              review_record("es2", "mi plan", "PLATFORM", l2="PLATFORM", teacher=call, language="es"),
              review_record("es3", "hola", None, layer=Layer.EMBEDDING, l2=None, language="es",
                            degraded="timeout"),
              review_record("old", "legacy row", "RETRIEVAL", layer=Layer.EMBEDDING, l2="RETRIEVAL")):
        sink.write(r)
    sink.close()


def test_stats_per_language(tmp_path):
    store = LogStore(tmp_path / "log.duckdb")
    _fill(store)
    by = convergence(store)["by_language"]
    assert list(by) == ["es", "en", "none"]                     # largest first; none: before the column
    es = by["es"]
    assert (es["n"], es["share"], es["llm_share"], es["degraded_share"]) == (3, 0.5, round(2 / 3, 6),
                                                                             round(1 / 3, 6))
    assert es["out_of_scope_share"] == round(1 / 3, 6) and by["en"]["out_of_scope_share"] == 0.0   # es3
    assert (es["l2_judged"], es["l2_agreement"]) == (2, 0.5)    # es1: layer 2 said RETRIEVAL, teacher PLATFORM
    assert (by["en"]["n"], by["en"]["llm_share"], by["en"]["l2_judged"], by["en"]["l2_agreement"]) == (
        2, 0.0, 0, None)
    table = format_table({**convergence(store), "windows": []})
    assert "per language" in table and any(ln.split()[:3] == ["es", "3", "50.0%"] for ln in table.splitlines())
    assert empty_stats()["by_language"] == {}
