"""What ``flywheel eval`` prints and draws, from its report (:mod:`training.eval.measure`):
the text report, the trade tables and the target's line, the tuning's lines, and the plots.

- :func:`eval_text`, the command's text: :func:`format_report` (headline metrics, tiers,
  latency, confusions, what each cutoff buys and the weakest intents), :func:`format_tradeoff`
  (the two trade tables and the target's line, :func:`target_line`) and :func:`tuning_lines`
  (what the encoder tuning did). :func:`chosen_line` is ``flywheel train``'s line for a
  fitted target.
- :func:`write_plots`: ``reliability.png`` (layer-2 reliability diagram), ``confusion.png``
  (the labels most involved in errors), and with a ``tradeoff`` ``tradeoff_oos.png`` and
  ``tradeoff_teacher.png`` (matplotlib, Agg canvas, imported only there).

The trade tables render the report's ``tradeoff`` and ``operating_point``
(:mod:`classifier.layer2.operating_point` computes both): in-scope accuracy against
out-of-scope recall as the ``oos`` cutoff sweeps, and the accuracy of layer 2's own answers
against their share (the rest goes to the teacher) as the ``confident`` (or ``defer``)
cutoff sweeps.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from flywheel.classifier.layer2.tiers import fmt_probs
from flywheel.training.eval.measure import RELIABILITY_BINS

__all__ = ["TABLE_ROWS", "chosen_line", "eval_text", "format_report", "format_tradeoff", "target_line",
           "tuning_lines", "write_plots"]

TABLE_ROWS = 11    # points each table shows (the served one always among them)


# --------------------------------------------------------------------- text
def eval_text(report: dict[str, Any]) -> str:
    """``flywheel eval``'s text: the report (:func:`format_report`), the trade tables and the
    target's line (:func:`format_tradeoff`), and what the encoder tuning did, when it ran
    (:func:`tuning_lines`)."""
    tuning = report.get("tuning")
    return "\n".join([format_report(report), *format_tradeoff(report), *(tuning_lines(tuning) if tuning else [])])


def format_report(report: dict[str, Any], *, worst: int = 10) -> str:
    """The report as readable terminal text (headline metrics, tiers, latency, confusions,
    and the ``worst`` intents by F1)."""
    n = report.get("n", 0)
    lines = [f"Model {report.get('model_version', '?')} ({report.get('n_labels', '?')} intents, "
             f"encoder {report.get('encoder', '?')})",
             f"Evaluated on {n:,} queries: {report.get('n_in_scope', 0):,} in scope, "
             f"{report.get('n_out_of_scope', 0):,} out of scope", ""]
    ece = report.get("ece")
    rows = [("accuracy (out of scope as a class)", _pct(report.get("accuracy"))),
            ("in-scope accuracy", _pct(report.get("in_scope_accuracy"))),
            ("out-of-scope recall", _pct(report.get("oos_recall"))),
            ("out-of-scope precision", _pct(report.get("oos_precision"))),
            ("macro F1", "n/a" if report.get("macro_f1") is None else f"{report['macro_f1']:.3f}"),
            ("layer-2 top-1 accuracy (no gate)", _pct(report.get("top1_accuracy_layer2"))),
            ("layer-2 top-3 accuracy", _pct(report.get("top3_accuracy"))),
            ("layer-2 ECE", "n/a" if ece is None else f"{ece:.4f}")]
    if report.get("set_coverage") is not None:
        rows += [(f"prediction-set coverage (nominal {report['nominal_coverage']:.0%})", _pct(report["set_coverage"])),
                 ("mean prediction-set size", f"{report['mean_set_size']:.2f}")]
    if report.get("sure_precision") is not None:
        rows.append((f"precision of layer 2's sure answers ({report.get('deferral')} rule)",
                     _pct(report["sure_precision"])))
    width = max(len(r[0]) for r in rows)
    lines += [f"  {name:<{width}}  {value:>8}" for name, value in rows]
    lines += _language_table(report.get("by_language") or {})
    lines += gate_lines(report.get("gate"))
    lines += followup_lines(report.get("followups"))
    lines.append("")
    for key, title in (("tier_share", "Tiers"), ("layer_share", "Layers")):
        shares = report.get(key) or {}
        lines.append(f"{title + ':':<8}" + "  ".join(f"{k} {_pct(v)}" for k, v in shares.items() if v))
    lat = report.get("latency_ms")
    if lat:
        threads = f", torch threads {report['torch_threads']}" if report.get("torch_threads") else ""
        lines.append(f"Latency (one query at a time, {lat['n']} sampled, cache bypassed{threads}): "
                     f"p50 {lat['p50']:.2f} ms, p99 {lat['p99']:.2f} ms, mean {lat['mean']:.2f} ms")
    if report.get("throughput_qps") is not None:
        lines.append(f"Throughput (batch pass): {report['throughput_qps']:,.1f} queries/s")
    unknown = report.get("unknown_labels") or []
    if unknown:
        shown = ", ".join(unknown[:10]) + (f" (+{len(unknown) - 10} more)" if len(unknown) > 10 else "")
        lines.append(f"Warning: {len(unknown)} true label(s) unknown to the model: {shown}")
    pairs = report.get("confused_pairs") or []
    if pairs:
        lines += ["", "Most confused (true -> predicted):"]
        cw = max(len(str(p[2])) for p in pairs)
        lines += [f"  {p[2]:>{cw}}  {p[0]} -> {p[1]}" for p in pairs]
    lines += _cutoff_table(report.get("cutoff_precision") or {}, worst)
    per = report.get("per_intent") or {}
    if per and worst > 0:
        items = sorted(per.items(), key=lambda kv: (kv[1]["f1"], -kv[1]["support"], kv[0]))[:worst]
        lw = max(5, *(len(k) for k, _ in items))
        lines += ["", f"Weakest intents by F1 ({min(worst, len(per))} of {len(per)}):",
                  f"  {'label':<{lw}}  {'prec':>6}  {'recall':>6}  {'f1':>6}  {'support':>7}"]
        lines += [f"  {k:<{lw}}  {v['precision']:>6.3f}  {v['recall']:>6.3f}  {v['f1']:>6.3f}  {v['support']:>7}"
                  for k, v in items]
    return "\n".join(lines)


def _cutoff_table(per: dict[str, dict[str, Any]], worst: int) -> list[str]:
    """The least precise intents at their cutoff (layer 2's sure answers)."""
    if not per or worst <= 0:
        return []
    items = sorted(per.items(), key=lambda kv: (kv[1]["precision"], -kv[1]["n"], kv[0]))[:worst]
    lw = max(5, *(len(k) for k, _ in items))
    lines = ["", f"What each cutoff buys: precision of layer 2's sure answers, least precise "
                 f"{len(items)} of {len(per)}:", f"  {'label':<{lw}}  {'cutoff':>6}  {'prec':>6}  {'n':>6}"]
    for k, v in items:
        cut = "" if v["cutoff"] is None else fmt_probs(v["cutoff"], digits=3)[0]
        lines.append(f"  {k:<{lw}}  {cut:>6}  {v['precision']:>6.3f}  {v['n']:>6}")
    return lines


def _language_table(slices: dict[str, dict[str, Any]]) -> list[str]:
    """A short per-language table (empty without languages)."""
    if not slices:
        return []
    lw = max(4, *(len(k) for k in slices))
    lines = ["", "By language:",
             f"  {'lang':<{lw}}  {'n':>6}  {'accuracy':>8}  {'in-scope':>8}  {'oos recall':>10}"]
    lines += [f"  {k:<{lw}}  {v['n']:>6,}  {_pct(v.get('accuracy')):>8}  {_pct(v.get('in_scope_accuracy')):>8}  "
              f"{_pct(v.get('oos_recall')):>10}" for k, v in slices.items()]
    return lines


def gate_lines(gate: dict[str, Any] | None) -> list[str]:
    """The out-of-scope gate's in-scope rejections, overall and by language (none without
    in-scope queries)."""
    if not gate or not gate.get("n_in_scope"):
        return []
    lines = ["", "In-scope queries thrown away as out of scope:",
             f"  {'lang':<7}  {'in scope':>8}  {'layer 2 sure':>12}  {'served out of scope':>19}"]
    rows = [("all", gate), *(gate.get("by_language") or {}).items()]
    lines += [f"  {k:<7}  {v['n_in_scope']:>8,}  {_pct(v.get('rejected_sure')):>12}  "
              f"{_pct(v.get('served_out_of_scope')):>19}" for k, v in rows]
    return lines


def followup_lines(fu: dict[str, Any] | None) -> list[str]:
    """A multi-turn file's follow-up figures, overall and by language (none for a
    single-turn file)."""
    if not fu:
        return []
    how = "the file's kind column" if fu["source"] == "kind" else "the follow-up detector"
    hist = "gold labels of the earlier turns" if fu["history"] == "gold" else "the file's history column"
    sessions = f"{fu['sessions']:,} sessions, " if fu.get("sessions") is not None else ""
    lines = ["", f"Follow-ups ({sessions}{fu['turns']:,} turns; history: {hist}; follow-ups by {how}):",
             f"  {'lang':<7}  {'n':>6}  {'accuracy':>8}  {'served out of scope':>19}"]
    rows = [("all", fu), *(fu.get("by_language") or {}).items()]
    lines += [f"  {k:<7}  {v['n']:>6,}  {_pct(v.get('accuracy')):>8}  {_pct(v.get('served_out_of_scope')):>19}"
              for k, v in rows]
    return lines


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


def _rows(points: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """About ``k`` evenly spaced points, the ends and the served one included."""
    if len(points) <= k:
        return points
    step = (len(points) - 1) / (k - 1)
    keep = {round(i * step) for i in range(k)} | {i for i, p in enumerate(points) if p.get("served")}
    return [points[i] for i in sorted(keep)]


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


def tuning_lines(tuning: dict[str, Any]) -> list[str]:
    """What the encoder tuning did (the report's ``tuning``: the tuner's report): its steps,
    epochs, seconds and loss, the encoder served, and the unlabelled stage when it ran."""
    t = tuning
    stopped = " (stopped by its budget)" if t["stopped_early"] else ""
    lines = [f"encoder tuned ({t['objective']}, {t['device']}): {t['steps']} steps, {t['epochs_done']} "
             f"epoch(s) in {t['seconds']:.0f} s{stopped}, loss {t['loss_first']} -> {t['loss_last']}; "
             f"served as {t['encoder_id']}" + (" (int8)" if t["quantized"] else " (fp32)")]
    stage = t.get("unlabelled_stage")
    if stage is not None:
        lines.append(f"unlabelled stage first (SimCSE): {stage['steps']} steps on {stage['rows']:,} "
                     f"texts in {stage['seconds']:.0f} s, loss {stage['loss_first']} -> {stage['loss_last']}")
    return lines


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100.0 * x:.1f}%"


# -------------------------------------------------------------------- plots
def write_plots(report: dict[str, Any], directory: str | Path) -> list[Path]:
    """Write eval's plots into ``directory`` and return their paths: ``reliability.png``
    (layer-2 reliability diagram), ``confusion.png`` (the labels most involved in errors)
    and, with a ``tradeoff``, ``tradeoff_oos.png`` (in-scope accuracy against out-of-scope
    recall) and ``tradeoff_teacher.png`` (accuracy against the share layer 2 answers), the
    served point marked."""
    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    version = report.get("model_version", "?")
    return [_reliability_plot(report, out_dir / "reliability.png", version),
            _confusion_plot(report, out_dir / "confusion.png", version),
            *_tradeoff_plots(report, out_dir, version)]


def _figure(width: float, height: float) -> Any:
    """A matplotlib figure on the Agg canvas (matplotlib is imported here, when plots are drawn)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def _saved(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path)
    return path


def _reliability_plot(report: dict[str, Any], path: Path, version: str) -> Path:
    """The reliability diagram: accuracy per confidence bin against the diagonal."""
    fig = _figure(6.5, 6.5)
    ax, ax_n = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    width = 1.0 / RELIABILITY_BINS
    bins = report.get("reliability") or []
    lefts = [min(int(b["confidence"] * RELIABILITY_BINS), RELIABILITY_BINS - 1) * width for b in bins]
    ax.bar(lefts, [b["accuracy"] for b in bins], width=width, align="edge", color="#4C72B0",
           edgecolor="black", linewidth=0.6, label="accuracy")
    ax.bar(lefts, [abs(b["confidence"] - b["accuracy"]) for b in bins],
           bottom=[min(b["confidence"], b["accuracy"]) for b in bins], width=width, align="edge",
           facecolor="none", edgecolor="#C44E52", hatch="//", linewidth=0.8, label="gap to mean confidence")
    ax.plot([0, 1], [0, 1], "--", color="gray", linewidth=1, label="perfect calibration")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ece = report.get("ece")
    ax.set_title(f"Layer-2 reliability, model {version}\nECE {ece:.4f}" if ece is not None
                 else f"Layer-2 reliability, model {version}")
    ax.legend(loc="upper left", fontsize=8)
    ax_n.bar(lefts, [b["count"] for b in bins], width=width, align="edge", color="gray", edgecolor="black",
             linewidth=0.6)
    ax_n.set_xlabel("top in-scope confidence")
    if bins:
        ax_n.set_yscale("log")
    ax_n.set_ylabel("queries (log)")
    return _saved(fig, path)


def _confusion_plot(report: dict[str, Any], path: Path, version: str) -> Path:
    """The confusion matrix of the labels most involved in errors."""
    conf = report.get("confusion") or {"labels": [], "matrix": [], "complete": True, "n_labels": 0}
    names = list(conf["labels"])
    m = np.array(conf["matrix"], dtype=float).reshape(len(names), len(names))
    size = min(14.0, max(5.0, 0.45 * len(names) + 3.0))
    fig = _figure(size + 1.0, size)
    ax = fig.subplots()
    if names:
        im = ax.imshow(np.log1p(m), cmap="Blues", aspect="equal")
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="log(1 + count)")
        ax.set_xticks(range(len(names)))
        ax.set_yticks(range(len(names)))
        ax.set_xticklabels([_short(s) for s in names], rotation=60, ha="right", fontsize=8)
        ax.set_yticklabels([_short(s) for s in names], fontsize=8)
        if len(names) <= 25:
            hi = m.max() if m.size else 0
            for i in range(len(names)):
                for j in range(len(names)):
                    if m[i, j]:
                        ax.text(j, i, f"{int(m[i, j])}", ha="center", va="center", fontsize=7,
                                color="white" if hi and math.log1p(m[i, j]) > 0.6 * math.log1p(hi) else "black")
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    subset = "" if conf.get("complete", True) else \
        f" ({len(names)} of {conf.get('n_labels', '?')} labels, most confused)"
    ax.set_title(f"Confusion matrix{subset}\nmodel {version}", fontsize=10)
    return _saved(fig, path)


def _tradeoff_plots(report: dict[str, Any], out_dir: Path, version: str) -> list[Path]:
    """The two trade curves, the served point marked; none without a ``tradeoff``."""
    trade = report.get("tradeoff")
    if not trade:
        return []
    paths = []
    for name, key, x, y, xlabel, ylabel in (
            ("tradeoff_oos.png", "oos", "oos_recall", "in_scope_accuracy", "out-of-scope recall",
             "in-scope accuracy"),
            ("tradeoff_teacher.png", "answered", "answered_share", "answered_accuracy",
             "share layer 2 answers (the rest goes to the teacher)", "accuracy of those answers")):
        pts = [p for p in trade[key] if p.get(x) is not None and p.get(y) is not None]
        fig = _figure(6.0, 5.0)
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
        paths.append(_saved(fig, out_dir / name))
    return paths


def _short(label: str, n: int = 28) -> str:
    return label if len(label) <= n else label[: n - 1] + "…"
