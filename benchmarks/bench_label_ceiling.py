"""What limits layer 2 after a flywheel run: the teacher's wrong labels, or how few there are?

Reads the log and models of a finished ``bench_flywheel.py`` run (``--workdir``), builds
the retrain job's training set from it exactly as ``flywheel retrain`` does, and fits
the challenger twice on the same rows:

- **as logged**: the teacher's labels (what retrain trains on);
- **oracle labels**: the same texts with the CLINC150 ground truth instead (for the
  training rows and the held-out rows the cutoffs are tuned on), i.e. a perfect
  teacher that was asked about exactly the same queries.

Both are scored on the CLINC150 test split (test + oos_test, out of scope counted as a
class) with their serving thresholds, after the same LLM-budget re-tuning. If the
oracle is not much better, label noise is not what keeps layer 2 below the teacher;
the number of labelled queries (and the out-of-scope gate) is.

    python benchmarks/bench_label_ceiling.py --workdir .bench/fw-v2 --llm-budget 0.05

``--synthetic N`` and ``--quantize true|false`` refit the same logged rows with another
count of synthetic negatives or another MiniLM precision (texts re-encoded), to tell
which encoder setting moves layer 2 (BENCHMARKS.md, section 12); ``--no-oracle`` skips
the oracle fit.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_flywheel import layer2_accuracy  # noqa: E402

from flywheel.classifier.encoders import make_embedder  # noqa: E402
from flywheel.classifier.layer2.fitter import fit_from_vectors  # noqa: E402
from flywheel.classifier.layer2.head import IntentHead  # noqa: E402
from flywheel.classifier.settings.intents import load_intents  # noqa: E402
from flywheel.classifier.versions.registry import ModelRegistry  # noqa: E402
from flywheel.logstore import LogStore  # noqa: E402
from flywheel.training.cutoffs import retune, traffic_sample, with_thresholds  # noqa: E402
from flywheel.training.teacher_noise import check_training_set, estimate_from_log  # noqa: E402
from flywheel.training.trainset import build_training_set  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", required=True, help="a finished bench_flywheel.py work directory")
    ap.add_argument("--data", default=str(ROOT.parent / "shared/datasets/clinc150/data_full.json"))
    ap.add_argument("--llm-budget", type=float, default=None)
    ap.add_argument("--synthetic", type=int, default=None, help="override out_of_scope.synthetic")
    ap.add_argument("--quantize", choices=("true", "false"), default=None, help="override embedder.quantize")
    ap.add_argument("--no-oracle", action="store_true", help="fit only the logged labels")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()

    work = Path(args.workdir)
    data = json.loads(Path(args.data).read_text())
    truth = {t: (None if lab == "oos" else lab) for sp in ("train", "oos_train", "test", "oos_test")
             for t, lab in data[sp]}
    intents = load_intents(work / "seed_intents.yaml")
    if args.synthetic is not None:
        intents = replace(intents, synthetic_negatives=args.synthetic)
    if args.quantize is not None:
        intents = replace(intents, embedder=replace(intents.embedder, quantize=args.quantize == "true"))
    embedder = make_embedder(intents.embedder)
    test = data["test"] + data["oos_test"]
    X_test = embedder.encode([t for t, _ in test])
    y_test = [None if lab == "oos" else lab for _, lab in test]

    tmp = tempfile.TemporaryDirectory()   # a copy: the run's own log stays untouched
    shutil.copy(work / "log.duckdb", Path(tmp.name) / "log.duckdb")
    spool = work / "log.duckdb.spool"
    if spool.is_dir():
        shutil.copytree(spool, Path(tmp.name) / "log.duckdb.spool")
    store = LogStore(Path(tmp.name) / "log.duckdb")
    champion = ModelRegistry(work / "models").load_current()
    ts = build_training_set(store, intents, embedder=embedder)
    # the retrain's teacher-label filter step: the noisy-teacher guard (evidence rules off, the default)
    ts, teacher_filter = check_training_set(ts, estimate_from_log(store), champion=champion,
                                            encoder_id=embedder.id, enabled=False)
    extra = ts.extra()
    wrong = [y != truth[t] for t, y in zip(extra.texts, extra.labels)]
    oos_labels = [y is None for y in extra.labels]
    stats = {
        "training_rows": len(ts), "intent_examples": ts.counts()["intent_example"], "teacher_rows": len(extra),
        "teacher_rows_wrong": int(sum(wrong)),
        "out_of_scope_labels": int(sum(oos_labels)),
        "out_of_scope_labels_wrong": int(sum(w and o for w, o in zip(wrong, oos_labels))),
        "noisy_guard_dropped": teacher_filter["guard"]["dropped"],
    }
    print(json.dumps(stats), flush=True)
    sample = traffic_sample(store, embedder.id, ts) if args.llm_budget is not None else None

    results = {}
    oracle_recent = ts.recent.select(range(len(ts.recent)))
    oracle_recent.labels = [truth[t] for t in oracle_recent.texts]
    fits = [("as logged", list(extra.labels), ts.recent),
            ("oracle labels", [truth[t] for t in extra.texts], oracle_recent)]
    for name, labels, recent in fits[:1] if args.no_oracle else fits:
        t0 = time.perf_counter()
        n_ex = len(ts) - len(extra)             # the intent examples come first, then the logged rows
        model = fit_from_vectors(ts.fit_intents, ts.vectors, list(ts.labels[:n_ex]) + labels,
                                 encoder_id=embedder.id, version=name.replace(" ", "-"), negatives=ts.negatives,
                                 head=IntentHead(target_precision=intents.thresholds.target_precision,
                                                 coverage=intents.thresholds.coverage))
        model = replace(model, intents=intents)
        _, tuned = retune(model, recent, intents.thresholds.target_precision, args.llm_budget, sample)
        model = with_thresholds(model, tuned)
        r = layer2_accuracy(model, X_test, y_test)
        s = model.head.scores(X_test)
        classes = np.array([str(c) for c in model.manifest.labels], dtype=object)
        top = classes[s.probs.argmax(axis=1)]
        ins = np.array([y is not None for y in y_test])
        r["in_scope_top1_no_rejection"] = float((top[ins] == np.array(y_test, dtype=object)[ins]).mean())
        r["fit_seconds"] = round(time.perf_counter() - t0, 1)
        results[name] = r
        print(f"{name:14s} accuracy {r['accuracy']:.3f}  in-scope {r['in_scope_accuracy']:.3f}  "
              f"OOS recall {r['oos_recall']:.3f}  in-scope top-1 without rejection "
              f"{r['in_scope_top1_no_rejection']:.3f}  ({r['fit_seconds']}s)", flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"stats": stats, "results": results, "args": vars(args)},
                                                  indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
