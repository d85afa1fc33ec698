"""The review page in a real browser (issue 25): Debian's headless chromium, driven by
Selenium through chromedriver, against a real log with decisions and labels. Two queue
items are labelled with the keyboard; both arrive as human labels and win over the
teacher's at the next retrain's training set; a logged ``<script>`` shows as text.
Issue 32: an intent outside a row's choices typed into its box, and a row merging
identical texts labelled with a click, reach the log as human labels (every merged
decision); long texts are clipped and the page opens at its title and token box.
Screenshots are kept under ``$FLYWHEEL_ARTIFACTS`` (``.ci/run`` sets it), else the test's
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

from flywheel.classifier.decision import Layer, Tier
from flywheel.fleet.human_labels import HumanLabels
from flywheel.training.review.app import ReviewApp, make_server
from flywheel.training.trainset import build_training_set
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
                      teacher=teacher_call(None, False, candidates=("RETRIEVAL", "PLATFORM"))),
        review_record(DISAGREE, "show my current plan and quota", "PLATFORM", l2="RETRIEVAL",
                      teacher=teacher_call("PLATFORM"), age_days=1),
        review_record(SCRIPT, "<script>document.title='pwned'</script> my invoices", "RETRIEVAL", l2="PLATFORM",
                      teacher=teacher_call("RETRIEVAL"), age_days=2),
    ])

    app = ReviewApp(world.store, HumanLabels(world.store, lambda: world.intents.labels), admin_token=TOKEN)
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
    cells = [c.text for c in browser.find_elements(By.CSS_SELECTOR, "div.text")]
    assert any(c.startswith("<script>document.title='pwned'</script>") for c in cells), cells
    assert browser.title == "flywheel review"
    assert "CODE_GENERATION" not in browser.page_source      # a logged alternative the intents no longer have

    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.TAG_NAME, "h1").click()            # focus leaves the token box
    first = browser.execute_script("return JSON.parse(document.getElementById('items').textContent).items[0].choices")
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


def _shot(browser, tmp_path, name: str) -> None:
    shots = Path(os.environ.get("FLYWHEEL_ARTIFACTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(shots / name))


def _serve(store, labels):
    server = make_server(ReviewApp(store, HumanLabels(store, lambda: labels), admin_token=TOKEN), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def _human(store, ids) -> dict:
    return {r.decision_id: r.human_label for r in store.labelled_rows() if r.has_human_label and r.decision_id in ids}


def test_any_intent_and_merged_rows_reach_the_log_as_human_labels(browser, tmp_path):
    """Issue 32 items 1 and 6: RETRIEVAL is none of the degraded row's choices; typed (in
    lower case, half) into its box it is recorded as a human label. A row standing for three
    decisions with one text says x3, and one click labels all three."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    from flywheel.logstore import LogStore

    store = LogStore(tmp_path / "log.duckdb")
    degraded, same = "4" * 32, ["5" * 31 + str(i) for i in range(3)]
    write(store, [review_record(degraded, "when do you open on sundays", None, layer=Layer.EMBEDDING, l2=None,
                                degraded="teacher down", tier=Tier.WEAK)]
          + [review_record(d, "cancel my plan", "RETRIEVAL", l2="RETRIEVAL", teacher=teacher_call("PLATFORM"),
                           age_days=i) for i, d in enumerate(same)])
    server, base = _serve(store, ("RETRIEVAL", "PLATFORM", "HOURS"))
    try:
        browser.get(base + "/")
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        row = browser.find_element(By.CSS_SELECTOR, f'tr.item[data-id="{degraded}"]')
        offered = [b.get_attribute("data-label") for b in row.find_elements(By.CSS_SELECTOR, "button.choice")]
        assert "RETRIEVAL" not in offered, offered
        box = row.find_element(By.CSS_SELECTOR, "form.other input")
        box.send_keys("retr", Keys.ENTER)                        # a unique start of an intent, any case
        assert _wait(lambda: "done" in row.get_attribute("class")), browser.find_element(By.ID, "status").text
        assert row.find_element(By.CSS_SELECTOR, ".outcome").text == "RETRIEVAL"

        merged = browser.find_element(By.CSS_SELECTOR, f'tr.item[data-id="{same[0]}"]')
        assert merged.find_element(By.CSS_SELECTOR, ".count").text == "\u00d73"
        merged.find_element(By.CSS_SELECTOR, 'button.choice[data-label="PLATFORM"]').click()
        assert _wait(lambda: "for 3 decisions" in browser.find_element(By.ID, "status").text), \
            browser.find_element(By.ID, "status").text
        _shot(browser, tmp_path, "review-page-any-intent.png")
        assert _human(store, {degraded, *same}) == {degraded: "RETRIEVAL", **{d: "PLATFORM" for d in same}}
    finally:
        server.shutdown()
        server.server_close()


def test_long_rows_are_clipped_and_the_page_opens_at_its_title(browser, tmp_path):
    """Issue 32 item 6: three 4,000-character rows first in the queue; the page opens with its
    title and token box in view, each long row is a few lines high until expanded."""
    from selenium.webdriver.common.by import By

    from flywheel.logstore import LogStore

    store = LogStore(tmp_path / "log.duckdb")
    long_ids = [str(i) * 32 for i in range(6, 9)]
    words = " ".join(f"word{i}" for i in range(800))[:4000]
    write(store, [review_record(d, f"{i} {words}", "RETRIEVAL", teacher=teacher_call(None, False,
                  candidates=("RETRIEVAL", "PLATFORM"))) for i, d in enumerate(long_ids)]
          + [review_record("9" * 32, "a short one", "RETRIEVAL", l2="RETRIEVAL", teacher=teacher_call("PLATFORM"),
                           age_days=3)])
    server, base = _serve(store, ("RETRIEVAL", "PLATFORM"))
    try:
        browser.get(base + "/")
        order = [r.get_attribute("data-id") for r in browser.find_elements(By.CSS_SELECTOR, "tr.item")]
        assert sorted(order[:3]) == sorted(long_ids), order                # the long rows come first
        view = browser.execute_script("return [window.scrollY, window.innerHeight]")
        assert view[0] == 0, view
        for el in (browser.find_element(By.TAG_NAME, "h1"), browser.find_element(By.ID, "token")):
            top, bottom = browser.execute_script("const r = arguments[0].getBoundingClientRect();"
                                                 "return [r.top, r.bottom]", el)
            assert 0 <= top and bottom <= view[1], (el.tag_name, top, bottom)
        heights = {d: browser.find_element(By.CSS_SELECTOR, f'tr.item[data-id="{d}"]').size["height"]
                   for d in long_ids}
        assert all(h < 160 for h in heights.values()), heights     # 3 lines and the controls, not 4,000 chars
        _shot(browser, tmp_path, "review-page-long.png")
        browser.set_window_size(1280, 900)     # a laptop: the whole table fits, no sideways scroll
        wide = browser.execute_script("return [document.documentElement.scrollWidth, "
                                      "document.documentElement.clientWidth]")
        assert wide[0] <= wide[1], wide
        browser.set_window_size(1400, 900)
        row = browser.find_element(By.CSS_SELECTOR, f'tr.item[data-id="{long_ids[0]}"]')
        row.find_element(By.CSS_SELECTOR, "button.more").click()
        assert _wait(lambda: row.size["height"] > 3 * heights[long_ids[0]]), row.size
        assert row.find_element(By.CSS_SELECTOR, "button.more").text == "less"
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------- issue 44: a new user's first hour

#: the widths the walk looked at: a laptop, a narrow window, a small tablet
WIDTHS = (1280, 800, 600)


def _fits(browser) -> list:
    """``[scrollWidth, innerWidth]``: the page needs no sideways scroll when the first is not larger."""
    return browser.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")


def _right_edges(browser, el) -> list:
    """The right edge of every label control of row ``el`` (its buttons and the any-intent box)."""
    return browser.execute_script("return Array.from(arguments[0].querySelectorAll('button.choice, form.other *'))"
                                  ".map(b => b.getBoundingClientRect().right)", el)


def test_the_label_buttons_are_on_screen_at_every_width(browser, tmp_path):
    """At 800 and 600 px the table's rows become stacked cards (the label buttons under the
    text); at 1280 px it stays a table; at none is a sideways scroll needed. The out-of-scope
    badge's key (``0``) labels the row out of scope."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    from flywheel.logstore import LogStore

    store = LogStore(tmp_path / "log.duckdb")
    write(store, [review_record(str(i) * 32, f"question {i}: where do I see my invoices or my plan's quota",
                                "RETRIEVAL", teacher=teacher_call(None, False, candidates=("RETRIEVAL", "PLATFORM")),
                                age_days=i) for i in range(1, 4)])
    server, base = _serve(store, ("RETRIEVAL", "PLATFORM", "CODE_GENERATION", "CONVERSATIONAL"))
    try:
        browser.get(base + "/")
        for width in WIDTHS:
            browser.set_window_size(width, 900)
            _shot(browser, tmp_path, f"review-page-{width}.png")
            inner = browser.execute_script("return window.innerWidth")
            assert inner <= width, inner
            scroll, inner = _fits(browser)
            assert scroll <= inner, (width, scroll, inner)
            first = browser.find_element(By.CSS_SELECTOR, "tr.item")
            edges = _right_edges(browser, first)
            assert len(edges) >= 4 and max(edges) <= inner, (width, edges, inner)
            stacked = browser.execute_script("return getComputedStyle(arguments[0]).display", first)
            assert (stacked == "table-row") == (width > 900), (width, stacked)
        # the out-of-scope button's badge is the key that labels out of scope
        badge = first.find_element(By.CSS_SELECTOR, 'button.choice[data-label="OUT_OF_SCOPE"] kbd').text
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        browser.find_element(By.TAG_NAME, "h1").click()
        ActionChains(browser).send_keys(badge).perform()
        assert _wait(lambda: "done" in first.get_attribute("class")), browser.find_element(By.ID, "status").text
        assert badge == "0" and _human(store, {"1" * 32}) == {"1" * 32: None}
    finally:
        server.shutdown()
        server.server_close()


def test_the_dashboard_fits_and_keeps_version_names_on_one_line(browser, tmp_path):
    """The dashboard with languages and a retrain history at 1280, 800 and 600 px: no sideways
    scroll, each retrain's version name on one line."""
    from selenium.webdriver.common.by import By

    from flywheel.logstore import LogStore

    store = LogStore(tmp_path / "log.duckdb")
    write(store, [review_record(f"{i:032x}", f"query {i}", "RETRIEVAL", language="en" if i % 3 else "de",
                                age_days=i / 100) for i in range(120)])
    history = [{"version": f"v2026112{i}-104901-12345{i}", "created_at": f"2026-11-2{i}T10:49:01Z",
                "outcome": "promoted" if i % 2 else "kept", "reason": "the challenger beats the champion "
                "on the gate's held-out set by more than the margin", "challenger_accuracy": 0.8 + i / 100,
                "champion_accuracy": 0.8, "champion_version": None, "n": 100} for i in range(4)]
    server = make_server(ReviewApp(store, HumanLabels(store, lambda: ("RETRIEVAL",)), history=lambda: history),
                         "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        browser.get(f"http://127.0.0.1:{server.server_address[1]}/dashboard")
        assert "de" in [c.text for c in browser.find_elements(By.CSS_SELECTOR, "table.languages td")]
        for width in WIDTHS:
            browser.set_window_size(width, 900)
            browser.execute_script("window.scrollTo(0, 0)")
            _shot(browser, tmp_path, f"dashboard-{width}.png")
            browser.execute_script("document.querySelector('table.languages').scrollIntoView()")
            _shot(browser, tmp_path, f"dashboard-{width}-tables.png")
            scroll, inner = _fits(browser)
            assert scroll <= inner, (width, scroll, inner)
            lines = browser.execute_script(
                "return Array.from(document.querySelectorAll('td.version')).map(td => {"
                "const r = document.createRange(); r.selectNodeContents(td);"
                "return new Set(Array.from(r.getClientRects()).map(x => Math.round(x.top))).size; })")
            assert lines == [1] * len(history), (width, lines)
    finally:
        server.shutdown()
        server.server_close()
