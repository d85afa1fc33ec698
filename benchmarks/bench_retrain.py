"""Retrain time on a large traffic log (default 100k logged, teacher-labelled rows).

The log is synthesised from CLINC150: every train/val/test query (and out-of-scope
query) is embedded once with the default MiniLM encoder, then repeated with a
numbered suffix until ``--rows`` decisions exist; each copy gets its base vector plus
a little noise (renormalised), so the vectors are realistic and every row is a
distinct text. Teacher labels are right with probability ``--accuracy`` (else a random
other intent). The log is written through the real sink; then ``retrain()`` runs once
and its phases are timed. No row is re-embedded: all vectors come from the log.

With ``--tune-budget S`` the retrain also tunes the encoder (issue 22) within ``S``
seconds: the tuned challenger re-encodes every training and evaluation row it can, so
``texts_embedded_during_retrain`` counts the base encoder only and ``tuning`` has the
tuned side's figures. ``peak_rss_mib`` is the process's peak memory.

    python benchmarks/bench_retrain.py --rows 100000 --json-out .bench/retrain.json
    python benchmarks/bench_retrain.py --rows 100000 --tune-budget 300 --json-out .bench/retrain-tuned.json
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flywheel.classifier.decision import Decision, Layer, TeacherCall, Tier  # noqa: E402
from flywheel.classifier.encoders import make_embedder  # noqa: E402
from flywheel.classifier.protocols import DecisionRecord, DelegatingEmbedder  # noqa: E402
from flywheel.classifier.settings.intents import TuneSettings, load_intents  # noqa: E402
from flywheel.classifier.versions.registry import ModelRegistry  # noqa: E402
from flywheel.logstore import LogStore  # noqa: E402
from flywheel.training.retrain import RetrainOptions, retrain  # noqa: E402


class CountingEmbedder(DelegatingEmbedder):
    """Wraps the real embedder and counts texts it had to encode."""

    def __init__(self, inner):
        super().__init__(inner)
        self.encoded = 0

    def encode(self, texts, **kw):
        self.encoded += len(texts)
        return self.inner.encode(texts, **kw)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(ROOT.parent / "shared/datasets/clinc150/data_full.json"))
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--accuracy", type=float, default=0.9)
    ap.add_argument("--per-intent", type=int, default=5, help="intent examples in the intent file")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--tune-budget", type=float, default=None,
                    help="also tune the encoder (issue 22) within this many seconds: the cost of tuning, "
                         "re-encoding and the second challenger at this volume")
    ap.add_argument("--tune-unlabelled", type=float, default=None,
                    help="with --tune-budget: this share of it for the unlabelled stage on the logged queries "
                         "(issue 35)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    nrng = np.random.default_rng(args.seed)

    data = json.loads(Path(args.data).read_text())
    base = [(t, None if lab == "oos" else lab) for s in ("train", "val", "test", "oos_train", "oos_val", "oos_test")
            for t, lab in data[s]]
    labels = sorted({lab for _, lab in base if lab is not None})
    work = Path(args.workdir or tempfile.mkdtemp(prefix="flywheel-retrain-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    by_label: dict[str, list[str]] = {}
    for t, lab in data["train"]:
        by_label.setdefault(lab, []).append(t)
    doc = {"version": 1, "name": "clinc150-bench",
           "intents": [{"name": lab, "description": lab, "examples": by_label[lab][: args.per_intent]}
                       for lab in labels]}
    (work / "intents.yaml").write_text(yaml.safe_dump(doc))
    intents = load_intents(work / "intents.yaml")
    embedder = make_embedder(intents.embedder)

    t0 = time.perf_counter()
    V = embedder.encode([t for t, _ in base], progress=True)
    t_embed_base = time.perf_counter() - t0
    print(f"embedded {len(base)} base queries in {t_embed_base:.1f}s", flush=True)

    store = LogStore(work / "log.duckdb")
    sink = store.open_sink(batch_size=5000, max_spool_bytes=None)
    t0 = time.perf_counter()
    now = time.time() - args.rows  # one decision a second, ending now
    for i in range(args.rows):
        j = i % len(base)
        text, truth = base[j]
        if i >= len(base):
            text = f"{text} ({i // len(base)})"
        v = V[j] + nrng.normal(0, 0.02, V.shape[1]).astype(np.float32)
        v /= np.linalg.norm(v)
        right = rng.random() < args.accuracy
        label = truth if right else rng.choice([x for x in labels if x != truth])
        d = Decision(label=label, confidence=0.9, tier=Tier.CONFIDENT, layer=Layer.LLM, reason="bench",
                     alternatives=[], model_version="bench", latency_ms={"llm": 300.0},
                     teacher=TeacherCall("simulated", label, True, 300.0))
        sink.write(DecisionRecord(decision=d, text=text, created_at=now + i, encoder_id=embedder.id,
                                  embedding=v))
    sink.close()
    t_log = time.perf_counter() - t0
    store.ingest()
    print(f"logged {args.rows} decisions in {t_log:.1f}s; log has {store.count()} rows", flush=True)

    counting = CountingEmbedder(embedder)
    registry = ModelRegistry(work / "models")
    t0 = time.perf_counter()
    tune = None if args.tune_budget is None else TuneSettings(budget_s=args.tune_budget,
                                                              unlabelled=args.tune_unlabelled or 0.0)
    result = retrain(store=store, registry=registry, intents=intents, embedder=counting,
                     options=RetrainOptions(progress=True, tune=tune))
    t_retrain = time.perf_counter() - t0
    report = result.report or {}
    tuning = report.get("tuning") or {}
    out = {
        "rows": args.rows, "retrain_seconds": round(t_retrain, 1), "outcome": result.outcome,
        "texts_embedded_during_retrain": counting.encoded,
        "timing": report.get("timing"), "dataset": report.get("dataset"),
        "log_seconds": round(t_log, 1), "summary": result.summary_line(),
        # the whole process's peak resident memory (the log build included), in MiB
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "tuning": {k: tuning.get(k) for k in ("rows", "rows_without_text", "step_seconds", "reencode_seconds",
                                               "reencoded_rows", "stopped_by_budget", "encoder_id",
                                               "tuner_budget_s", "reencode_forecast_seconds",
                                               "export_forecast_seconds", "budget_overrun_seconds",
                                               "unlabelled_pool")} | {
            "steps": (tuning.get("tuner") or {}).get("steps"),
            "steps_planned": (tuning.get("tuner") or {}).get("steps_planned"),
            "tune_seconds": (tuning.get("tuner") or {}).get("seconds"),
            "export_seconds": (tuning.get("tuner") or {}).get("export_seconds"),
            "unlabelled_stage": (tuning.get("tuner") or {}).get("unlabelled_stage")} if tuning else None,
        "challengers": report.get("challengers"),
    }
    print(json.dumps(out, indent=2, default=str))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
