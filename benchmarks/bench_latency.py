"""In-process latency of ``Classifier.classify`` on the starter model, per path.

- rules: a query decided by layer 1 (the usage-figures regex), and the rule engine alone
  with 500 extra rules;
- layer 2, uncached: distinct queries through MiniLM + the head (teacher off);
- layer 2, repeated: the same query again, served from the embedding cache;
- batch: ``classify_many`` throughput.

    python benchmarks/bench_latency.py --json-out .bench/latency.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flywheel.classifier.assembly import build_classifier  # noqa: E402
from flywheel.classifier.rules import RuleEngine  # noqa: E402
from flywheel.classifier.settings.config import load_config  # noqa: E402
from flywheel.classifier.settings.intents import Rule  # noqa: E402


def timed(fn, n: int) -> np.ndarray:
    out = np.empty(n)
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        out[i] = time.perf_counter() - t0
    return out * 1000.0


def row(name: str, ms: np.ndarray) -> dict:
    return {"path": name, "n": int(len(ms)), "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)), "mean_ms": float(ms.mean())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--data", default=str(ROOT.parent / "shared/datasets/clinc150/data_full.json"))
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    os.environ.setdefault("FLYWHEEL_HOME", str(ROOT / ".bench" / "latency-home"))

    clf = build_classifier(load_config(teacher="off"), progress=False)
    queries = [t for t, _ in json.loads(Path(args.data).read_text())["test"]][: args.n * 2]
    clf.classify("warm up the encoder")
    rows = []
    rows.append(row("rules: classify() decided by layer 1",
                    timed(lambda i: clf.classify(f"usage percentage of {i % 100}%"), args.n)))
    eng = RuleEngine(list(clf.intents.rules) + [Rule(id=f"x{i}", intent="PLATFORM", priority=i % 9, kind="regex",
                                                     patterns=(rf"\bzz{i}qq\b",)) for i in range(500)])
    rows.append(row("rules: RuleEngine.match, 503 rules, no match",
                    timed(lambda i: eng.match(queries[i]), args.n)))
    rows.append(row("rules: RuleEngine.match, 503 rules, prefix rule hits",
                    timed(lambda i: eng.match("You are a direct and concise assistant. Hi"), args.n)))
    rows.append(row("layer 2: classify(), distinct queries (MiniLM + head)",
                    timed(lambda i: clf.classify(queries[args.n + i]), args.n)))
    rows.append(row("layer 2: classify(), repeated query (embedding cache hit)",
                    timed(lambda i: clf.classify(queries[args.n]), args.n)))
    emb = clf.embedder
    rows.append(row("embedding cache hit alone (CachedEmbedder.encode)",
                    timed(lambda i: emb.encode([queries[args.n]]), args.n)))
    batch = [f"{q} #{k}" for k in range(2) for q in queries[:512]]
    t0 = time.perf_counter()
    clf.classify_many(batch)
    qps = len(batch) / (time.perf_counter() - t0)

    print(f"# classify() latency, starter model, teacher off ({platform.node()}, {os.cpu_count()} CPUs, "
          f"{time.strftime('%Y-%m-%d')})\n")
    print("| path | n | p50 ms | p99 ms | mean ms |\n|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['path']} | {r['n']} | {r['p50_ms']:.4f} | {r['p99_ms']:.4f} | {r['mean_ms']:.4f} |")
    print(f"\nbatch: classify_many of {len(batch)} distinct queries: {qps:.0f} queries/s")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"rows": rows, "batch_qps": qps}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
