"""How many synthetic negatives, at what weight: nonsense against real queries (BENCHMARKS.md §9.3).

For an intent file, fits layer 2 on its examples once per (count, weight) setting and
reports, from layer 2 alone (no rules, no teacher):

- accuracy on the English and Spanish held-out queries (``tests/data``);
- how many of the nonsense inputs (``nonsense()`` in ``tests/support/docs.py``) come out ``confident``,
  and how many are not ``no_match``;
- which short real turns ("hi", "y esto?", ...) come out ``no_match``.

    python benchmarks/nonsense_sweep.py data/starter_intents.yaml
    python benchmarks/nonsense_sweep.py my_english_only.yaml --grid 0:1 120:0.15
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flywheel.classifier.encoders import make_embedder  # noqa: E402
from flywheel.classifier.layer2.fitter import fit_from_vectors  # noqa: E402
from flywheel.classifier.layer2.negatives import synthetic_negatives  # noqa: E402
from flywheel.classifier.settings.intents import load_intents  # noqa: E402
from flywheel.training.layer2 import layer2_predict  # noqa: E402
from tests.support.docs import nonsense  # noqa: E402

SHORT = ["hi", "hola", "jajaja", "yes", "no", "ok", "thanks", "Thank you!", "gracias", "sigue", "and this?",
         "y esto?", "lol", "hello there", "buenas", "cool", "perfecto", "hmm", "👍"]


def rows(name: str) -> list[dict]:
    path = ROOT / "tests" / "data" / name
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("intents")
    ap.add_argument("--grid", nargs="+", default=["0:1", "120:1.0", "120:0.3", "120:0.2", "120:0.15", "120:0.1"],
                    help="count:weight settings")
    args = ap.parse_args()
    intents = load_intents(args.intents)
    emb = make_embedder(intents.embedder)
    texts, labels = intents.training_pairs()
    X = emb.encode(texts)
    sets = {"en": rows("heldout_queries.jsonl"), "es": rows("heldout_queries_es.jsonl")}
    vectors = {k: emb.encode([r["text"] for r in v]) for k, v in sets.items()}
    junk = [t[:intents.embedder.max_chars] for t in nonsense()]
    J, S = emb.encode(junk), emb.encode(SHORT)
    print(f"encoder {emb.id}; {len(junk)} nonsense inputs")
    for setting in args.grid:
        count, weight = int(setting.split(":")[0]), float(setting.split(":")[1])
        neg = emb.encode(list(synthetic_negatives(count))) if count else None
        model = fit_from_vectors(intents, X, labels, encoder_id=emb.id, negatives=neg, negative_weight=weight)
        acc = {k: np.mean([label == row["label"]
                           for label, row in zip(layer2_predict(model, vectors[k]).labels, sets[k])]) for k in sets}
        tiers = layer2_predict(model, J).tiers
        confident = tiers.count("confident")
        answered = len(tiers) - tiers.count("no_match")
        dropped = [t for t, tier in zip(SHORT, layer2_predict(model, S).tiers) if tier == "no_match"]
        print(f"count {count:4d} weight {weight:4.2f}: en {acc['en']:.3f} es {acc['es']:.3f} | nonsense confident "
              f"{confident}/{len(junk)}, not no_match {answered} | short turns no_match: {dropped}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
