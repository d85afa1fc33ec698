"""Bytes of tuned versions with their encoder's large weights in shared blobs (issue 34, item 2).

Tunes the starter set's encoder twice (seeds 0 and 1, a short budget, holdout calibration:
what a retrain's served encoder goes through), exports each (int8 where it holds), fits the
head on it, saves both as versions v1 and v2 of one models home, and prints per version its
own bytes, the shared blob bytes it names, what the graph weighed before the split, the
store's bytes, and what a replica serving v1 downloads to follow a promotion to v2.

    nice -n 10 python benchmarks/bench_version_blobs.py --backend e5-multilingual --budget 30
    nice -n 10 python benchmarks/bench_version_blobs.py --backend minilm --budget 30
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

from flywheel.classifier.encoders.backends import E5_MULTILINGUAL
from flywheel.classifier.encoders.blobs import BLOBS_DIR, version_storage
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.settings.config import starter_intents_path
from flywheel.classifier.settings.intents import TuneSettings, load_intents
from flywheel.classifier.versions.registry import ModelRegistry
from flywheel.training.tuner.export import intent_pairs, tune_and_export


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default=E5_MULTILINGUAL.id)
    ap.add_argument("--budget", type=float, default=30.0, help="tuning seconds per version")
    args = ap.parse_args()
    intents = load_intents(starter_intents_path())
    settings = dataclasses.replace(intents.embedder, backend=args.backend)
    intents = dataclasses.replace(intents, embedder=settings)
    texts, labels = intent_pairs(intents)
    out: dict[str, object] = {"backend": args.backend, "rows": len(texts)}
    with tempfile.TemporaryDirectory(prefix="bench-blobs-") as tmp:
        reg = ModelRegistry(Path(tmp) / "home")
        for seed, name in ((0, "v1"), (1, "v2")):
            t0 = time.perf_counter()
            tuned = tune_and_export(texts, labels, settings, TuneSettings(budget_s=args.budget, seed=seed, epochs=1,
                                                                          calibration="holdout"), Path(tmp) / name)
            model = fit_model(intents, embedder=tuned.embedder, version=name)
            model.encoder_dir = tuned.export.path
            path = model.save(reg.version_dir(name))
            st = version_storage(path, [reg.version_dir("v1")] if name == "v2" else [])
            out[name] = {**st, "encoder_id": tuned.export.id, "served": tuned.export.served,
                         "graph_before_split_bytes": tuned.export.size_bytes + tuned.export.blob_bytes,
                         "blobs": {b.name: [b.sha256[:12], b.bytes] for b in tuned.export.blobs},
                         "steps": tuned.report.get("steps"), "seconds": round(time.perf_counter() - t0, 1)}
            print(name, json.dumps(out[name]), flush=True)
        store = [p for p in (reg.home / BLOBS_DIR).iterdir() if p.is_file()]
        out["store"] = {"blobs": len(store), "bytes": sum(p.stat().st_size for p in store)}
        out["shared"] = out["v1"]["blobs"] == out["v2"]["blobs"]   # type: ignore[index]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
