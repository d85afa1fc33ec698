"""The retrain job's promotion gate: layer-2 metrics of a model on a labelled set, and
the decision to promote a challenger or keep the champion.

The champion is what serves now: the promoted version, else the served default model
(see :mod:`training.retrain`). Both models score the same gate-set queries with their
serving thresholds, so the comparison is paired. With ``tolerance`` (``--tolerance``,
0.01 by default) the challenger is kept out, and the reason says why, when:

1. its **accuracy** is lower than the champion's by more than ``tolerance``;
2. its accuracy is lower at all and the evaluation set is too small to rule out a drop
   larger than ``tolerance``. Of the ``d`` queries on which the two disagree, ``w`` the
   champion gets right ("worse") and ``d - w`` the challenger ("better"); the drop is
   ``(2 w - d) / n``. Its upper bound takes the exact one-sided 95% (Clopper-Pearson)
   upper bound of ``w / d`` (:func:`scipy.stats.binomtest`: the inverted exact
   sign/McNemar test) in place of ``w / d``. An upper bound above ``tolerance`` means
   the set cannot tell a harmless dip from a real loss (300 queries, 4 worse and 2
   better: 0.007 observed, up to 0.018 possible: kept). With 45 queries one net loss is
   already 0.022, so rule 1 keeps the champion; the old noise margin (1.96 paired
   standard errors: 0.073 for 3 losses in 45) promoted 1.000 -> 0.933;
3. the same two checks fail for **out-of-scope recall** (on the gate set's out-of-scope
   queries), when there are at least :data:`MIN_OOS_FOR_GATE` of them;
4. its **LLM share** (the share of queries layer 2 is not sure of, at each model's own
   serving cutoff, i.e. at the budget when one is set; on the same recent queries) is
   higher than the champion's by more than ``tolerance``, **unless its accuracy gain is
   significant**: the exact one-sided 95% bound of rule 2, taken the other way, rules out
   that it is no better (``drop_upper < 0``: of the ``d`` discordant queries, so many more
   go its way that a coin could not have done it). Asking the teacher more often is then
   what a measurably better model costs: a champion that defers less because it is
   overconfident (BENCHMARKS.md §14.2: 3% LLM share at 86% accuracy, against challengers
   that were right more often and asked more) must not keep every better model out.

5. a **tie goes to the smaller model**: a challenger that carries its own encoder (a tuned
   one) while the champion does not is kept out when the gate rows show no difference (0
   worse, 0 better) and its LLM share is not lower by more than ``tolerance``: it would add
   its encoder for no measured gain. Between models of one size (both or neither carry an
   encoder), or with a smaller challenger, a tie promotes as before.

6. **per language**: where the gate rows carry two logged languages or more, rules 1 and 2
   (the same paired accuracy check) on each language's rows with at least
   :data:`MIN_GATE_ROWS` of them: a challenger better overall but worse in one language
   beyond the tolerance (or worse there on too few rows to bound the drop) is kept, and
   the reason names the language. A language with fewer rows is listed, not gated (a note
   says so). Rows without a language (intent-file examples, decisions logged before the
   language column) count only overall; with one language or none the gate is as above.

7. **cannot tell**: with fewer than :data:`MIN_GATE_ROWS` gate rows (a small deployment's
   first weeks), a challenger that passed 1-6 is kept unless its accuracy gain is
   significant (:func:`significant_gain`): the gate cannot tell a tie from a loss on so few
   rows, and four promotions on ties once took a shop's layer 2 from 1.000 to 0.762
   (issue 41). ``promote_untested`` (``retrain --promote-untested``) promotes it all the
   same, with a note. A changed intent set keeps its own rule, below.

A **changed intent set** (:func:`decide_changed`) is gated the other way round, on the rows
of the intents both sets share: the champion cannot serve the new intent file, so the
challenger is kept out only when it is *measurably* worse there: when, for accuracy (for
out-of-scope recall with at least :data:`MIN_OOS_FOR_GATE` out-of-scope rows; for the LLM
share unless the accuracy gain is significant), the exact one-sided 95% *lower* bound of
the paired drop (:func:`drop_lower`) is above ``tolerance``. Few rows, a tie or no shared
rows promote it; ``--tolerance 1`` always does.

A champion or challenger that carries its own encoder scores the same gate rows encoded
by that encoder (``champion_data``: same rows, same order), so the comparison stays paired.

A challenger that is not worse on the point estimate always passes 1 and 2: the gate
never refuses an improvement for lack of evidence. Without a usable champion (nothing
serves, or it was trained with another encoder) the challenger is the first model and is
promoted. Everything here is deterministic (no resampling).

With encoder tuning on, two challengers are fitted (a head on the served encoder's vectors,
and a head on a tuned encoder's), and :func:`pick_challenger` puts one forward to the gate
above: the tuned one only when, on the same gate rows, its accuracy is at least the
head-only one's, its LLM share is not higher by more than ``tolerance`` (unless, as in rule
4, its accuracy gain is significant), and, where the
rows carry a language, its accuracy is at least the head-only one's for every declared
language (without per-row languages it is judged on all rows, and the choice says so); a
tie with the head-only one (rule 5) goes to the head-only one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from flywheel.classifier.versions.model import IntentModel
from flywheel.training.layer2 import layer2_predict
from flywheel.training.metrics import classification_metrics
from flywheel.training.rows import LabelledSet

__all__ = ["MIN_GATE_ROWS", "MIN_OOS_FOR_GATE", "CONFIDENCE", "evaluate_layer2", "paired_drop", "significant_gain",
           "decide", "decide_changed", "drop_lower", "pick_challenger", "encoder_bytes"]

MIN_GATE_ROWS = 20          # rows a figure needs before the gate leans on it (a summary flags fewer)
MIN_OOS_FOR_GATE = 20       # out-of-scope eval queries needed to gate on out-of-scope recall
CONFIDENCE = 0.95           # one-sided confidence of the drop's upper bound
_EPS = 1e-12
def evaluate_layer2(model: IntentModel, data: LabelledSet) -> dict[str, Any]:
    """Layer-2 metrics of ``model`` on ``data`` with its serving thresholds.

    ``accuracy`` counts out of scope as a class; ``llm_share`` is the share of queries
    layer 2 is not ``sure`` of (they would go to the teacher); ``sure_accuracy`` is the
    accuracy on the rest; ``ece`` is over in-scope queries (top calibrated probability
    vs. top label right).
    """
    n = len(data)
    if n == 0:
        return {"n": 0, "n_in_scope": 0, "n_out_of_scope": 0, "accuracy": None, "in_scope_accuracy": None,
                "oos_recall": None, "macro_f1": None, "ece": None, "llm_share": None, "sure_accuracy": None,
                "per_intent": {}, "confused_pairs": []}
    from flywheel.classifier.layer2.calibration import (
        expected_calibration_error,  # scipy: when a gate runs, not with the CLI
    )

    b = layer2_predict(model, data.vectors)
    m = classification_metrics(data.labels, b.labels)
    truth = np.array([v is not None for v in data.labels])
    top = np.array(b.classes, dtype=object)[b.probs.argmax(axis=1)]
    correct = np.array([t == y for t, y in zip(top, data.labels)])
    ece = expected_calibration_error(b.probs.max(axis=1)[truth], correct[truth]) if truth.any() else None
    right = np.array([p == y for p, y in zip(b.labels, data.labels)])
    return {
        "n": n, "n_in_scope": m["n_in_scope"], "n_out_of_scope": m["n_out_of_scope"],
        "accuracy": m["accuracy"], "in_scope_accuracy": m["in_scope_accuracy"],
        "oos_recall": m["oos_recall"], "macro_f1": m["macro_f1"], "ece": ece,
        "llm_share": round(float(1.0 - b.sure.mean()), 6),
        "sure_accuracy": round(float(right[b.sure].mean()), 6) if b.sure.any() else None,
        "per_intent": {k: {"precision": v["precision"], "recall": v["recall"], "support": v["support"]}
                       for k, v in m["per_intent"].items()},
        "confused_pairs": m["confused_pairs"][:5],
    }


def paired_drop(right_challenger: np.ndarray, right_champion: np.ndarray,
                confidence: float = CONFIDENCE) -> dict[str, Any]:
    """How much worse the challenger is on the same queries (``right_*``: per query,
    whether each model got it right): ``worse`` (champion right, challenger wrong),
    ``better`` (the reverse), the observed ``drop`` (``(worse - better) / n``; negative
    when the challenger is better) and ``drop_upper``, the largest drop consistent with
    the data at ``confidence`` (one-sided, exact; see the module docs)."""
    from scipy.stats import binomtest

    r_ch = np.asarray(right_challenger, dtype=bool)
    r_cp = np.asarray(right_champion, dtype=bool)
    n = int(r_ch.size)
    worse, better = int((r_cp & ~r_ch).sum()), int((~r_cp & r_ch).sum())
    d = worse + better
    if n == 0:
        return {"n": 0, "worse": 0, "better": 0, "drop": 0.0, "drop_upper": 0.0}
    drop = (worse - better) / n
    upper = drop
    if d:
        p_hi = binomtest(worse, d, 0.5, alternative="less").proportion_ci(confidence_level=confidence).high
        upper = max(drop, (2.0 * float(p_hi) - 1.0) * d / n)
    return {"n": n, "worse": worse, "better": better, "drop": round(drop, 6), "drop_upper": round(upper, 6)}


def significant_gain(pair: dict[str, Any]) -> bool:
    """Whether a :func:`paired_drop` shows the challenger more accurate at the one-sided
    :data:`CONFIDENCE` (its drop's upper bound is below zero)."""
    return pair["n"] > 0 and pair["drop_upper"] < -_EPS


def _f(x: Any) -> str:
    return "n/a" if x is None else f"{float(x):.3f}"


def _pct(x: Any) -> str:
    return "n/a" if x is None else f"{100.0 * float(x):.1f}%"


def _paired_check(metric: str, a: Any, b: Any, pair: dict[str, Any], tolerance: float,
                  where: str) -> tuple[dict[str, Any], str | None]:
    """One paired metric's check and, when it fails, the reason."""
    check = {"metric": metric, "challenger": a, "champion": b, **pair, "tolerance": tolerance}
    n, drop, upper = pair["n"], pair["drop"], pair["drop_upper"]
    counts = f"{pair['worse']} worse, {pair['better']} better"
    why = None
    if drop > tolerance + _EPS:
        why = (f"{metric} {_f(a)} < champion {_f(b)} - tolerance {tolerance:g} (n={n:,} {where}: {counts}); "
               f"keeping the champion")
    elif drop > _EPS and upper > tolerance + _EPS:
        why = (f"evaluation set too small (n={n:,} {where}) to rule out a drop in {metric} larger than "
               f"{tolerance:g} ({metric} {_f(a)} vs champion {_f(b)}: {counts}; the drop may be up to "
               f"{upper:.3f}); keeping the champion")
    check["ok"] = why is None
    return check, why


def _language_checks(r_ch: np.ndarray, r_cp: np.ndarray, langs: list[str | None] | None,
                     declared: tuple[str, ...] | list[str], gate_name: str, tolerance: float,
                     notes: list[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """Rule 6: the paired accuracy check of rules 1 and 2 (:func:`_paired_check` on
    :func:`paired_drop`) on each language's gate rows, for a language with at least
    :data:`MIN_GATE_ROWS` of them (fewer: listed, not gated, and a note says so). Only when
    the rows carry two languages or more (one language, or none: ``[]``, as before); rows
    without one count only overall. ``(checks, reasons)``: each check has ``language``."""
    present = sorted({v for v in langs or () if v})
    if len(present) < 2:
        return [], []
    assert langs is not None
    row_langs = np.array([v or "" for v in langs], dtype=object)
    checks: list[dict[str, Any]] = []
    failed: list[str] = []
    for lang in [x for x in declared if x in present] + [x for x in present if x not in declared]:
        mask = row_langs == lang
        n = int(mask.sum())
        a, b = _accuracy(r_ch[mask]), _accuracy(r_cp[mask])
        if n < MIN_GATE_ROWS:
            pair = paired_drop(r_ch[mask], r_cp[mask])
            checks.append({"metric": "accuracy", "language": lang, "challenger": a, "champion": b, **pair,
                           "tolerance": tolerance, "gated": False, "ok": True,
                           "note": f"not gated (n < {MIN_GATE_ROWS})"})
            notes.append(f"accuracy in language {lang} not gated: {n} {gate_name} queries (< {MIN_GATE_ROWS}); "
                         f"challenger {_f(a)} vs champion {_f(b)}")
            continue
        check, why = _paired_check(f"accuracy in language {lang}", a, b, paired_drop(r_ch[mask], r_cp[mask]),
                                   tolerance, f"{lang} {gate_name} queries")
        checks.append({**check, "metric": "accuracy", "language": lang, "gated": True})
        if why:
            failed.append(why)
    return checks, failed


def decide(challenger: IntentModel, champion: IntentModel | None, ch: dict[str, Any], cp: dict[str, Any] | None,
           data: LabelledSet | None, gate_name: str, tolerance: float,
           notes: list[str], champion_data: LabelledSet | None = None,
           langs: list[str | None] | None = None,
           declared: tuple[str, ...] | list[str] = (),
           promote_untested: bool = False) -> tuple[str, str, list[dict[str, Any]]]:
    """``(outcome, reason, checks)`` for the challenger's and champion's metrics ``ch`` and
    ``cp`` (per set, from :func:`evaluate_layer2`, with ``llm_share`` and ``llm_share_on``)
    on the gate set ``data`` named ``gate_name`` (the rule: see the module docs). Appends
    to ``notes`` what was not gated. ``reason`` is one line. ``champion_data``: the same
    rows with the champion's vectors when its encoder is not the challenger's (default
    ``data``). ``langs``: one logged language per gate row (``None`` where a row has none,
    or as a whole) for rule 6, in the order of ``declared`` (the intent set's languages);
    its checks come last in ``checks``, each with ``language``. ``promote_untested``: rule 7
    promotes what it cannot measure, with a note."""
    checks: list[dict[str, Any]] = []
    if cp is None or champion is None or data is None:
        return "promoted", "no usable champion: first model", checks
    if ch["n"] == 0:
        return "kept", "no evaluation data to compare the challenger with the champion", checks
    n_oos = ch[gate_name]["n_out_of_scope"]
    if n_oos < MIN_OOS_FOR_GATE:
        notes.append(f"out-of-scope recall not gated: {n_oos} out-of-scope eval queries (< {MIN_OOS_FOR_GATE})")
    truth = list(data.labels)
    r_ch = np.array([p == y for p, y in zip(layer2_predict(challenger, data.vectors).labels, truth)], dtype=bool)
    cp_data = data if champion_data is None else champion_data
    if list(cp_data.labels) != truth:
        raise ValueError("champion_data must be the gate rows, in the same order")
    r_cp = np.array([p == y for p, y in zip(layer2_predict(champion, cp_data.vectors).labels, truth)], dtype=bool)
    if langs is not None and len(langs) != len(truth):
        raise ValueError("langs must give one language (or None) per gate row")
    oos = np.array([y is None for y in truth], dtype=bool)
    failed: list[str] = []
    paired = [("accuracy", np.ones_like(oos), f"{gate_name} queries")]
    if n_oos >= MIN_OOS_FOR_GATE:
        paired.append(("oos_recall", oos, f"out-of-scope {gate_name} queries"))
    for metric, mask, where in paired:
        check, why = _paired_check(metric, ch[gate_name][metric], cp[gate_name][metric],
                                   paired_drop(r_ch[mask], r_cp[mask]), tolerance, where)
        checks.append(check)
        if why:
            failed.append(why)
    s_ch, s_cp, on = ch.get("llm_share"), cp.get("llm_share"), ch.get("llm_share_on", gate_name)
    n_share = (ch.get(on) or {}).get("n", 0)
    if s_ch is not None and s_cp is not None:
        acc = next(c for c in checks if c["metric"] == "accuracy")   # the paired accuracy check above
        gain = significant_gain(acc)
        rose = s_ch > s_cp + tolerance + _EPS
        checks.append({"metric": "llm_share", "challenger": s_ch, "champion": s_cp, "n": n_share, "set": on,
                       "rise": round(s_ch - s_cp, 6), "tolerance": tolerance, "ok": not rose or gain,
                       "traded_for_accuracy": rose and gain})
        if rose and not gain:
            failed.append(f"LLM share {_pct(s_ch)} > champion {_pct(s_cp)} + tolerance {tolerance:g} "
                          f"(n={n_share:,} {on} queries) without a significant accuracy gain "
                          f"({acc['better']} better, {acc['worse']} worse); keeping the champion")
    by_lang, lang_failed = _language_checks(r_ch, r_cp, langs, declared, gate_name, tolerance, notes)
    checks += by_lang
    failed += lang_failed
    if failed:
        return "kept", failed[0], checks
    tie = _tie_to_the_smaller(challenger, champion, checks, tolerance)
    if tie is not None:
        return "kept", tie, checks
    untested = _cannot_tell(ch["n"], gate_name, checks)
    if untested is not None:
        if not promote_untested:
            return "kept", untested + "; keeping the champion (retrain --promote-untested promotes it anyway)", checks
        notes.append(untested + "; promoted because of --promote-untested")
    parts = [f"{c['metric']} {_f(c['challenger'])} vs {_f(c['champion'])} ({c['worse']} worse, {c['better']} "
             f"better of {c['n']:,})" for c in checks if "worse" in c and "language" not in c]
    parts += [f"LLM share {_pct(c['challenger'])} vs {_pct(c['champion'])} (n={c['n']:,} {c['set']} queries"
              + ("; a rise traded for a significant accuracy gain)" if c["traded_for_accuracy"] else ")")
              for c in checks if c["metric"] == "llm_share"]
    return "promoted", (f"not worse than the champion beyond tolerance {tolerance:g} on {ch['n']:,} {gate_name} "
                        f"queries: " + "; ".join(parts)), checks


def _cannot_tell(n: int, gate_name: str, checks: list[dict[str, Any]]) -> str | None:
    """Rule 7: why the gate cannot tell, or ``None``: fewer than :data:`MIN_GATE_ROWS` gate
    rows and no significant accuracy gain on them."""
    if n >= MIN_GATE_ROWS:
        return None
    acc = next(c for c in checks if c["metric"] == "accuracy")
    if significant_gain(acc):
        return None
    return (f"cannot tell: only {n:,} held-out {gate_name} queries (the gate needs {MIN_GATE_ROWS}) and the "
            f"challenger is not measurably better on them ({acc['better']} better, {acc['worse']} worse)")


def drop_lower(pair: dict[str, Any], confidence: float = CONFIDENCE) -> float:
    """The smallest drop a :func:`paired_drop` is consistent with at ``confidence`` (one-sided,
    exact): above 0 when the challenger is worse beyond chance."""
    from scipy.stats import binomtest

    worse, better, n = pair["worse"], pair["better"], pair["n"]
    d = worse + better
    if n == 0 or d == 0:
        return 0.0
    p_lo = binomtest(worse, d, 0.5, alternative="greater").proportion_ci(confidence_level=confidence).low
    return round(min(pair["drop"], (2.0 * float(p_lo) - 1.0) * d / n), 6)


def _right(model: IntentModel, data: LabelledSet) -> np.ndarray:
    return np.array([p == y for p, y in zip(layer2_predict(model, data.vectors).labels, data.labels)], dtype=bool)


def decide_changed(challenger: IntentModel, champion: IntentModel, data: LabelledSet, champion_data: LabelledSet,
                   share_data: LabelledSet, champion_share_data: LabelledSet, tolerance: float, notes: list[str],
                   change: str) -> tuple[str, str, list[dict[str, Any]]]:
    """``(outcome, reason, checks)`` for a challenger trained on a **changed intent set**
    (``change`` says how, in words), on the rows of the intents both sets share (``data``,
    and ``champion_data``: the same rows with the champion's vectors; ``share_data`` and
    ``champion_share_data``: the recent ones for the LLM share). The champion cannot serve
    the new intent file, so the rule is turned round: the challenger is kept out only when
    it is **measurably worse** on the shared rows, i.e. when, for accuracy (out-of-scope
    recall with at least :data:`MIN_OOS_FOR_GATE` out-of-scope rows; the LLM share, unless
    the accuracy gain is significant), the exact one-sided 95% *lower* bound of the paired
    drop (:func:`drop_lower`) is above ``tolerance``. A tie, too few rows, or no shared
    rows at all promote it."""
    checks: list[dict[str, Any]] = []
    n = len(data)
    if n == 0:
        return "promoted", (f"intent set changed ({change}); no evaluation rows of the intents both sets share: "
                            f"nothing to compare on, promoted"), checks
    if list(champion_data.labels) != list(data.labels) or list(champion_share_data.labels) != list(share_data.labels):
        raise ValueError("the champion's rows must be the challenger's, in the same order")
    r_ch, r_cp = _right(challenger, data), _right(champion, champion_data)
    oos = np.array([y is None for y in data.labels], dtype=bool)
    paired = [("accuracy", np.ones_like(oos))]
    if int(oos.sum()) >= MIN_OOS_FOR_GATE:
        paired.append(("oos_recall", oos))
    else:
        notes.append(f"out-of-scope recall not gated: {int(oos.sum())} out-of-scope shared queries "
                     f"(< {MIN_OOS_FOR_GATE})")
    failed: list[str] = []
    for metric, mask in paired:
        pair = paired_drop(r_ch[mask], r_cp[mask])
        low = drop_lower(pair)
        a, b = _accuracy(r_ch[mask]), _accuracy(r_cp[mask])
        checks.append({"metric": metric, "challenger": a, "champion": b, **pair, "drop_lower": low,
                       "tolerance": tolerance, "ok": low <= tolerance + _EPS})
        if low > tolerance + _EPS:
            failed.append(f"{metric} {_f(a)} < champion {_f(b)} on {pair['n']:,} shared queries ({pair['worse']} "
                          f"worse, {pair['better']} better): a drop of at least {low:.3f}")
    gain = significant_gain(checks[0])
    sure_ch = layer2_predict(challenger, share_data.vectors).sure
    sure_cp = layer2_predict(champion, champion_share_data.vectors).sure
    share = paired_drop(np.asarray(sure_ch, bool), np.asarray(sure_cp, bool))   # "worse": deferred, the champion sure
    low = drop_lower(share)
    s_ch = None if not len(share_data) else round(float(1.0 - np.mean(sure_ch)), 6)
    s_cp = None if not len(share_data) else round(float(1.0 - np.mean(sure_cp)), 6)
    rose = low > tolerance + _EPS
    checks.append({"metric": "llm_share", "challenger": s_ch, "champion": s_cp, "n": share["n"],
                   "rise": share["drop"], "rise_lower": low, "tolerance": tolerance, "ok": not rose or gain,
                   "traded_for_accuracy": rose and gain})
    if rose and not gain:
        failed.append(f"LLM share {_pct(s_ch)} > champion {_pct(s_cp)} on {share['n']:,} shared queries: a rise of "
                      f"at least {low:.3f}")
    if failed:
        return "kept", (f"intent set changed ({change}); measurably worse on the intents both sets share: "
                        f"{failed[0]} (95%, tolerance {tolerance:g}); keeping the champion (retrain --tolerance 1 "
                        f"promotes it anyway)"), checks
    acc = checks[0]
    return "promoted", (f"intent set changed ({change}); not measurably worse on the {n:,} queries of the intents "
                        f"both sets share: accuracy {_f(acc['challenger'])} vs {_f(acc['champion'])} "
                        f"({acc['worse']} worse, {acc['better']} better), LLM share {_pct(s_ch)} vs {_pct(s_cp)} "
                        f"(n={share['n']:,})"), checks


def encoder_bytes(model: IntentModel) -> int:
    """The bytes of the encoder ``model`` carries (0: it uses the served encoder)."""
    d = model.encoder_dir
    if d is None:
        return 0
    return sum(p.stat().st_size for p in Path(d).rglob("*") if p.is_file())


def _is_tie(pair: dict[str, Any], s_bigger: Any, s_smaller: Any, tolerance: float) -> bool:
    """A tie: no query either way (0 worse, 0 better) and an LLM share not lower than the
    smaller model's by more than ``tolerance`` (a lower one is a measured gain)."""
    if pair["worse"] or pair["better"]:
        return False
    return s_bigger is None or s_smaller is None or s_bigger >= s_smaller - tolerance - _EPS


def _tie_to_the_smaller(challenger: IntentModel, champion: IntentModel, checks: list[dict[str, Any]],
                        tolerance: float) -> str | None:
    """Why a tie keeps the champion: the challenger carries its own encoder and the champion
    does not (a tie between two models of one size, or a smaller challenger: ``None``)."""
    if challenger.encoder_dir is None or champion.encoder_dir is not None:
        return None
    acc = next(c for c in checks if c["metric"] == "accuracy")
    share = next((c for c in checks if c["metric"] == "llm_share"), {})
    if not _is_tie(acc, share.get("challenger"), share.get("champion"), tolerance):
        return None
    size = encoder_bytes(challenger) / 1e6
    return (f"a tie (0 worse, 0 better of {acc['n']:,} queries; LLM share {_pct(share.get('challenger'))} vs "
            f"{_pct(share.get('champion'))}) goes to the smaller model: the challenger's own encoder "
            f"({size:.1f} MB) would be added for no measured gain; keeping the champion")


def _accuracy(right: np.ndarray) -> float | None:
    return round(float(right.mean()), 6) if right.size else None


def pick_challenger(head_only: IntentModel, tuned: IntentModel | None, ch_head: dict[str, Any],
                    ch_tuned: dict[str, Any] | None, data: LabelledSet, tuned_data: LabelledSet | None,
                    tolerance: float, declared: tuple[str, ...] | list[str] = (),
                    langs: list[str | None] | None = None) -> dict[str, Any]:
    """Which challenger to put forward to :func:`decide` (the rule: see the module docs).

    ``data`` and ``tuned_data`` are the same gate rows with each challenger's vectors;
    ``ch_head`` and ``ch_tuned`` their metrics (:func:`evaluate_layer2` per set, with
    ``llm_share``); ``declared`` the intent set's languages; ``langs`` one language per
    gate row (``None`` where a row has none; ``None`` as a whole: rows carry no language).

    Returns ``{"put_forward": "tuned" | "head_only", "reason": one line, "paired": the
    tuned-vs-head-only :func:`paired_drop` (or ``None``), "by_language": {lang: {n,
    head_only, tuned}}, "languages": "per_row" | "none"}``.
    """
    out: dict[str, Any] = {"put_forward": "head_only", "paired": None, "by_language": {},
                           "languages": "none" if not langs or all(v is None for v in langs) else "per_row"}
    if tuned is None or ch_tuned is None or tuned_data is None:
        out["reason"] = "no tuned challenger"
        return out
    truth = list(data.labels)
    if list(tuned_data.labels) != truth:
        raise ValueError("tuned_data must be the gate rows, in the same order")
    r_head = np.array([p == y for p, y in zip(layer2_predict(head_only, data.vectors).labels, truth)], dtype=bool)
    r_tuned = np.array([p == y for p, y in zip(layer2_predict(tuned, tuned_data.vectors).labels, truth)], dtype=bool)
    pair = paired_drop(r_tuned, r_head)
    out["paired"] = pair
    a_head, a_tuned = _accuracy(r_head), _accuracy(r_tuned)
    n = len(truth)
    counts = f"{pair['worse']} worse, {pair['better']} better of {n:,} gate queries"
    if n == 0:
        out["reason"] = "no gate rows to compare the tuned challenger with the head-only one"
        return out
    if pair["drop"] > _EPS:
        out["reason"] = f"tuned accuracy {_f(a_tuned)} < head-only {_f(a_head)} ({counts})"
        return out
    s_head, s_tuned = ch_head.get("llm_share"), ch_tuned.get("llm_share")
    if tuned.encoder_dir is not None and head_only.encoder_dir is None and _is_tie(pair, s_tuned, s_head, tolerance):
        out["reason"] = (f"a tie ({counts}; LLM share {_pct(s_tuned)} vs {_pct(s_head)}) goes to the smaller "
                         f"model: the head-only one")
        return out
    if s_head is not None and s_tuned is not None and s_tuned > s_head + tolerance + _EPS \
            and not significant_gain(pair):
        out["reason"] = (f"tuned LLM share {_pct(s_tuned)} > head-only {_pct(s_head)} + tolerance {tolerance:g} "
                         f"(accuracy {_f(a_tuned)} vs {_f(a_head)})")
        return out
    worse_langs = []
    if out["languages"] == "per_row":
        assert langs is not None
        row_langs = np.array([v or "" for v in langs], dtype=object)
        check = list(declared) or sorted({v for v in langs if v})
        for lang in check:
            mask = row_langs == lang
            if not mask.any():
                continue
            lh, lt = _accuracy(r_head[mask]), _accuracy(r_tuned[mask])
            out["by_language"][lang] = {"n": int(mask.sum()), "head_only": lh, "tuned": lt}
            assert lh is not None and lt is not None, "the mask has rows"
            if lt < lh - _EPS:
                worse_langs.append(f"{lang} {_f(lt)} < {_f(lh)} (n={int(mask.sum()):,})")
    if worse_langs:
        out["reason"] = (f"tuned accuracy {_f(a_tuned)} >= head-only {_f(a_head)} overall, but worse for "
                         f"{', '.join(worse_langs)}")
        return out
    out["put_forward"] = "tuned"
    where = ("not worse for any declared language" if out["languages"] == "per_row"
             else "rows carry no language: judged on all rows")
    out["reason"] = f"tuned accuracy {_f(a_tuned)} >= head-only {_f(a_head)} ({counts}); {where}"
    return out
