"""``flywheel eval``'s operating point: the trade tables, the target's line and the trade plots.

They render the report's ``tradeoff`` and ``operating_point``
(:mod:`classifier.layer2.operating_point` computes both): in-scope accuracy against out-of-scope
recall as the ``oos`` cutoff sweeps, and the accuracy of layer 2's own answers against
their share (the rest goes to the teacher) as the ``confident`` (or ``defer``) cutoff sweeps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["TABLE_ROWS", "format_tradeoff", "write_tradeoff_plots", "target_line", "chosen_line"]

TABLE_ROWS = 11    # points each table shows (the served one always among them)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100.0 * x:.1f}%"


def _rows(points: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """About ``k`` evenly spaced points, the ends and the served one included."""
    if len(points) <= k:
        return points
    step = (len(points) - 1) / (k - 1)
    keep = {round(i * step) for i in range(k)} | {i for i, p in enumerate(points) if p.get("served")}
    return [points[i] for i in sorted(keep)]


def format_tradeoff(report: dict[str, Any], rows: int = TABLE_ROWS) -> list[str]:
    """The two trade tables and the target's line, as terminal lines (none without a
    ``tradeoff``)."""
    trade = report.get("tradeoff")
    if not trade:
        return []
    lines = ["", f"Out-of-scope trade (layer 2, the oos cutoff swept; {trade['n_in_scope']:,} in scope, "
                 f"{trade['n_out_of_scope']:,} out of scope):",
             f"  {'cutoff':>7}  {'in-scope acc':>12}  {'oos recall':>10}"]
    lines += [f"  {p['cutoff']:>7.3f}  {_pct(p['in_scope_accuracy']):>12}  {_pct(p['oos_recall']):>10}"
              + ("  <- served" if p.get("served") else "") for p in _rows(trade["oos"], rows)]
    lines += ["", f"Teacher trade (the {trade['answered_cutoff']} cutoff swept; layer 2 answers alone, the rest "
                  "goes to the teacher):",
              f"  {'cutoff':>7}  {'answered':>8}  {'accuracy':>8}  {'LLM share':>9}"]
    lines += [f"  {p['cutoff']:>7.3f}  {_pct(p['answered_share']):>8}  {_pct(p['answered_accuracy']):>8}  "
              f"{_pct(p['llm_share']):>9}" + ("  <- served" if p.get("served") else "")
              for p in _rows(trade["answered"], rows)]
    op = report.get("operating_point")
    if op:
        lines += ["", target_line(op)]
    return lines


def target_line(op: dict[str, Any]) -> str:
    """``Target oos_recall 85.0%: oos cutoff 0.676 (chosen on 300 ...: 85.3% ±4.0); on this
    test set 83.3% of 300 (±4.2)``, and a second line when the choice rests on few rows or
    the test set disagrees with it."""
    (kind, want), = op["target"].items()
    chosen, test = op.get("chosen") or {}, op.get("test") or {}
    where = (f" (chosen on {chosen['n']:,} {chosen.get('on', 'rows')}: {_pct(chosen.get(kind))}{_pm(chosen)}"
             + ("" if chosen.get("reached", True) else ", not reachable there") + ")") if chosen.get("n") else ""
    value = "n/a" if op.get("value") is None else f"{op['value']:.3f}"
    line = (f"Target {kind} {_pct(want)}: {op['cutoff']} cutoff {value}{where}; on this test set "
            f"{_pct(test.get(kind))} of {test.get('n', 0):,}{_pm(test)}")
    notes = [n for n in [_few_rows_note(chosen, "(--calibration)")] if n]
    if op.get("consistent") is False:
        notes.append("the test set's figure lies outside what the chosen rows allow: its queries differ from "
                     "those the cutoff was chosen on")
    return line + "".join(f"\n  note: {n}" for n in notes)


def chosen_line(target: dict[str, float], op: dict[str, Any], value: float | None) -> str:
    """``flywheel train``'s line for a fitted target (the manifest's ``operating_point``):
    ``target oos_recall 85.0%: oos cutoff 0.835, chosen on 100 out-of-fold training rows:
    85.0% ±8.3``, and a note when that rests on too few rows."""
    (kind, want), = target.items()
    shown = "n/a" if value is None else f"{value:.3f}"
    line = (f"target {kind} {_pct(want)}: {op.get('cutoff', '?')} cutoff {shown}, chosen on {op.get('n', 0):,} "
            f"{op.get('on', 'rows')}: {_pct(op.get(kind))}{_pm(op)}"
            + ("" if op.get("reached", True) else " (not reachable there)"))
    note = _few_rows_note(op, "(more examples of that kind)")
    return line + (f"\n  note: {note}" if note else "")


def _few_rows_note(figure: dict[str, Any], remedy: str) -> str | None:
    """The note for a target chosen on rows too few to promise it (:func:`few_rows`), or ``None``."""
    from flywheel.classifier.layer2.operating_point import FEW_ROWS_TOLERANCE, few_rows

    if not figure.get("n") or figure.get("tolerance") is None or not few_rows(figure):
        return None
    return (f"{figure['n']:,} rows place this cutoff only to ±{100 * figure['tolerance']:.1f} points (95%), wider "
            f"than ±{100 * FEW_ROWS_TOLERANCE:.0f}: give more labelled rows of that kind {remedy}")


def _pm(figure: dict[str, Any]) -> str:
    """`` (±4.2)``: the figure's 95% tolerance in points, or nothing."""
    tol = figure.get("tolerance")
    return "" if tol is None else f" ±{100 * float(tol):.1f}"


def write_tradeoff_plots(report: dict[str, Any], directory: str | Path) -> list[Path]:
    """``tradeoff_oos.png`` (in-scope accuracy against out-of-scope recall) and
    ``tradeoff_teacher.png`` (accuracy against the share layer 2 answers) in ``directory``,
    the served point marked; none without a ``tradeoff``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    trade = report.get("tradeoff")
    if not trade:
        return []
    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    version = report.get("model_version", "?")
    paths = []
    for name, key, x, y, xlabel, ylabel in (
            ("tradeoff_oos.png", "oos", "oos_recall", "in_scope_accuracy", "out-of-scope recall",
             "in-scope accuracy"),
            ("tradeoff_teacher.png", "answered", "answered_share", "answered_accuracy",
             "share layer 2 answers (the rest goes to the teacher)", "accuracy of those answers")):
        pts = [p for p in trade[key] if p.get(x) is not None and p.get(y) is not None]
        fig = Figure(figsize=(6.0, 5.0), dpi=110)
        FigureCanvasAgg(fig)
        ax = fig.subplots()
        ax.plot([p[x] for p in pts], [p[y] for p in pts], "-o", markersize=3, color="#4C72B0")
        for p in pts:
            if p.get("served"):
                ax.plot([p[x]], [p[y]], "o", markersize=9, color="#C44E52", label=f"served (cutoff {p['cutoff']:.3f})")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{ylabel} against {xlabel.split(' (')[0]}, model {version}", fontsize=9)
        ax.grid(alpha=0.3)
        if any(p.get("served") for p in pts):
            ax.legend(loc="lower left", fontsize=8)
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path)
        paths.append(path)
    return paths
