"""Is MiniLM + USE, concatenated, worth its cost? Measured with the project's own head and gate.

Issue 16 measured the concatenation with plain logistic regression on CLINC150 (95.96%
top-1 against 95.49% for MiniLM int8). This script measures it the way flywheel would
serve it: each encoder's vectors L2-normalised, concatenated (so each counts equally),
then :class:`~classifier.layer2.head.IntentHead` (temperature, out-of-scope gate, cutoffs) fitted
on CLINC150 train + oos_train and scored on test + oos_test with the served tier rule.
Then the starter intents (English and Spanish examples) on both held-out sets, and the
encoding time per query of each encoder on the same texts.

    python benchmarks/concat_encoders.py --json-out .bench/concat.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flywheel.classifier.encoders import make_embedder  # noqa: E402
from flywheel.classifier.layer2.head import IntentHead, set_coverage  # noqa: E402
from flywheel.classifier.layer2.scoring import normalise_rows  # noqa: E402
from flywheel.classifier.layer2.tiers import Thresholds  # noqa: E402
from flywheel.classifier.settings.intents import EmbedderSettings, load_intents  # noqa: E402

ENCODERS = {"minilm-int8": EmbedderSettings(backend="minilm"),
            "use-multilingual": EmbedderSettings(backend="use-multilingual")}


def encode_all(texts: list[str]) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    vecs, secs = {}, {}
    for name, settings in ENCODERS.items():
        emb = make_embedder(settings, cache=False)
        emb.encode(texts[:8])                      # load outside the timing
        t0 = time.perf_counter()
        vecs[name] = normalise_rows(emb.encode(texts))
        secs[name] = time.perf_counter() - t0
    vecs["concat"] = np.hstack([vecs["minilm-int8"], vecs["use-multilingual"]])
    secs["concat"] = secs["minilm-int8"] + secs["use-multilingual"]
    return vecs, secs


def served(head: IntentHead, X: np.ndarray, y: list[str | None]) -> dict[str, float]:
    s = head.scores(X)
    th = Thresholds(confident=head.thresholds_["confident"], ambiguous_ratio=head.thresholds_["ambiguous_ratio"],
                    oos=head.thresholds_["oos"], oos_confident=head.thresholds_["oos_confident"],
                    set_cutoff=head.thresholds_["set"], coverage=head.thresholds_["coverage"])
    rejected = s.rejected(th.oos)
    pred = np.where(rejected, None, head.classes_[s.probs.argmax(axis=1)])
    truth = np.array(y, dtype=object)
    ins = truth != None  # noqa: E711
    known = np.array([t in set(head.classes_) for t in truth])
    yi = np.searchsorted(head.classes_, truth[ins & known])
    cov, size = set_coverage(s.probs[ins & known], yi, th.set_cutoff)
    return {"accuracy": float((pred == truth).mean()), "in_scope_accuracy": float((pred[ins] == truth[ins]).mean()),
            "oos_recall": float((pred[~ins] == None).mean()) if (~ins).any() else None,  # noqa: E711
            "top1_in_scope": float((head.classes_[s.probs.argmax(1)][ins] == truth[ins]).mean()),
            "set_coverage": cov, "mean_set_size": size}


def clinc(data_path: Path) -> dict:
    data = json.loads(data_path.read_text())
    train = data["train"] + data["oos_train"]
    test = data["test"] + data["oos_test"]
    texts = [t for t, _ in train] + [t for t, _ in test]
    vecs, secs = encode_all(texts)
    lab = [None if x == "oos" else x for _, x in train + test]
    n = len(train)
    out = {}
    for name, V in vecs.items():
        head = IntentHead().fit(V[:n], lab[:n])
        out[name] = {**served(head, V[n:], lab[n:]), "encode_ms_per_query": 1000 * secs[name] / len(texts)}
        print(name, json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in out[name].items()}),
              flush=True)
    return out


def starter() -> dict:
    intents = load_intents(ROOT / "data" / "starter_intents.yaml")
    ex_texts, ex_labels = intents.training_pairs()
    out = {}
    for lang, f in (("en", "heldout_queries.jsonl"), ("es", "heldout_queries_es.jsonl")):
        rows = [json.loads(x) for x in (ROOT / "tests" / "data" / f).read_text().splitlines() if x.strip()]
        texts = list(ex_texts) + [r["text"] for r in rows]
        vecs, _ = encode_all(texts)
        y = [None if r["label"] in (None, "OUT_OF_SCOPE") else r["label"] for r in rows]
        for name, V in vecs.items():
            head = IntentHead().fit(V[:len(ex_texts)], list(ex_labels))
            out.setdefault(name, {})[lang] = served(head, V[len(ex_texts):], y)
    for name, r in out.items():
        print(name, {lang: round(v["accuracy"], 4) for lang, v in r.items()}, flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(ROOT.parent / "shared/datasets/clinc150/data_full.json"))
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    result = {"clinc150": clinc(Path(args.data)), "starter_heldout": starter()}
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
