"""A one-shot ``flywheel classify`` on the starter set with a cached model, before and after,
beside the sidecar's figure for the same query (issue 44: under 1 s).

Each source tree given with ``--tree NAME=PATH`` (e.g. ``before=/tmp/base`` from
``git worktree add /tmp/base <commit>``, ``after=.``) runs

    flywheel classify --teacher off "What is addVar in AVAP?"

in a fresh process (``python -m flywheel`` with ``PYTHONPATH=PATH``), the traffic log on, in
its own home (the first call trains and caches the starter model, the USE tokenizer and,
where the tree does it, the uncompressed USE weights: not timed). Then ``--runs`` timed calls
per tree, the trees taking turns so machine noise hits them alike. Reported per tree: the
median and max wall time, and the decision's ``latency_ms``, and the languages the calls
logged (they must agree across trees: the cheaper language pass must not change them).

The sidecar: ``flywheel serve`` from the last tree (same home, teacher off, log on); once it is
serving, ``--sidecar-calls`` ``Classify`` calls of the same query one at a time, p50 and p95
(the embedding cache answers all but the first: what a pod pays per call).

    python benchmarks/bench_oneshot.py --tree before=/tmp/base --tree after=. --json-out .bench/oneshot.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_sidecar import write_json  # noqa: E402

QUERIES = ("What is addVar in AVAP?", "¿Cuánto me queda de cuota este mes?")


def _env(tree: Path, home: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(tree), "FLYWHEEL_HOME": str(home), "OLLAMA_HOST": "http://127.0.0.1:9"}
    env.pop("FLYWHEEL_INTENTS", None)
    env.pop("FLYWHEEL_MODEL", None)
    return env


def _classify(tree: Path, home: Path, query: str) -> tuple[float, dict[str, Any]]:
    cmd = [sys.executable, "-m", "flywheel", "classify", "--teacher", "off", query]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=_env(tree, home), capture_output=True, text=True, cwd=tree)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{tree}: exit {done.returncode}: {done.stderr[-2000:]}")
    return wall, json.loads(done.stdout.splitlines()[-1])


def one_shot(trees: dict[str, Path], runs: int, tmp: Path) -> dict[str, Any]:
    homes = {name: tmp / f"home-{name}" for name in trees}
    for name, tree in trees.items():
        for q in QUERIES:
            _classify(tree, homes[name], q)         # trains, caches; not timed
    walls: dict[str, list[float]] = {name: [] for name in trees}
    last: dict[str, dict[str, Any]] = {}
    langs: dict[str, list[str]] = {name: [] for name in trees}
    for i in range(runs):
        for name, tree in (list(trees.items()) if i % 2 == 0 else list(trees.items())[::-1]):
            wall, decision = _classify(tree, homes[name], QUERIES[0])
            walls[name].append(wall)
            last[name] = decision
        for name, tree in trees.items():               # the language of another query (untimed)
            langs[name].append(_classify(tree, homes[name], QUERIES[i % 2])[1]["language"])
    return {name: {"wall_s_median": round(float(np.median(w)), 3), "wall_s_max": round(max(w), 3), "runs": len(w),
                   "latency_ms": last[name]["latency_ms"], "label": last[name]["label"],
                   "languages": langs[name]} for name, w in walls.items()}


def sidecar(tree: Path, home: Path, calls: int) -> dict[str, Any]:
    import grpc

    from benchmarks.bench_sidecar import Server
    from flywheel.service.protos.flywheel.v1 import classifier_pb2 as pb
    from flywheel.service.protos.flywheel.v1 import classifier_pb2_grpc as pb_grpc

    server = Server(home)
    try:
        lat = []
        with grpc.insecure_channel(server.target) as ch:
            stub = pb_grpc.IntentClassifierStub(ch)
            for _ in range(calls):
                t0 = time.perf_counter()
                stub.Classify(pb.ClassifyRequest(text=QUERIES[0]), timeout=30)
                lat.append((time.perf_counter() - t0) * 1000.0)
    finally:
        server.stop()
    a = np.asarray(lat)
    return {"calls": calls, "p50_ms": round(float(np.percentile(a, 50)), 2),
            "p95_ms": round(float(np.percentile(a, 95)), 2), "first_ms": round(lat[0], 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True, metavar="NAME=PATH",
                    help="a source tree to time (repeat; the sidecar runs from the last)")
    ap.add_argument("--runs", type=int, default=9, help="timed calls per tree")
    ap.add_argument("--sidecar-calls", type=int, default=200)
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args(argv)
    trees = {}
    for item in args.tree:
        name, sep, path = item.partition("=")
        if not sep or not Path(path).is_dir():
            ap.error(f"--tree wants NAME=PATH with an existing directory, got {item!r}")
        trees[name] = Path(path).resolve()
    with tempfile.TemporaryDirectory(prefix="bench-oneshot-") as tmp:
        res: dict[str, Any] = {"machine": platform.processor() or platform.machine(),
                               "one_shot": one_shot(trees, args.runs, Path(tmp))}
        last = list(trees)[-1]
        res["sidecar"] = sidecar(trees[last], Path(tmp) / f"home-{last}", args.sidecar_calls)
    for name, r in res["one_shot"].items():
        print(f"{name:<8} one-shot classify: median {r['wall_s_median']:.2f} s, max {r['wall_s_max']:.2f} s "
              f"({r['runs']} runs), latency_ms {r['latency_ms']}")
    s = res["sidecar"]
    print(f"sidecar ({last}): Classify p50 {s['p50_ms']} ms, p95 {s['p95_ms']} ms over {s['calls']} calls "
          f"(first {s['first_ms']} ms)")
    write_json(res, args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
