"""The retrain job's result and its readable report (``report.md``)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from flywheel.classifier.layer2.tiers import Thresholds
from flywheel.classifier.settings.output import counted
from flywheel.training.gate import MIN_GATE_ROWS, MIN_OOS_FOR_GATE, evaluate_layer2
from flywheel.training.trainset import SPLIT_ID

if TYPE_CHECKING:   # the run's records load with the retrain, not with the CLI (report.py is imported by it)
    from flywheel.classifier.versions.model import IntentModel
    from flywheel.training.rows import LabelledSet, TrainingSet
    from flywheel.training.trial import Challenger, Champion, Evaluation, Job, Trial

__all__ = ["RetrainResult", "fmt_value", "fmt_share", "fmt_n", "figures_line", "jsonable", "render_markdown",
           "challenger_lines", "intent_change_lines", "teacher_markdown", "write_reports", "model_metrics",
           "with_run_metrics", "run_timing", "challengers_section", "run_report", "teacher_fields",
           "gate_by_language", "gate_language_markdown"]


@dataclass
class RetrainResult:
    """What one run did. ``outcome`` is ``promoted``, ``shadowed`` (passed the gate and
    published as the shadow version, see ``RetrainOptions.shadow``), ``kept`` or ``skipped``;
    with ``dry_run`` it is what would have happened (a winner is ``would_promote`` or
    ``would_shadow``, never ``promoted``) and ``version`` is ``None``. ``reason`` is the
    gate's one-line reason, and every summary line but a skip's ends with it."""

    outcome: str
    version: str | None
    reason: str
    challenger: dict[str, Any] | None = None
    champion: dict[str, Any] | None = None
    report_path: Path | None = None
    dry_run: bool = False
    report: dict[str, Any] = field(default_factory=dict)
    markdown: str = ""

    @property
    def promoted(self) -> bool:
        return self.outcome == "promoted" and not self.dry_run

    def to_dict(self) -> dict[str, Any]:
        out = {"outcome": self.outcome, "version": self.version, "reason": self.reason,
               "summary": self.summary_line(), "dry_run": self.dry_run,
               "report_path": str(self.report_path) if self.report_path else None,
               "challenger": self.challenger, "champion": self.champion}
        for k in ("gate", "dataset", "thresholds", "timing", "notes", "challengers", "tuning", "encoder_tuning",
                  "teacher_noise", "teacher_noise_by_intent", "teacher_filtered", "teacher_filter", "teacher_guard",
                  "teacher_unsure"):
            if k in self.report:
                out[k] = self.report[k]
        return jsonable(out)

    def summary_line(self) -> str:
        if self.outcome == "skipped":
            return f"skipped: {self.reason}"
        name = self.version or ("(dry run)" if self.dry_run else "?")
        if self.dry_run and self.version:
            name += " (dry run)"
        if (self.report.get("challengers") or {}).get("put_forward") == "tuned":
            name += " [tuned encoder]"
        ch = self.challenger or {}
        cp = self.champion
        acc = f"{fmt_n(ch.get('n'), what=_set_words(ch.get('gate_set')))}"
        share = fmt_n(ch.get("llm_share_n"), what=_set_words(ch.get("llm_share_on")))
        if self.outcome in ("promoted", "would_promote"):
            if not cp:
                return (f"{self.outcome} {name} (first model: accuracy {fmt_value(ch.get('accuracy'))}, {acc}; "
                        f"LLM share {fmt_share(ch.get('llm_share'))}, {share}): {self.reason}")
            return (f"{self.outcome} {name} (accuracy {fmt_value(cp.get('accuracy'))} -> "
                    f"{fmt_value(ch.get('accuracy'))}, {acc}; LLM share "
                    f"{fmt_share(cp.get('llm_share'))} -> {fmt_share(ch.get('llm_share'))}, {share}): {self.reason}")
        champ = cp.get("version") if cp else "?"
        if self.outcome in ("shadowed", "would_shadow"):
            return (f"{self.outcome} {name} (passed the gate: accuracy "
                    f"{fmt_value(cp.get('accuracy') if cp else None)} -> {fmt_value(ch.get('accuracy'))}, "
                    f"{acc}); still serving {champ}: {self.reason}")
        return f"kept {champ}, challenger {name} not promoted: {self.reason}"


def _set_words(name: Any) -> str:
    """``eval`` -> ``eval queries``: what a figure's n counts."""
    return f"{str(name or 'eval').replace('_', ' ')} queries"


def fmt_n(n: Any, minimum: int = MIN_GATE_ROWS, what: str = "") -> str:
    """The n a figure was measured on, flagged when it is below the gate's minimum:
    ``n=2 recent queries, below the gate's minimum of 20``."""
    k = int(n or 0)
    out = f"n={k:,}" + (f" {what}" if what else "")
    return out + (f", below the gate's minimum of {minimum}" if k < minimum else "")


def figures_line(g: dict[str, Any], gate_set: str, llm: dict[str, Any]) -> str:
    """One model's figures, each with the n it was measured on: ``g`` its metrics on
    ``gate_set`` (:func:`training.gate.evaluate_layer2`), ``llm`` its ``llm_share``,
    ``llm_share_on`` and ``llm_share_n``. A figure on fewer rows than the gate's minimum
    says so (out-of-scope recall: :data:`~training.gate.MIN_OOS_FOR_GATE`)."""
    whole = f"accuracy {fmt_value(g.get('accuracy'))}"
    if "macro_f1" in g:
        whole += f", macro F1 {fmt_value(g.get('macro_f1'))}"
    inside = f"in-scope {fmt_value(g.get('in_scope_accuracy'))}"
    if "ece" in g:
        inside += f", ECE {fmt_value(g.get('ece'))}"
    return (f"{whole} ({gate_set}, {fmt_n(g.get('n'))}); {inside} ({fmt_n(g.get('n_in_scope'))}); "
            f"oos recall {fmt_value(g.get('oos_recall'))} ({fmt_n(g.get('n_out_of_scope'), MIN_OOS_FOR_GATE)}); "
            f"LLM share {fmt_share(llm.get('llm_share'))} ({llm.get('llm_share_on')}, {fmt_n(llm.get('llm_share_n'))})")


def fmt_value(x: Any) -> str:
    return "n/a" if x is None else f"{float(x):.3f}"


def fmt_share(x: Any) -> str:
    return "n/a" if x is None else f"{100.0 * float(x):.0f}%"


def jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, float) and not np.isfinite(x):
        return None
    return x



def _row(label: str, key: str, cp: dict | None, ch: dict, pct: bool = True) -> str:
    def fmt(x: Any) -> str:
        return "n/a" if x is None else f"{100 * x:.1f}%" if pct else f"{x:.4f}"
    a = fmt(cp.get(key)) if cp else "-"
    return f"| {label} | {a} | {fmt(ch.get(key))} |"


_WHO = (("champion", "champion"), ("head_only", "head-only"), ("tuned", "tuned"))


def challenger_lines(report: dict[str, Any]) -> list[str]:
    """The champion and both challengers on the gate set, one line each, then which
    challenger was put forward and why (empty without encoder tuning)."""
    c = report.get("challengers")
    if not c:
        return []
    out = []
    for key, who in _WHO:
        m = c.get(key)
        if not m:
            out.append(f"  {who:<10} none" + (" (encoder tuning failed)" if key == "tuned" else ""))
            continue
        enc = "own encoder " + str(m.get("encoder")) if m.get("own_encoder") else "served encoder"
        mark = "  <- put forward" if key == c.get("put_forward") else ""
        out.append(f"  {who:<10} {m['version']} ({enc}): {figures_line(m, c['gate_set'], m)}{mark}")
    out.append(f"  put forward: {str(c.get('put_forward')).replace('_', '-')}: {c.get('reason')}")
    for lang, v in (c.get("languages") or {}).get("by_language", {}).items():
        out.append(f"  language {lang}: accuracy head-only {fmt_value(v['head_only'])}, tuned {fmt_value(v['tuned'])} "
                   f"({fmt_n(v['n'])})")
    t = report.get("tuning") or {}
    if t:
        tuner = t.get("tuner") or {}
        line = (f"  encoder tuning: {t.get('rows', 0):,} rows ({t.get('rows_without_text', 0):,} without text, left "
                f"out), {len(t.get('hard_pairs') or [])} hard pairs")
        if "error" in t:
            line += f"; failed: {t['error']}"
        else:
            line += (f"; {tuner.get('steps')} steps in {tuner.get('seconds')}s"
                     + (" (stopped by its budget)" if t.get("stopped_by_budget") else "")
                     + f", export {tuner.get('export_seconds')}s, re-encoding {t.get('reencode_seconds')}s")
        out.append(line)
    return out


def _challenger_markdown(r: dict[str, Any]) -> list[str]:
    c = r.get("challengers")
    if not c:
        return []

    def cell(m: dict | None, key: str, pct: bool = True) -> str:
        if not m:
            return "-"
        x = m.get(key)
        if key in ("version", "encoder"):
            return f"`{x}`" if x else "-"
        return "n/a" if x is None else f"{100 * x:.1f}%" if pct else f"{x:,}"

    ms = [c.get(k) for k, _ in _WHO]
    rows = [("version", "version", False), ("encoder", "encoder", False), ("queries", "n", False),
            ("accuracy", "accuracy", True), ("in-scope accuracy", "in_scope_accuracy", True),
            ("out-of-scope recall", "oos_recall", True), ("LLM share (at the budget)", "llm_share", True)]
    lines = ["", f"## Champion and challengers (`{c['gate_set']}` set; LLM share on "
                 f"`{(c.get('head_only') or {}).get('llm_share_on')}`)", "",
             "| metric | champion | head-only challenger | tuned challenger |", "|---|---|---|---|"]
    lines += [f"| {label} | " + " | ".join(cell(m, key, pct) for m in ms) + " |" for label, key, pct in rows]
    lines += ["", f"- put forward: **{str(c.get('put_forward')).replace('_', '-')}** — {c.get('reason')}",
              f"- languages: {c['languages']['note']}"]
    by = c["languages"].get("by_language") or {}
    if by:
        lines += ["", "| language | queries | head-only accuracy | tuned accuracy |", "|---|---|---|---|"]
        lines += [f"| {k} | {v['n']:,} | {100 * v['head_only']:.1f}% | {100 * v['tuned']:.1f}% |"
                  for k, v in by.items()]
    t = r.get("tuning") or {}
    if t:
        tuner = t.get("tuner") or {}
        lines += ["", "## Encoder tuning", "",
                  f"- base: {t.get('base')}; objective {t['settings'].get('objective')}, budget "
                  f"{t['settings'].get('budget_s'):g} s",
                  f"- rows: {t.get('rows', 0):,} ({t.get('rows_without_text', 0):,} training rows without text "
                  f"left out: text retention erased them); {tuner.get('held_out_rows') or 0:,} rows of "
                  f"{tuner.get('held_out_intents') or 0:,} intents held out of the tuning to calibrate the head",
                  "- hard pairs (" + str(t.get("hard_pairs_from")) + "): "
                  + (", ".join(f"{p['pair'][0] or 'out of scope'} / {p['pair'][1] or 'out of scope'} "
                               f"({p['errors']})" for p in t.get("hard_pairs") or []) or "none"),
                  "- the teacher's candidate sets: "
                  + (", ".join(f"{p['pair'][0] or 'out of scope'} / {p['pair'][1] or 'out of scope'} "
                               f"({p['sets']})" for p in t.get("candidate_set_pairs") or []) or "none")]
        if "error" in t:
            lines.append(f"- failed: {t['error']}")
        else:
            lines.append(f"- {tuner.get('steps')} of {tuner.get('steps_planned')} steps, {tuner.get('epochs_done')} "
                         f"epoch(s) in {tuner.get('seconds')} s" + (" (stopped by its budget)" if t.get(
                             "stopped_by_budget") else "") + f"; loss {tuner.get('loss_first')} -> "
                         f"{tuner.get('loss_last')}; encoder `{t.get('encoder_id')}` "
                         f"({'int8' if tuner.get('quantized') else 'fp32'}, {tuner.get('encoder_bytes', 0):,} bytes)")
            lines.append(f"- export {tuner.get('export_seconds')} s (forecast {t.get('export_forecast_seconds')} s); "
                         f"re-encoding {t.get('reencoded_rows', 0):,} rows {t.get('reencode_seconds')} s (forecast "
                         f"{t.get('reencode_forecast_seconds')} s); both inside the budget: the tuner got "
                         f"{t.get('tuner_budget_s')} s, {t.get('budget_overrun_seconds', 0)} s over")
    return lines


def teacher_markdown(r: dict[str, Any]) -> list[str]:
    """The report's "Teacher labels" section: the noise estimate (overall and per teacher
    label), what the teacher filter dropped, or would drop when it is off, and what the
    noise guard did (``--max-teacher-noise``)."""
    from flywheel.training.teacher_noise import GUARD_REASON, format_noise

    if "teacher_noise" not in r:
        return []
    noise, by = r["teacher_noise"], r.get("teacher_noise_by_intent") or {}
    lines = ["", "## Teacher labels", "", "- " + format_noise(noise, by)]
    if by:
        lines += ["", "| teacher label | decisions with a human label | wrong | 95% CI |", "|---|---|---|---|"]
        lines += [f"| {k} | {v['n']:,} | {100 * v['estimate']:.1f}% | {100 * v['low']:.1f}-{100 * v['high']:.1f}% |"
                  for k, v in by.items()]
        lines.append("")
    f = r.get("teacher_filter")
    if f:
        g = f.get("guard")   # a report written before issue 33 has it as dataset.noisy_teacher
        if g:
            lines.append(f"- noisy teacher labels dropped: {g['dropped']:,} of {g['checked']:,} checked"
                         + (f" ({g['reason']})" if g.get("active") else f" (guard off: {g.get('inactive_because')})"))
        counts = {k: v for k, v in (f["dropped"] if f["enabled"] else f.get("would_drop", {})).items()
                  if k != GUARD_REASON}
        what = ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in counts.items())
        lines.append(f"- teacher filter {'on' if f['enabled'] else 'off (--teacher-filter turns it on)'}: "
                     f"{sum(counts.values()):,} of {f['checked']:,} teacher rows "
                     f"{'dropped' if f['enabled'] else 'would be dropped'} ({what}); held back: "
                     f"{f['held_back']['oos_cap']:,} out-of-scope rows kept for the gate, "
                     f"{f['held_back']['last_rows_of_label']:,} last rows of a label; runner-up from "
                     f"{f['runner_up_from']}")
        for p in f.get("pairs") or []:
            lines.append(f"- humans corrected the teacher's {p['teacher']} to {p['human']} on {p['n']:,} of "
                         f"{counted(p['of'], 'checked decision')}")
    g = r.get("teacher_guard")
    if g and g.get("line"):
        lines.append(f"- {g['line']}")
    return lines


def intent_change_lines(r: dict[str, Any], lead: str = "  ") -> list[str]:
    """What changed in the intent set since the champion, and the labels that cost (empty
    when it did not change)."""
    c = r.get("intent_change")
    if not c:
        return []
    by = ", ".join(f"{k} {v:,}" for k, v in (c.get("labels_dropped") or {}).items())
    return [f"{lead}intent set changed: added {', '.join(c['added']) or 'none'}; removed "
            f"{', '.join(c['removed']) or 'none'}; {c['labels_dropped_total']:,} logged labels of removed intents "
            f"dropped{f' ({by})' if by else ''}; gated on {c['gate_rows']:,} rows of the shared intents "
            f"({', '.join(c['shared']) or 'none'}, out of scope)"]


def render_markdown(result: RetrainResult) -> str:
    """The readable ``report.md``."""
    r = result.report
    ch = result.challenger or {}
    cp = result.champion
    lines = [f"# flywheel retrain: {result.outcome}" + (" (dry run)" if result.dry_run else ""), "",
             result.summary_line(), "",
             f"- run at: {r.get('created_at')}",
             f"- challenger: {result.version or '(not saved: dry run)'}"
             + ("" if result.dry_run else (" — promoted" if result.outcome == "promoted" else " — NOT promoted")),
             f"- champion: {r.get('champion_version') or 'none'}",
             f"- decision: {result.reason}",
             f"- gate: accuracy on the `{r['gate']['set']}` set ({r['gate']['n']:,} queries), "
             f"tolerance {r['gate']['tolerance']:g}"]
    t = r.get("encoder_tuning")
    if t:
        lines.append(f"- encoder tuning: {t['why']}" + (f"; {t['fallback']}: the head-only challenger alone"
                                                       if t.get("fallback") else ""))
    st = r.get("storage")
    if st:   # training.retrain._record_storage
        lines.append(f"- storage: {st['own_bytes']:,} bytes of its own + {st['blob_bytes']:,} bytes of shared encoder "
                     f"blobs; a replica serving the champion downloads {st['download_bytes']:,} bytes on a promotion")
    lines += [f"- note: {n}" for n in r.get("notes", [])]
    lines += intent_change_lines(r, "- ")
    lines += gate_language_markdown(r)
    for part in ("eval", "recent") + tuple(k for k in ("eval_traffic", "shared", "recent_shared") if k in ch):
        c = ch.get(part) or {}
        p = cp.get(part) if cp else None
        lines += ["", f"## {part} ({c.get('n', 0):,} queries, {c.get('n_out_of_scope', 0):,} out of scope)", "",
                  "| metric | champion | challenger |", "|---|---|---|",
                  _row("accuracy", "accuracy", p, c), _row("in-scope accuracy", "in_scope_accuracy", p, c),
                  _row("out-of-scope recall", "oos_recall", p, c), _row("macro F1", "macro_f1", p, c, False),
                  _row("ECE", "ece", p, c, False), _row("LLM share", "llm_share", p, c),
                  _row("accuracy when sure", "sure_accuracy", p, c)]
    lines += _challenger_markdown(r)
    ev = ch.get("eval") or {}
    if ev.get("per_intent"):
        pev = (cp or {}).get("eval") or {}
        lines += ["", "## Per intent (eval)", "", "| intent | support | precision | recall |", "|---|---|---|---|"]
        for k, v in ev["per_intent"].items():
            o = (pev.get("per_intent") or {}).get(k)
            pp = f"{o['precision']:.3f} -> " if o else ""
            rr = f"{o['recall']:.3f} -> " if o else ""
            lines.append(f"| {k} | {v['support']} | {pp}{v['precision']:.3f} | {rr}{v['recall']:.3f} |")
    d = r.get("dataset", {})
    if d:
        tr = d["train"]["by_source"]
        lines += ["", "## Training data", "",
                  f"- training rows: {d['train']['n']:,} ({tr['intent_example']:,} intent examples, "
                  f"{tr['teacher']:,} teacher, {tr['human']:,} human, {tr.get('layer2', 0):,} layer-2 self-training; "
                  f"{d['train']['n_out_of_scope']:,} out of scope)",
                  f"- log: {counted(d['log_rows'], 'labelled decision')} ({d['log_rows_human']:,} with a human label); "
                  f"{d['unique_texts']:,} unique texts, {d['duplicates_merged']:,} duplicates merged",
                  f"- invalid teacher answers ignored: {d['invalid_teacher_answers_ignored']:,} "
                  f"({d.get('teacher_unsure', 0):,} unsure: a candidate set or cannot tell, kept for review)",
                  "- conflicts: " + ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in d["conflicts"].items()),
                  f"- dropped, intent no longer defined: {d['dropped_unknown_intent']['total']:,}"
                  + (f" ({', '.join(f'{k} {v}' for k, v in d['dropped_unknown_intent']['by_label'].items())})"
                     if d['dropped_unknown_intent']['total'] else ""),
                  f"- evaluation: {d['eval']['n']:,} fixed eval rows, {d['recent']['n']:,} recent-traffic rows "
                  f"(split {d['split']['id']})"]
    lines += teacher_markdown(r)
    th = r.get("thresholds", {})
    if th:
        cut = th["tuning"]   # the cutoffs' re-tuning (the encoder's is the top-level "tuning")
        lines += ["", "## Thresholds", "",
                  f"- confident: {cut['cv_confident']:.4f} (cross-validation) -> {cut['confident']:.4f} "
                  f"({cut['method']}" + (f"; {cut['why']}" if cut.get("why") else "") + ")",
                  "- saved: " + ", ".join(f"{k}={v:.4f}" for k, v in th["saved"].items())]
        if cut.get("note"):
            lines.append(f"- note: {cut['note']}")
    tm = r.get("timing", {})
    if tm:
        lines += ["", "## Timing", "",
                  f"- total {tm['total_seconds']:.2f}s: data {tm['dataset_seconds']:.2f}s (embedding "
                  f"{tm['embed_seconds']:.2f}s; {tm['embeddings_reused']:,} vectors reused from the log, "
                  f"{tm['embeddings_computed']:,} computed), fit {tm['fit_seconds']:.2f}s, "
                  f"evaluation {tm['eval_seconds']:.2f}s"]
        if "tune_step_seconds" in tm:
            lines.append(f"- encoder tuning {tm['tune_step_seconds']}s (tuning {tm.get('tune_seconds')}s within its "
                         f"budget, export {tm.get('export_seconds')}s), re-encoding {tm.get('reencode_seconds')}s, "
                         f"tuned challenger's fit {tm.get('tuned_fit_seconds')}s")
        if "champion_reencode_seconds" in tm:
            lines.append(f"- re-encoding the evaluation sets with the champion's own encoder "
                         f"{tm['champion_reencode_seconds']}s")
    return "\n".join(lines)


def gate_language_markdown(r: dict[str, Any]) -> list[str]:
    """The gate's per-language accuracy (``gate.by_language``): each language's n, both
    models' accuracy, and whether it was gated (empty with one language or none)."""
    by = (r.get("gate") or {}).get("by_language") or {}
    if not by:
        return []
    lines = ["", f"## Gate by language (`{r['gate']['set']}` set)", "",
             "| language | queries | champion | challenger | worse | better | gated |", "|---|---|---|---|---|---|---|"]
    for lang, c in by.items():
        gated = ("ok" if c["ok"] else "**failed**") if c["gated"] else c.get("note", "not gated")
        lines.append(f"| {lang} | {c['n']:,} | {fmt_value(c['champion'])} | {fmt_value(c['challenger'])} | "
                     f"{c['worse']} | {c['better']} | {gated} |")
    return lines


def write_reports(path: Path, result: RetrainResult) -> None:
    """``report.json`` and ``report.md`` of ``result`` into the directory ``path``
    (``result.report_path`` then names the JSON one)."""
    result.report_path = path / "report.json"
    result.report_path.write_text(json.dumps(result.report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (path / "report.md").write_text(result.markdown + "\n", encoding="utf-8")


# ------------------------------------------------- the retrain's report, assembled
def model_metrics(m: IntentModel, sets: dict[str, LabelledSet], gate: str) -> dict[str, Any]:
    per = {k: evaluate_layer2(m, v) for k, v in sets.items()}
    recent = "recent_shared" if "recent_shared" in per else "recent"
    share_on = recent if per[recent]["n"] else gate
    return {"version": m.version, "encoder": m.manifest.encoder.get("id"), "own_encoder": m.encoder_dir is not None,
            "accuracy": per[gate]["accuracy"], "n": per[gate]["n"],
            "oos_recall": per[gate]["oos_recall"], "gate_set": gate,
            "llm_share": per[share_on]["llm_share"], "llm_share_on": share_on, "llm_share_n": per[share_on]["n"],
            "thresholds": Thresholds.for_model(m).to_dict(), **per}


def with_run_metrics(chosen: Challenger, ts: TrainingSet, ev: Evaluation) -> IntentModel:
    """The challenger put forward as saved: its manifest's metrics say which split and log it
    saw and how its cutoffs were re-tuned (and, for a tuned one, that its encoder was tuned
    and how long that took)."""
    model, step = chosen.model, chosen.step
    ch = ev.challenger
    metrics = {**model.manifest.metrics,
               "eval_split": SPLIT_ID, "log_until": ts.log_until,
               "eval_accuracy": ch["eval"]["accuracy"], "eval_n": ch["eval"]["n"],
               "recent_llm_share": ch["recent"]["llm_share"], "recent_n": ch["recent"]["n"],
               "confident_tuning": chosen.cutoffs["method"]}
    if step is not None:
        metrics.update(encoder_tuned=True, encoder_tune_seconds=step.report.get("step_seconds"),
                       encoder_export_seconds=(step.report.get("tuner") or {}).get("export_seconds"),
                       encoder_rows_without_text=step.report.get("rows_without_text"))
    return replace(model, manifest=replace(model.manifest, metrics=metrics))


def run_timing(trial: Trial, champion: Champion, model: IntentModel, t_eval: float) -> dict[str, Any]:
    emb = trial.ts.report["embeddings"]
    out = {"total_seconds": round(time.perf_counter() - trial.t_start, 3), "dataset_seconds": round(trial.t_data, 3),
           "embed_seconds": emb["seconds"], "embeddings_reused": emb["reused"],
           "embeddings_computed": emb["computed"], "fit_seconds": round(trial.head_only.t_fit, 3),
           "head_fit_seconds": model.manifest.metrics.get("fit_seconds"), "eval_seconds": round(t_eval, 3)}
    r = trial.tune_report
    if r is not None:   # the tuning budget bounds the step: tuning, export and re-encoding (forecast)
        tuner = r.get("tuner") or {}
        out.update(tune_step_seconds=r.get("step_seconds"), tune_seconds=tuner.get("seconds"),
                   export_seconds=tuner.get("export_seconds"), reencode_seconds=r.get("reencode_seconds"),
                   tuned_fit_seconds=round(trial.tuned.t_fit, 3) if trial.tuned is not None else None)
    if "seconds" in champion.encoded:
        out["champion_reencode_seconds"] = champion.encoded["seconds"]
    return out


_SIDE_KEYS = ("accuracy", "in_scope_accuracy", "oos_recall", "n", "n_in_scope", "n_out_of_scope")


def _side(m: dict[str, Any] | None, gate: str) -> dict[str, Any] | None:
    """One model's figures on the gate set, for the side-by-side table."""
    if m is None:
        return None
    g = m.get(gate) or {}
    return {"version": m["version"], "encoder": m.get("encoder"), "own_encoder": m.get("own_encoder"),
            **{k: g.get(k) for k in _SIDE_KEYS}, "llm_share": m.get("llm_share"),
            "llm_share_on": m.get("llm_share_on"), "llm_share_n": m.get("llm_share_n")}


def challengers_section(job: Job, ev: Evaluation) -> dict[str, Any]:
    """``report["challengers"]``: the champion and both challengers side by side on the
    gate set, which challenger was put forward and why, and what languages allowed."""
    c = ev.choice
    declared = list(job.intents.languages)
    if c.get("languages") == "per_row":
        lang_note = "per-language accuracy from the rows' languages"
    else:
        lang_note = (f"the evaluation rows carry no language (the traffic log records none): the challengers "
                     f"were compared on all rows (declared: {', '.join(declared) or 'none'})")
    return {"gate_set": ev.gate, "put_forward": c.get("put_forward"), "reason": c.get("reason"),
            "champion": _side(ev.champion, ev.gate), "head_only": _side(ev.head_only, ev.gate),
            "tuned": _side(ev.tuned, ev.gate), "paired_tuned_vs_head_only": c.get("paired"),
            "languages": {"declared": declared, "rows": c.get("languages"), "note": lang_note,
                          "by_language": c.get("by_language", {})}}


def run_report(job: Job, name: str, run_at: float, outcome: str, reason: str, checks: list[dict[str, Any]],
               champion: IntentModel | None, ev: Evaluation, ts: TrainingSet, timing: dict[str, Any],
               thresholds: dict[str, Any], trial: Trial) -> dict[str, Any]:
    """``report.json`` of the challenger ``name`` (its version is ``None`` in a dry run);
    with encoder tuning on, also ``challengers`` and ``tuning``."""
    dry_run = job.opts.dry_run
    extra = ({} if trial.tune_report is None
             else {"challengers": challengers_section(job, ev), "tuning": trial.tune_report})
    if ev.change is not None:
        extra["intent_change"] = ev.change.report(len(ev.sets["shared"]))
    return {
        "outcome": outcome, "version": None if dry_run else name, "reason": reason,
        "promoted": outcome == "promoted" and not dry_run, "dry_run": dry_run,
        "created_at": datetime.fromtimestamp(run_at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "champion_version": champion.version if champion else None,
        "notes": job.notes,
        "gate": {"set": ev.gate, "n": ev.challenger["n"], "tolerance": job.opts.tolerance, "checks": checks,
                 **gate_by_language(checks)},
        "challenger": ev.challenger, "champion": ev.champion,
        "thresholds": thresholds,
        "dataset": ts.report,
        "teacher_unsure": ts.report["teacher_unsure"],
        "timing": timing,
        "encoder_tuning": encoder_tuning(job, trial),
        **teacher_fields(job),
        **extra,
    }


def encoder_tuning(job: Job, trial: Trial) -> dict[str, Any]:
    """``report["encoder_tuning"]``: whether the run tuned the encoder, why it was on or off
    (``RetrainOptions.tune_why``: a flag, the intent file, or the default), and what came of
    it: ``tuned``, ``off``, or ``head_only`` with the reason (budget spent, no torch, a
    failed tuning)."""
    on = job.opts.tune is not None
    r = trial.tune_report or {}
    if not on:
        result, fallback = "off", None
    elif r.get("error"):
        result, fallback = "head_only", str(r["error"])
    else:
        result, fallback = "tuned", None
    return {"on": on, "why": job.opts.tune_why or ("on" if on else "off"), "result": result,
            "fallback": fallback}


def gate_by_language(checks: list[dict[str, Any]]) -> dict[str, Any]:
    """``gate.by_language``: the gate's per-language checks (rule 6 of :mod:`training.gate`)
    by language, each with its n; nothing when the gate had none (one language or none)."""
    by = {c["language"]: {k: v for k, v in c.items() if k not in ("language", "metric")}
          for c in checks if "language" in c}
    return {"by_language": by} if by else {}


def teacher_fields(job: Job) -> dict[str, Any]:
    """The report's ``teacher_noise``, ``teacher_noise_by_intent``, ``teacher_filtered``,
    ``teacher_filter`` and ``teacher_guard`` (the last three only once step 4a ran; the
    guard's: :func:`training.teacher_noise.guard_teacher_rows`)."""
    return {k: job.teacher[k] for k in ("teacher_noise", "teacher_noise_by_intent", "teacher_filtered",
                                        "teacher_filter", "teacher_guard") if k in job.teacher}
