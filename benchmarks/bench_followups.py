"""Follow-ups at layer 2 (issue 43): the detector's precision and recall, and the two ways
(``resolve``: score the query with the last in-scope turn's snippet; ``defer``: send it to the
teacher with the history) against today's (``off``), teacher off and with a teacher that
reads the history.

Data: ``benchmarks/data/followups/`` (two domains: the starter set and a made-up support set
without a conversational intent; sessions in English, Spanish and German; every turn has a
gold label, ``null`` for out of scope, a ``kind`` and a ``split``). Each domain's model is
``fit_model`` on its intent file (the multilingual default, USE), as ``flywheel train`` fits it.
Every session is classified turn by turn through ``Classifier.classify(text, session_id=...)``,
so the history is the one the pipeline keeps (the labels it decided, 60-character snippets).

The teacher (``--teacher oracle``) is a history-reading oracle: it answers the gold label of the
turn whose previous turn's snippet and text it is asked about (the request's history and text),
out of scope when that label is not offered. It stands for an LLM that resolves references
perfectly: the upper bound of what deferring can get; the LLM share and calls are what it costs.

    python benchmarks/bench_followups.py --split test [--json-out .bench/followups.json]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flywheel.classifier.decision import Decision, Layer, Tier
from flywheel.classifier.encoders import make_embedder
from flywheel.classifier.followup import FollowupDetector
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.pipeline import Classifier
from flywheel.classifier.protocols import HistoryEntry, TeacherAnswer, TeacherRequest
from flywheel.classifier.settings.intents import load_intents

ROOT = Path(__file__).resolve().parents[1]

DATA = ROOT / "benchmarks/data/followups"
DOMAINS = {"support": DATA / "support_intents.yaml", "starter": ROOT / "classifier/data/starter_intents.yaml"}
MODES = ("off", "resolve", "defer")
KINDS = ("self_contained", "referential", "content_change", "out_of_scope")


def load_sessions(domain: str) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (DATA / f"{domain}_sessions.jsonl").open(encoding="utf-8")]
    return sorted(rows, key=lambda r: (r["session"], r["turn"]))


class HistoryOracle:
    """A teacher that reads the history: the gold label of (previous turn's snippet, text)."""

    model = "oracle"

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.gold: dict[tuple[str, str], str | None] = {}
        prev: dict[str, str] = {}
        for r in rows:
            self.gold[(prev.get(r["session"], ""), r["text"])] = r["label"]
            prev[r["session"]] = HistoryEntry.of(None, r["text"]).snippet
        self.calls = 0

    def label(self, request: TeacherRequest) -> TeacherAnswer:
        self.calls += 1
        last = request.history[-1].snippet if request.history else ""
        label = self.gold.get((last, request.text))
        offered = {o.name for o in request.options}
        return TeacherAnswer(label=label if label in offered else None, model=self.model, latency_ms=0.0)


@dataclass
class Turn:
    row: dict[str, Any]
    d: Decision

    @property
    def right(self) -> bool:
        return self.d.label == self.row["label"]

    @property
    def served_oos(self) -> bool:
        return self.d.label is None

    @property
    def sure_oos(self) -> bool:   # layer 2 said out of scope and asked nobody
        return self.d.label is None and self.d.layer is Layer.EMBEDDING and self.d.tier is Tier.NO_MATCH \
            and self.d.degraded is None


def run(clf: Classifier, rows: list[dict[str, Any]]) -> list[Turn]:
    out = []
    for r in rows:
        out.append(Turn(r, clf.classify(r["text"], session_id=r["session"])))
    return out


def detector_scores(rows_by_domain: dict[str, list[dict[str, Any]]], split: str) -> dict[str, dict[str, float]]:
    """Precision / recall of the detector per language, on the gold history."""
    det = FollowupDetector()
    c: dict[str, dict[str, int]] = defaultdict(lambda: {"tp": 0, "fp": 0, "fn": 0, "sc_fired": 0, "n_ref": 0})
    for rows in rows_by_domain.values():
        hist: dict[str, list[HistoryEntry]] = defaultdict(list)
        for r in rows:
            h = hist[r["session"]]
            fired = det.detect(r["text"], h) is not None
            h.append(HistoryEntry.of(r["label"], r["text"]))
            if split != "all" and r["split"] != split:
                continue
            ref = r["kind"] == "referential"
            for key in (r["lang"], "all"):
                s = c[key]
                s["n_ref"] += ref
                s["tp"] += fired and ref
                s["fp"] += fired and not ref
                s["fn"] += ref and not fired
                s["sc_fired"] += fired and r["kind"] == "self_contained"
    return {k: {"precision": v["tp"] / max(v["tp"] + v["fp"], 1), "recall": v["tp"] / max(v["n_ref"], 1),
                "false_fires": v["fp"], "self_contained_fired": v["sc_fired"], "referential": v["n_ref"]}
            for k, v in sorted(c.items())}


def _share(flags: list[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def _pct(x: float | None, digits: int = 0) -> str:
    return "–" if x is None else f"{x:.{digits}%}"


def summary(turns: list[Turn], baseline: list[Turn] | None, llm_calls: int, wall_s: float) -> dict[str, Any]:
    by_kind = {k: [t for t in turns if t.row["kind"] == k] for k in KINDS}
    ref = by_kind["referential"]
    sc = by_kind["self_contained"]
    acc = {k: _share([t.right for t in v]) for k, v in by_kind.items()}
    lang_acc = {lang: _share([t.right for t in ref if t.row["lang"] == lang]) for lang in ("en", "es", "de")}
    moved = sum(a.d.label != b.d.label for a, b in zip(turns, baseline or turns) if a.row["kind"] == "self_contained")
    return {"n": len(turns), "acc": acc, "followup_acc_by_lang": lang_acc,
            "ref_served_oos": sum(t.served_oos for t in ref), "ref_sure_oos": sum(t.sure_oos for t in ref),
            "self_contained_moved": moved,
            "llm_share_self_contained": sum(t.d.layer is Layer.LLM for t in sc) / max(len(sc), 1),
            "llm_share_all": sum(t.d.layer is Layer.LLM for t in turns) / max(len(turns), 1),
            "llm_calls_per_100": 100 * llm_calls / max(len(turns), 1),
            "texts_encoded_per_query": 1 + sum("resolved with" in t.d.reason for t in turns) / max(len(turns), 1),
            "layer2_ms_per_query": sum(t.d.latency_ms.get("embedding", 0.0) for t in turns) / max(len(turns), 1),
            "ms_per_query": 1000 * wall_s / max(len(turns), 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--split", choices=("dev", "test", "all"), default="test")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args(argv)
    rows_by_domain = {d: load_sessions(d) for d in DOMAINS}
    results: dict[str, Any] = {"split": args.split, "detector": detector_scores(rows_by_domain, args.split),
                               "arms": {}}
    embedder = make_embedder(load_intents(DOMAINS["support"]).embedder, cache=False)   # every text encoded
    embedder.encode(["warm up"])
    for domain, path in DOMAINS.items():
        model = fit_model(load_intents(path), embedder=embedder)
        rows = rows_by_domain[domain]
        for teacher_name in ("none", "oracle"):
            baseline = None
            for mode in MODES:
                teacher = HistoryOracle(rows) if teacher_name == "oracle" else None
                clf = Classifier(model, embedder=embedder, teacher=teacher, followups=mode, teacher_cache=None)
                t0 = time.perf_counter()
                turns = run(clf, rows)   # whole sessions: a test turn keeps its real history
                wall = time.perf_counter() - t0
                keep = [t for t in turns if args.split == "all" or t.row["split"] == args.split]
                s = summary(keep, baseline, sum(t.d.teacher is not None for t in keep), wall)
                baseline = keep if mode == "off" else baseline
                results["arms"][f"{domain}/{teacher_name}/{mode}"] = s
    print_tables(results)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(results, indent=2))
    return 0


def print_tables(results: dict[str, Any]) -> None:
    print(f"## Follow-up detector ({results['split']} split, gold history)\n")
    print("| language | referential | precision | recall | false fires | self-contained fired |")
    print("|---|---:|---:|---:|---:|---:|")
    for lang, s in results["detector"].items():
        print(f"| {lang} | {s['referential']} | {s['precision']:.1%} | {s['recall']:.1%} | {s['false_fires']} "
              f"| {s['self_contained_fired']} |")
    print(f"\n## Pipeline ({results['split']} split)\n")
    print("| domain / teacher / followups | follow-ups right | en | es | de | follow-ups served OOS (sure) "
          "| content change | OOS turns | self-contained | self-contained moved | LLM share self-contained "
          "| LLM calls /100 | texts encoded /query | layer-2 ms/query |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for arm, s in results["arms"].items():
        a, la = s["acc"], s["followup_acc_by_lang"]
        print(f"| {arm} | {_pct(a['referential'], 1)} | {_pct(la['en'])} | {_pct(la['es'])} | {_pct(la['de'])} "
              f"| {s['ref_served_oos']} ({s['ref_sure_oos']}) | {_pct(a['content_change'])} "
              f"| {_pct(a['out_of_scope'])} "
              f"| {_pct(a['self_contained'], 1)} | {s['self_contained_moved']} | {s['llm_share_self_contained']:.1%} "
              f"| {s['llm_calls_per_100']:.1f} | {s['texts_encoded_per_query']:.2f} | {s['layer2_ms_per_query']:.2f} |")


if __name__ == "__main__":
    raise SystemExit(main())
