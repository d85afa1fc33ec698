"""The review API and page (issue 25): JSON with the queue's filters, labels written only
with the admin token, bad input as a clear 4xx, a batch checked whole before any write,
logged text escaped; and the same over a real HTTP server on loopback."""

from __future__ import annotations

import json
import re
import socket
import threading
import urllib.error
import urllib.request
from html.parser import HTMLParser

import pytest

from flywheel.classifier.decision import Layer, Tier
from flywheel.classifier.settings.config import load_config
from flywheel.fleet.human_labels import HumanLabels
from flywheel.fleet.site import LocalSite
from flywheel.logstore import LogStore
from flywheel.training.review.app import MAX_BODY, ReviewApp, make_server
from flywheel.training.review.dashboard import retrain_history
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
                      teacher=teacher_call(None, False, candidates=("RETRIEVAL", "PLATFORM"))),
        review_record(IDS[1], "<script>alert('x')</script> & <b>me</b>", "PLATFORM", teacher=teacher_call("PLATFORM")),
        review_record(IDS[2], "write a loop", "CODE_GENERATION", l2="CODE_GENERATION",
                      teacher=teacher_call("CODE_GENERATION")),
    ])
    return s


def _app(store, token=TOKEN):
    return ReviewApp(store, HumanLabels(store, lambda: LABELS), admin_token=token)


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
    assert "docs or my plan?" in page and "<kbd>1</kbd>RETRIEVAL" in page


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


@pytest.mark.slow   # starts flywheel as a process
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
    app = ReviewApp(store, HumanLabels(store, lambda: LABELS), admin_token=None,
                    history=lambda: retrain_history(LocalSite(load_config(home=tmp_path)).version_reports()))
    doc = json.loads(app.handle("GET", "/api/dashboard?window=2", {}).body)
    assert [h["version"] for h in doc["history"]] == ["v1", "v2"]                 # oldest first
    assert doc["history"][0]["outcome"] == "promoted" and doc["history"][1]["challenger_accuracy"] == 0.80
    assert doc["stats"]["n_windows"] == 2 and doc["stats"]["total"] == 3
    assert doc["errors"]["teacher_calls"] == 2
    res = app.handle("GET", "/dashboard?window=2", {})
    page = res.body.decode()
    assert res.status == 200 and page.count("<svg") == 2                         # no accuracy point yet:
    assert "No window has 5 or more audits or human labels yet" in page          # a sentence, not a chart
    assert "&lt;i&gt;kept&lt;/i&gt;" in page and "<i>kept</i>" not in page        # report text escaped
    assert "http://www.w3.org/2000/svg" in page and 'src="http' not in page        # inline SVG, no fetch
    assert "PLATFORM" in page and "no per-language slices" in page


def test_the_dashboard_works_on_an_empty_log(tmp_path):
    empty = LogStore(tmp_path / "empty.duckdb")
    app = ReviewApp(empty, HumanLabels(empty, lambda: None))
    res = app.handle("GET", "/dashboard", {})
    assert res.status == 200 and "No retrain yet" in res.body.decode() and "<svg" not in res.body.decode()
    bad = app.handle("GET", "/api/dashboard?window=0", {})
    assert bad.status == 400 and "window must be" in json.loads(bad.body)["error"]


# ---------------------------------------------------------------- issue 32: the page


class _Cells(HTMLParser):
    """The text of every cell of the page's ``tr.item`` rows, and the attributes of its tags."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.tags: list[tuple[str, dict]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "tr" and "item" in (a.get("class") or "").split():
            self.rows.append([])
        elif tag == "td" and self.rows:
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr":
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _page(app) -> tuple[str, _Cells]:
    res = app.handle("GET", "/", {})
    assert res.status == 200
    parsed = _Cells()
    parsed.feed(res.body.decode())
    return res.body.decode(), parsed


def _script_data(page: str) -> dict:
    return json.loads(re.search(r'<script type="application/json" id="items">(.*?)</script>', page, re.S).group(1))


def test_every_intent_of_the_served_set_can_be_given_to_any_row(tmp_path):
    """Item 1: a degraded row offers only its logged alternatives; every intent (and out of scope)
    is still offered through the row's box, and the one a person picks is a human label."""
    store = LogStore(tmp_path / "log.duckdb")
    did = "d" * 32
    write(store, [review_record(did, "when do you open on sundays", None, layer=Layer.EMBEDDING, l2=None,
                                degraded="teacher down", tier=Tier.WEAK)])
    app = _app(store)
    page, parsed = _page(app)
    item = _script_data(page)["items"][0]
    assert item["choices"] == ["PLATFORM", "CODE_GENERATION"]    # neither model had the right one
    options = [a["value"] for tag, a in parsed.tags if tag == "option"]
    assert options == [*LABELS, "OUT_OF_SCOPE"]
    assert _script_data(page)["intents"] == options
    boxes = [a for tag, a in parsed.tags if tag == "input" and a.get("list") == "intents"]
    assert len(boxes) == len(parsed.rows) == 1                   # one box on every row
    assert _post(app, {"labels": [{"decision_id": did, "label": "CONVERSATIONAL"}]}).status == 200
    assert _human(store) == {did: "CONVERSATIONAL"}


def test_a_merged_row_says_how_many_and_carries_every_decision(tmp_path):
    """Item 6: three decisions with one text are one row marked x3; the page's data holds
    every id, so one label answers them all."""
    store = LogStore(tmp_path / "log.duckdb")
    ids = ["e" * 31 + str(i) for i in range(3)]
    write(store, [review_record(d, "cancel my plan", "PLATFORM", l2="PLATFORM", teacher=teacher_call("RETRIEVAL"),
                                age_days=i)
                  for i, d in enumerate(ids)])
    page, parsed = _page(_app(store))
    assert len(parsed.rows) == 1 and parsed.rows[0][1] == "cancel my plan \u00d73"
    item = _script_data(page)["items"][0]
    assert sorted(item["decision_ids"]) == sorted(ids) and item["count"] == 3
    assert "3 decisions with this text" in page


def test_long_texts_are_clipped_with_a_way_to_expand(tmp_path):
    """Item 6: a 4,000-character text is clipped to a few lines with a "more" control; a short one is not."""
    store = LogStore(tmp_path / "log.duckdb")
    long_id, short_id = "f" * 32, "0" * 32
    write(store, [review_record(long_id, "x" * 4000, "PLATFORM", l2="PLATFORM", teacher=teacher_call("RETRIEVAL")),
                  review_record(short_id, "short one", "PLATFORM", l2="PLATFORM", teacher=teacher_call("RETRIEVAL"))])
    page, parsed = _page(_app(store))
    texts = {a.get("class") for tag, a in parsed.tags if tag == "div" and "text" in (a.get("class") or "")}
    assert texts == {"text clip", "text"}
    assert ".clip{" in page and "line-clamp:3" in page
    assert sum(1 for tag, a in parsed.tags if tag == "button" and a.get("class") == "more") == 1
    assert "scrollIntoView" not in page.split("focus(0")[1][:40]          # no scroll on load


def test_the_teacher_column_says_out_of_scope(tmp_path):
    """Item 9, on the page: the teacher's out-of-scope answer reads OUT_OF_SCOPE, no answer stays blank."""
    store = LogStore(tmp_path / "log.duckdb")
    said, silent = "1" * 32, "2" * 32
    write(store, [review_record(said, "what's the weather", "PLATFORM", teacher=teacher_call(None)),
                  review_record(silent, "hmm", "PLATFORM", layer=Layer.EMBEDDING, degraded="teacher down")])
    page, parsed = _page(_app(store))
    by_id = {it["decision_id"]: row for it, row in zip(_script_data(page)["items"], parsed.rows)}
    assert by_id[said][3] == "OUT_OF_SCOPE" and by_id[silent][3] == ""


@pytest.mark.parametrize("length", ["-5", "1.5", "abc", "", "+3"])
def test_a_content_length_that_is_not_a_whole_number_is_a_400(store, length):
    """Left from the last round: a negative content-length was read as 0."""
    server = make_server(_app(store), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        for method, path in (("GET", "/api/health"), ("POST", "/api/labels")):
            with socket.create_connection(server.server_address, timeout=5) as sock:
                sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                             f"Content-Length: {length}\r\n\r\n".encode())
                head, _, body = sock.makefile("rb").read().partition(b"\r\n\r\n")
            assert head.split()[1] == b"400", (method, head)
            assert json.loads(body)["error"] == (f"content-length must be a whole number of bytes (0 or more), "
                                                 f"got {length!r}")
        assert _human(store) == {}
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_the_served_column_shows_layer_2s_own_answer_where_it_differs(tmp_path):
    """A teacher_vs_l2 row says what layer 2 answered: the served label is the teacher's, so
    without it the row shows no disagreement at all (seen in a screenshot)."""
    store = LogStore(tmp_path / "log.duckdb")
    differs, agrees = "1" * 32, "2" * 32
    write(store, [review_record(differs, "is it sunny", "PLATFORM", l2=None, teacher=teacher_call("PLATFORM")),
                  review_record(agrees, "my plan", "PLATFORM", layer=Layer.EMBEDDING, l2="PLATFORM",
                                degraded="teacher down")])
    page, parsed = _page(_app(store))
    by_id = {it["decision_id"]: row for it, row in zip(_script_data(page)["items"], parsed.rows)}
    assert "layer 2: OUT_OF_SCOPE" in by_id[differs][2]
    assert "layer 2" not in by_id[agrees][2]


# ---------------------------------------------------------------- issue 44: a new user's first hour


def test_the_out_of_scope_badge_is_a_key_the_help_names(store):
    page, _ = _page(_app(store))
    badges = re.findall(r'data-label="OUT_OF_SCOPE"><kbd>([^<]*)</kbd>', page)
    keys = re.search(r"1-9 pick a likely intent, (.+?) out of scope", page).group(1).split(" or ")
    assert badges and set(badges) == {"0"}            # a digit beside the 1-9 badges (a grey o read as 0)
    assert keys[0] == "0" and "o" in keys             # the help names the badge's key, and o still works


def test_the_pages_have_an_icon(store):
    app = _app(store)
    icon = app.handle("GET", "/favicon.ico", {})
    assert icon.status == 200 and icon.content_type == "image/svg+xml" and icon.body.startswith(b"<svg")
    for path in ("/", "/dashboard"):
        head = app.handle("GET", path, {}).body.decode().split("</head>")[0]
        assert re.search(r'<link rel="icon" [^>]*href="data:image/svg\+xml,', head), path
