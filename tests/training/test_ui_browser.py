"""The review page in a real browser (issue 25): Debian's headless chromium, driven by
Selenium through chromedriver, against a real log with decisions and labels. Two queue
items are labelled with the keyboard; both arrive as human labels and win over the
teacher's at the next retrain's training set; a logged ``<script>`` shows as text. A
screenshot is kept under ``$FLYWHEEL_ARTIFACTS`` (``.ci/run`` sets it), else the test's
tmp directory.

``.ci/run`` installs chromium and chromedriver (Debian packages); elsewhere the test is
skipped when either is missing."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from flywheel.training.trainset import build_training_set
from flywheel.training.ui import ReviewApp, make_server
from tests.support.records import review_record, teacher_call
from tests.support.worlds import World, write

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
TOKEN = "browser-test-token"
UNSURE, DISAGREE, SCRIPT = "1" * 32, "2" * 32, "3" * 32


@pytest.fixture
def browser():
    if not (CHROMIUM and DRIVER):
        pytest.skip("chromium and chromedriver are not installed (.ci/run installs them)")
    os.environ.setdefault("SE_OFFLINE", "true")      # Selenium Manager must not try to download a driver
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,900"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def served(tmp_path):
    world = World(tmp_path)
    world.seed_traffic(n_teacher=200, n_human=10)
    write(world.store, [
        review_record(UNSURE, "where do I see my invoices or the docs", "RETRIEVAL",
                      teacher=teacher_call(None, False, "unsure: teacher unsure between RETRIEVAL, PLATFORM")),
        review_record(DISAGREE, "show my current plan and quota", "PLATFORM", l2="RETRIEVAL",
                      teacher=teacher_call("PLATFORM"), age_days=1),
        review_record(SCRIPT, "<script>document.title='pwned'</script> my invoices", "RETRIEVAL", l2="PLATFORM",
                      teacher=teacher_call("RETRIEVAL"), age_days=2),
    ])

    def write_label(did, label, author):
        world.store.add_human_label(did, label, author=author)

    app = ReviewApp(world.store, write_label, labels=world.intents.labels, admin_token=TOKEN)
    server = make_server(app, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield world, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _wait(pred, timeout_s: float = 15.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    return pred()


def test_keyboard_labels_reach_the_log_and_win_at_the_next_retrain(browser, served, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    world, base = served
    browser.get(base + "/")
    rows = browser.find_elements(By.CSS_SELECTOR, "tr.item")
    order = [r.get_attribute("data-id") for r in rows]
    assert order[0] == UNSURE and set(order) == {UNSURE, DISAGREE, SCRIPT}     # the teacher's candidate set first
    # the logged <script> is text on the page, and it did not run
    cells = [c.text for c in browser.find_elements(By.CSS_SELECTOR, "td.text")]
    assert any(c.startswith("<script>document.title='pwned'</script>") for c in cells), cells
    assert browser.title == "flywheel review"
    assert "CODE_GENERATION" not in browser.page_source      # a logged alternative the intents no longer have

    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.TAG_NAME, "h1").click()            # focus leaves the token box
    first = browser.execute_script("return JSON.parse(document.getElementById('items').textContent)[0].choices")
    ActionChains(browser).send_keys("2").perform()               # the first row: its second choice
    assert _wait(lambda: "recorded" in browser.find_element(By.ID, "status").text), \
        browser.find_element(By.ID, "status").text
    ActionChains(browser).send_keys("o").perform()               # the second row: out of scope
    assert _wait(lambda: len(browser.find_elements(By.CSS_SELECTOR, "tr.item.done")) == 2)

    shots = Path(os.environ.get("FLYWHEEL_ARTIFACTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(shots / "review-page.png"))

    human = {r.decision_id: r.human_label for r in world.store.labelled_rows() if r.has_human_label
             and r.decision_id in (UNSURE, DISAGREE, SCRIPT)}
    assert human == {order[0]: first[1], order[1]: None}
    # the next retrain trains on them as human labels, over the teacher's
    ts = build_training_set(world.store, world.intents, embedder=world.embedder)
    rows_by_id = {}
    for part in (ts, ts.eval, ts.recent):
        for did, label, source in zip(part.decision_ids, part.labels, part.sources):
            rows_by_id[did] = (label, source)
    for did, label in human.items():
        if did in rows_by_id:
            assert rows_by_id[did] == (label, "human"), (did, rows_by_id[did])
    assert any(did in rows_by_id for did in human), "neither label reached the training set"
