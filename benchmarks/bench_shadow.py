"""The cost of a shadow version on the sidecar, in one run: ``flywheel serve`` on a models
home serving the starter model (``v1``), with a shadow version (``v2``: the same head with a
lower confident cutoff, so it disagrees) set (``on``) or not (``off``), alternated
``--rounds`` times, each time the same number of distinct CLINC150 queries at concurrency
32; the ratio of the median throughputs (target >= 0.9). Also the share of layer-2 queries
the shadow scored (the rest were skipped as busy or never offered) and the shadow answers
logged, read from the ``on`` server's traffic log after it stopped. With ``--own-encoder``
the shadow is a version that carries its own tuned MiniLM (``flywheel train --tune-encoder``
on the starter intents in English), so the shadow's worker encodes its share itself.

    python benchmarks/bench_shadow.py --json-out .bench/shadow.json
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

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_sidecar import Server, load, queries, write_json  # noqa: E402

from flywheel.classifier.settings.config import load_config, starter_intents_path  # noqa: E402
from flywheel.classifier.versions.default import cached_model_dir  # noqa: E402
from flywheel.classifier.versions.registry import ModelRegistry  # noqa: E402
from flywheel.logstore import LogStore  # noqa: E402

MODES = ("off", "on")


def _version(src: Path, dst: Path, name: str, confident: float | None = None) -> None:
    shutil.copytree(src, dst)
    m = json.loads((dst / "manifest.json").read_text())
    m["version"] = name
    if confident is not None:
        m["thresholds"]["confident"] = confident
    (dst / "manifest.json").write_text(json.dumps(m))


def tuned_version(work: Path) -> Path:
    """``flywheel train --tune-encoder`` on the starter intents in English (MiniLM, tuned and
    exported into the version's ``encoder/``): a shadow that carries its own encoder."""
    en = work / "starter_en.yaml"
    en.write_text(starter_intents_path().read_text(encoding="utf-8").replace("languages: [en, es]", "languages: [en]"),
                  encoding="utf-8")
    out = work / "tuned-src"
    subprocess.run([sys.executable, "-m", "flywheel", "train", "--intents", str(en), "--out", str(out),
                    "--tune-encoder", "--tune-budget", "300", "--quiet"], cwd=ROOT, check=True, capture_output=True)
    return out


def setup(work: Path, own_encoder: bool = False) -> None:
    """A home per mode, each a models home with v1 (served) and v2; ``on`` shadows v2 (with
    ``own_encoder``, v2 carries a tuned MiniLM: the shadow encodes its share itself)."""
    starter = cached_model_dir(load_config(home=work / "home"), starter_intents_path())
    shadow_src = tuned_version(work) if own_encoder else starter
    for mode in MODES:
        home = work / mode
        home.mkdir()
        os.symlink(work / "home" / "cache", home / "cache")
        reg = ModelRegistry(home / "models")
        _version(starter, reg.version_dir("v1"), "v1")
        _version(shadow_src, reg.version_dir("v2"), "v2", confident=None if own_encoder else 0.3)
        reg.promote("v1")
        if mode == "on":
            reg.set_shadow("v2")


def shadow_coverage(home: Path) -> dict:
    store = LogStore(load_config(home=home).log_path)
    layer2 = store.query("SELECT count(*) FROM decisions WHERE l2_tier IS NOT NULL")[0][0]
    rows = store.query("SELECT count(*), count(DISTINCT decision_id) FROM labels WHERE source = 'shadow'")[0]
    return {"layer2_decisions": int(layer2), "shadow_answers": int(rows[0]),
            "scored_share": round(rows[1] / layer2, 4) if layer2 else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(ROOT.parent / "shared/datasets/clinc150/data_full.json"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-round", type=int, default=2500)
    ap.add_argument("--own-encoder", action="store_true",
                    help="the shadow carries its own tuned encoder (it encodes its share of the queries itself)")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="flywheel-bench-shadow-"))
    os.environ["FLYWHEEL_HOME"] = str(work / "home")
    subprocess.run([sys.executable, "-m", "flywheel", "classify", "--no-log", "--teacher", "off", "warm"],
                   cwd=ROOT, check=True, capture_output=True)          # trains the starter model once
    setup(work, own_encoder=args.own_encoder)
    texts = queries(args.data)
    runs: dict[str, list[float]] = {m: [] for m in MODES}
    cursor = 0
    for r in range(args.rounds):
        for mode in MODES:
            srv = Server(work / mode)
            batch = texts[cursor:cursor + args.per_round]
            cursor += args.per_round
            asyncio.run(load(srv.target, texts[-50:], 8))               # warm-up (same texts each time)
            res = asyncio.run(load(srv.target, batch, 32))
            srv.stop()
            runs[mode].append(res["throughput_qps"])
            print(f"round {r} shadow {mode}: {res['throughput_qps']} q/s ({res['codes']})", flush=True)
    med = {m: float(np.median(v)) for m, v in runs.items()}
    result = {"machine": f"{platform.node()} {os.cpu_count()} CPUs", "date": time.strftime("%Y-%m-%d"),
              "python": platform.python_version(), "rounds": args.rounds, "queries_per_round": args.per_round,
              "concurrency": 32, "own_encoder": args.own_encoder, **{f"qps_{m}": v for m, v in runs.items()},
              **{f"median_{m}": v for m, v in med.items()},
              "ratio_on_over_off": round(med["on"] / med["off"], 3),
              "shadow": shadow_coverage(work / "on")}
    print(json.dumps(result), flush=True)
    write_json(result, args.json_out)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
