"""Fleet mode's costs, in one run against a real S3 server (SeaweedFS ``weed mini`` on
loopback, the tests' fixture):

1. **Sidecar throughput, shipping on against off**: ``flywheel serve`` with the local DuckDB
   log (off: no store) and in fleet mode (on: the spool ships to the store every
   ``--ship-interval`` s), alternated ``--rounds`` times, the same number of distinct
   CLINC150 queries at concurrency 32 each time; ratio of the medians.
2. **Rows shipped per second**: ``--rows`` decisions (384-d vectors) spooled with shipping
   paused, then one :class:`fleet.shipper.ObjectShipper` drain, timed.
3. **Mirror time per 100k rows**: :func:`fleet.mirror.mirror` of those objects into an
   empty DuckDB log, and a second (no-op) mirror.
4. **Promotion propagation**: ``--replicas`` fleet-mode sidecars; ``--promotions`` times a
   compare-and-swap of ``models/CURRENT`` between two versions, then the time until every
   replica's ``GetModelInfo`` names the new version (p50, p99), with the replicas'
   ``FLYWHEEL_STORE_POLL`` as given (default 5 s, the shipped default).

    python benchmarks/bench_fleet.py --json-out .bench/fleet.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_sidecar import Server, load, queries, write_json  # noqa: E402

from flywheel.classifier.decision import Decision, Layer, Tier  # noqa: E402
from flywheel.classifier.protocols import DecisionRecord  # noqa: E402
from flywheel.classifier.settings.config import load_config, starter_intents_path  # noqa: E402
from flywheel.classifier.versions.default import cached_model_dir  # noqa: E402
from flywheel.classifier.versions.registry import ModelRegistry  # noqa: E402
from flywheel.fleet.config import StoreConfig  # noqa: E402
from flywheel.fleet.mirror import mirror  # noqa: E402
from flywheel.fleet.objects import ObjectStore  # noqa: E402
from flywheel.fleet.registry import BucketRegistry  # noqa: E402
from flywheel.fleet.shipper import ObjectShipper  # noqa: E402
from flywheel.logstore import LogStore, SpoolSink  # noqa: E402
from flywheel.service.protos.flywheel.v1 import classifier_pb2 as pb  # noqa: E402
from flywheel.service.protos.flywheel.v1 import classifier_pb2_grpc as pb_grpc  # noqa: E402
from tests.support.s3 import WeedServer  # noqa: E402


def store_env(weed: WeedServer, prefix: str, **extra: str) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": weed.endpoint, "AWS_ACCESS_KEY_ID": weed.access_key,
            "AWS_SECRET_ACCESS_KEY": weed.secret_key, "AWS_REGION": weed.region,
            "FLYWHEEL_STORE": f"s3://{weed.bucket}/{prefix}", **extra}


MODES = ("off", "on", "held")   # local DuckDB log; fleet mode shipping; fleet mode, shipping held back


def throughput(home: Path, weed: WeedServer, texts: list[str], rounds: int, per_round: int,
               ship_interval: float, modes: tuple[str, ...] = ("off", "on")) -> dict:
    runs: dict[str, list[float]] = {m: [] for m in modes}
    cursor = 0
    for r in range(rounds):
        for mode in modes:
            env_before = dict(os.environ)
            if mode in ("on", "held"):   # "held": fleet mode whose spool ships only after the load
                interval = ship_interval if mode == "on" else 3600.0
                os.environ.update(store_env(weed, "bench-throughput", FLYWHEEL_SHIP_INTERVAL=str(interval)))
            try:
                srv = Server(home / mode)
                batch = texts[cursor:cursor + per_round]
                cursor += per_round
                asyncio.run(load(srv.target, texts[-50:], 8))          # warm-up (same texts each time)
                res = asyncio.run(load(srv.target, batch, 32))
                srv.stop()
            finally:
                os.environ.clear()
                os.environ.update(env_before)
            runs[mode].append(res["throughput_qps"])
            print(f"round {r} shipping {mode}: {res['throughput_qps']} q/s ({res['codes']})", flush=True)
    med = {m: float(np.median(v)) for m, v in runs.items()}
    out = {"rounds": rounds, "queries_per_round": per_round, "concurrency": 32,
           **{f"qps_{m}": v for m, v in runs.items()}, **{f"median_{m}": v for m, v in med.items()}}
    for m in modes:
        if m != "off" and "off" in med:
            out[f"ratio_{m}_over_off"] = round(med[m] / med["off"], 3)
    if "on" in med and "held" in med:
        out["ratio_on_over_held"] = round(med["on"] / med["held"], 3)
    return out


def _record(i: int, rng: np.random.Generator) -> DecisionRecord:
    d = Decision(label="RETRIEVAL", confidence=0.9, tier=Tier.CONFIDENT, layer=Layer.EMBEDDING,
                 reason="bench", model_version="v-bench", latency_ms={"embedding": 2.0})
    v = rng.standard_normal(384).astype(np.float32)
    return DecisionRecord(decision=d, text=f"benchmark query number {i} about addVar in AVAP", created_at=time.time(),
                          session_id=f"s{i % 100}", encoder_id="bench:384", embedding=v / np.linalg.norm(v))


def ship_and_mirror(work: Path, objects: ObjectStore, rows: int) -> dict:
    spool = work / "ship" / "log.duckdb.spool"
    spool.mkdir(parents=True)
    sink = SpoolSink(spool, drain=None, max_spool_bytes=None, fsync=False)
    rng = np.random.default_rng(0)
    for i in range(rows):
        sink.write(_record(i, rng))
    sink.flush()
    sink.close()
    segs = len(list(spool.glob("*.arrow")))
    shipper = ObjectShipper(objects)
    t0 = time.perf_counter()
    shipped = shipper.drain(spool, timeout_s=3600.0)
    ship_s = time.perf_counter() - t0
    store = LogStore(work / "mirror" / "log.duckdb")
    rep = mirror(objects, store)
    again = mirror(objects, store)
    return {"rows": rows, "segments": segs, "shipped": shipped, "ship_s": round(ship_s, 2),
            "rows_shipped_per_s": round(shipped / ship_s, 1), "mirror_rows": rep.rows,
            "mirror_s": round(rep.seconds, 2),
            "mirror_s_per_100k_rows": round(rep.seconds / rep.rows * 100_000, 2),
            "mirror_mib": round(rep.bytes / 2**20, 1), "second_mirror_s": round(again.seconds, 3),
            "count_after_two_mirrors": store.count()}


def _version(src: Path, dst: Path, name: str) -> Path:
    shutil.copytree(src, dst)
    m = json.loads((dst / "manifest.json").read_text())
    m["version"] = name
    (dst / "manifest.json").write_text(json.dumps(m))
    return dst


def propagation(work: Path, weed: WeedServer, objects: ObjectStore, replicas: int, promotions: int,
                poll: str) -> dict:
    src = cached_model_dir(load_config(), starter_intents_path())
    bucket = BucketRegistry(objects, ModelRegistry(work / "prop-admin"))
    names = ["v-prop-a", "v-prop-b"]
    for n in names:
        bucket.publish(_version(src, work / "prop-src" / n, n))
    bucket.promote(names[0], expected=None)
    env_before = dict(os.environ)
    os.environ.update({k: v for k, v in store_env(weed, "bench-prop", FLYWHEEL_STORE_POLL=poll).items()})
    servers = []
    try:
        servers = [Server(work / f"prop-replica-{i}") for i in range(replicas)]
        chans = [grpc.insecure_channel(s.target) for s in servers]
        stubs = [pb_grpc.IntentClassifierStub(c) for c in chans]
        lat = []
        for k in range(promotions):
            target = names[(k + 1) % 2]
            _, etag = bucket.current()
            t0 = time.perf_counter()
            bucket.promote(target, expected=etag, verify=False)
            pending = set(range(replicas))
            while pending and time.perf_counter() - t0 < 120:
                for i in list(pending):
                    if stubs[i].GetModelInfo(pb.GetModelInfoRequest(), timeout=5).version == target:
                        pending.discard(i)
                time.sleep(0.01)
            lat.append(time.perf_counter() - t0)
            print(f"promotion {k}: every replica on {target} after {lat[-1]:.2f}s"
                  + (f" ({len(pending)} never did)" if pending else ""), flush=True)
        for c in chans:
            c.close()
    finally:
        for s in servers:
            s.stop()
        os.environ.clear()
        os.environ.update(env_before)
    a = np.array(lat)
    return {"replicas": replicas, "promotions": promotions, "store_poll_s": float(poll),
            "p50_s": round(float(np.percentile(a, 50)), 3), "p99_s": round(float(np.percentile(a, 99)), 3),
            "max_s": round(float(a.max()), 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(ROOT.parent / "shared/datasets/clinc150/data_full.json"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-round", type=int, default=2500)
    ap.add_argument("--ship-interval", type=float, default=5.0)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--promotions", type=int, default=20)
    ap.add_argument("--poll", default="5")
    ap.add_argument("--modes", default="off,on", help=f"throughput modes, of {','.join(MODES)}")
    ap.add_argument("--parts", default="throughput,ship,propagation")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="flywheel-bench-fleet-"))
    os.environ["FLYWHEEL_HOME"] = str(work / "home")
    subprocess.run([sys.executable, "-m", "flywheel", "classify", "--no-log", "--teacher", "off", "warm"],
                   cwd=ROOT, check=True, capture_output=True)          # trains the starter model once
    for sub in MODES:                                                    # the servers' homes share that cache
        (work / sub).mkdir()
        os.symlink(work / "home" / "cache", work / sub / "cache")
    for i in range(args.replicas):
        (work / f"prop-replica-{i}").mkdir()
        os.symlink(work / "home" / "cache", work / f"prop-replica-{i}" / "cache")
    weed = WeedServer(work / "s3")
    weed.start()
    result: dict = {"machine": f"{platform.node()} {os.cpu_count()} CPUs", "date": time.strftime("%Y-%m-%d"),
                    "python": platform.python_version()}
    try:
        os.environ.update({k: v for k, v in store_env(weed, "x").items() if k.startswith("AWS_")})
        parts = set(args.parts.split(","))
        if "throughput" in parts:
            modes = tuple(m for m in args.modes.split(",") if m in MODES)
            result["throughput"] = throughput(work, weed, queries(args.data), args.rounds, args.per_round,
                                              args.ship_interval, modes)
            print(json.dumps(result["throughput"]), flush=True)
        if "ship" in parts:
            objects = ObjectStore(StoreConfig.parse(f"s3://{weed.bucket}/bench-ship"))
            result["ship_and_mirror"] = ship_and_mirror(work, objects, args.rows)
            print(json.dumps(result["ship_and_mirror"]), flush=True)
        if "propagation" in parts:
            prop_objects = ObjectStore(StoreConfig.parse(f"s3://{weed.bucket}/bench-prop"))
            result["propagation"] = propagation(work, weed, prop_objects, args.replicas, args.promotions,
                                                args.poll)
            print(json.dumps(result["propagation"]), flush=True)
    finally:
        weed.stop()
    write_json(result, args.json_out)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
