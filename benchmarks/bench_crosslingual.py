"""Cross-lingual transfer on the starter intents (issue 34 items 1 and 5): train on one
language's examples, score the English and the Spanish held-out queries, for USE frozen, e5
frozen and e5 tuned (``--tune-encoder``).

The training sets come from ``classifier/data/starter_intents.yaml`` as shipped (rules,
thresholds, tiers and ``languages: [en, es]`` unchanged), with only ``embedder.backend`` set
and the examples filtered:

- ``en``: each intent's (and out of scope's) examples *before* its ``# Spanish`` comment line;
- ``es``: the examples after it;
- ``all``: every example (the starter set as shipped).

The file's own structure decides the language (its examples lists put the Spanish ones after a
``# Spanish`` comment); lingua (``classifier.language.LanguageDetector``, restricted to en/es,
as served) is asked too, and the disagreements are printed and kept in the JSON, not used.

The test set is ``tests/data/heldout_queries.jsonl`` (65, English) and
``heldout_queries_es.jsonl`` (75, Spanish) in one file; their rows carry ``lang``, so one
command scores both (its ``by_language``) and a tuned arm tunes once. Each arm is the command a
user would run, in a subprocess::

    flywheel eval --intents SET.yaml --test heldout_en_es.jsonl --json --quiet --latency-sample 0 \\
        --no-tune-encoder | --tune-encoder --tune-budget B

Run it alone (tuning time is part of what it reports)::

    python benchmarks/bench_crosslingual.py --train-langs en es all --arms use e5 e5-tuned \\
        --tune-budget 3600 --json-out .bench/crosslingual.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from flywheel.classifier.encoders.backends import E5_MULTILINGUAL, USE_MULTILINGUAL

ROOT = Path(__file__).resolve().parents[1]
STARTER = ROOT / "classifier/data/starter_intents.yaml"
HELDOUT = [ROOT / "tests/data/heldout_queries.jsonl", ROOT / "tests/data/heldout_queries_es.jsonl"]
ARMS = {"use": (USE_MULTILINGUAL.id, False), "e5": (E5_MULTILINGUAL.id, False), "e5-tuned": (E5_MULTILINGUAL.id, True)}
SPANISH_MARK = re.compile(r"^\s*#\s*Spanish\s*$")


def spanish_examples(path: Path) -> set[str]:
    """The examples listed after a ``# Spanish`` comment line, up to the end of that list
    (the first line that is not a list item at the comment's indentation ends it)."""
    spanish: set[str] = set()
    indent = None   # the marker's indentation while inside a Spanish block
    for line in path.read_text(encoding="utf-8").splitlines():
        if SPANISH_MARK.match(line):
            indent = len(line) - len(line.lstrip())
            continue
        stripped = line.strip()
        if indent is None or not stripped:
            continue
        if len(line) - len(line.lstrip()) == indent and stripped.startswith("- "):
            spanish.add(yaml.safe_load(stripped)[0])
        else:
            indent = None
    return spanish


def lingua_disagreements(doc: dict, spanish: set[str]) -> list[dict]:
    """The examples whose lingua language (en/es, high accuracy) differs from the file's."""
    from flywheel.classifier.language import LanguageDetector

    detector = LanguageDetector(("en", "es"))
    texts = [t for i in doc["intents"] for t in i["examples"]] + doc["out_of_scope"]["examples"]
    out = []
    for t in texts:
        marked, found = ("es" if t in spanish else "en"), detector.detect(t)
        if found != marked:
            out.append({"text": t, "file": marked, "lingua": found})
    return out


def intent_file(doc: dict, spanish: set[str], lang: str, backend: str, out: Path) -> tuple[Path, dict]:
    keep = {"en": lambda t: t not in spanish, "es": lambda t: t in spanish, "all": lambda t: True}[lang]
    d = json.loads(json.dumps(doc))
    d["embedder"]["backend"] = backend
    counts = {}
    for intent in d["intents"]:
        intent["examples"] = [t for t in intent["examples"] if keep(t)]
        counts[intent["name"]] = len(intent["examples"])
    d["out_of_scope"]["examples"] = [t for t in d["out_of_scope"]["examples"] if keep(t)]
    counts["out_of_scope"] = len(d["out_of_scope"]["examples"])
    path = out / f"starter-{lang}-{backend}.yaml"
    path.write_text(yaml.safe_dump(d, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path, counts


def run_eval(intents: Path, test: Path, home: Path, tune: bool, budget: float | None) -> dict:
    cmd = [sys.executable, "-m", "flywheel", "eval", "--intents", str(intents), "--test", str(test), "--json",
           "--quiet", "--latency-sample", "0"] + (["--tune-encoder"] if tune else ["--no-tune-encoder"]) \
        + (["--tune-budget", str(budget)] if tune and budget is not None else [])
    env = dict(os.environ, FLYWHEEL_HOME=str(home), FLYWHEEL_TEACHER="off", HF_HUB_OFFLINE="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=4 * 3600)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rep = json.loads(proc.stdout)
    rep["wall_seconds"] = round(time.perf_counter() - t0, 1)
    return rep


def row_of(lang: str, arm: str, counts: dict, rep: dict) -> dict:
    t = rep.get("tuning") or {}
    row = {"train": lang, "arm": arm, "train_rows": counts, "encoder": rep.get("encoder"),
           "wall_seconds": rep["wall_seconds"], "tune_seconds": t.get("seconds"), "steps": t.get("steps"),
           "steps_planned": t.get("steps_planned"), "epochs_done": t.get("epochs_done"),
           "stopped_by_budget": t.get("stopped_early") if t else None, "calibration": t.get("calibration"),
           "crossfit_halves": t.get("crossfit_halves"), "quantized": t.get("quantized")}
    for code, s in (rep.get("by_language") or {}).items():
        row[code] = {k: s.get(k) for k in ("n", "n_in_scope", "accuracy", "in_scope_accuracy", "oos_recall")}
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train-langs", nargs="+", default=["en", "es", "all"], choices=["en", "es", "all"])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--tune-budget", type=float, default=None, help="--tune-budget of the tuned arm (seconds)")
    ap.add_argument("--home", default=None, help="FLYWHEEL_HOME for the commands (default: a temporary one)")
    ap.add_argument("--json-out", default=None, help="rows written here after every arm")
    args = ap.parse_args(argv)
    doc = yaml.safe_load(STARTER.read_text(encoding="utf-8"))
    spanish = spanish_examples(STARTER)
    disagree = lingua_disagreements(doc, spanish)
    print(json.dumps({"spanish_examples": len(spanish), "lingua_disagreements": disagree}, ensure_ascii=False),
          flush=True)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="crosslingual-") as tmp:
        test = Path(tmp) / "heldout_en_es.jsonl"
        test.write_text("".join(p.read_text(encoding="utf-8") for p in HELDOUT), encoding="utf-8")
        home = Path(args.home) if args.home else Path(tmp) / "home"
        for lang in args.train_langs:
            for arm in args.arms:
                backend, tune = ARMS[arm]
                intents, counts = intent_file(doc, spanish, lang, backend, Path(tmp))
                row = row_of(lang, arm, counts, run_eval(intents, test, home, tune, args.tune_budget))
                rows.append(row)
                print(json.dumps(row, ensure_ascii=False), flush=True)
                if args.json_out:
                    Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
                    Path(args.json_out).write_text(json.dumps({"lingua_disagreements": disagree, "rows": rows},
                                                              indent=1, ensure_ascii=False))
    print("\n| train | arm | EN accuracy | EN in-scope | ES accuracy | ES in-scope | ES OOS recall | "
          "steps (budget-cut?) | wall s |")
    print("|---|---|---:|---:|---:|---:|---:|---|---:|")
    pct = lambda v: "" if v is None else f"{100 * v:.1f}"   # noqa: E731
    for r in rows:
        en, es = r.get("en", {}), r.get("es", {})
        steps = "" if r["steps"] is None else f"{r['steps']}/{r['steps_planned']} ({r['stopped_by_budget']})"
        print(f"| {r['train']} | {r['arm']} | {pct(en.get('accuracy'))} | {pct(en.get('in_scope_accuracy'))} | "
              f"{pct(es.get('accuracy'))} | {pct(es.get('in_scope_accuracy'))} | {pct(es.get('oos_recall'))} | "
              f"{steps} | {r['wall_seconds']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
