"""The flywheel benchmark across a fleet: ``--replicas`` serving processes share the stream
through an S3 store (a real SeaweedFS ``weed mini`` on loopback), and ``flywheel retrain``
runs as its own process against the store. Same data, seed model, simulated teacher and
windows as ``bench_flywheel.py``, so its table can be compared with the single-process run.

Per window: the window's queries are dealt round-robin to the replicas (each a
``benchmarks/fleet_replica.py`` process: ``open_runtime`` in fleet mode, audits off as in
the single-process run); each replica ships its spool; the retrain process mirrors the
bucket, trains, gates and promotes by compare-and-swap of ``models/CURRENT``; every replica
must then serve the fleet's version before the next window (its ``RegistrySync`` polls every
``--poll`` seconds). Layer-2 test accuracy is measured on the fleet's current version.

    python benchmarks/bench_flywheel_fleet.py --data ../shared/datasets/clinc150/data_full.json \
        --retrain-args "--llm-budget 0.05" --json-out .bench/flywheel-fleet.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_flywheel import add_arguments, layer2_accuracy, report, setup  # noqa: E402

from flywheel.classifier.encoders import make_embedder  # noqa: E402
from flywheel.classifier.layer2.fitter import fit_model  # noqa: E402
from flywheel.classifier.versions.registry import ModelRegistry  # noqa: E402
from flywheel.fleet.config import StoreConfig  # noqa: E402
from flywheel.fleet.objects import ObjectStore  # noqa: E402
from flywheel.fleet.registry import BucketRegistry  # noqa: E402
from tests.support.s3 import WeedServer  # noqa: E402
from tests.support.simulated_ollama import SimulatedOllama  # noqa: E402


class Replica:
    def __init__(self, i: int, work: Path, env: dict[str, str]) -> None:
        home = work / f"replica-{i}"
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "fleet_replica.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                     env={**env, "FLYWHEEL_HOME": str(home), "FLYWHEEL_REPLICA": f"r{i}"})
        self.ready = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"replica exited with {self.proc.wait()}")
        return json.loads(line)

    def ask(self, cmd: dict) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def stop(self) -> None:
        try:
            self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=60)
        except Exception:  # noqa: BLE001
            self.proc.kill()


def _parallel(fns) -> list:
    out = [None] * len(fns)

    def run(i, fn):
        out[i] = fn()
    ts = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--poll", type=float, default=0.5, help="replicas' FLYWHEEL_STORE_POLL")
    args = ap.parse_args()
    data, work, intents = setup(args, "flywheel-fleet-bench-")
    embedder = make_embedder(intents.embedder)
    test = data["test"] + data["oos_test"]
    X_test = embedder.encode([t for t, _ in test])
    test_truth = [None if lab == "oos" else lab for _, lab in test]
    stream = data["train"] + data["oos_train"]
    random.Random(args.seed).shuffle(stream)
    if args.limit:
        stream = stream[: args.limit]
    truth = {t: (None if lab == "oos" else lab) for split in ("train", "oos_train", "test", "oos_test")
             for t, lab in data[split]}

    weed = WeedServer(work / "s3")
    weed.start()
    replicas: list[Replica] = []
    rows = []
    try:
        env = {**os.environ, "AWS_ENDPOINT_URL": weed.endpoint, "AWS_ACCESS_KEY_ID": weed.access_key,
               "AWS_SECRET_ACCESS_KEY": weed.secret_key, "AWS_REGION": weed.region,
               "FLYWHEEL_STORE": f"s3://{weed.bucket}/bench", "FLYWHEEL_STORE_POLL": str(args.poll),
               "FLYWHEEL_SHIP_INTERVAL": "1", "FLYWHEEL_AUDIT_RATE": "0", "FLYWHEEL_TEACHER_TIMEOUT": "5"}
        os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
        objects = ObjectStore(StoreConfig.parse(env["FLYWHEEL_STORE"]))
        bucket = BucketRegistry(objects, ModelRegistry(work / "seed-home"))
        seed = fit_model(intents, embedder=embedder, version="v0-seed")
        seed.save(bucket.staging_dir("v0-seed"))
        bucket.promote(bucket.publish(bucket.staging_dir("v0-seed")), expected=None)
        with SimulatedOllama(truth, accuracy=args.accuracy, latency_s=args.latency_s,
                             latency_scale=args.latency_scale, seed=args.seed) as sim:
            env["OLLAMA_HOST"] = sim.url
            t0 = time.perf_counter()
            replicas = _parallel([lambda i=i: Replica(i, work, env) for i in range(args.replicas)])
            print(f"{args.replicas} replicas up in {time.perf_counter() - t0:.1f}s, serving "
                  f"{[r.ready['ready'] for r in replicas]}", flush=True)
            base = layer2_accuracy(bucket.load("v0-seed"), X_test, test_truth)
            rows.append({"window": 0, "queries": 0, "llm_share": None, "e2e_accuracy": None,
                         "layer2_test": base, "model": "v0-seed", "retrain": None})
            retrain_env = {**env, "FLYWHEEL_HOME": str(work / "retrain-home"), "FLYWHEEL_REPLICA": "retrain"}
            for w, start in enumerate(range(0, len(stream), args.retrain_every), 1):
                chunk = stream[start:start + args.retrain_every]
                t_serve = time.perf_counter()
                shares = [chunk[i::args.replicas] for i in range(args.replicas)]
                answers = _parallel([lambda r=r, s=s: r.ask({"q": [t for t, _ in s]})
                                     for r, s in zip(replicas, shares)])
                llm = right = 0
                for s, a in zip(shares, answers):
                    for (_, lab), (layer, label) in zip(s, a["answers"]):
                        llm += layer == "llm"
                        right += label == (None if lab == "oos" else lab)
                serve_s = time.perf_counter() - t_serve
                t_ship = time.perf_counter()
                shipped = sum(a["shipped"] for a in _parallel([lambda r=r: r.ask({"ship": True}) for r in replicas]))
                ship_s = time.perf_counter() - t_ship
                t_re = time.perf_counter()
                cmd = [sys.executable, "-m", "flywheel", "retrain", "--json", "--quiet", *args.retrain_args.split()]
                proc = subprocess.run(cmd, capture_output=True, text=True, env=retrain_env, cwd=ROOT)
                re_s = time.perf_counter() - t_re
                try:
                    out = json.loads(proc.stdout.strip().splitlines()[-1])
                except (IndexError, json.JSONDecodeError):
                    out = {"outcome": "error", "stderr": proc.stderr[-2000:], "rc": proc.returncode}
                current, _ = bucket.current()
                t_sync = time.perf_counter()
                served = _parallel([lambda r=r: r.ask({"wait": current, "timeout": 60})["version"] for r in replicas])
                sync_s = time.perf_counter() - t_sync
                l2 = layer2_accuracy(bucket.load(current), X_test, test_truth)
                row = {"window": w, "queries": start + len(chunk), "llm_share": llm / len(chunk),
                       "e2e_accuracy": right / len(chunk), "serve_s": round(serve_s, 1), "shipped_rows": shipped,
                       "ship_s": round(ship_s, 2), "retrain_s": round(re_s, 1), "sync_s": round(sync_s, 2),
                       "retrain": out.get("outcome"), "retrain_reason": out.get("reason"), "model": current,
                       "replicas_serving": served, "layer2_test": l2}
                rows.append(row)
                print(f"window {w:2d} ({row['queries']:5d} q): LLM share {row['llm_share']:.3f}  "
                      f"e2e acc {row['e2e_accuracy']:.3f}  layer-2 test acc {l2['accuracy']:.3f} "
                      f"(in-scope {l2['in_scope_accuracy']:.3f}, oos recall {l2['oos_recall']:.3f})  "
                      f"retrain: {row['retrain']} in {re_s:.0f}s; all replicas on {current}: "
                      f"{all(v == current for v in served)} after {sync_s:.2f}s", flush=True)
                if row["retrain"] == "error":
                    print(out.get("stderr", ""), file=sys.stderr)
            sim_counts = dict(sim.counts)
    finally:
        for r in replicas:
            r.stop()
        weed.stop()

    total_q = len(stream)
    sizes = [min(args.retrain_every, total_q - (r["window"] - 1) * args.retrain_every) for r in rows[1:]]
    summary = {
        "replicas": args.replicas, "queries": total_q, "teacher_accuracy_setting": args.accuracy,
        "llm_share_last_window": rows[-1]["llm_share"],
        "layer2_test_accuracy_final": rows[-1]["layer2_test"]["accuracy"],
        "e2e_accuracy_overall": float(np.average([r["e2e_accuracy"] for r in rows[1:]], weights=sizes)),
        "promotions": sum(r["retrain"] == "promoted" for r in rows[1:]),
        "rows_shipped": sum(r["shipped_rows"] for r in rows[1:]),
        "simulator": sim_counts,
    }
    report(rows, summary, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
