"""Where layer 2 loses accuracy on the CLINC150 test split: the head or the out-of-scope gate?

For the model a finished flywheel run serves (``--workdir`` of bench_flywheel.py) it
prints the in-scope top-1 accuracy with no rejection, the operating point it serves
(its learned ``oos`` cutoff), and a sweep of the ``oos`` cutoff. The sweep reads the
test labels, so it is a diagnosis (what the best cutoff would give), never a way to
pick one.

    python benchmarks/gate_sweep.py --workdir .bench/fw-st1 [--workdir .bench/fw-v6] [--json-out F]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flywheel.classifier.encoders import make_embedder  # noqa: E402
from flywheel.classifier.layer2.tiers import Thresholds  # noqa: E402
from flywheel.classifier.versions.registry import ModelRegistry  # noqa: E402


def sweep(model, X: np.ndarray, truth: np.ndarray, cutoffs) -> dict:
    s = model.head.scores(X)
    classes = np.array(model.manifest.labels, dtype=object)
    top = classes[s.probs.argmax(axis=1)]
    ins = truth != None  # noqa: E711

    def point(t: float) -> dict:
        rej = s.rejected(t)
        pred = np.where(rej, None, top)
        return {"oos_cutoff": round(float(t), 4), "accuracy": float((pred == truth).mean()),
                "in_scope_accuracy": float((pred[ins] == truth[ins]).mean()),
                "oos_recall": float(rej[~ins].mean())}

    served = point(Thresholds.for_model(model).oos)
    rows = [point(t) for t in cutoffs]
    best = max(rows, key=lambda r: r["accuracy"])
    return {"version": model.version, "in_scope_top1": float((top[ins] == truth[ins]).mean()),
            "served": served, "best_on_test": best, "sweep": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", action="append", required=True)
    ap.add_argument("--data", default=str(ROOT.parent / "shared/datasets/clinc150/data_full.json"))
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    data = json.loads(Path(args.data).read_text())
    test = data["test"] + data["oos_test"]
    truth = np.array([None if lab == "oos" else lab for _, lab in test], dtype=object)
    out = {}
    X = None
    for wd in args.workdir:
        model = ModelRegistry(Path(wd) / "models").load_current()
        if X is None:
            X = make_embedder(model.intents.embedder).encode([t for t, _ in test], progress=True)
        r = sweep(model, X, truth, np.round(np.arange(0.30, 0.951, 0.05), 2))
        out[wd] = r
        sv, b = r["served"], r["best_on_test"]
        print(f"{wd}: {r['version']}  in-scope top-1 (no rejection) {r['in_scope_top1']:.1%}")
        print(f"  served   oos cutoff {sv['oos_cutoff']:.3f}: accuracy {sv['accuracy']:.1%}, in-scope "
              f"{sv['in_scope_accuracy']:.1%}, OOS recall {sv['oos_recall']:.1%}")
        print(f"  best on the test split (diagnosis only) {b['oos_cutoff']:.2f}: accuracy {b['accuracy']:.1%}, "
              f"in-scope {b['in_scope_accuracy']:.1%}, OOS recall {b['oos_recall']:.1%}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
