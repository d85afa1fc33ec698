"""What the promotion-gate tests share: two real heads that disagree on some queries of the
synthetic world, and the metrics the retrain job hands the gate."""

from __future__ import annotations

from typing import Any

from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.layer2.head import IntentHead
from flywheel.classifier.settings.intents import parse_intents
from flywheel.training.gate import evaluate_layer2
from flywheel.training.layer2 import layer2_predict
from flywheel.training.rows import LabelledSet
from tests.support.fakes import HashEmbedder
from tests.support.worlds import INTENT_DOC, sample


def heads_that_disagree() -> tuple[Any, Any, list[str], Any, list, list]:
    """Two heads that disagree on some queries, and their predictions on 1,500 queries:
    ``(champion, challenger, texts, X, champion_labels, challenger_labels)``."""
    intents = parse_intents(INTENT_DOC, source="synthetic.yaml")
    champion = fit_model(intents, embedder=HashEmbedder())
    challenger = fit_model(intents, embedder=HashEmbedder(), head=IntentHead(C=0.01))
    texts = [t for t, _ in sample(1500, 11)]
    X = HashEmbedder().encode(texts)
    p_cp, p_ch = layer2_predict(champion, X).labels, layer2_predict(challenger, X).labels
    return champion, challenger, texts, X, list(p_cp), list(p_ch)


def gate_metrics(model: Any, data: LabelledSet) -> dict:
    """What the retrain job hands the gate (training.report.model_metrics), on one set."""
    per = evaluate_layer2(model, data)
    return {"version": model.version, "n": per["n"], "accuracy": per["accuracy"], "oos_recall": per["oos_recall"],
            "llm_share": per["llm_share"], "llm_share_on": "eval", "eval": per}
