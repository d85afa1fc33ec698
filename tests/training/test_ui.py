"""The review API and page (issue 25): JSON with the queue's filters, labels written only
with the admin token, bad input as a clear 4xx, a batch checked whole before any write,
logged text escaped; and the same over a real HTTP server on loopback."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from flywheel.logstore import LogStore
from flywheel.training.ui import MAX_BODY, ReviewApp, make_server
from tests.support.records import review_record, teacher_call
from tests.support.worlds import write

TOKEN = "s3cret-token"
IDS = ("a" * 32, "b" * 32, "c" * 32)
LABELS = ("RETRIEVAL", "PLATFORM", "CODE_GENERATION", "CONVERSATIONAL")
AUTH = {"authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def store(tmp_path):
    s = LogStore(tmp_path / "log.duckdb")
    write(s, [
        review_record(IDS[0], "docs or my plan?", "RETRIEVAL",
                      teacher=teacher_call(None, False, "unsure: teacher unsure between RETRIEVAL, PLATFORM")),
        review_record(IDS[1], "<script>alert('x')</script> & <b>me</b>", "PLATFORM", teacher=teacher_call("PLATFORM")),
        review_record(IDS[2], "write a loop", "CODE_GENERATION", l2="CODE_GENERATION",
                      teacher=teacher_call("CODE_GENERATION")),
    ])
    return s


def _app(store, token=TOKEN):
    def write_label(did, label, author):
        store.add_human_label(did, label, author=author)

    return ReviewApp(store, write_label, labels=LABELS, admin_token=token)


def _human(store) -> dict:
    return {r.decision_id: r.human_label for r in store.labelled_rows() if r.has_human_label}


def _post(app, doc, headers=AUTH):
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return app.handle("POST", "/api/labels", headers, body)


def test_the_queue_as_json_with_filters(store):
    app = _app(store)
    res = app.handle("GET", "/api/queue", {})
    assert res.status == 200 and res.content_type.startswith("application/json")
    doc = json.loads(res.body)
    assert doc["n"] == 2 and doc["items"][0]["decision_id"] == IDS[0]        # IDS[2] agrees: not queued
    only = json.loads(app.handle("GET", "/api/queue?reason=teacher_vs_l2&limit=5", {}).body)
    assert [it["decision_id"] for it in only["items"]] == [IDS[1]]


@pytest.mark.parametrize("target, status, words", [
    ("/api/queue?limit=zero", 400, "limit must be a number"),
    ("/api/queue?limit=5000", 400, "limit must be a whole number"),
    ("/api/queue?reason=nope", 400, "unknown review reason"),
    ("/api/queue?min_confidence=2", 400, "between 0 and 1"),
    ("/api/queue?days=-1", 400, "days must be at least 0"),
    ("/api/queue?colour=red", 400, "unknown query parameter(s) colour"),
    ("/nowhere", 404, "no such path"),
])
def test_bad_queries_are_a_clear_4xx(store, target, status, words):
    res = _app(store).handle("GET", target, {})
    assert res.status == status and words in json.loads(res.body)["error"]


def test_labels_need_the_admin_token(store):
    app = _app(store)
    assert _post(app, {"decision_id": IDS[0], "label": "PLATFORM"}, headers={}).status == 401
    assert _post(app, {"decision_id": IDS[0], "label": "PLATFORM"},
                 headers={"authorization": "Bearer wrong"}).status == 401
    read_only = _app(store, token=None)
    res = _post(read_only, {"decision_id": IDS[0], "label": "PLATFORM"})
    assert res.status == 403 and "read-only" in json.loads(res.body)["error"]
    assert _human(store) == {}
    assert TOKEN not in res.body.decode()


def test_a_label_is_a_human_label_and_leaves_the_queue(store):
    app = _app(store)
    assert "item 0: unknown label 'platform'" in json.loads(_post(app, {"decision_id": IDS[0],
                                                                         "label": "platform"}).body)["error"]
    res = _post(app, {"decision_id": IDS[0], "label": " PLATFORM ", "author": "ana"})
    assert res.status == 200, res.body
    assert json.loads(res.body) == {"recorded": [{"decision_id": IDS[0], "label": "PLATFORM"}], "n": 1}
    res = _post(app, {"labels": [{"decision_id": IDS[1], "label": "OUT_OF_SCOPE"}]})
    assert res.status == 200
    assert _human(store) == {IDS[0]: "PLATFORM", IDS[1]: None}
    assert json.loads(app.handle("GET", "/api/queue", {}).body)["n"] == 0


@pytest.mark.parametrize("body, status, words", [
    (b"{not json", 400, "not JSON"),
    ({"labels": []}, 400, "list of 1 to"),
    ({"labels": [{"decision_id": IDS[0], "label": "PLATFORM"}, {"decision_id": IDS[1], "label": "NOPE"}]}, 400,
     "item 1: unknown label"),
    ({"labels": [{"decision_id": IDS[0], "label": "PLATFORM"}, {"decision_id": "", "label": "PLATFORM"}]}, 400,
     "item 1: decision_id"),
    ({"decision_id": IDS[0]}, 400, "label is missing"),
    ({"labels": [{"decision_id": IDS[0], "label": "PLATFORM"}, "x"]}, 400, "item 1: expected an object"),
])
def test_a_bad_batch_is_refused_whole_and_names_the_item(store, body, status, words):
    res = _post(_app(store), body)
    assert res.status == status and words in json.loads(res.body)["error"], res.body
    assert _human(store) == {}                           # nothing of the batch was written


def test_an_unknown_decision_is_404_and_says_what_was_recorded(store):
    res = _post(_app(store), {"labels": [{"decision_id": IDS[0], "label": "PLATFORM"},
                                         {"decision_id": "f" * 32, "label": "PLATFORM"}]})
    assert res.status == 404 and "1 label(s) before it were recorded" in json.loads(res.body)["error"]
    assert _human(store) == {IDS[0]: "PLATFORM"}


def test_the_page_escapes_logged_text(store):
    res = _app(store).handle("GET", "/", {})
    page = res.body.decode()
    assert res.status == 200 and res.content_type.startswith("text/html")
    assert "<script>alert(" not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "\\u003cscript\\u003e" in page                        # and in the script's data
    assert "http://" not in page and "https://" not in page      # nothing fetched from elsewhere
    assert "docs or my plan?" in page and "1) RETRIEVAL" in page


def test_wrong_methods_are_405(store):
    res = _app(store).handle("DELETE", "/api/labels", AUTH)
    assert res.status == 405 and "takes POST" in json.loads(res.body)["error"]


def test_over_http_on_loopback(store):
    server = make_server(_app(store), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with urllib.request.urlopen(f"{base}/api/health", timeout=5) as r:
            assert json.loads(r.read()) == {"ok": True, "writable": True}
        req = urllib.request.Request(f"{base}/api/labels", method="POST", headers={**AUTH},
                                     data=json.dumps({"decision_id": IDS[0], "label": "PLATFORM"}).encode())
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.status == 200 and r.headers["x-content-type-options"] == "nosniff"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(urllib.request.Request(f"{base}/api/labels", method="POST",
                                                          data=b"x" * (MAX_BODY + 1), headers=AUTH), timeout=5)
        assert err.value.code == 413
        assert _human(store) == {IDS[0]: "PLATFORM"}
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_flywheel_ui_serves_the_page_until_stopped(store, tmp_path):
    """The command itself, as a process: it says where it listens (a free port on loopback)."""
    import os
    import re
    import subprocess

    from tests.support.servers import flywheel_cmd

    env = {**os.environ, "FLYWHEEL_HOME": str(tmp_path / "home"), "FLYWHEEL_ADMIN_TOKEN": TOKEN}
    proc = subprocess.Popen(flywheel_cmd("ui", "--port", "0", "--log-db", str(store.path)), env=env,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        import select

        ready, _, _ = select.select([proc.stderr], [], [], 60)   # bounded: the first line says where
        assert ready, "flywheel ui said nothing in 60 s"
        line = proc.stderr.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert m, line
        with urllib.request.urlopen(f"http://127.0.0.1:{m.group(1)}/", timeout=10) as r:
            page = r.read().decode()
        assert "flywheel review queue" in page and "docs or my plan?" in page
        assert TOKEN not in page and TOKEN not in line
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _report(models, version: str, created: str, outcome: str, acc: float, champ: float) -> None:
    d = models / version
    d.mkdir(parents=True)
    (d / "report.json").write_text(json.dumps({
        "version": version, "created_at": created, "outcome": outcome, "reason": f"<i>{outcome}</i>",
        "challenger": {"accuracy": acc, "n": 100}, "champion": {"accuracy": champ}, "champion_version": "v0"}))


def test_the_dashboard_draws_the_log_and_the_retrain_history(store, tmp_path):
    models = tmp_path / "models"
    _report(models, "v2", "2026-11-27T02:00:00Z", "kept", 0.80, 0.85)
    _report(models, "v1", "2026-11-27T01:00:00Z", "promoted", 0.85, 0.70)
    store.add_human_label(IDS[1], "RETRIEVAL", author="ana")      # a correction of a served PLATFORM
    app = ReviewApp(store, lambda *a: None, labels=LABELS, admin_token=None, models_home=models)
    doc = json.loads(app.handle("GET", "/api/dashboard?window=2", {}).body)
    assert [h["version"] for h in doc["history"]] == ["v1", "v2"]                 # oldest first
    assert doc["history"][0]["outcome"] == "promoted" and doc["history"][1]["challenger_accuracy"] == 0.80
    assert doc["stats"]["n_windows"] == 2 and doc["stats"]["total"] == 3
    assert doc["errors"]["teacher_calls"] == 2
    res = app.handle("GET", "/dashboard?window=2", {})
    page = res.body.decode()
    assert res.status == 200 and page.count("<svg") == 3
    assert "&lt;i&gt;kept&lt;/i&gt;" in page and "<i>kept</i>" not in page        # report text escaped
    assert "http://www.w3.org/2000/svg" in page and 'src="http' not in page        # inline SVG, no fetch
    assert "PLATFORM" in page and "no per-language slices" in page


def test_the_dashboard_works_on_an_empty_log(tmp_path):
    app = ReviewApp(LogStore(tmp_path / "empty.duckdb"), lambda *a: None, models_home=tmp_path / "none")
    res = app.handle("GET", "/dashboard", {})
    assert res.status == 200 and "no retrain yet" in res.body.decode()
    bad = app.handle("GET", "/api/dashboard?window=0", {})
    assert bad.status == 400 and "window must be" in json.loads(bad.body)["error"]
