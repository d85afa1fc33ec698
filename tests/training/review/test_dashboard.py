"""The dashboard's charts with little data (issue 32, item 13): windows and retrains ticked
in whole numbers, shares on a fixed 0-100% axis, and a sentence instead of an empty chart.
Drawn for real (matplotlib, SVG with text labels) and read back from the SVG."""

from __future__ import annotations

import json
import re

import pytest

from flywheel.classifier.decision import Layer
from flywheel.fleet.human_labels import HumanLabels
from flywheel.logstore import LogStore
from flywheel.training.review.app import ReviewApp
from flywheel.training.review.dashboard import POINTS, auto_window, charts, dashboard_data, render_dashboard
from tests.support.records import review_record
from tests.support.worlds import write

PERCENT = ["0%", "20%", "40%", "60%", "80%", "100%"]


def _window(i: int, llm: float = 0.0, **kw) -> dict:
    return {"index": i, "llm_share": llm, "degraded_share": 0.0, "audit_agreement": None, "audit_labelled": 0,
            "human_labelled": 0, "human_corrected": 0, **kw}


def _retrain(acc: float, champ: float, outcome: str) -> dict:
    return {"challenger_accuracy": acc, "champion_accuracy": champ, "outcome": outcome}


def _ticks(svg: str, axis: str) -> list[str]:
    """The tick labels matplotlib drew on ``axis`` ("x" or "y"), in order."""
    return re.findall(rf'<g id="{axis}tick_\d+">.*?<text[^>]*>([^<]*)</text>', svg, re.S)


def test_one_window_and_two_retrains_tick_in_whole_numbers_on_a_0_to_100_axis():
    data = {"stats": {"window": 1000, "windows": [_window(0, llm=0.0, human_labelled=5, human_corrected=1)]},
            "history": [_retrain(0.8, 0.75, "promoted"), _retrain(0.7, 0.8, "kept")]}
    pics = charts(data)
    assert _ticks(pics["llm_share"], "x") == ["1"]                 # was 0.96 ... 1.04
    assert _ticks(pics["llm_share"], "y") == PERCENT               # a 0% point: was -0.04 ... 0.04
    assert _ticks(pics["accuracy"], "x") == ["1"] and _ticks(pics["accuracy"], "y") == PERCENT
    assert _ticks(pics["retrains"], "x") == ["1", "2"]             # was 1.0, 1.5, 2.0
    assert _ticks(pics["retrains"], "y") == PERCENT


def test_many_windows_still_tick_in_whole_numbers():
    data = {"stats": {"window": 50, "windows": [_window(i, llm=0.9 - i / 40) for i in range(37)]}, "history": []}
    xs = _ticks(charts(data)["llm_share"], "x")
    assert 3 <= len(xs) <= 12 and all(x.isdigit() and 1 <= int(x) <= 37 for x in xs), xs


def test_nothing_to_draw_is_a_sentence_not_an_empty_chart(tmp_path):
    data = dashboard_data(LogStore(tmp_path / "empty.duckdb"), [], window=100)
    pics = charts(data)
    assert not any("<svg" in p for p in pics.values())
    assert pics["llm_share"].startswith('<p class="empty">No decisions logged yet')
    assert "No window has 5 or more audits or human labels yet" in pics["accuracy"]
    assert "No retrain yet" in pics["retrains"]
    page = render_dashboard(data)
    assert "<svg" not in page and page.count('class="empty"') == 3


# ---------------------------------------------------------------- issue 44: a new user's first hour


def _log(tmp_path, langs: list[str | None]) -> LogStore:
    """A log of one decision per entry of ``langs``, a minute apart; every third served out of scope."""
    store = LogStore(tmp_path / "log.duckdb")
    write(store, [review_record(f"{i:032x}", f"query {i}", None if i % 3 == 0 else "PLATFORM",
                                layer=Layer.EMBEDDING, language=lang, age_days=(len(langs) - i) / 1440)
                  for i, lang in enumerate(langs)])
    return store


def _app(store) -> ReviewApp:
    return ReviewApp(store, HumanLabels(store, lambda: ("PLATFORM", "RETRIEVAL")))


def test_the_languages_section_is_built_from_the_log(tmp_path):
    app = _app(_log(tmp_path, ["en"] * 6 + ["de"] * 3))
    doc = json.loads(app.handle("GET", "/api/dashboard", {}).body)
    assert list(doc["languages"]) == ["en", "de"]                           # largest first
    de = doc["languages"]["de"]
    assert (de["n"], de["share"], de["llm_share"]) == (3, round(3 / 9, 6), 0.0)
    assert de["out_of_scope_share"] == round(1 / 3, 6)                      # decision 6 of 6, 7, 8
    page = app.handle("GET", "/dashboard", {}).body.decode()
    section = page[page.index("<h2>Languages</h2>"):]
    rows = re.findall(r"<tr><td>(\w+)</td><td>(\d+)</td><td>([\d.]+%)</td>", section)
    assert rows == [("en", "6", "66.7%"), ("de", "3", "33.3%")], rows
    assert "no language per decision" not in page


def test_the_no_language_sentence_only_when_no_decision_has_one(tmp_path):
    app = _app(_log(tmp_path, [None] * 4))
    assert json.loads(app.handle("GET", "/api/dashboard", {}).body)["languages"] == {"none": {
        "n": 4, "share": 1.0, "llm_share": 0.0, "confident_share": 1.0, "degraded_share": 0.0,
        "out_of_scope_share": 0.5, "l2_judged": 0, "l2_agreement": None}}
    assert "no language per decision yet" in app.handle("GET", "/dashboard", {}).body.decode()


@pytest.mark.parametrize(("n", "window"), [(0, 50), (300, 50), (999, 50), (1_001, 100), (1_500, 100),
                                           (4_100, 250), (20_000, 1_000), (1_000_000, 50_000)])
def test_windows_are_sized_to_the_log(n, window):
    assert auto_window(n) == window
    assert n <= POINTS * window and (window == 50 or n > POINTS * window / 2.5)   # never many more than 20 points


def test_a_small_log_is_several_points_and_the_axis_says_per_how_many(tmp_path):
    app = _app(_log(tmp_path, ["en"] * 300))
    doc = json.loads(app.handle("GET", "/api/dashboard", {}).body)
    assert doc["stats"]["window"] == 50 and len(doc["stats"]["windows"]) == 6     # was one window of 1,000
    page = app.handle("GET", "/dashboard", {}).body.decode()
    assert "per 50 decisions" in page
    assert _ticks(page[page.index("<svg"):], "x") == ["1", "2", "3", "4", "5", "6"]
    given = json.loads(app.handle("GET", "/api/dashboard?window=100", {}).body)["stats"]
    assert (given["window"], len(given["windows"])) == (100, 3)                  # ?window= still sets it


def test_a_last_window_still_filling_says_how_many_decisions_it_holds(tmp_path):
    """56 decisions in windows of 50: the second point is a share over 6, drawn hollow and
    named on the axis (a screenshot showed it as a full window at 50%)."""
    page = _app(_log(tmp_path, ["en"] * 56)).handle("GET", "/dashboard", {}).body.decode()
    assert "per 50 decisions); the last: 6 so far" in page
    assert "last window, still filling" in page
    full = _app(_log(tmp_path / "full", ["en"] * 100)).handle("GET", "/dashboard", {}).body.decode()
    assert "so far" not in full and "still filling" not in full


def test_retrain_version_names_do_not_wrap(tmp_path):
    long = "v20261122-104901-123456"
    page = render_dashboard(dashboard_data(LogStore(tmp_path / "empty.duckdb"), [
        {"version": long, "outcome": "kept", "challenger_accuracy": 0.8, "champion_accuracy": 0.9}]))
    assert f'<td class="version" title="{long}">{long}</td>' in page      # the whole name, also on hover
    style = re.search(r"td\.version\{([^}]*)\}", page).group(1)
    assert "white-space:nowrap" in style and "text-overflow:ellipsis" in style   # was wrapped at its hyphens
