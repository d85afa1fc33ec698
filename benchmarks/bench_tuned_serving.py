"""What a tuned encoder costs to serve, against the default it was tuned from (issue 22).

Tunes MiniLM for one epoch on a 10-shot CLINC150 split (``training.tuner.export.tune_and_export``,
the path ``flywheel train --tune-encoder`` and the retrain take: exported to ONNX, int8 where
it holds), then times, in one run and interleaved query by query so machine noise hits both
alike, one thread each:

- ``default``: the default English encoder (MiniLM, ONNX Runtime, int8), as ``classify()``
  serves it;
- ``tuned``: the tuned export through :class:`~classifier.encoders.VersionEncoderEmbedder`,
  as a version that carries its encoder is served.

Reports single-query p50/p90, batch-64 throughput, load time (a replica's warm-up after a
hot reload) and the ratios tuned / default. How much the encoder was tuned does not change
its graph, so one epoch stands for any tuning.

    python benchmarks/bench_tuned_serving.py --json-out .bench/tuned-serving.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from bench_onnx import batch_qps, interleaved, queries  # noqa: E402
from bench_sidecar import write_json  # noqa: E402

from flywheel.classifier.encoders import MiniLMEmbedder, VersionEncoderEmbedder  # noqa: E402
from flywheel.classifier.settings.intents import EmbedderSettings, TuneSettings  # noqa: E402
from flywheel.training.tuner.export import tune_and_export  # noqa: E402


def split(path: str, k: int) -> tuple[list[str], list[str | None]]:
    doc = json.loads(Path(path).read_text())
    seen: dict[str, int] = {}
    texts, labels = [], []
    for text, label in doc["train"]:
        if seen.get(label, 0) < k:
            seen[label] = seen.get(label, 0) + 1
            texts.append(text)
            labels.append(label)
    return texts, labels


def timed(make: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    e = make()
    e.encode(["warm-up"])
    return e, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared/datasets/clinc150/data_full.json"))
    ap.add_argument("--shots", type=int, default=10)
    ap.add_argument("--n", type=int, default=400, help="distinct queries, one per call")
    ap.add_argument("--batch-n", type=int, default=1024, help="queries for the batch throughput")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    texts, labels = split(args.data, args.shots)
    qs = queries(args.data, args.n + args.batch_n)
    single, batch = qs[:args.n], qs[args.n:]
    with tempfile.TemporaryDirectory(prefix="tuned-serving-") as tmp:
        settings = EmbedderSettings(backend="minilm", num_threads=1)
        t0 = time.perf_counter()
        tuned = tune_and_export(texts, labels, settings, TuneSettings(epochs=1), tmp)
        tune_s = time.perf_counter() - t0
        encoders: dict[str, Any] = {}
        load: dict[str, float] = {}
        encoders["default"], load["default"] = timed(
            lambda: MiniLMEmbedder(num_threads=1, runtime="onnx", quantize=True, onnx_cache_dir=Path(tmp) / "onnx"))
        encoders["tuned"], load["tuned"] = timed(lambda: VersionEncoderEmbedder(tuned.export.path, num_threads=1))
        for e in encoders.values():
            e.encode(["warm up the encoder", "and once more"])
        ms, _ = interleaved(encoders, single)
        rows = {k: {"p50_ms": round(float(np.percentile(ms[k], 50)), 3),
                    "p90_ms": round(float(np.percentile(ms[k], 90)), 3),
                    "batch64_qps": round(batch_qps(encoders[k], batch, 64), 1),
                    "load_s": round(load[k], 3)} for k in encoders}
        out = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
               "date": time.strftime("%Y-%m-%d"), "queries": len(single), "tune_and_export_s": round(tune_s, 1),
               "tuned_id": tuned.export.id, "tuned_quantized": tuned.export.quantized,
               "tuned_bytes": tuned.export.size_bytes, "encoders": rows,
               "ratio_p50": round(rows["tuned"]["p50_ms"] / rows["default"]["p50_ms"], 3),
               "ratio_p90": round(rows["tuned"]["p90_ms"] / rows["default"]["p90_ms"], 3),
               "ratio_batch_qps": round(rows["tuned"]["batch64_qps"] / rows["default"]["batch64_qps"], 3)}
    print(json.dumps(out, indent=1))
    write_json(out, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
