"""The gRPC sidecar under load, against the same queries in process, in one run.

A real ``flywheel serve`` subprocess (starter intents and their default encoder, teacher off,
traffic log on) listens on 127.0.0.1; a bounded ``grpc.aio`` client sends distinct
CLINC150 queries (no embedding-cache hits: every level gets queries no level sent
before) at concurrency 1, 8, 32 and 64 and records throughput, p50 and p99. In the
same run the bench process classifies the same number of fresh queries in process
through ``classify_many`` (its own classifier, same model).

Also: the rules path's p99 end to end over loopback (on the settled server before the
load, and again right after it, while the traffic log is still writing), the time to
``RESOURCE_EXHAUSTED`` when the queue is full (a second server with a tiny queue),
failed calls during a SIGTERM run and during a hot-swap (promotion) run.

    python benchmarks/bench_sidecar.py --json-out .bench/sidecar.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flywheel.classifier.assembly import build_classifier  # noqa: E402
from flywheel.classifier.settings.config import load_config, starter_intents_path  # noqa: E402
from flywheel.classifier.versions.default import cached_model_dir  # noqa: E402
from flywheel.classifier.versions.registry import ModelRegistry  # noqa: E402
from flywheel.service.protos.flywheel.v1 import classifier_pb2 as pb  # noqa: E402
from flywheel.service.protos.flywheel.v1 import classifier_pb2_grpc as pb_grpc  # noqa: E402
from tests.support.servers import free_port  # noqa: E402

RULE_TEXT = "you are a direct and concise assistant. summarise this thread #{}"


def write_json(result: dict, path: str | None) -> None:
    """Write a benchmark's result to ``--json-out`` (nothing without one)."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=1))


def queries(path: str) -> list[str]:
    data = json.loads(Path(path).read_text())
    seen, out = set(), []
    for part in ("test", "val", "train", "oos_test", "oos_val"):
        for text, _ in data[part]:
            if text not in seen:
                seen.add(text)
                out.append(text)
    return out


class Server:
    """``flywheel serve`` as a subprocess, ready when health says SERVING."""

    def __init__(self, home: Path, *extra: str) -> None:
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        env = dict(os.environ, FLYWHEEL_HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "flywheel", "serve", "--address", self.target,
                                      "--teacher", "off", "--home", str(home), *extra],
                                     cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait_ready(120.0)

    def _wait_ready(self, limit_s: float) -> None:
        end = time.monotonic() + limit_s
        with grpc.insecure_channel(self.target) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while time.monotonic() < end:
                if self.proc.poll() is not None:
                    raise SystemExit(f"server exited: {self.proc.stderr.read().decode()[-2000:]}")
                try:
                    if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.2)
        raise SystemExit("server not ready in time")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)


async def load(target: str, texts: list[str], concurrency: int, *, deadline_s: float = 30.0,
               stop_after_s: float | None = None, on_start=None) -> dict:
    """Send every text once with at most ``concurrency`` calls in flight; per-call latency
    and status codes. Bounded by the list and by ``stop_after_s``."""
    lat: list[float] = []
    codes: dict[str, int] = {}
    it = iter(texts)
    t_end = None if stop_after_s is None else time.perf_counter() + stop_after_s
    async with grpc.aio.insecure_channel(target) as ch:
        stub = pb_grpc.IntentClassifierStub(ch)

        async def worker() -> None:
            for text in it:
                if t_end is not None and time.perf_counter() > t_end:
                    return
                t0 = time.perf_counter()
                try:
                    await stub.Classify(pb.ClassifyRequest(text=text), timeout=deadline_s)
                    code = "OK"
                    lat.append((time.perf_counter() - t0) * 1000)
                except grpc.aio.AioRpcError as exc:
                    code = exc.code().name
                codes[code] = codes.get(code, 0) + 1

        t0 = time.perf_counter()
        tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
        if on_start is not None:
            on_start()
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    ms = np.array(lat) if lat else np.zeros(1)
    return {"concurrency": concurrency, "calls": sum(codes.values()), "codes": codes, "wall_s": round(wall, 3),
            "throughput_qps": round(codes.get("OK", 0) / wall, 1),
            "p50_ms": round(float(np.percentile(ms, 50)), 2), "p99_ms": round(float(np.percentile(ms, 99)), 2)}


def exhausted_latency(target: str, flood: int = 48, probes: int = 50, flood_s: float = 2.0) -> dict:
    """Keep a tiny-queue server full with ``flood`` concurrent callers, and meanwhile send
    ``probes`` calls one at a time: how fast a probe is refused with RESOURCE_EXHAUSTED."""
    async def run() -> dict:
        probe: list[tuple[str, float]] = []
        flood_codes: dict[str, int] = {}
        async with grpc.aio.insecure_channel(target) as ch:
            stub = pb_grpc.IntentClassifierStub(ch)
            end = time.perf_counter() + flood_s

            async def flooder(k: int) -> None:
                i = 0
                while time.perf_counter() < end:
                    i += 1
                    try:
                        await stub.Classify(pb.ClassifyRequest(text=f"flood {k} query {i} about lists"), timeout=30)
                        code = "OK"
                    except grpc.aio.AioRpcError as exc:
                        code = exc.code().name
                    flood_codes[code] = flood_codes.get(code, 0) + 1

            async def prober() -> None:
                await asyncio.sleep(0.3)                      # let the flood fill the queue
                for i in range(probes):
                    t0 = time.perf_counter()
                    try:
                        await stub.Classify(pb.ClassifyRequest(text=f"probe query {i} on maps"), timeout=30)
                        probe.append(("OK", (time.perf_counter() - t0) * 1000))
                    except grpc.aio.AioRpcError as exc:
                        probe.append((exc.code().name, (time.perf_counter() - t0) * 1000))
                    await asyncio.sleep(0.01)
            await asyncio.gather(prober(), *(flooder(k) for k in range(flood)))
        ex = np.array([ms for c, ms in probe if c == "RESOURCE_EXHAUSTED"])
        return {"flood_callers": flood, "flood_codes": flood_codes, "probes": probes,
                "probes_exhausted": int(len(ex)),
                "exhausted_p50_ms": round(float(np.percentile(ex, 50)), 2) if len(ex) else None,
                "exhausted_p99_ms": round(float(np.percentile(ex, 99)), 2) if len(ex) else None}
    return asyncio.run(run())


def rules_path(target: str, n: int) -> dict:
    res = asyncio.run(load(target, [RULE_TEXT.format(i) for i in range(n)], 1))
    return {"calls": res["calls"], "codes": res["codes"], "p50_ms": res["p50_ms"], "p99_ms": res["p99_ms"]}


def in_process(texts: list[str]) -> dict:
    cfg = load_config(teacher="off")
    clf = build_classifier(cfg, progress=False)
    clf.classify_many(["warm-up query"])
    t0 = time.perf_counter()
    clf.classify_many(texts)
    wall = time.perf_counter() - t0
    clf.close()
    return {"queries": len(texts), "wall_s": round(wall, 3), "throughput_qps": round(len(texts) / wall, 1)}


def sigterm_run(home: Path, texts: list[str], concurrency: int) -> dict:
    """Load, SIGTERM mid-way. Calls in flight must finish; calls made after shutdown
    began are refused with UNAVAILABLE (a balancer stops routing on NOT_SERVING)."""
    srv = Server(home, "--grace", "10")
    loop_result: dict = {}

    def kill_soon() -> None:
        asyncio.get_running_loop().call_later(1.5, srv.proc.send_signal, signal.SIGTERM)

    loop_result = asyncio.run(load(srv.target, texts, concurrency, stop_after_s=4.0, on_start=kill_soon))
    rc = srv.proc.wait(60)
    codes = loop_result["codes"]
    failed = sum(v for k, v in codes.items() if k not in ("OK", "UNAVAILABLE"))
    return {"exit_code": rc, "codes": codes, "ok": codes.get("OK", 0),
            "refused_unavailable": codes.get("UNAVAILABLE", 0), "failed": failed}


def swap_run(home: Path, texts: list[str], concurrency: int) -> dict:
    """Load while a new version is promoted: zero failed calls, both versions served."""
    models = home / "models-swap"
    src = cached_model_dir(load_config(), starter_intents_path())
    reg = ModelRegistry(models)
    for name in ("v-a", "v-b"):
        shutil.copytree(src, reg.version_dir(name))
        m = json.loads((reg.version_dir(name) / "manifest.json").read_text())
        m["version"] = name
        (reg.version_dir(name) / "manifest.json").write_text(json.dumps(m))
    reg.promote("v-a")
    srv = Server(home, "--model", str(models))
    versions: dict[str, int] = {}

    async def run() -> dict:
        codes: dict[str, int] = {}
        it = iter(texts)
        async with grpc.aio.insecure_channel(srv.target) as ch:
            stub = pb_grpc.IntentClassifierStub(ch)

            async def worker() -> None:
                end = time.perf_counter() + 8.0
                for text in it:
                    if time.perf_counter() > end:
                        return
                    try:
                        r = await stub.Classify(pb.ClassifyRequest(text=text), timeout=30)
                        versions[r.decision.model_version] = versions.get(r.decision.model_version, 0) + 1
                        codes["OK"] = codes.get("OK", 0) + 1
                    except grpc.aio.AioRpcError as exc:
                        codes[exc.code().name] = codes.get(exc.code().name, 0) + 1
            asyncio.get_running_loop().call_later(2.0, reg.promote, "v-b")
            await asyncio.gather(*(worker() for _ in range(concurrency)))
        return codes
    codes = asyncio.run(run())
    rc = srv.stop()
    return {"exit_code": rc, "codes": codes, "failed": sum(v for k, v in codes.items() if k != "OK"),
            "decisions_by_version": versions}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(ROOT.parent / "shared/datasets/clinc150/data_full.json"))
    ap.add_argument("--levels", default="1,8,32,64")
    ap.add_argument("--per-level", type=int, default=1200, help="distinct queries per concurrency level")
    ap.add_argument("--single", type=int, default=300, help="queries at concurrency 1")
    ap.add_argument("--rules", type=int, default=500)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()

    texts = queries(args.data)
    home = Path(tempfile.mkdtemp(prefix="flywheel-bench-sidecar-"))
    os.environ["FLYWHEEL_HOME"] = str(home)
    subprocess.run([sys.executable, "-m", "flywheel", "classify", "--no-log", "--teacher", "off", "warm"],
                   cwd=ROOT, check=True, capture_output=True)          # trains the starter model once
    cursor = 0

    def take(n: int) -> list[str]:
        nonlocal cursor
        out = texts[cursor:cursor + n]
        cursor += n
        return out

    result: dict = {"machine": f"{platform.node()} {os.cpu_count()} CPUs", "python": platform.python_version(),
                    "date": time.strftime("%Y-%m-%d"), "levels": []}
    srv = Server(home)
    try:
        asyncio.run(load(srv.target, take(50), 8))                    # warm the server's threads
        result["rules_path"] = rules_path(srv.target, args.rules)     # a settled server
        print(json.dumps(result["rules_path"]), flush=True)
        for c in (int(x) for x in args.levels.split(",")):
            r = asyncio.run(load(srv.target, take(args.single if c == 1 else args.per_level), c))
            result["levels"].append(r)
            print(json.dumps(r), flush=True)
        # right after the load: the log's writer and ingest threads are still busy with the
        # thousands of decisions just logged, and compete for the GIL
        result["rules_path_after_load"] = rules_path(srv.target, args.rules)
        print(json.dumps(result["rules_path_after_load"]), flush=True)
    finally:
        result["main_server_exit_code"] = srv.stop()
    result["in_process"] = in_process(take(args.per_level))
    print(json.dumps(result["in_process"]), flush=True)
    tiny = Server(home, "--max-queue", "4", "--max-batch", "1", "--max-wait-ms", "0")
    try:
        result["resource_exhausted"] = exhausted_latency(tiny.target)
    finally:
        tiny.stop()
    print(json.dumps(result["resource_exhausted"]), flush=True)
    result["sigterm"] = sigterm_run(home, take(3000), 16)
    print(json.dumps(result["sigterm"]), flush=True)
    result["swap"] = swap_run(home, take(3000), 16)
    print(json.dumps(result["swap"]), flush=True)

    by_c = {r["concurrency"]: r for r in result["levels"]}
    ratios = {}
    if 1 in by_c and 32 in by_c:
        ratios["c32_over_c1_throughput"] = round(by_c[32]["throughput_qps"] / by_c[1]["throughput_qps"], 2)
        ratios["c32_over_in_process_throughput"] = round(
            by_c[32]["throughput_qps"] / result["in_process"]["throughput_qps"], 2)
    if 1 in by_c and 8 in by_c:
        ratios["c8_p99_over_c1_p50"] = round(by_c[8]["p99_ms"] / by_c[1]["p50_ms"], 2)
    result["ratios"] = ratios
    result["targets"] = {
        "c32 throughput >= 3x c1": ratios.get("c32_over_c1_throughput", 0) >= 3,
        "c32 throughput >= 0.8x in-process classify_many": ratios.get("c32_over_in_process_throughput", 0) >= 0.8,
        "c8 p99 <= 4x c1 p50": ratios.get("c8_p99_over_c1_p50", 99) <= 4,
        "rules p99 <= 2 ms": result["rules_path"]["p99_ms"] <= 2.0,
        "no failed calls in the SIGTERM run": result["sigterm"]["failed"] == 0,
        "no failed calls in the swap run": result["swap"]["failed"] == 0,
    }
    print(json.dumps({"ratios": ratios, "targets": result["targets"]}, indent=1), flush=True)
    write_json(result, args.json_out)
    shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
