"""The flywheel dashboard (issue 25): pictures of the traffic log and the retrain history,
drawn on the server with matplotlib (SVG, nothing fetched by the page) for ``flywheel ui``.

:func:`dashboard_data` gathers what it shows: :func:`training.stats.traffic.convergence` per window
of ``window`` decisions, the needless teacher calls and the confident answers people corrected
(:meth:`~logstore.reads.NamedReads.error_directions`) and the retrain
history (:func:`retrain_history`, every version's ``report.json``). :func:`charts` draws it
(:func:`figures`; windows and retrains ticked in whole numbers, shares on a fixed 0-100%
axis, and a sentence instead of a chart with nothing to draw yet):

- ``llm_share``: per window, the LLM share and the degraded share;
- ``accuracy``: per window, layer 2 against the teacher (audit agreement) and the served
  answer against human labels (1 - corrected / human-labelled), where the window has at
  least :data:`MIN_POINT` such labels;
- ``retrains``: each challenger's gate accuracy against its champion's, promoted or kept.

:func:`render_dashboard` lays them out as one HTML page with the tables beside them: the
most confused intent pairs (layer 2 against the teacher, served against humans), the
shadow version's answers by direction (permissive, abstaining, flips), the teacher-noise
estimate (and, when the teacher is above the retrain's default ``--max-teacher-noise``, that
the next retrain drops its labels), and errors by direction (confident answers people corrected; teacher calls
whose answer layer 2 already had). Languages: the
log's decisions per logged language (:func:`training.stats.language.language_section`, what
``flywheel stats`` prints per language: share, LLM share, out-of-scope share, layer 2 against
the teacher), under ``languages`` in the data too; a sentence instead while every decision
was logged before the language column (``none``).

Windows: unless a ``window`` is given, :func:`auto_window` sizes them to the log, about
:data:`POINTS` points (at least :data:`MIN_WINDOW` decisions, rounded to 1, 2, 2.5 or 5 times a
power of ten), so a small log is several points, not one; the charts' axis says how many
decisions a point is.
"""

from __future__ import annotations

import html
import io
import json
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flywheel.logstore.reads import LogReader

__all__ = ["MIN_POINT", "MIN_WINDOW", "POINTS", "auto_window", "charts", "dashboard_data", "figures",
           "render_dashboard", "retrain_history"]

#: the fewest labelled decisions a window needs for an accuracy point (fewer: no point drawn)
MIN_POINT = 5
#: about how many windows :func:`auto_window` cuts the log into
POINTS = 20
#: the fewest decisions :func:`auto_window` puts in a window
MIN_WINDOW = 50


def auto_window(n: int) -> int:
    """Decisions per window for a log of ``n``: about :data:`POINTS` windows, at least
    :data:`MIN_WINDOW` decisions each, rounded up to 1, 2, 2.5 or 5 times a power of ten.

    >>> [auto_window(n) for n in (0, 300, 1_500, 20_000, 1_000_000)]
    [50, 50, 100, 1000, 50000]
    """
    want = max(MIN_WINDOW, math.ceil(n / POINTS))
    scale = 10 ** (len(str(want)) - 1)
    return next(int(m * scale) for m in (1, 2, 2.5, 5, 10) if m * scale >= want)


def retrain_history(reports: Iterable[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Every retrain's outcome, oldest first, from the versions' ``report.json``: ``reports``
    is ``(version, report)`` of each, as the site's registry has them
    (:meth:`fleet.site.Site.version_reports`: the local home's, or the fleet's bucket's)."""
    out = []
    for name, r in reports:
        ch, champ = r.get("challenger") or {}, r.get("champion") or {}
        out.append({"version": r.get("version") or name, "created_at": r.get("created_at"),
                    "outcome": r.get("outcome"), "reason": r.get("reason"),
                    "challenger_accuracy": ch.get("accuracy"), "champion_accuracy": champ.get("accuracy"),
                    "champion_version": r.get("champion_version"), "n": ch.get("n")})
    return sorted(out, key=lambda h: (h["created_at"] or "", h["version"]))


def dashboard_data(store: LogReader, history: list[dict[str, Any]], *, window: int | None = None) -> dict[str, Any]:
    """What the dashboard shows (see the module docs; ``history``: :func:`retrain_history`;
    ``window``: decisions per window, ``None``: :func:`auto_window` of the log's size);
    JSON-ready."""
    from flywheel.training.stats.traffic import convergence

    if window is None:
        window = auto_window(sum(r.n for r in store.language_breakdown()))
    stats = convergence(store, window=window, top=8)
    e = store.error_directions()
    return {"stats": stats, "history": history, "languages": stats.get("by_language") or {},
            "errors": {"teacher_calls": e.teacher_calls, "teacher_calls_layer2_had": e.teacher_calls_layer2_had,
                       "confident_layer2": e.confident_layer2,
                       "confident_layer2_corrected": e.confident_layer2_corrected}}


def _svg(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    with plt.rc_context({"svg.fonttype": "none"}):       # labels stay text: smaller, and searchable
        fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.find("<svg"):]    # the element only: it is inlined into the page


def _axes(xlabel: str, ylabel: str, n: int) -> tuple[Any, Any]:
    """A figure whose x axis counts 1..``n`` in whole numbers and whose y axis is 0-100%."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    fig, ax = plt.subplots(figsize=(6.4, 2.6))
    ax.set_xlim(0.5, max(n, 1) + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    ax.set_ylim(0, 100)
    ax.yaxis.set_major_formatter(PercentFormatter(100, decimals=0))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _per_window(stats: dict[str, Any]) -> str:
    """The windowed charts' x label: what one point is ("per 50 decisions", "per day"), and
    how many decisions the last point holds when it is a window still filling (its share
    is over fewer decisions than the others')."""
    w = stats.get("window")
    label = f"window, oldest first (per {w:,} decisions)" if isinstance(w, int) else f"window (per {w})"
    partial = _partial_last(stats)
    return label if partial is None else f"{label}; the last: {partial:,} so far"


def _partial_last(stats: dict[str, Any]) -> int | None:
    """The decisions in the last window when it holds fewer than a full window (``None``
    otherwise, and for calendar windows)."""
    w, windows = stats.get("window"), stats.get("windows") or []
    if not isinstance(w, int) or len(windows) < 2:
        return None
    n = int(windows[-1].get("n") or 0)
    return n if n < w else None


def figures(data: dict[str, Any]) -> dict[str, Any]:
    """The dashboard's charts as matplotlib figures by name, or, where there is nothing to
    draw yet, the sentence that says so (a ``str``) instead of an empty chart. Counts
    (windows, retrains) are ticked in whole numbers; shares and accuracies on a fixed
    0-100% axis."""
    import matplotlib

    matplotlib.use("Agg", force=False)

    windows = data["stats"].get("windows") or []
    x = [w["index"] + 1 for w in windows]
    out: dict[str, Any] = {}
    if not windows:
        out["llm_share"] = "No decisions logged yet: the LLM share is drawn per window once there are some."
    else:
        fig, ax = _axes(_per_window(data["stats"]), "share of decisions", len(x))
        ax.plot(x, [100 * w["llm_share"] for w in windows], marker="o", label="LLM share", clip_on=False)
        ax.plot(x, [100 * w["degraded_share"] for w in windows], marker="s", label="degraded share",
                clip_on=False)
        if _partial_last(data["stats"]) is not None:   # a filling window: a hollow point, not a full one
            ax.plot(x[-1:], [100 * windows[-1]["llm_share"]], marker="o", markersize=11, fillstyle="none",
                    linestyle="none", color="grey", label="last window, still filling", clip_on=False)
        ax.legend(loc="upper right")
        out["llm_share"] = fig

    agree = [(i, 100 * w["audit_agreement"]) for i, w in zip(x, windows)
             if w.get("audit_agreement") is not None and w.get("audit_labelled", 0) >= MIN_POINT]
    human = [(i, 100 * (1 - w["human_corrected"] / w["human_labelled"])) for i, w in zip(x, windows)
             if w.get("human_labelled", 0) >= MIN_POINT]
    if not (agree or human):
        out["accuracy"] = (f"No window has {MIN_POINT} or more audits or human labels yet: accuracy against "
                           "labels is drawn once one has.")
    else:
        fig, ax = _axes(_per_window(data["stats"]), "agreeing", len(x))
        if agree:
            ax.plot(*zip(*agree), marker="o", label="layer 2 vs teacher (audits)", clip_on=False)
        if human:
            ax.plot(*zip(*human), marker="s", label="served vs human labels", clip_on=False)
        ax.legend(loc="lower right")
        out["accuracy"] = fig

    hist = [h for h in data["history"] if h.get("challenger_accuracy") is not None]
    if not hist:
        out["retrains"] = "No retrain yet: each retrain's gate accuracy is drawn here once there is one."
    else:
        fig, ax = _axes("retrain", "gate accuracy", len(hist))
        xs = list(range(1, len(hist) + 1))
        ax.plot(xs, [100 * (h["champion_accuracy"] or 0) for h in hist], color="grey", marker="_",
                label="champion", clip_on=False)
        for promoted in (True, False):
            pts = [(i, 100 * h["challenger_accuracy"]) for i, h in zip(xs, hist)
                   if (h["outcome"] == "promoted") == promoted]
            if pts:
                ax.scatter(*zip(*pts), marker="o" if promoted else "x", clip_on=False,
                           label="challenger, promoted" if promoted else "challenger, kept out")
        ax.legend(loc="lower right")
        out["retrains"] = fig
    return out


def charts(data: dict[str, Any]) -> dict[str, str]:
    """The dashboard's pictures as inline SVG elements by name; an empty state is a
    ``<p class="empty">`` sentence instead."""
    return {name: f'<p class="empty">{html.escape(fig)}</p>' if isinstance(fig, str) else _svg(fig)
            for name, fig in figures(data).items()}


def _pairs(rows: list[dict[str, Any]], a: str, b: str) -> str:
    e = html.escape
    body = "".join(f"<tr><td>{e(str(r[a] or 'OUT_OF_SCOPE'))}</td><td>{e(str(r[b] or 'OUT_OF_SCOPE'))}</td>"
                   f"<td>{int(r['n'])}</td></tr>" for r in rows) or '<tr><td colspan="3">none</td></tr>'
    return f"<table><tr><th>{e(a)}</th><th>{e(b)}</th><th>n</th></tr>{body}</table>"


def _history_row(h: dict[str, Any]) -> str:
    e = html.escape
    acc = h.get("challenger_accuracy")
    shown = "" if acc is None else f"{100 * acc:.1f}%"
    version = e(str(h["version"]))
    return (f'<tr><td class="version" title="{version}">{version}</td><td>{e(str(h["outcome"]))}</td>'
            f"<td>{shown}</td>"
            f"<td>{e(str(h.get('reason') or ''))}</td></tr>")


def _window_line(stats: dict[str, Any]) -> str:
    w = stats.get("window")
    per = f"{w:,} decisions" if isinstance(w, int) else str(w)
    return f"one point per {per} ({int(stats.get('n_windows') or 0):,} windows; ?window=N sets another size)"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _judged(s: dict[str, Any]) -> str:
    return "none judged yet" if not s["l2_judged"] else f"{_pct(s['l2_agreement'])} of {s['l2_judged']:,}"


def _languages(section: dict[str, dict[str, Any]]) -> str:
    """The Languages table (:func:`training.stats.language.language_section`), or the sentence
    that there is none while no decision has a logged language (``none``: before the column)."""
    e = html.escape
    if not set(section) - {"none"}:
        return "<p>The log records no language per decision yet, so there are no per-language slices.</p>"
    body = "".join(
        f"<tr><td>{e(lang if lang != 'none' else 'none (logged before languages)')}</td><td>{s['n']:,}</td>"
        f"<td>{_pct(s['share'])}</td><td>{_pct(s['llm_share'])}</td><td>{_pct(s.get('out_of_scope_share'))}</td>"
        f"<td>{_judged(s)}</td></tr>" for lang, s in section.items())
    return ('<table class="languages"><tr><th>language</th><th>decisions</th><th>share</th><th>LLM share</th>'
            f"<th>out of scope</th><th>layer 2 agrees with the teacher</th></tr>{body}</table>")


def render_dashboard(data: dict[str, Any]) -> str:
    """The dashboard page (pictures inlined, tables escaped)."""
    from flywheel.training.review.page import ICON_LINK

    e = html.escape
    pics = charts(data)
    s, err = data["stats"], data["errors"]
    noise = s.get("teacher_noise") or {}
    shadow = s.get("shadow")
    est = noise.get("estimate")
    noise_line = ("no decision has both a teacher and a human label yet" if est is None else
                  f"{100 * est:.1f}% (95% interval {100 * noise['low']:.1f}-{100 * noise['high']:.1f}%, "
                  f"n = {noise['n']})")
    guard = s.get("teacher_guard") or {}
    guard_line = f"<p><strong>{e(guard['line'])}</strong></p>" if guard.get("status") == "above" else ""
    shadow_line = "no shadow version" if not shadow else e(json.dumps(
        {k: shadow.get(k) for k in ("version", "n", "agreement", "permissive", "abstaining", "flips")}))
    calls, had = err["teacher_calls"], err["teacher_calls_layer2_had"]
    conf, wrong = err["confident_layer2"], err["confident_layer2_corrected"]
    hist_rows = "".join(_history_row(h) for h in reversed(data["history"][-20:]))
    l2t = _pairs(s.get("confused_l2_teacher") or [], "layer2", "teacher")
    hs = _pairs(s.get("confused_human_served") or [], "served", "human")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>flywheel dashboard</title>
<meta name="viewport" content="width=device-width, initial-scale=1">{ICON_LINK}
<style>body{{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}} table{{border-collapse:collapse}}
td,th{{border-bottom:1px solid #ddd;padding:.25em .5em;text-align:left;vertical-align:top}}
.grid{{display:flex;flex-wrap:wrap;gap:1.5em}}
svg{{max-width:100%;height:auto}} .empty{{color:#666;max-width:34em}}
td.version{{white-space:nowrap;overflow:hidden;text-overflow:ellipsis;max-width:16em}}</style></head>
<body><h1>flywheel dashboard</h1>
<p><a href="/">review queue</a> &middot; {int(s.get('total') or 0):,} decisions logged,
LLM share {100 * float(s.get('llm_share') or 0):.1f}% overall; {e(_window_line(s))}</p>
<div class="grid">
<section><h2>LLM and degraded share</h2>{pics['llm_share']}</section>
<section><h2>Accuracy against labels</h2>{pics['accuracy']}</section>
<section><h2>Retrains</h2>{pics['retrains']}</section>
</div>
<div class="grid">
<section><h2>Most confused: layer 2 against the teacher</h2>{l2t}</section>
<section><h2>Most confused: served against humans</h2>{hs}</section>
<section><h2>Errors by direction</h2><table>
<tr><td>confident layer-2 answers people corrected</td><td>{wrong:,} of {conf:,}</td></tr>
<tr><td>teacher calls whose answer layer 2 already had</td><td>{had:,} of {calls:,}</td></tr>
</table>
<h2>Teacher noise</h2><p>{e(noise_line)}</p>{guard_line}
<h2>Shadow version</h2><p>{shadow_line}</p>
<h2>Languages</h2>{_languages(data.get("languages") or {})}
</section></div>
<h2>Retrain history (newest first)</h2>
<table><tr><th>version</th><th>outcome</th><th>challenger</th><th>why</th></tr>{hist_rows}</table>
</body></html>
"""
