"""The out-of-scope gate under shift (issue 43): how many in-scope queries layer 2's gate
throws away, by language, before and after unsure rejections go to the teacher.

**Cross-lingual split** (the starter set): train on one language's examples of
``classifier/data/starter_intents.yaml`` (``languages: [en, es]`` as shipped; the file's
``# Spanish`` comment splits them, as in ``bench_crosslingual.py``), test on both
languages' held-out queries (``tests/data/heldout_queries.jsonl``, English, and
``heldout_queries_es.jsonl``, Spanish). Two gates: ``oos`` (that language's out-of-scope
examples and the synthetic negatives, as shipped: a learned gate), ``novelty`` (no
out-of-scope examples, the synthetic negatives as for any set: the novelty cut, the issue's
case) and ``novelty-bare`` (no out-of-scope rows at all, ``out_of_scope.synthetic: 0``).

**CLINC150 full**: fit on ``train`` + ``oos_train`` with the English defaults (MiniLM int8,
120 synthetic negatives), test on ``test`` + ``oos_test``.

Each fit is scored twice with the same vectors: ``before`` (the gate as it was: the
thresholds without the undertrained languages) and ``after``
(:func:`classifier.layer2.tiers.unsure_rejections`). Layer 2 alone, as the pipeline tiers it
(:func:`classifier.layer2.tiers.tier_rows` with the query languages the pipeline detects);
rules do not take part. Per test language:

- ``top1``: layer 2's top intent is right (in-scope rows, no gate);
- ``no_match``: the share of in-scope rows answered out of scope (tier ``no_match``);
- ``sure_no_match``: the share of in-scope rows layer 2 is *sure* are out of scope;
- ``to_teacher``: the share of in-scope rows layer 2 is unsure of (the teacher is asked);
- ``served``: with the teacher off, the served answer is right (in-scope rows; an unsure
  answer is served as layer 2's best guess, a rejection as out of scope);
- ``oos_recall``: with the teacher off, out-of-scope rows served as out of scope (CLINC150's
  definition, as ``flywheel eval`` computes it);
- ``served_oracle`` / ``oos_recall_oracle``: the same with a teacher that is always right on
  what layer 2 is unsure of (an upper bound: what reaches the teacher can be saved).

Run (a few minutes; most of it encoding CLINC150)::

    OMP_NUM_THREADS=1 python benchmarks/bench_gate_shift.py --json-out .bench/gate_shift.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import yaml

from flywheel.classifier.decision import Tier
from flywheel.classifier.encoders import make_embedder
from flywheel.classifier.language import LanguageDetector
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.layer2.shift import shifted_rows
from flywheel.classifier.layer2.tiers import Thresholds, tier_rows
from flywheel.classifier.protocols import Embedder
from flywheel.classifier.settings.intents import IntentSet, parse_intents
from flywheel.classifier.versions.model import IntentModel
from flywheel.training.eval.loaders import intent_set_from_data, load_labelled

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.bench_crosslingual import STARTER, spanish_examples  # noqa: E402
from benchmarks.bench_sidecar import write_json  # noqa: E402

HELDOUT = [ROOT / "tests/data/heldout_queries.jsonl", ROOT / "tests/data/heldout_queries_es.jsonl"]
CLINC = Path("/work/shared/datasets/clinc150/data_full.json")


def starter_set(lang: str, gate: str) -> IntentSet:
    """The starter set with only ``lang``'s examples; ``gate="novelty"`` drops the
    out-of-scope examples, ``"novelty-bare"`` the synthetic negatives too."""
    doc = yaml.safe_load(STARTER.read_text(encoding="utf-8"))
    spanish = spanish_examples(STARTER)
    keep = (lambda t: t in spanish) if lang == "es" else (lambda t: t not in spanish)
    for intent in doc["intents"]:
        intent["examples"] = [t for t in intent["examples"] if keep(t)]
    oos = doc["out_of_scope"]
    oos["examples"] = [t for t in oos["examples"] if keep(t)] if gate == "oos" else []
    if gate == "novelty-bare":
        oos["synthetic"] = 0
    return parse_intents(doc, source=f"starter-{lang}-{gate}")


def score(model: IntentModel, embedder: Embedder, texts: Sequence[str], truth: Sequence[str | None],
          langs: Sequence[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """``before`` and ``after`` figures by test language (and ``all``) for one fitted model."""
    X = embedder.encode(list(texts))
    scores = model.head.scores(X)
    th = Thresholds.for_model(model)
    labels = [str(c) for c in model.manifest.labels]
    detector = LanguageDetector(model.intents.languages)
    shifted = shifted_rows([detector.detect(t) for t in texts], th.undertrained)
    arms = {"before": tier_rows(scores, labels, replace(th, undertrained=frozenset())),
            "after": tier_rows(scores, labels, th, shifted)}
    top = np.asarray(labels, dtype=object)[scores.probs.argmax(axis=1)]
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for arm, res in arms.items():
        out[arm] = {}
        for lang in sorted(set(langs)) + ["all"]:
            rows = [j for j in range(len(texts)) if lang in ("all", langs[j])]
            out[arm][lang] = figures([res[j] for j in rows], [truth[j] for j in rows], [top[j] for j in rows])
    return out


def figures(res: list[Any], truth: list[str | None], top: list[str]) -> dict[str, Any]:
    """The shares the module docstring defines."""
    inn = [j for j, y in enumerate(truth) if y is not None]
    oos = [j for j, y in enumerate(truth) if y is None]

    def share(rows: list[int], ok: Any) -> float | None:
        return round(sum(bool(ok(j)) for j in rows) / len(rows), 4) if rows else None
    return {"n_in_scope": len(inn), "n_oos": len(oos),
            "top1": share(inn, lambda j: top[j] == truth[j]),
            "no_match": share(inn, lambda j: res[j].tier is Tier.NO_MATCH),
            "sure_no_match": share(inn, lambda j: res[j].tier is Tier.NO_MATCH and res[j].sure),
            "to_teacher": share(inn, lambda j: not res[j].sure),
            "served": share(inn, lambda j: res[j].label == truth[j]),
            "oos_recall": share(oos, lambda j: res[j].label is None),
            # with a teacher that is always right on what layer 2 is unsure of (an upper bound)
            "served_oracle": share(inn, lambda j: res[j].label == truth[j] or not res[j].sure),
            "oos_recall_oracle": share(oos, lambda j: res[j].label is None or not res[j].sure)}


def heldout() -> tuple[list[str], list[str | None], list[str]]:
    rows = [json.loads(line) for p in HELDOUT for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r["text"] for r in rows], [r["label"] for r in rows], [r["lang"] for r in rows]


def crosslingual() -> dict[str, Any]:
    texts, truth, langs = heldout()
    out: dict[str, Any] = {}
    embedder = None
    for gate in ("oos", "novelty", "novelty-bare"):
        for lang in ("en", "es"):
            intents = starter_set(lang, gate)
            embedder = embedder or make_embedder(intents.embedder, cache=False)
            t0 = time.perf_counter()
            model = fit_model(intents, embedder=embedder)
            out[f"train-{lang}/{gate}"] = {"language_rows": model.manifest.metrics.get("language_rows"),
                                           "seconds": round(time.perf_counter() - t0, 1),
                                           **score(model, embedder, texts, truth, langs)}
    return out


def clinc(path: Path) -> dict[str, Any]:
    train = load_labelled(path, fmt="clinc150", split="train")
    test = load_labelled(path, fmt="clinc150", split="test")
    intents = intent_set_from_data(train, name="clinc150")
    embedder = make_embedder(intents.embedder, cache=False)
    t0 = time.perf_counter()
    model = fit_model(intents, embedder=embedder)
    figs = score(model, embedder, test.texts, test.labels, ["en"] * len(test.texts))
    return {"encoder": embedder.id, "seconds": round(time.perf_counter() - t0, 1),
            **{arm: v["all"] for arm, v in figs.items()}}


def print_tables(res: dict[str, Any]) -> None:
    cols = ("top1", "no_match", "sure_no_match", "to_teacher", "served", "oos_recall")
    print("| train / gate | test lang | arm | n in | " + " | ".join(cols) + " |")
    print("|---|---|---|---:|" + "---:|" * len(cols))
    for key, arms in res.get("crosslingual", {}).items():
        for lang in ("en", "es"):
            for arm in ("before", "after"):
                f = arms[arm][lang]
                vals = ["" if f[c] is None else f"{100 * f[c]:.1f}%" for c in cols]
                print(f"| {key} | {lang} | {arm} | {f['n_in_scope']} | " + " | ".join(vals) + " |")
    if "clinc150" in res:
        c = res["clinc150"]
        for arm in ("before", "after"):
            f = c[arm]
            vals = ["" if f[k] is None else f"{100 * f[k]:.2f}%" for k in cols]
            print(f"| CLINC150 ({c['encoder']}) | en | {arm} | {f['n_in_scope']} | " + " | ".join(vals) + " |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clinc", type=Path, default=CLINC, help="CLINC150 data_full.json")
    ap.add_argument("--no-clinc", action="store_true")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args(argv)
    res: dict[str, Any] = {"crosslingual": crosslingual()}
    if not args.no_clinc:
        res["clinc150"] = clinc(args.clinc)
    print_tables(res)
    write_json(res, args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
