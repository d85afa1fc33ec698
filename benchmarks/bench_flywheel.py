"""The flywheel benchmark on CLINC150: does the LLM share fall while accuracy holds?

Layer 2 starts from 5 examples per intent. The 15,000 training queries plus the 100
out-of-scope training queries, shuffled with a fixed seed, are streamed as live
traffic through ``Classifier.classify()`` with the DuckDB log on. The teacher is a
simulated LLM behind a local server that speaks Ollama's API (right with probability
``--accuracy``, else a plausible wrong label, lognormal latency). Every
``--retrain-every`` queries the real ``flywheel retrain`` command runs in a separate
process against the same log while the serving process keeps it open; a promoted
version is hot-reloaded by the serving classifier.

Per window it reports: LLM share, end-to-end accuracy on the window, layer-2
accuracy on the CLINC150 test split (test + oos_test, out of scope counted as a
class), the retrain outcome and its wall time, and the retrain's teacher-noise
estimate and what its teacher filter dropped (or would drop, when it is off).

The teacher's errors (issue 24): ``--teacher-errors uniform`` (the default, the
protocol of BENCHMARKS.md §4) answers a wrong label uniformly among the offered intents,
or ``OUT_OF_SCOPE`` (``--wrong-oos-rate``, 0.3). ``--teacher-errors close`` errs on the
same queries and says ``OUT_OF_SCOPE`` on the same ones, but a wrong intent is the
offered intent closest to the query (cosine to the centroids of the seed intent
examples, in the served encoder: roughly the intent layer 2 ranks next), as LLMs err on
close intents (Sahu et al. 2022). ``--human-rate R`` gives that share of each window's
LLM decisions a human label (the true one, as ``flywheel feedback`` would), so the
retrain's noise estimate and its human-corrected-pair rule have something to read (0 by
default: the §4 protocol has no human labels). Filter on against off:
``--retrain-args "--llm-budget 0.05 --teacher-filter"`` and ``"... --no-teacher-filter"``.

Asking twice (issue 24 item 4): ``--position-bias P`` makes that share of the teacher's
wrong answers the first offered option instead (a small real LLM did that, §12.7: the only
errors that depend on the order of the options), and ``--ask-twice`` turns on
``teacher.ask_twice``. Per window, ``teacher_answers`` counts the teacher's answers that
became training labels (``labels``, ``labels_wrong`` against the truth), candidate sets
(``unsure``) and cache hits (``cached``); ``second_asks`` the extra calls.
The cache (item 5): ``--repeat-rate R`` replaces that share of the stream with a repeat of
an earlier query drawn uniformly; the summary has the cache's hits and misses.

    python benchmarks/bench_flywheel.py --data ../shared/datasets/clinc150/data_full.json \
        --json-out .bench/flywheel.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flywheel.classifier.decision import Layer  # noqa: E402
from flywheel.classifier.encoders import make_embedder  # noqa: E402
from flywheel.classifier.layer2.fitter import fit_model  # noqa: E402
from flywheel.classifier.layer2.tiers import Thresholds, assign_tiers  # noqa: E402
from flywheel.classifier.pipeline import Classifier  # noqa: E402
from flywheel.classifier.settings.intents import load_intents  # noqa: E402
from flywheel.classifier.teachers import CircuitBreaker, OllamaTeacher  # noqa: E402
from flywheel.classifier.versions.registry import ModelRegistry  # noqa: E402
from flywheel.logstore import LabelRecord, LogStore, label_records_to_table  # noqa: E402
from tests.support.simulated_ollama import OUT_OF_SCOPE, SimulatedOllama  # noqa: E402


class CloseErrorsOllama(SimulatedOllama):
    """The simulated teacher of ``--teacher-errors close``: right, wrong and out of scope on
    exactly the queries the uniform one is (the same per-query draws), but a wrong intent
    is the offered intent (other than the truth) whose seed-example centroid is closest
    to the query. ``counts["close"]`` counts the answers it redirected."""

    def __init__(self, truth: dict, *, embedder: Any, intents: Any, **kw: Any) -> None:
        super().__init__(truth, **kw)
        texts, labels = intents.training_pairs()
        X = np.asarray(embedder.encode(list(texts)), dtype=np.float64)
        by: dict[str, list[np.ndarray]] = defaultdict(list)
        for v, lab in zip(X, labels):
            if lab is not None:
                by[lab].append(v / (np.linalg.norm(v) or 1.0))
        self._centroids = {lab: np.mean(vs, axis=0) / (np.linalg.norm(np.mean(vs, axis=0)) or 1.0)
                           for lab, vs in by.items()}
        self._embedder = embedder
        self._vectors: dict[str, np.ndarray] = {}
        self._embed_lock = threading.Lock()

    def _vector(self, text: str) -> np.ndarray:
        with self._embed_lock:
            v = self._vectors.get(text)
            if v is None:
                v = np.asarray(self._embedder.encode([text])[0], dtype=np.float64)
                v = self._vectors[text] = v / (np.linalg.norm(v) or 1.0)
            return v

    def choose(self, text: str, offered: list[str]) -> tuple[str, str | None, bool]:
        answer, truth, right = super().choose(text, offered)
        if right or answer == OUT_OF_SCOPE:
            return answer, truth, right
        pool = [o for o in offered if o != OUT_OF_SCOPE and o != truth and o in self._centroids]
        if not pool:
            return answer, truth, right
        v = self._vector(text)
        close = max(sorted(pool), key=lambda lab: float(self._centroids[lab] @ v))
        if close != answer:
            self._count("close")
        return close, truth, False



def teacher_filter_fields(out: dict) -> dict:
    """The retrain's one teacher-label filter section (``teacher_filter``) as this benchmark's
    row fields: the evidence rules' drops (``teacher_filtered``, comparable with earlier
    records), what they would drop when off, and the noisy-teacher guard's drops (before
    issue 33 the report's ``dataset.noisy_teacher``; now ``noisy_teacher`` in the section)."""
    f = out.get("teacher_filter") or {}
    filtered = out.get("teacher_filtered")
    return {"teacher_filtered": None if filtered is None else {k: v for k, v in filtered.items()
                                                               if k != "noisy_teacher"},
            "teacher_would_drop": f.get("would_drop"),
            "noisy_teacher_dropped": (f.get("dropped") or {}).get("noisy_teacher")}

def starter_intents(train: list[list[str]], per_intent: int, seed: int, max_candidates: int,
                    deferral: str = "tiers") -> dict:
    by_label: dict[str, list[str]] = defaultdict(list)
    for text, label in train:
        by_label[label].append(text)
    rng = random.Random(seed)
    intents = []
    for label in sorted(by_label):
        intents.append({"name": label, "description": label.replace("_", " "),
                        "examples": rng.sample(by_label[label], per_intent)})
    return {"version": 1, "name": "clinc150-seed", "intents": intents,
            "teacher": {"model": "simulated", "max_candidates": max_candidates, "timeout_s": 5.0},
            "thresholds": {"deferral": deferral}}


def layer2_accuracy(model, X: np.ndarray, truth: list[str | None]) -> dict[str, float]:
    s = model.head.scores(X)
    th = Thresholds.for_model(model)
    labels = tuple(model.manifest.labels)
    t = assign_tiers(s, labels, th)
    pred, sure = t.labels(labels), t.sure
    pred_a = np.array(pred, dtype=object)
    truth_a = np.array(truth, dtype=object)
    ins = truth_a != None  # noqa: E711
    return {"accuracy": float((pred_a == truth_a).mean()),
            "in_scope_accuracy": float((pred_a[ins] == truth_a[ins]).mean()),
            "oos_recall": float((pred_a[~ins] == None).mean()),  # noqa: E711
            "llm_share_on_test": float(1 - np.mean(sure))}


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x:.1%}"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The stream, seed model and simulated teacher options every flywheel benchmark takes."""
    ap.add_argument("--data", default=str(ROOT.parent / "shared/datasets/clinc150/data_full.json"))
    ap.add_argument("--per-intent", type=int, default=5)
    ap.add_argument("--accuracy", type=float, default=0.9, help="simulated teacher accuracy")
    ap.add_argument("--latency-s", type=float, default=0.3, help="median teacher latency")
    ap.add_argument("--latency-scale", type=float, default=0.1, help="multiplier on the latency (time budget)")
    ap.add_argument("--retrain-every", type=int, default=1000)
    ap.add_argument("--max-candidates", type=int, default=20)
    ap.add_argument("--retrain-args", default="", help="extra arguments for flywheel retrain")
    ap.add_argument("--limit", type=int, default=None, help="stream only this many queries (smoke runs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--deferral", choices=("tiers", "risk"), default="tiers",
                    help="when layer 2 asks the teacher (thresholds.deferral)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json-out", default=None)


def add_teacher_arguments(ap: argparse.ArgumentParser) -> None:
    """This benchmark's teacher-noise options (issue 24; see the module docs)."""
    ap.add_argument("--teacher-errors", choices=("uniform", "close"), default="uniform",
                    help="where a wrong teacher answer falls: a uniformly random offered intent, or the offered "
                         "intent closest to the query (in both, --wrong-oos-rate of them are OUT_OF_SCOPE)")
    ap.add_argument("--wrong-oos-rate", type=float, default=0.3,
                    help="share of wrong answers on in-scope queries that are OUT_OF_SCOPE")
    ap.add_argument("--human-rate", type=float, default=0.0,
                    help="share of each window's LLM decisions that get a (true) human label")
    ap.add_argument("--position-bias", type=float, default=0.0,
                    help="share of wrong teacher answers that are the first offered option instead (order-dependent)")
    ap.add_argument("--unsure-rate", type=float, default=0.0,
                    help="share of the teacher's wrong answers given as a candidate set or 'cannot tell' instead")
    ap.add_argument("--ask-twice", action="store_true",
                    help="teacher.ask_twice: ask again, options reordered, when the teacher disagrees with layer 2")
    ap.add_argument("--repeat-rate", type=float, default=0.0,
                    help="share of the stream replaced by a repeat of a uniformly drawn earlier query "
                         "(the teacher cache's hit rate)")


def setup(args: argparse.Namespace, prefix: str) -> tuple[dict, Path, Any]:
    """The data set, the work directory and the seed intent set written into it."""
    data = json.loads(Path(args.data).read_text())
    work = Path(args.workdir or tempfile.mkdtemp(prefix=prefix))
    work.mkdir(parents=True, exist_ok=True)
    intents_file = work / "seed_intents.yaml"
    intents_file.write_text(yaml.safe_dump(starter_intents(data["train"], args.per_intent, args.seed,
                                                           args.max_candidates, args.deferral)))
    return data, work, load_intents(intents_file)


def report(rows: list[dict], summary: dict, args: argparse.Namespace) -> None:
    """Print the windows as a markdown table and the summary; write both to ``--json-out``."""
    print("\n| window | queries | LLM share | e2e acc | layer-2 test acc | stream-weighted | in-scope | OOS recall "
          "| retrain |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        l2 = r["layer2_test"]
        took = "" if r.get("retrain_s") is None else f" ({r['retrain_s']}s)"
        print(f"| {r['window']} | {r['queries']} | {_pct(r['llm_share'])} | {_pct(r['e2e_accuracy'])} | "
              f"{_pct(l2['accuracy'])} | {_pct(l2.get('accuracy_stream_weighted'))} | "
              f"{_pct(l2['in_scope_accuracy'])} | {_pct(l2['oos_recall'])} | "
              f"{r['retrain'] or ''}{took} |")
    print("\n" + json.dumps(summary, indent=2))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"summary": summary, "windows": rows, "args": vars(args)},
                                                  indent=2, default=str))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    add_teacher_arguments(ap)
    args = ap.parse_args()
    data, work, intents = setup(args, "flywheel-bench-")
    models_home, log_db = work / "models", work / "log.duckdb"
    registry = ModelRegistry(models_home)
    embedder = make_embedder(intents.embedder)

    t0 = time.perf_counter()
    seed_model = fit_model(intents, embedder=embedder, version="v0-seed")
    seed_model.save(registry.version_dir("v0-seed"))
    registry.promote("v0-seed")
    print(f"seed model: {len(intents.labels)} intents x {args.per_intent} examples "
          f"({time.perf_counter() - t0:.1f}s)", flush=True)

    test = data["test"] + data["oos_test"]
    test_texts = [t for t, _ in test]
    test_truth = [None if lab == "oos" else lab for _, lab in test]
    t0 = time.perf_counter()
    X_test = embedder.encode(test_texts, progress=True)
    print(f"embedded the test split ({len(test_texts)}) in {time.perf_counter() - t0:.1f}s", flush=True)

    stream = data["train"] + data["oos_train"]
    random.Random(args.seed).shuffle(stream)
    if args.limit:
        stream = stream[: args.limit]
    if args.repeat_rate > 0:   # the stream's length stays: a repeat takes a fresh query's place
        rep_rng, seen_q = random.Random(args.seed ^ 0x2E9E), []
        for i, item in enumerate(stream):
            if seen_q and rep_rng.random() < args.repeat_rate:
                stream[i] = rep_rng.choice(seen_q)
            else:
                seen_q.append(item)
    truth = {t: (None if lab == "oos" else lab) for split in ("train", "oos_train", "test", "oos_test")
             for t, lab in data[split]}

    rows = []
    sim_kw = dict(accuracy=args.accuracy, latency_s=args.latency_s, latency_scale=args.latency_scale,
                  seed=args.seed, wrong_oos_rate=args.wrong_oos_rate, position_bias=args.position_bias,
                  unsure_rate=args.unsure_rate)
    simulator = (CloseErrorsOllama(truth, embedder=embedder, intents=intents, **sim_kw)
                 if args.teacher_errors == "close" else SimulatedOllama(truth, **sim_kw))
    human_rng = random.Random(args.seed ^ 0x4A11)
    with simulator as sim:
        store = LogStore(log_db)
        sink = store.open_sink()
        teacher = OllamaTeacher("simulated", host=sim.url, timeout_s=5.0,
                                breaker=CircuitBreaker(intents.teacher.breaker_failures, 5.0))
        clf = Classifier.from_registry(models_home, embedder=embedder, teacher=teacher, log_sink=sink,
                                       interval_s=0.0, ask_twice=args.ask_twice)
        by_encoder = {embedder.id: X_test}

        def test_vectors(c: Classifier) -> np.ndarray:
            """The test split as the served version's encoder sees it (a tuned version carries its own)."""
            emb = c.embedder
            if emb.id not in by_encoder:
                t1 = time.perf_counter()
                by_encoder.clear()   # one tuned encoder at a time: the base one is re-made if needed
                by_encoder[emb.id] = emb.encode(test_texts)
                print(f"embedded the test split with {emb.id} in {time.perf_counter() - t1:.1f}s", flush=True)
            return by_encoder[emb.id]

        base = layer2_accuracy(clf.model, X_test, test_truth)
        print(f"window 0: layer-2 accuracy on test {base['accuracy']:.3f}", flush=True)
        rows.append({"window": 0, "queries": 0, "llm_share": None, "e2e_accuracy": None,
                     "layer2_test": base, "model": clf.model_version, "retrain": None})
        env = {**os.environ, "FLYWHEEL_HOME": str(work / "home")}
        for w, start in enumerate(range(0, len(stream), args.retrain_every), 1):
            chunk = stream[start:start + args.retrain_every]
            t_serve = time.perf_counter()
            llm = right = 0
            lat = []
            humans = []
            asks0 = clf.second_asks
            tl: Counter[str] = Counter()   # the teacher's answers by what becomes of them
            for text, lab in chunk:
                d = clf.classify(text)
                lat.append(d.latency_ms.get("total", 0.0))
                llm += d.layer is Layer.LLM
                right += d.label == (None if lab == "oos" else lab)
                if d.layer is Layer.LLM and "cached; " in d.reason:
                    tl["cached"] += 1
                elif d.teacher is not None and d.teacher.valid:   # a training label
                    tl["labels"] += 1
                    tl["labels_wrong"] += d.teacher.label != (None if lab == "oos" else lab)
                elif d.teacher is not None and (d.teacher.error or "").startswith("unsure"):
                    tl["unsure"] += 1
                if d.layer is Layer.LLM and args.human_rate > 0 and human_rng.random() < args.human_rate:
                    humans.append(LabelRecord.human(d.id, None if lab == "oos" else lab, author="bench"))
            serve_s = time.perf_counter() - t_serve
            sink.flush()
            if humans:   # one transaction, as feedback arriving between two retrains
                store.insert_objects([(f"bench-human-{w}", "labels", label_records_to_table(humans))])
            t_re = time.perf_counter()
            cmd = [sys.executable, "-m", "flywheel", "retrain", "--json", "--quiet",
                   "--models", str(models_home), "--log-db", str(log_db), *args.retrain_args.split()]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
            re_s = time.perf_counter() - t_re
            try:
                out = json.loads(proc.stdout.strip().splitlines()[-1])
            except (IndexError, json.JSONDecodeError):
                out = {"outcome": "error", "stderr": proc.stderr[-2000:], "rc": proc.returncode}
            clf.watcher.poll(force=True)
            l2 = layer2_accuracy(clf.model, test_vectors(clf), test_truth)
            row = {"window": w, "queries": start + len(chunk), "llm_share": llm / len(chunk),
                   "e2e_accuracy": right / len(chunk), "serve_s": round(serve_s, 1),
                   "latency_ms_p50": float(np.percentile(lat, 50)), "retrain_s": round(re_s, 1),
                   "retrain": out.get("outcome"), "retrain_reason": out.get("reason"),
                   "model": clf.model_version, "layer2_test": l2, "human_labels": len(humans),
                   "teacher_noise": out.get("teacher_noise"), **teacher_filter_fields(out),
                   "teacher_answers": dict(tl), "second_asks": clf.second_asks - asks0}
            rows.append(row)
            print(f"window {w:2d} ({row['queries']:5d} q): LLM share {row['llm_share']:.3f}  "
                  f"e2e acc {row['e2e_accuracy']:.3f}  layer-2 test acc {l2['accuracy']:.3f} "
                  f"(in-scope {l2['in_scope_accuracy']:.3f}, oos recall {l2['oos_recall']:.3f})  "
                  f"retrain: {row['retrain']} in {re_s:.0f}s; teacher filter "
                  f"{row['teacher_filtered'] if row['teacher_filtered'] is not None else '-'} "
                  f"(would drop {row['teacher_would_drop'] or '-'}; noisy teacher guard "
                  f"{row['noisy_teacher_dropped'] if row['noisy_teacher_dropped'] is not None else '-'}), noise "
                  f"{(row['teacher_noise'] or {}).get('estimate')} (n={(row['teacher_noise'] or {}).get('n')})",
                  flush=True)
            if row["retrain"] == "error":
                print(out.get("stderr", ""), file=sys.stderr)
        cache_counts = clf.teacher_cache.counts if clf.teacher_cache is not None else None
        second_asks = clf.second_asks
        clf.close()
        sim_counts = dict(sim.counts)

    total_q = sum(len(stream[i:i + args.retrain_every]) for i in range(0, len(stream), args.retrain_every))
    oos_share = sum(lab == "oos" for _, lab in stream) / max(len(stream), 1)
    for r in rows:   # layer-2 test accuracy as the stream would weigh it (CLINC150's test split is 18% out of scope)
        t = r["layer2_test"]
        t["accuracy_stream_weighted"] = (1 - oos_share) * t["in_scope_accuracy"] + oos_share * t["oos_recall"]
    sizes = [min(args.retrain_every, total_q - (r["window"] - 1) * args.retrain_every) for r in rows[1:]]
    tail, n_tail = 0.0, 0
    for r, n in zip(reversed(rows[1:]), reversed(sizes)):   # the last 3,000 queries
        take = min(n, 3000 - n_tail)
        tail, n_tail = tail + r["llm_share"] * take, n_tail + take
        if n_tail >= 3000:
            break
    summary = {
        "queries": total_q,
        "teacher_accuracy_setting": args.accuracy,
        "teacher_errors": args.teacher_errors,
        "human_labels": sum(r.get("human_labels", 0) for r in rows[1:]),
        "teacher_filtered_total": dict(sum((Counter(r.get("teacher_filtered") or {}) for r in rows[1:]), Counter())),
        "llm_share_last_window": rows[-1]["llm_share"],
        "llm_share_last_3000": tail / max(n_tail, 1),
        "stream_oos_share": oos_share,
        "layer2_test_accuracy_final": rows[-1]["layer2_test"]["accuracy"],
        "layer2_test_accuracy_final_stream_weighted": rows[-1]["layer2_test"]["accuracy_stream_weighted"],
        "e2e_accuracy_overall": float(np.average([r["e2e_accuracy"] for r in rows[1:]],
                                                 weights=[min(args.retrain_every, total_q - (r["window"] - 1)
                                                              * args.retrain_every) for r in rows[1:]])),
        "promotions": sum(r["retrain"] == "promoted" for r in rows[1:]),
        "simulator": sim_counts,
        "teacher_answers": dict(sum((Counter(r.get("teacher_answers") or {}) for r in rows[1:]), Counter())),
        "second_asks": second_asks,
        "teacher_cache": cache_counts,
        "repeats_in_stream": len(stream) - len(set(t for t, _ in stream)),
    }
    report(rows, summary, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
