"""The review queue filtered by the query's language (issue 34 item 4): ``ReviewFilters.language``,
``flywheel review --language`` and the page's ``?language=`` with its select."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from flywheel.cli import build_app, main
from flywheel.fleet.human_labels import HumanLabels
from flywheel.logstore import LogStore
from flywheel.training.review.app import ReviewApp
from flywheel.training.review.queue import ReviewFilters, review_queue
from tests.support.records import NOW, review_record, teacher_call
from tests.support.worlds import write

ES, EN, OLD = "e" * 32, "f" * 32, "0" * 32
LABELS = ("RETRIEVAL", "PLATFORM")


@pytest.fixture
def logged(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    path = tmp_path / "log.duckdb"
    write(LogStore(path), [
        review_record(ES, "¿dónde está mi factura?", "PLATFORM", teacher=teacher_call("PLATFORM"), language="es"),
        review_record(EN, "where is my invoice", "PLATFORM", teacher=teacher_call("PLATFORM"), language="en"),
        review_record(OLD, "logged before the column", "PLATFORM", teacher=teacher_call("PLATFORM")),
    ])
    return path


def test_the_queue_keeps_one_language(logged):
    store = LogStore(logged)
    assert {it.decision_id for it in review_queue(store, now=NOW)} == {ES, EN, OLD}
    es = review_queue(store, ReviewFilters(language="es"), now=NOW)
    assert [(it.decision_id, it.language) for it in es] == [(ES, "es")]
    assert es[0].to_dict()["language"] == "es"
    assert review_queue(store, ReviewFilters(language="unknown"), now=NOW) == []


def test_flywheel_review_language(logged, capsys):
    res = CliRunner().invoke(build_app(), ["review", "--json", "--language", "en", "--log-db", str(logged)])
    assert res.exit_code == 0, res.output
    assert [it["decision_id"] for it in json.loads(res.output)["items"]] == [EN]
    assert main(["review", "--json", "--language", "Spanish!", "--log-db", str(logged)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flywheel: error: language must be a language code") and err.count("\n") == 1


def test_the_page_and_the_api_filter_by_language(logged):
    app = ReviewApp(LogStore(logged), HumanLabels(LogStore(logged), lambda: LABELS), admin_token="t")
    doc = json.loads(app.handle("GET", "/api/queue?language=es", {}).body)
    assert [it["decision_id"] for it in doc["items"]] == [ES]
    page = app.handle("GET", "/?language=es", {}).body.decode()
    assert '<select name="language"' in page
    assert '<option value="es" selected>es</option>' in page and '<option value="en">en</option>' in page
    assert "¿dónde está mi factura?" in page and "where is my invoice" not in page
    assert "llm \u00b7 es" in page                                  # the row shows its language
    bad = app.handle("GET", "/api/queue?language=%3Cb%3E", {})
    assert bad.status == 400 and "language must be a language code" in json.loads(bad.body)["error"]
