"""Issue 41, item 5: a running ``flywheel ui`` follows the served version, as the sidecar
does. After a promotion with another intent set, the page and its API offer and take the new
intent and refuse the removed one (a 400 that names it), without a restart: the app asks the
site for the served labels again once they are ``LABELS_MAX_AGE_S`` old, and the one writer of
human labels checks a label against them again when it writes it."""

from __future__ import annotations

import copy
import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from flywheel.classifier.settings.config import load_config
from flywheel.classifier.versions.registry import ModelRegistry
from flywheel.fleet.human_labels import HumanLabels
from flywheel.logstore import LogStore
from flywheel.training.cli.review import ui_app
from flywheel.training.review.app import LABELS_MAX_AGE_S, ReviewApp, make_server
from tests.support.intent_sets import NEW_DOC, OLD_DOC, OPENING_HOURS, save_fitted
from tests.support.records import review_record, teacher_call
from tests.support.worlds import write

TOKEN = "s3cret"
AUTH = {"authorization": f"Bearer {TOKEN}"}
IDS = ("a" * 32, "b" * 32, "c" * 32)
REFUND = {"name": "REFUND", "description": "money back",
          "examples": ["i want a refund", "give my money back", "refund my order", "return for a refund",
                       "how do refunds work", "refund status"]}
#: the set promoted while the page runs: OPENING_HOURS removed, REFUND added
V2_DOC = {**copy.deepcopy(NEW_DOC), "intents": [*copy.deepcopy(NEW_DOC["intents"]), REFUND]}


@pytest.fixture
def shop(monkeypatch):
    """The tests' home (conftest's) serving v1 (RETRIEVAL, PLATFORM, OPENING_HOURS) from its
    models home, no intents setting, with three logged decisions worth a review."""
    monkeypatch.setenv("FLYWHEEL_TEACHER", "off")
    cfg = load_config()
    reg = ModelRegistry(cfg.models_dir)
    save_fitted(reg, OLD_DOC, "v1")
    reg.promote("v1")
    write(LogStore(cfg.log_path), [
        review_record(IDS[0], "docs or my plan?", "RETRIEVAL",
                      teacher=teacher_call(None, False, candidates=("RETRIEVAL", "PLATFORM"))),
        review_record(IDS[1], "can i get my money back", "PLATFORM", teacher=teacher_call("PLATFORM")),
        review_record(IDS[2], "are you open on sunday", "RETRIEVAL", teacher=teacher_call("PLATFORM")),
    ])
    return cfg, reg


def _promote_v2(reg: ModelRegistry) -> None:
    save_fitted(reg, V2_DOC, "v2")
    reg.promote("v2")


def _post(app: ReviewApp, did: str, label: str):
    res = app.handle("POST", "/api/labels", AUTH, json.dumps({"decision_id": did, "label": label}).encode())
    return res.status, json.loads(res.body)


def _offered(app: ReviewApp) -> tuple[list[str], str]:
    """The served set the API offers, and the page's HTML."""
    doc = json.loads(app.handle("GET", "/api/queue", {}).body)
    page = app.handle("GET", "/", {})
    assert page.status == 200
    return doc["labels"], page.body.decode("utf-8")


def _human(cfg) -> dict:
    return {r.decision_id: r.human_label for r in LogStore(cfg.log_path).labelled_rows() if r.has_human_label}


def test_the_page_and_the_api_follow_a_promotion_with_another_intent_set(shop):
    cfg, reg = shop
    now = [1000.0]
    app = ui_app(None, None, TOKEN, clock=lambda: now[0])           # as flywheel ui builds it
    labels, page = _offered(app)
    assert "OPENING_HOURS" in labels and "REFUND" not in labels
    assert 'value="OPENING_HOURS"' in page and 'value="REFUND"' not in page
    status, doc = _post(app, IDS[1], "REFUND")
    assert status == 400 and "unknown label 'REFUND'" in doc["error"]

    _promote_v2(reg)                                   # a retrain promoted another set; the app runs on
    now[0] += LABELS_MAX_AGE_S                         # at most this long later, the app asks the site again
    labels, page = _offered(app)
    assert "REFUND" in labels and "OPENING_HOURS" not in labels
    assert 'value="REFUND"' in page and 'value="OPENING_HOURS"' not in page
    assert "Intents: RETRIEVAL, PLATFORM, REFUND" in page
    assert _post(app, IDS[1], "REFUND") == (200, {"recorded": [{"decision_id": IDS[1], "label": "REFUND"}], "n": 1})
    status, doc = _post(app, IDS[2], OPENING_HOURS["name"])
    assert status == 400 and "unknown label 'OPENING_HOURS'" in doc["error"]
    assert "RETRIEVAL, PLATFORM, REFUND" in doc["error"]                     # the labels it takes now
    assert _human(cfg) == {IDS[1]: "REFUND"}


def test_the_served_labels_are_kept_at_most_their_max_age(shop):
    cfg, reg = shop
    now = [1000.0]
    app = ui_app(None, None, TOKEN, clock=lambda: now[0])
    assert "OPENING_HOURS" in _offered(app)[0]
    _promote_v2(reg)
    now[0] += LABELS_MAX_AGE_S / 2                     # still fresh: the answer read before the promotion
    assert "OPENING_HOURS" in _offered(app)[0]
    now[0] += LABELS_MAX_AGE_S / 2
    assert "REFUND" in _offered(app)[0]


def test_a_label_is_checked_against_the_served_labels_when_it_is_written(shop):
    """The served set changes between the check of a POST and its write: the writer refuses
    it at write time, a 400 that names the label and says what was recorded before it."""
    cfg, _ = shop
    answers = iter([("RETRIEVAL", "PLATFORM", "OPENING_HOURS")])       # the first read; then v2's set

    def served():
        return next(answers, ("RETRIEVAL", "PLATFORM", "REFUND"))

    store = LogStore(cfg.log_path)
    app = ReviewApp(store, HumanLabels(store, served).following(0.0), admin_token=TOKEN)
    status, doc = _post(app, IDS[2], "OPENING_HOURS")
    assert status == 400 and "unknown label 'OPENING_HOURS'" in doc["error"]
    assert "0 label(s) before it were recorded" in doc["error"] and _human(cfg) == {}


def test_the_real_server_follows_a_promotion_without_a_restart(shop):
    """Over HTTP on loopback with the real clock: within about LABELS_MAX_AGE_S of the
    promotion the running server offers and takes REFUND and refuses OPENING_HOURS."""
    cfg, reg = shop
    server = make_server(ui_app(None, None, TOKEN), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"

    def queue_labels() -> list[str]:
        with urllib.request.urlopen(f"{base}/api/queue", timeout=10) as res:
            return json.loads(res.read())["labels"]

    def post(did: str, label: str) -> tuple[int, dict]:
        req = urllib.request.Request(f"{base}/api/labels", method="POST", headers={**AUTH},
                                     data=json.dumps({"decision_id": did, "label": label}).encode())
        try:
            with urllib.request.urlopen(req, timeout=10) as res:
                return res.status, json.loads(res.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    try:
        assert "OPENING_HOURS" in queue_labels()
        _promote_v2(reg)
        deadline = time.monotonic() + LABELS_MAX_AGE_S + 10
        while "REFUND" not in queue_labels():
            assert time.monotonic() < deadline, "the running server still offers the old intent set"
            time.sleep(0.1)
        assert "OPENING_HOURS" not in queue_labels()
        assert post(IDS[1], "REFUND")[0] == 200
        status, doc = post(IDS[2], "OPENING_HOURS")
        assert status == 400 and "unknown label 'OPENING_HOURS'" in doc["error"]
    finally:
        server.shutdown()
        server.server_close()
    assert _human(cfg) == {IDS[1]: "REFUND"}
