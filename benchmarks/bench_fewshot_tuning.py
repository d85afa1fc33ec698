"""Few-shot CLINC150 with and without encoder tuning (issue 22): ``flywheel eval --tune-encoder``.

For each shot count and seed it writes a split to a temporary directory (``k`` rows per
in-scope intent of CLINC150 ``train`` and ``oos`` rows of ``oos_train``, drawn with
``random.Random(seed)``; the test set is the full ``test`` + ``oos_test``, 5,500 rows), then
runs the two commands a user would run and reads their JSON::

    flywheel eval --train T --test S --json --latency-sample 0 --no-tune-encoder
    flywheel eval --train T --test S --json --latency-sample 0 --tune-encoder
    flywheel eval ... --tune-encoder --unlabelled POOL --tune-unlabelled SHARE   # --unlabelled-shares SHARE

``--backend use-multilingual --objective adapter`` measures the adapter on the numpy USE
default instead (issue 22 item 5): eval gets ``--intents`` with that encoder and
``--tune-objective adapter``.

Run it alone (tuning time is part of what it reports)::

    python benchmarks/bench_fewshot_tuning.py --data ../shared/datasets/clinc150/data_full.json \\
        --shots 5 10 --seeds 0 --json-out .bench/fewshot-tuning.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def banking77_doc(directory: Path) -> dict:
    """BANKING77 (PolyAI, CC BY 4.0: ``train.csv`` and ``test.csv``, columns text,category) as
    the CLINC150 layout this script reads; it has no out-of-scope rows."""
    import csv

    def rows(name: str) -> list[list[str]]:
        with open(directory / name, newline="", encoding="utf-8") as f:
            return [[r["text"], r["category"]] for r in csv.DictReader(f)]

    return {"train": rows("train.csv"), "test": rows("test.csv"), "oos_train": [], "oos_test": []}


def write_split(doc: dict, k: int, n_oos: int, seed: int, out: Path) -> tuple[Path, Path, Path]:
    """The k-shot training file, the test file, and the unlabelled pool (issue 35): the rest
    of the train split (in scope and out of scope), one text a line, labels dropped."""
    rng = random.Random(seed)
    by: dict[str, list] = collections.defaultdict(list)
    for text, label in doc["train"]:
        by[label].append([text, label])
    train = [row for label in sorted(by) for row in rng.sample(by[label], k)]
    oos = rng.sample(doc["oos_train"], n_oos)
    out.mkdir(parents=True, exist_ok=True)
    tr, te, pool = out / f"train-{k}-{seed}.json", out / "test.json", out / f"unlabelled-{k}-{seed}.txt"
    tr.write_text(json.dumps({"train": train, "oos_train": oos}))
    te.write_text(json.dumps({"test": doc["test"], "oos_test": doc["oos_test"]}))
    chosen = {t for t, _ in train} | {t for t, _ in oos}
    rest = [t for t, _ in doc["train"] + doc["oos_train"] if t not in chosen and "\n" not in t]
    pool.write_text("\n".join(rest) + "\n", encoding="utf-8")
    return tr, te, pool


def run_eval(train: Path, test: Path, home: Path, tune: bool, holdout: float | None = None, *,
             intents: Path | None = None, objective: str | None = None, calibration: str | None = None,
             unlabelled: Path | None = None, share: float | None = None, budget: float | None = None) -> dict:
    cmd = [sys.executable, "-m", "flywheel", "eval", "--train", str(train), "--test", str(test), "--json",
           "--latency-sample", "0", "--quiet"] + (["--tune-encoder"] if tune else ["--no-tune-encoder"]) \
        + (["--tune-holdout", str(holdout)] if tune and holdout is not None else []) \
        + (["--intents", str(intents)] if intents is not None else []) \
        + (["--tune-objective", objective] if tune and objective else []) \
        + (["--tune-calibration", calibration] if tune and calibration else []) \
        + (["--unlabelled", str(unlabelled), "--tune-unlabelled", str(share)] if tune and share else []) \
        + (["--tune-budget", str(budget)] if tune and budget else [])
    env = dict(os.environ, FLYWHEEL_HOME=str(home), FLYWHEEL_TEACHER="off", HF_HUB_OFFLINE="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rep = json.loads(proc.stdout)
    rep["wall_seconds"] = round(time.perf_counter() - t0, 1)
    return rep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared/datasets/clinc150/data_full.json"))
    ap.add_argument("--banking77", default=None,
                    help="a directory with BANKING77's train.csv and test.csv, instead of --data (use --oos 0)")
    ap.add_argument("--shots", type=int, nargs="+", default=[5, 10])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--oos", type=int, default=60, help="out-of-scope training rows")
    ap.add_argument("--holdouts", type=float, nargs="+", default=[None],
                    help="--tune-holdout values to run tuned (default: the command's own default)")
    ap.add_argument("--no-frozen", action="store_true", help="skip the untuned run")
    ap.add_argument("--backend", default=None,
                    help="embedder.backend of the base encoder (default: the command's, MiniLM for English)")
    ap.add_argument("--objective", default=None, help="--tune-objective (adapter: an adapter on the frozen encoder)")
    ap.add_argument("--calibrations", nargs="+", default=[None],
                    help="--tune-calibration values to run tuned, each with every --holdouts value "
                         "(default: the command's own default)")
    ap.add_argument("--unlabelled-shares", type=float, nargs="+", default=[],
                    help="also run tuned with the unlabelled stage at each of these budget shares, the rest of "
                         "the train split as its pool (issue 35)")
    ap.add_argument("--tune-budget", type=float, default=None, help="--tune-budget of every tuned run")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args(argv)
    doc = banking77_doc(Path(args.banking77)) if args.banking77 else json.loads(Path(args.data).read_text())
    rows = []
    with tempfile.TemporaryDirectory(prefix="fewshot-") as tmp:
        for k in args.shots:
            for seed in args.seeds:
                train, test, pool = write_split(doc, k, args.oos, seed, Path(tmp))
                intents = None
                if args.backend:   # --intents gives eval the encoder settings; the intents come from --train
                    intents = Path(tmp) / "encoder.yaml"
                    intents.write_text(json.dumps({"version": 1, "name": "encoder", "embedder": {
                        "backend": args.backend}, "intents": [{"name": n, "description": n, "examples": [n, n + "?"]}
                                                              for n in ("a", "b")]}))
                arms = ([] if args.no_frozen else [(False, None, None, None)]) + [
                    (True, h, c, None) for c in args.calibrations for h in args.holdouts] + [
                    (True, None, None, share) for share in args.unlabelled_shares]
                for tune, holdout, calibration, share in arms:
                    rep = run_eval(train, test, Path(tmp) / "home", tune, holdout, intents=intents,
                                   objective=args.objective, calibration=calibration, unlabelled=pool, share=share,
                                   budget=args.tune_budget)
                    t = rep.get("tuning", {})
                    stage = t.get("unlabelled_stage") or {}
                    row = {"shots": k, "seed": seed, "tuned": tune, "objective": t.get("objective"),
                           "unlabelled_share": share, "stage_rows": stage.get("rows"),
                           "stage_steps": stage.get("steps"), "stage_seconds": stage.get("seconds"),
                           "holdout": t.get("holdout"), "calibration": t.get("calibration"),
                           "held_out_rows": t.get("held_out_rows"), "accuracy": rep["accuracy"],
                           "in_scope_accuracy": rep["in_scope_accuracy"], "oos_recall": rep["oos_recall"],
                           "top1": rep.get("top1_accuracy_layer2"), "encoder": rep.get("encoder"),
                           "wall_seconds": rep["wall_seconds"], "tune_seconds": t.get("seconds"),
                           "steps": t.get("steps"), "export_seconds": t.get("export_seconds")}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(rows, indent=1))
    print("\n| shots | seed | tuned (calibration) | accuracy | in-scope | OOS recall | top-1 | wall s | tuning s |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        tuned = (f"yes ({r['calibration']}" + (f" {r['holdout']:g})" if r["calibration"] != "crossfit" else ")")
                 if r["tuned"] else "no")
        if r["unlabelled_share"]:
            tuned += f" + unlabelled {r['unlabelled_share']:g} ({r['stage_steps']} steps, {r['stage_seconds']} s)"
        print(f"| {r['shots']} | {r['seed']} | {tuned} | {100 * r['accuracy']:.2f} | "
              f"{100 * r['in_scope_accuracy']:.2f} | "
              f"{'' if r['oos_recall'] is None else format(100 * r['oos_recall'], '.1f')} | "
              f"{100 * (r['top1'] or 0):.2f} | {r['wall_seconds']:.0f} | {r['tune_seconds'] or ''} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
