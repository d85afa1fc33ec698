"""Issue 41: the sidecar holds to the configured intent set. A version of another set that
reaches the models home (another host's promotion, a forced move) is refused by the hot
reload, counted and logged, and the old version keeps serving; a start with no stored
version of the file exits with one line, unless ``--serve-last-good`` asks to serve the
last good version, which it then says loudly and in a metric."""

from __future__ import annotations

import time

import pytest

from flywheel.classifier.errors import IntentSetMismatch
from flywheel.classifier.settings.config import load_config
from flywheel.classifier.versions.registry import ModelRegistry
from flywheel.service.server import ServerOptions, create_server
from tests.support.fakes import HashEmbedder
from tests.support.intent_sets import NEW_DOC, OLD_DOC, save_fitted, write_doc
from tests.support.sidecar import LOCAL, client, serving


def metric(server, name, labels=None):
    return server.metrics.registry.get_sample_value(name, labels or {})


def wait_until(cond, timeout_s, what):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def shop(tmp_path, monkeypatch):
    monkeypatch.setenv("FLYWHEEL_INTENTS", str(write_doc(tmp_path / "shop.yaml", NEW_DOC)))
    reg = ModelRegistry(tmp_path / "models")
    save_fitted(reg, NEW_DOC, "v1")
    reg.promote("v1")
    return reg


def test_the_hot_reload_refuses_another_sets_version_and_keeps_serving(shop):
    with serving(shop.home) as server, client(server) as fw:
        assert fw.classify("when do you open").label != "OPENING_HOURS"
        save_fitted(shop, OLD_DOC, "v2")
        shop.promote("v2")                       # another host moved the pointer to the old set
        wait_until(lambda: metric(server, "flywheel_model_reloads_total", {"outcome": "refused"}) == 1, 15,
                   "the refusal")
        for _ in range(5):
            d = fw.classify("when do you open")
            assert d.model_version == "v1" and d.label != "OPENING_HOURS"
        assert metric(server, "flywheel_model_reloads_total", {"outcome": "ok"}) == 0
        assert metric(server, "flywheel_serving_other_intent_set") == 0
        save_fitted(shop, NEW_DOC, "v3")
        shop.promote("v3")                       # the file's own version: followed
        wait_until(lambda: fw.classify("show my invoices").model_version == "v3", 15, "the swap to v3")
        assert metric(server, "flywheel_model_reloads_total", {"outcome": "ok"}) == 1


def test_a_start_with_no_version_of_the_file_refuses_unless_asked_to_serve_the_last_good(shop, monkeypatch,
                                                                                         caplog):
    save_fitted(shop, OLD_DOC, "v2")
    shop.promote("v2")
    shop_file = write_doc(shop.home.parent / "shop.yaml", {**NEW_DOC, "intents": NEW_DOC["intents"] + [
        {"name": "RETURNS", "examples": ["send it back", "return my order", "refund a parcel"]}]})
    monkeypatch.setenv("FLYWHEEL_INTENTS", str(shop_file))   # an edit no stored version was trained on
    cfg = load_config(teacher="off", model=str(shop.home))
    with pytest.raises(IntentSetMismatch, match=r"no stored version was trained on this file; run flywheel "
                                                r"retrain --intents .*--serve-last-good"):
        create_server(cfg, ServerOptions(address=LOCAL), embedder=HashEmbedder())
    last_good = load_config(teacher="off", model=str(shop.home), serve_last_good=True)
    server = create_server(last_good, ServerOptions(address=LOCAL), embedder=HashEmbedder())
    try:
        server.start()
        assert metric(server, "flywheel_serving_other_intent_set") == 1
        assert "SERVING ANOTHER INTENT SET: v2" in caplog.text
        with client(server) as fw:
            assert fw.classify("show my invoices").model_version == "v2"
    finally:
        server.stop(grace_s=1.0)
