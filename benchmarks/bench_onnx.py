"""Layer 2's encoders through ONNX Runtime against torch, interleaved in one run.

Part ``minilm``: the packaged all-MiniLM-L6-v2, one thread each, on the same distinct
CLINC150 queries (one query per call; the encoders take turns on every query so machine
noise hits them alike):

- ``plain torch``: transformers ``AutoModel`` + masked mean pooling, no tricks (the
  issue's baseline);
- ``flywheel torch``: the project's own torch runner (``runtime: torch``);
- ``onnx fp32`` and ``onnx int8``: ``runtime: onnx``, exported into a fresh cache;
- ``classify() default``: ``Classifier.classify`` of a model trained on the English-only
  starter intents with the default settings (MiniLM, runtime auto = ONNX, quantize auto =
  int8): the whole layer-1 + layer-2 path, what a caller waits for;
- ``use-multilingual`` and ``classify() multilingual``: the multilingual default (a
  different model: its ratio to MiniLM's plain torch is a comparison of defaults).

Also: the export time (fresh cache), batch throughput (batches of 64), the cosine of each
MiniLM encoder's vectors to the plain torch ones.

Part ``bge``: a bge-m3-shaped model with random weights (XLM-RoBERTa large, 24 layers;
``--bge-layers``) through FlagEmbedding (``runtime: torch``), ONNX fp32 and ONNX int8: export
time, interleaved single-query latency, batch-32 throughput, cosine to torch.

Part ``cli``: wall time of ``flywheel classify "thanks, that was helpful"`` in a fresh
process, the model and the ONNX export already cached, no Ollama; and whether the process
imported torch or transformers (``python -X importtime``).

    python benchmarks/bench_onnx.py --json-out .bench/onnx.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from flywheel.classifier.encoders import BGEM3Embedder, MiniLMEmbedder, USEMultilingualEmbedder, minilm_model_dir  # noqa: E402

STARTER = ROOT / "data" / "starter_intents.yaml"


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


class ViaClassify:
    """``Classifier.classify`` of a model trained on an intent file (teacher off, no log)."""

    def __init__(self, intents: Path) -> None:
        from flywheel.classifier.layer2.fitter import fit_model
        from flywheel.classifier.pipeline import Classifier
        from flywheel.classifier.settings.intents import load_intents

        self.clf = Classifier(fit_model(load_intents(intents)), teacher=None)
        self.encoder_id = self.clf.model.manifest.encoder["id"]

    def encode(self, texts: list[str]) -> None:
        for t in texts:
            self.clf.classify(t)


def queries(path: str, n: int) -> list[str]:
    data = json.loads(Path(path).read_text())
    seen, out = set(), []
    for text, _ in data["test"] + data["val"] + data["train"]:
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out[:n]


def interleaved(encoders: dict[str, Any], texts: list[str]) -> tuple[dict[str, list[float]], dict[str, np.ndarray]]:
    """Each text once per encoder, one call per text, the order rotating every text."""
    ms: dict[str, list[float]] = {k: [] for k in encoders}
    vecs: dict[str, list[Any]] = {k: [] for k in encoders}
    names = list(encoders)
    for i, text in enumerate(texts):
        for k in names[i % len(names):] + names[:i % len(names)]:
            t0 = time.perf_counter()
            v = encoders[k].encode([text])
            ms[k].append((time.perf_counter() - t0) * 1000)
            vecs[k].append(None if v is None else np.asarray(v)[0])
    return ms, {k: np.stack(v) for k, v in vecs.items() if v and v[0] is not None}


def batch_qps(encoder: Any, texts: list[str], size: int) -> float:
    t0 = time.perf_counter()
    for j in range(0, len(texts), size):
        encoder.encode(texts[j:j + size])
    return len(texts) / (time.perf_counter() - t0)


def _cos_min(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())


def _timed_load(make: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    e = make()
    e.encode(["warm-up"])
    return e, time.perf_counter() - t0


def _english_only(tmp: Path) -> Path:
    path = tmp / "starter_en.yaml"
    path.write_text(STARTER.read_text(encoding="utf-8").replace("languages: [en, es]", "languages: [en]"),
                    encoding="utf-8")
    return path


def bench_minilm(args: argparse.Namespace, single: list[str], batch: list[str], tmp: Path) -> dict[str, Any]:
    cache = tmp / "onnx"
    os.environ["FLYWHEEL_ONNX_CACHE"] = str(cache)  # the classify() models use the same fresh cache
    encoders: dict[str, Any] = {"plain torch": PlainTorch(), "flywheel torch": MiniLMEmbedder(num_threads=1,
                                                                                              runtime="torch")}
    encoders["onnx fp32"], export_s = _timed_load(lambda: MiniLMEmbedder(num_threads=1, runtime="onnx",
                                                                         onnx_cache_dir=cache))
    encoders["onnx int8"], int8_s = _timed_load(lambda: MiniLMEmbedder(num_threads=1, runtime="onnx", quantize=True,
                                                                       onnx_cache_dir=cache))
    encoders["use-multilingual"], use_load_s = _timed_load(USEMultilingualEmbedder)
    default = ViaClassify(_english_only(tmp))
    multilingual = ViaClassify(STARTER)
    encoders["classify() default"], encoders["classify() multilingual"] = default, multilingual
    for e in encoders.values():
        e.encode(["warm up the encoder", "and once more"])
    ms, vecs = interleaved(encoders, single)
    rows: dict[str, dict[str, Any]] = {}
    for k in encoders:
        rows[k] = {"p50_ms": round(float(np.percentile(ms[k], 50)), 3),
                   "p90_ms": round(float(np.percentile(ms[k], 90)), 3),
                   "batch_qps": round(batch_qps(encoders[k], batch, 64), 1)}
        if k in vecs and vecs[k].shape == vecs["plain torch"].shape:
            rows[k]["cosine_to_plain_min"] = round(_cos_min(vecs[k], vecs["plain torch"]), 6)
    for k in rows:
        rows[k]["p50_ratio_to_plain_torch"] = round(rows[k]["p50_ms"] / rows["plain torch"]["p50_ms"], 3)
        rows[k]["p50_ratio_to_flywheel_torch"] = round(rows[k]["p50_ms"] / rows["flywheel torch"]["p50_ms"], 3)
    return {"queries": len(single), "export_s": round(export_s, 2), "int8_build_s": round(int8_s, 2),
            "use_load_s": round(use_load_s, 2), "classify_default_encoder": default.encoder_id,
            "classify_multilingual_encoder": multilingual.encoder_id, "encoders": rows}


def bench_bge(args: argparse.Namespace, single: list[str], batch: list[str], tmp: Path) -> dict[str, Any]:
    from benchmarks.bench_embedders import build_random_bge_m3

    path = tmp / "bge-m3-random"
    t0 = time.perf_counter()
    info = build_random_bge_m3(path, single + batch, args.bge_layers)
    build_s = time.perf_counter() - t0
    cache = tmp / "onnx-bge"
    encoders: dict[str, Any] = {}
    loads: dict[str, float] = {}
    for name, kw in (("torch fp32", {"runtime": "torch"}), ("onnx fp32", {"runtime": "onnx"}),
                     ("onnx int8", {"runtime": "onnx", "quantize": True})):
        encoders[name], loads[name] = _timed_load(lambda kw=kw: BGEM3Embedder(
            str(path), device="cpu", num_threads=1, onnx_cache_dir=cache, **kw))
    ms, vecs = interleaved(encoders, single)
    rows = {}
    for k in encoders:
        rows[k] = {"p50_ms": round(float(np.percentile(ms[k], 50)), 2),
                   "p90_ms": round(float(np.percentile(ms[k], 90)), 2),
                   "batch32_qps": round(batch_qps(encoders[k], batch, 32), 2),
                   "cosine_to_torch_min": round(_cos_min(vecs[k], vecs["torch fp32"]), 6),
                   "load_s": round(loads[k], 1)}
        rows[k]["p50_ratio_to_torch"] = round(rows[k]["p50_ms"] / rows["torch fp32"]["p50_ms"], 3)
    return {"layers": args.bge_layers, "params_m": round(info["params"] / 1e6), "build_s": round(build_s, 1),
            "tokens_per_query": round(info["tokens_per_query"], 1), "queries": len(single),
            "export_s_includes_torch_reference_load": loads["onnx fp32"], "encoders": rows}


def bench_cli(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    flywheel = Path(sys.executable).with_name("flywheel")
    out: dict[str, Any] = {}
    for name, intents in (("multilingual default (starter intents)", STARTER),
                          ("English-only (MiniLM, ONNX int8)", _english_only(tmp))):
        env = {**os.environ, "FLYWHEEL_HOME": str(tmp / f"home-{len(out)}"), "FLYWHEEL_INTENTS": str(intents),
               "OLLAMA_HOST": "http://127.0.0.1:9"}
        env.pop("FLYWHEEL_ONNX_CACHE", None)
        cmd = [str(flywheel), "classify", "--teacher", "off", "thanks, that was helpful"]
        subprocess.run(cmd, env=env, capture_output=True, check=True)  # trains, exports and caches
        walls = []
        for _ in range(args.cli_runs):
            t0 = time.perf_counter()
            subprocess.run(cmd, env=env, capture_output=True, check=True)
            walls.append(time.perf_counter() - t0)
        imp = subprocess.run([sys.executable, "-X", "importtime", "-m", "flywheel", *cmd[1:]], env=env,
                             capture_output=True, text=True, check=True)
        imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in imp.stderr.splitlines()
                    if line.startswith("import time:")}
        out[name] = {"wall_s_median": round(float(np.median(walls)), 2), "wall_s_max": round(max(walls), 2),
                     "runs": len(walls), "imports_torch": "torch" in imported,
                     "imports_transformers": "transformers" in imported,
                     "decision": json.loads(imp.stdout.splitlines()[-1]) if imp.stdout.strip() else None}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(ROOT.parent / "shared/datasets/clinc150/data_full.json"))
    ap.add_argument("--parts", default="minilm,bge,cli", help="comma-separated: minilm, bge, cli")
    ap.add_argument("--n", type=int, default=300, help="distinct queries, one per call (minilm)")
    ap.add_argument("--batch-n", type=int, default=1024, help="queries for the batch throughput (minilm)")
    ap.add_argument("--bge-layers", type=int, default=24)
    ap.add_argument("--bge-n", type=int, default=40, help="single queries per bge encoder")
    ap.add_argument("--bge-batch-n", type=int, default=96)
    ap.add_argument("--cli-runs", type=int, default=5)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    texts = queries(args.data, args.n + args.batch_n + args.bge_n + args.bge_batch_n)
    tmp = Path(tempfile.mkdtemp(prefix="flywheel-onnx-bench-"))
    os.environ["FLYWHEEL_HOME"] = str(tmp / "home")
    result: dict[str, Any] = {"machine": f"{platform.node()} {os.cpu_count()} CPUs", "date": time.strftime("%Y-%m-%d")}
    try:
        if "minilm" in parts:
            result["minilm"] = bench_minilm(args, texts[:args.n], texts[args.n:args.n + args.batch_n], tmp)
            print(json.dumps(result["minilm"], indent=1), flush=True)
        if "bge" in parts:
            rest = texts[args.n + args.batch_n:]
            result["bge"] = bench_bge(args, rest[:args.bge_n], rest[args.bge_n:args.bge_n + args.bge_batch_n], tmp)
            print(json.dumps(result["bge"], indent=1), flush=True)
        if "cli" in parts:
            result["cli"] = bench_cli(args, tmp)
            print(json.dumps(result["cli"], indent=1), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
