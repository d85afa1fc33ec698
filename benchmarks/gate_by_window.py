"""Where did each promoted model's out-of-scope gate cut? (BENCHMARKS.md, section 12.2)

Reads every model version of a finished ``bench_flywheel.py`` work directory and scores
the CLINC150 test split (test + oos_test) three ways: with the served thresholds (after
any LLM-budget tuning), with the gate's own learned ``oos`` cutoff, and with the gate cut
at 0.5. Prints accuracy, in-scope accuracy and OOS recall for each.

    python benchmarks/gate_by_window.py --workdir <bench_flywheel work directory>
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flywheel.classifier.encoders import make_embedder  # noqa: E402
from flywheel.classifier.layer2.tiers import Thresholds, assign_tiers  # noqa: E402
from flywheel.classifier.versions.registry import ModelRegistry  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--data", default=str(ROOT.parent / "shared/datasets/clinc150/data_full.json"))
    args = ap.parse_args()
    work = Path(args.workdir)
    reg = ModelRegistry(work / "models")
    data = json.loads(Path(args.data).read_text())
    test = data["test"] + data["oos_test"]
    y = np.array([None if lab == "oos" else lab for _, lab in test], dtype=object)
    ins = y != None  # noqa: E711
    X = None
    for v in sorted(p.name for p in (work / "models").iterdir() if p.name.startswith("v")):
        m = reg.load(v)
        if X is None:
            X = make_embedder(m.intents.embedder).encode([t for t, _ in test])
        s, th, labels = m.head.scores(X), Thresholds.for_model(m), list(m.manifest.labels)
        out = [v]
        for name, t in (("served", th), ("learned", replace(th, oos=float(m.head.thresholds_["oos"]))),
                        ("at 0.5", replace(th, oos=0.5))):
            pred = np.array(assign_tiers(s, labels, t).labels(labels), dtype=object)
            out.append(f"{name} oos={t.oos:.3f}: {(pred == y).mean():.3f} "
                       f"({(pred[ins] == y[ins]).mean():.3f} / {(pred[~ins] == None).mean():.3f})")  # noqa: E711
        print(" | ".join(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
