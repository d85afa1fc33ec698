"""MiniLM through ONNX Runtime against torch, interleaved in one run.

Four encoders of the packaged all-MiniLM-L6-v2, one thread each, on the same distinct
CLINC150 queries (one query per call, the four take turns on every query so machine
noise hits them alike):

- ``plain torch``: transformers ``AutoModel`` + masked mean pooling, no tricks (the
  issue's baseline);
- ``flywheel torch``: the project's own torch runner (``runtime: torch``);
- ``onnx fp32`` and ``onnx int8``: ``runtime: onnx``, exported into a fresh cache.

Also: the export time (fresh cache), batch throughput (batches of 64) and the cosine of
each encoder's vectors to the plain torch ones.

    python benchmarks/bench_onnx.py --json-out .bench/onnx.json
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

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from classifier.embedders import MiniLMEmbedder  # noqa: E402
from classifier.runners import minilm_model_dir  # noqa: E402


class PlainTorch:
    """transformers AutoModel + mean pooling, one thread: the baseline."""

    def __init__(self) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        torch.set_num_threads(1)
        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(str(minilm_model_dir()))
        self.model = AutoModel.from_pretrained(str(minilm_model_dir())).eval()

    def encode(self, texts: list[str]) -> np.ndarray:
        with self.torch.inference_mode():
            enc = self.tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
            out = self.model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(out.dtype)
            v = (out * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            v = v / v.norm(dim=1, keepdim=True)
        return v.numpy()


def queries(path: str, n: int) -> list[str]:
    data = json.loads(Path(path).read_text())
    seen, out = set(), []
    for text, _ in data["test"] + data["val"]:
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out[:n]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(ROOT.parent / "shared/datasets/clinc150/data_full.json"))
    ap.add_argument("--n", type=int, default=300, help="distinct queries, one per call")
    ap.add_argument("--batch-n", type=int, default=1024, help="queries for the batch throughput")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    texts = queries(args.data, args.n + args.batch_n)
    single, batch = texts[:args.n], texts[args.n:]
    cache = Path(tempfile.mkdtemp(prefix="flywheel-onnx-bench-"))

    encoders = {"plain torch": PlainTorch()}
    encoders["flywheel torch"] = MiniLMEmbedder(num_threads=1)
    t0 = time.perf_counter()
    fp32 = MiniLMEmbedder(num_threads=1, runtime="onnx", onnx_cache_dir=cache)
    fp32.encode(["warm-up"])
    export_s = time.perf_counter() - t0
    encoders["onnx fp32"] = fp32
    t0 = time.perf_counter()
    int8 = MiniLMEmbedder(num_threads=1, runtime="onnx", quantize=True, onnx_cache_dir=cache)
    int8.encode(["warm-up"])
    int8_s = time.perf_counter() - t0
    encoders["onnx int8"] = int8
    for e in encoders.values():
        e.encode(["warm up the encoder", "and once more"])

    ms: dict[str, list[float]] = {k: [] for k in encoders}
    vecs: dict[str, list[np.ndarray]] = {k: [] for k in encoders}
    names = list(encoders)
    for i, text in enumerate(single):
        for k in names[i % len(names):] + names[:i % len(names)]:    # rotate the order
            t0 = time.perf_counter()
            v = encoders[k].encode([text])
            ms[k].append((time.perf_counter() - t0) * 1000)
            vecs[k].append(np.asarray(v)[0])
    base = np.stack(vecs["plain torch"])
    rows = {}
    for k in names:
        a = np.stack(vecs[k])
        cos = (a * base).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(base, axis=1))
        t0 = time.perf_counter()
        for j in range(0, len(batch), 64):
            encoders[k].encode(batch[j:j + 64])
        qps = len(batch) / (time.perf_counter() - t0)
        rows[k] = {"p50_ms": round(float(np.percentile(ms[k], 50)), 2),
                   "p90_ms": round(float(np.percentile(ms[k], 90)), 2),
                   "cosine_to_plain_min": round(float(cos.min()), 6), "batch_qps": round(qps, 1)}
    p = rows["plain torch"]["p50_ms"]
    for k in names:
        rows[k]["p50_ratio_to_plain_torch"] = round(rows[k]["p50_ms"] / p, 3)
        rows[k]["p50_ratio_to_flywheel_torch"] = round(rows[k]["p50_ms"] / rows["flywheel torch"]["p50_ms"], 3)
    result = {"machine": f"{platform.node()} {os.cpu_count()} CPUs", "date": time.strftime("%Y-%m-%d"),
              "queries": len(single), "export_s": round(export_s, 2), "int8_build_s": round(int8_s, 2),
              "encoders": rows}
    print(json.dumps(result, indent=1))
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
