"""The dashboard's charts with little data (issue 32, item 13): windows and retrains ticked
in whole numbers, shares on a fixed 0-100% axis, and a sentence instead of an empty chart.
Drawn for real (matplotlib, SVG with text labels) and read back from the SVG."""

from __future__ import annotations

import re

from flywheel.logstore import LogStore
from flywheel.training.review.dashboard import charts, dashboard_data, render_dashboard

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
