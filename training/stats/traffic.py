"""How the flywheel converges: layer shares, tiers, audits and confusions from the traffic log.

:func:`convergence` reads the DuckDB traffic log (:class:`logstore.LogStore`) with one
named read, :meth:`~logstore.reads.NamedReads.traffic_by_window` (one statement: one
consistent snapshot), and returns a JSON-ready dict;
:func:`format_table` renders it for a terminal; ``flywheel stats``
(:func:`training.cli.offline.stats_command`) prints it.

Definitions (every count is over the ``decisions`` table, windows included):

- ``layer_share``: share of decisions made by each layer (``declared``, ``rules``,
  ``embedding``, ``llm`` are always present; any other logged value is added).
  ``llm_share`` is ``layer_share["llm"]``; ``teacher_calls`` counts decisions for
  which the teacher was called inline (valid answer or not).
- ``tier_share``: share of each tier (``confident``, ``ambiguous``, ``weak``,
  ``no_match`` always present).
- teacher label of a decision: its latest *valid* teacher answer, inline or
  back-filled (``labels`` rows with ``source='teacher' AND valid``), exactly as
  :meth:`LogStore.labelled_rows` picks it; ``None`` means out of scope.
  Human label: the latest ``source='human'`` row.
- audits: ``audited`` = audit-sampled decisions; ``audit_labelled`` = those with a
  valid teacher label; ``audit_agree`` = those whose teacher label equals the layer-2
  label (``l2_label``; out of scope equals out of scope); ``audit_agreement`` =
  ``audit_agree / audit_labelled`` (``None`` when nothing was answered yet: an audit
  still waiting for the teacher is not counted as a disagreement).
- pending: ``pending_flagged`` = decisions that needed the teacher while it was
  unavailable; ``pending`` = those still open, with the definition of
  :meth:`LogStore.pending`: not in ``resolutions`` and without a valid back-filled
  teacher label.
- confusions: ``confused_l2_teacher`` = ``(layer2, teacher, n)`` over decisions that
  have a layer-2 answer (``l2_confidence`` not NULL) and a teacher label that
  differs; ``confused_human_served`` = ``(served, human, n)`` over decisions whose
  human label differs from the served ``label``. Top ``top`` pairs by count (ties by
  name, out of scope last); ``None`` = out of scope. ``teacher_labelled``,
  ``human_labelled`` and ``human_corrected`` give the denominators.
- degraded: ``degraded`` counts decisions that did not get the layer they needed
  (``decisions.degraded`` set: layer 2 was unsure and the teacher did not answer, or
  there is no teacher); ``degraded_share`` = ``degraded / n`` and ``degraded_reasons``
  the counts by reason (:data:`classifier.decision.DEGRADED_REASONS`). Rows logged before
  migration 4 are never counted as degraded.
- ``teacher_noise``: how often the teacher's label differs from a human label on the same
  decision, over the whole log, with an exact 95% interval and ``by_intent`` (per teacher
  label with at least 10 such decisions), by :mod:`training.teacher_noise` (its own
  statement; the same figures the retrain reports and exports as ``flywheel_teacher_noise_ratio``).
- ``teacher_guard``: what the retrain's noise guard makes of those figures at the default
  level (``flywheel retrain --max-teacher-noise``; :func:`training.teacher_noise.noise_guard`):
  ``status`` ``above`` (the estimate's 95% lower bound is above the level: the next retrain
  drops the teacher's rows of the labels above it), ``within``, ``unknown`` (too few human
  labels) or ``off``, with its ``line``.
- ``anchoring``: the teacher's history anchoring (ADR RC-03) over the whole log, by
  :mod:`training.stats.anchoring` (its own statement; definition in :mod:`classifier.anchoring`).
- ``by_language``: per logged language (``decisions.language``; ``none`` for rows logged
  before it) its share, LLM share, confident and degraded shares and layer 2's agreement
  with the teacher, over the whole log, by :mod:`training.stats.language` (its own statement).
- ``shadow``: a shadow model version against the champion over the whole log (agreement,
  permissive / abstaining / flipped answers, accuracy on the disagreements, the LLM share it
  would have had), by :mod:`training.stats.shadow` (its own statement); ``None`` without a
  shadow version (``shadow_version``).

Windows: ``window="day"`` (also ``"hour"``, ``"week"``) groups by UTC calendar
period; ``start``/``end`` are the period bounds (``end`` exclusive) and periods
without traffic are omitted. ``window=N`` cuts the log, ordered by
``(created_at, decision_id)``, into consecutive blocks of N decisions (the last may
be shorter); ``start``/``end`` are the first and last decision times of the block.
Every window also has ``first``/``last`` (its first and last decision times), its
``index`` (0-based, counted over all windows) and ``n`` (its decisions); ``n_windows``
is the number of windows in the whole log (``last=K`` returns only the last K, and
only those are summarised, so ``--window 1 --last 20`` stays cheap on a big log).
Shares are rounded to 6 digits; ``layer_counts`` gives the raw layer counts.
Timestamps are ISO 8601 UTC strings ending in ``Z``.

CLI (errors follow the project's convention: bad option values and log problems
raise :class:`~classifier.errors.FlywheelError` subclasses with exit code 2, which
``flywheel.cli.main`` prints as one ``flywheel: error: ...`` line):
``flywheel stats [--window day|hour|week|N] [--last K] [--top K] [--json]
[--shadow VERSION] [--log-db PATH] [--home DIR]``; the log path is ``load_config(home=..., log_db=...).log_path``.
A missing log file is not an error: ``flywheel stats`` prints
``no traffic log at PATH yet`` on stderr, reports ``total`` 0 (with ``"missing":
true`` in ``--json``) and exits 0, so cron jobs and dashboards need no special case.
It never creates the file. Other log problems (a directory, locked for too long,
newer schema) raise :class:`~logstore.LogStoreError` (exit code 2).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from flywheel.classifier.errors import InvalidInputError
from flywheel.classifier.settings.label_names import label_name
from flywheel.classifier.settings.output import counted
from flywheel.training.stats.anchoring import anchoring_section, empty_anchoring, format_anchoring
from flywheel.training.stats.language import format_languages, language_section
from flywheel.training.stats.shadow import empty_shadow, format_shadow, shadow_section
from flywheel.training.teacher_noise import NoiseEstimate, format_noise, noise_guard, noise_section

if TYPE_CHECKING:  # pragma: no cover
    from flywheel.logstore.reads import LogReader

__all__ = ["LAYERS", "TIERS", "check_options", "convergence", "empty_stats", "format_table", "parse_window",
           "int_option", "stats_for_path"]

LAYERS = ("declared", "rules", "embedding", "llm")
TIERS = ("confident", "ambiguous", "weak", "no_match")
PERIODS = {"hour": timedelta(hours=1), "day": timedelta(days=1), "week": timedelta(weeks=1)}

_COUNTS = ("audited", "audit_labelled", "audit_agree", "pending_flagged", "pending",
           "teacher_calls", "teacher_labelled", "human_labelled", "human_corrected", "degraded")


def parse_window(window: str | int) -> str | int:
    """``"day"``/``"hour"``/``"week"`` or a positive decision count (int or digit string)."""
    if isinstance(window, bool):
        raise InvalidInputError(f"window must be 'day', 'hour', 'week' or a positive integer, got {window!r}")
    if isinstance(window, int):
        n = window
    else:
        w = str(window).strip().lower()
        if w in PERIODS:
            return w
        try:
            n = int(w)
        except ValueError:
            raise InvalidInputError(
                f"window must be 'day', 'hour', 'week' or a positive integer, got {window!r}") from None
    if n < 1:
        raise InvalidInputError(f"window must be a positive number of decisions, got {n}")
    return n


def int_option(name: str, value: str) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        raise InvalidInputError(f"{name} must be an integer, got {value!r}") from None


def _check_limits(last: int | None, top: int) -> None:
    if last is not None and (isinstance(last, bool) or last < 1):
        raise InvalidInputError(f"--last must be >= 1, got {last}")
    if isinstance(top, bool) or top < 0:
        raise InvalidInputError(f"--top must be >= 0, got {top}")


def check_options(window: str | int, last: int | None, top: int) -> str | int:
    """Check :func:`convergence`'s options (:class:`InvalidInputError` when bad) before
    anything slow runs; returns the parsed window."""
    window = parse_window(window)
    _check_limits(last, top)
    return window


def _iso(ts: datetime | None) -> str | None:
    if ts is None:
        return None
    return ts.isoformat(timespec="seconds") + "Z"


def _shares(counts: dict[str | None, int], n: int, always: Sequence[str]) -> dict[str, float]:
    named = {("none" if k is None else str(k)): v for k, v in counts.items()}
    keys = list(always) + sorted(k for k in named if k not in always)
    return {k: (round(named.get(k, 0) / n, 6) if n else 0.0) for k in keys}


def _top(pairs: dict[tuple[str | None, str | None], int], names: tuple[str, str],
         top: int) -> list[dict[str, Any]]:
    items = sorted(pairs.items(), key=lambda kv: (-kv[1], kv[0][0] is None, kv[0][0] or "",
                                                  kv[0][1] is None, kv[0][1] or ""))
    return [{names[0]: a, names[1]: b, "n": int(n)} for (a, b), n in items[:top]]


def _summary(n: int, layers: dict, tiers: dict, counts: dict[str, int],
             l2t: dict, hs: dict, top: int, degraded: dict | None = None) -> dict[str, Any]:
    agree, labelled = counts["audit_agree"], counts["audit_labelled"]
    layer_share = _shares(layers, n, LAYERS)
    return {
        "degraded_share": round(counts["degraded"] / n, 6) if n else 0.0,
        "degraded_reasons": {k: int(v) for k, v in sorted((degraded or {}).items())},
        "n": n,
        "layer_share": layer_share,
        "layer_counts": {k: int(layers.get(k, 0)) for k in layer_share},
        "tier_share": _shares(tiers, n, TIERS),
        "llm_share": layer_share["llm"],
        **{k: int(counts[k]) for k in _COUNTS},
        "audit_agreement": round(agree / labelled, 6) if labelled else None,
        "confused_l2_teacher": _top(l2t, ("layer2", "teacher"), top),
        "confused_human_served": _top(hs, ("served", "human"), top),
    }


def empty_stats(window: str | int = "day", shadow_version: str | None = None) -> dict[str, Any]:
    """The result of :func:`convergence` on an empty log."""
    window = parse_window(window)
    out = _summary(0, {}, {}, {k: 0 for k in _COUNTS}, {}, {}, 0)
    out.pop("n")
    return {"total": 0, "window": window, **out, "first": None, "last": None, "n_windows": 0,
            "by_language": {}, "teacher_guard": noise_guard(NoiseEstimate().overall(), {}),
            "teacher_noise": {**NoiseEstimate().overall(), "by_intent": {}}, "anchoring": empty_anchoring(),
            "shadow": None if shadow_version is None else empty_shadow(shadow_version), "windows": []}


def convergence(store: "LogReader", *, window: str | int = "day", last: int | None = None,
                top: int = 5, shadow_version: str | None = None) -> dict[str, Any]:
    """Convergence statistics of the traffic log, overall and per window.

    Parameters
    ----------
    store : LogReader
        The traffic log (a :class:`logstore.LogStore`; its spool is ingested first, as by
        every read).
    window : {"day", "hour", "week"} or int
        Calendar windows (UTC), or blocks of that many decisions.
    last : int, optional
        Keep only the last ``last`` windows in ``windows`` (totals cover the whole log).
    top : int
        How many confused pairs to list, overall and per window.
    shadow_version : str, optional
        The shadow model version to report in ``shadow`` (``None``: no such section).

    Returns
    -------
    dict
        ``total``, ``window``, ``first``/``last``, the summary fields described in the
        module docstring (``layer_share``, ``tier_share``, ``llm_share``, audit, pending,
        confusion fields) for the whole log, ``anchoring``, ``shadow`` (``None`` without
        ``shadow_version``), and ``windows``: one dict per window,
        oldest first, with ``index``, ``start``, ``end``, ``first``, ``last`` and the
        same summary fields, where ``n`` is the window's decision count.
    """
    window = parse_window(window)
    _check_limits(last, top)
    rows = store.traffic_by_window(window, last)

    per: dict[Any, dict[str, Any]] = {}
    total_slot = _slot()
    for row in rows:
        r = row._asdict()
        if r["scope"] == "total":
            s = total_slot
        elif r["w"] in per:
            s = per[r["w"]]
        else:
            s = per[r["w"]] = _slot()
        kind = r["kind"]
        if kind == "window":
            s["n"], s["first"], s["last"] = int(r["n"]), r["first_at"], r["last_at"]
            s["counts"] = {k: int(r[k] or 0) for k in _COUNTS}
            s["n_windows"] = int(r["n_windows"] or 0)
        elif kind == "layer":
            s["layers"][r["k1"]] = int(r["n"])
        elif kind == "tier":
            s["tiers"][r["k1"]] = int(r["n"])
        elif kind == "degraded":
            s["degraded"][r["k1"]] = int(r["n"])
        elif kind == "l2_teacher":
            s["l2t"][(r["k1"], r["k2"])] = int(r["n"])
        elif kind == "human_served":
            s["hs"][(r["k1"], r["k2"])] = int(r["n"])

    if not total_slot["n"]:
        return {**empty_stats(window), "n_windows": 0, "shadow": shadow_section(store, shadow_version)}
    keys = sorted(per)
    n_windows = total_slot["n_windows"]
    windows = []
    for i, w in enumerate(keys, start=n_windows - len(keys)):
        s = per[w]
        if isinstance(window, int):
            start, end = s["first"], s["last"]
        else:
            start, end = w, w + PERIODS[window]
        windows.append({"index": i, "start": _iso(start), "end": _iso(end),
                        "first": _iso(s["first"]), "last": _iso(s["last"]),
                        **_summary(s["n"], s["layers"], s["tiers"], s["counts"], s["l2t"], s["hs"],
                                   top, s["degraded"])})
    t = total_slot
    summary = _summary(t["n"], t["layers"], t["tiers"], t["counts"], t["l2t"], t["hs"], top, t["degraded"])
    summary.pop("n")
    noise = noise_section(store)
    return {"total": t["n"], "window": window, **summary,
            "first": _iso(t["first"]), "last": _iso(t["last"]),
            "n_windows": n_windows, "by_language": language_section(store),
            "teacher_guard": noise_guard(noise, noise["by_intent"]),
            "teacher_noise": noise, "anchoring": anchoring_section(store),
            "shadow": shadow_section(store, shadow_version), "windows": windows}


def _slot() -> dict[str, Any]:
    return {"layers": {}, "tiers": {}, "l2t": {}, "hs": {}, "degraded": {}, "n": 0, "n_windows": 0,
            "first": None, "last": None, "counts": {k: 0 for k in _COUNTS}}


# --------------------------------------------------------------------------- rendering

def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100.0 * x:.1f}%"


_SHORT = {"declared": "decl", "embedding": "embed", "confident": "conf", "ambiguous": "ambig",
          "no_match": "nomatch"}


def _minute(iso: str | None) -> str:
    return "-" if not iso else iso[:16].replace("T", " ")




def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [len(h) for h in headers]
    for r in rows:
        for i, cell in enumerate(r):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        out = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(cells)]
        return "  ".join(out).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def _audit_cell(s: dict[str, Any]) -> str:
    if not s["audited"]:
        return "-"
    if not s["audit_labelled"]:
        return f"0/{s['audited']} answered"
    return f"{s['audit_agree']}/{s['audit_labelled']} {_pct(s['audit_agreement'])}"


def format_table(stats: dict[str, Any]) -> str:
    """Render :func:`convergence`'s result as aligned plain text for a terminal."""
    lines: list[str] = []
    total = int(stats.get("total", 0))
    where = f" (log: {stats['log_path']})" if stats.get("log_path") else ""
    lines.append(f"flywheel stats: {counted(total, 'decision')}{where}")
    if stats.get("missing"):
        lines.append("  no traffic log yet: nothing has been logged")
        return "\n".join(lines)
    if not total:
        lines.append("  the traffic log is empty")
        return "\n".join(lines)
    lines.append(f"  from {stats.get('first')} to {stats.get('last')}")
    lines.append("  layers: " + "  ".join(f"{k} {_pct(v)}" for k, v in stats["layer_share"].items()))
    lines.append("  tiers:  " + "  ".join(f"{k} {_pct(v)}" for k, v in stats["tier_share"].items()))
    lines.append(f"  audits: {stats['audited']} sampled, {stats['audit_labelled']} answered by the "
                 f"teacher, agreement with layer 2 {_pct(stats['audit_agreement'])}"
                 + (f" ({stats['audit_agree']}/{stats['audit_labelled']})" if stats["audit_labelled"] else ""))
    lines.append(f"  pending: {stats['pending']} open ({stats['pending_flagged']} flagged in all)"
                 f"   teacher calls: {stats['teacher_calls']}   teacher-labelled: "
                 f"{stats['teacher_labelled']}   human-labelled: {stats['human_labelled']} "
                 f"({stats['human_corrected']} corrected)")
    reasons = ", ".join(f"{k} {v}" for k, v in stats.get("degraded_reasons", {}).items())
    lines.append(f"  degraded: {_pct(stats.get('degraded_share'))} of decisions did not get the layer they needed"
                 + (f" ({reasons})" if reasons else ""))
    if stats.get("teacher_noise"):
        lines.append("  " + format_noise(stats["teacher_noise"], stats["teacher_noise"].get("by_intent")))
    if (stats.get("teacher_guard") or {}).get("status") == "above":
        lines.append("  " + stats["teacher_guard"]["line"])
    if stats.get("anchoring"):
        lines.append("  " + format_anchoring(stats["anchoring"]))
    if stats.get("shadow"):
        lines.extend("  " + ln for ln in format_shadow(stats["shadow"]).splitlines())
    if stats.get("by_language"):
        lines.append("")
        lines.append("per language: share, LLM share, confident, degraded, layer 2 agreeing with the teacher")
        lines.extend("  " + ln for ln in _table(["language", "n", "share", "llm", "confident", "degraded", "l2 agree"],
                                                 format_languages(stats["by_language"]), {1, 2, 3, 4, 5, 6}))
    windows = stats.get("windows") or []
    if windows:
        w = stats.get("window")
        by_count = isinstance(w, int)
        layer_keys = list(stats["layer_share"])
        tier_keys = list(stats["tier_share"])
        if by_count:
            head_cols = ["#", "first", "last"]
        else:
            head_cols = [str(w)]
        headers = (head_cols + ["n"] + [_SHORT.get(k, k) for k in layer_keys]
                   + [_SHORT.get(k, k) for k in tier_keys] + ["audit agree", "pending", "degraded"])
        rows = []
        for s in windows:
            if by_count:
                head = [str(s["index"] + 1), _minute(s["first"]), _minute(s["last"])]
            else:
                start = s["start"] or "-"
                head = [start[:13] + "h" if w == "hour" else start[:10]]
            rows.append(head + [f"{s['n']:,}"]
                        + [_pct(s["layer_share"].get(k, 0.0)) for k in layer_keys]
                        + [_pct(s["tier_share"].get(k, 0.0)) for k in tier_keys]
                        + [_audit_cell(s), str(s["pending"]), _pct(s["degraded_share"])])
        title = f"per window of {counted(w, 'decision')}" if isinstance(w, int) else f"per {w} (UTC)"
        shown = len(windows)
        if shown < _n_windows(stats):
            title += f", last {shown} of {_n_windows(stats)}"
        lines.append("")
        lines.append(title + ": layer and tier shares, audit agreement (agree/answered), "
                     "open pending, degraded share")
        lines.extend("  " + ln for ln in _table(headers, rows,
                                                 set(range(len(head_cols), len(headers)))))
    for key, (a, b), title in (
            ("confused_l2_teacher", ("layer2", "teacher"), "top confusions, layer 2 -> teacher"),
            ("confused_human_served", ("served", "human"), "top human corrections, served -> human")):
        pairs = stats.get(key) or []
        if pairs:
            lines.append("")
            lines.append(title + ":")
            rows = [[label_name(p[a]), "->", label_name(p[b]), str(p["n"])] for p in pairs]
            lines.extend("  " + ln for ln in _table([a, "", b, "n"], rows, {3}))
    return "\n".join(lines)


def _n_windows(stats: dict[str, Any]) -> int:
    return int(stats.get("n_windows", len(stats.get("windows") or [])))


# --------------------------------------------------------------------------- command line

def stats_for_path(path: str | Path, *, window: str | int = "day", last: int | None = None,
                   top: int = 5, open_store: Callable[[], Any] | None = None,
                   shadow_version: str | None = None) -> dict[str, Any]:
    """:func:`convergence` of the log at ``path``; a missing log gives ``total`` 0 and
    ``"missing": true`` (the file is not created). ``open_store`` opens the log instead (in
    fleet mode: mirrored from the bucket first); it runs only once the options are valid.
    ``shadow_version``: the shadow version to report (``shadow``), as in :func:`convergence`."""
    p = Path(path).expanduser()
    window = check_options(window, last, top)
    if open_store is not None:
        store = open_store()
        full = convergence(store, window=window, last=last, top=top, shadow_version=shadow_version)
        full.update(log_path=store.path, missing=False)
        return full
    spool = Path(str(p) + ".spool")
    if not p.exists() and not (spool.is_dir() and any(spool.glob("*.arrow"))):
        out = empty_stats(window, shadow_version)
        out.update(log_path=str(p), missing=True)
        return out
    from flywheel.logstore import LogStore

    store = LogStore(p)
    full = convergence(store, window=window, last=last, top=top, shadow_version=shadow_version)
    full["log_path"] = store.path
    full["missing"] = False
    return full
