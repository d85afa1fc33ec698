"""The retrain's records (:mod:`training.retrain`): one run's inputs (:class:`Job`), the
champion as the run read it (:class:`Champion`), the challengers (:class:`Challenger`, the
head-only one and the tuned one) and what they were made from (:class:`Trial`), their
evaluation (:class:`Evaluation`) and how the intent set changed (:class:`Change`,
:func:`intent_change`). Data only: the steps that
fill them are the retrain's, the report made of them is :mod:`training.report`'s.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from flywheel.classifier.protocols import Embedder, Registry
from flywheel.classifier.settings.intents import EmbedderSettings, IntentSet
from flywheel.classifier.text import normalise_key
from flywheel.classifier.versions.model import IntentModel, intents_to_doc
from flywheel.training.options import RetrainOptions
from flywheel.training.protocols import TrafficLog
from flywheel.training.rows import LabelledSet, TrainingSet
from flywheel.training.trainset import RECENT_HOLDOUT_SHARE, SPLIT_ID, held_out_examples, split_value
from flywheel.training.tuner.step import TunedStep

__all__ = ["Challenger", "Champion", "Change", "Evaluation", "Job", "Trial", "intent_change"]


@dataclass(frozen=True)
class Job:
    """One run's inputs; ``notes`` collects what the report should say."""

    store: TrafficLog
    registry: Registry
    intents: IntentSet
    embedder: Embedder
    opts: RetrainOptions
    notes: list[str] = field(default_factory=list)
    served_default: Path | None = None
    embedder_for: Callable[[EmbedderSettings], Embedder] | None = None   # a champion's own encoder (a switch)
    teacher: dict[str, Any] = field(default_factory=dict)   # steps 2b and 4a: noise estimate, filter report

    @property
    def target_precision(self) -> float:
        tp = self.opts.target_precision
        return float(tp if tp is not None else self.intents.thresholds.target_precision)

    def say(self, msg: str) -> None:
        if self.opts.progress:
            print(f"flywheel retrain: {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Evaluation:
    """The champion and the challengers on the same rows, each with its own encoder's
    vectors; ``gate`` names the gate set; ``challenger`` (on ``sets``) is the one put
    forward (``choice`` says which and why), ``head_only`` and ``tuned`` both challengers."""

    gate: str
    sets: dict[str, LabelledSet]
    challenger: dict[str, Any]
    champion: dict[str, Any] | None
    champion_sets: dict[str, LabelledSet] | None = None
    head_only: dict[str, Any] | None = None
    tuned: dict[str, Any] | None = None
    choice: dict[str, Any] = field(default_factory=dict)
    change: Change | None = None


@dataclass(frozen=True)
class Change:
    """How the intent set differs from the champion's: the intents added, removed and
    shared, whether examples, rules or settings changed too, and the normalised texts the
    champion may have trained on (``seen``: never gate rows).

    When ``intents`` differs from the champion's bundled set (an example added, an intent
    added, removed or renamed: a rename is a removal plus an addition), the run moves to the
    new set with the labels already logged: labels of removed intents are dropped and
    counted (``dataset.dropped_unknown_intent``, ``intent_change`` in the report, the
    summary), and the challenger trains on the new file plus the logged teacher and human
    labels. It is gated on the ``shared`` set: the held-out rows (``eval`` and ``recent``)
    whose label both sets know, out of scope included, less every text the champion may have
    trained on (its examples its own split did not hold out; new examples it may have seen
    as logged teacher rows), with :func:`training.gate.decide_changed`: the champion cannot
    serve the new file, so the challenger is kept out only when it is measurably worse there."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    shared: frozenset[str]
    seen: frozenset[str]
    dropped: dict[str, int]       # labels of removed intents dropped from the log, per label

    def rows(self, data: LabelledSet) -> LabelledSet:
        """``data``'s rows whose label both sets know (out of scope included) and whose text
        the champion did not train on."""
        return data.select(i for i, (t, y) in enumerate(zip(data.texts, data.labels))
                           if (y is None or y in self.shared) and normalise_key(t) not in self.seen)

    def words(self) -> str:
        parts = [f"added {', '.join(self.added)}" if self.added else "",
                 (f"removed {', '.join(self.removed)} ({sum(self.dropped.values()):,} logged labels dropped)"
                  if self.removed else ""),
                 "" if self.added or self.removed else "same intents, other examples, rules or settings"]
        return "; ".join(p for p in parts if p)

    def report(self, n_shared: int) -> dict[str, Any]:
        return {"added": list(self.added), "removed": list(self.removed), "shared": sorted(self.shared),
                "labels_dropped": dict(self.dropped), "labels_dropped_total": sum(self.dropped.values()),
                "champion_trained_texts_left_out": len(self.seen), "gate_rows": n_shared}


@dataclass(frozen=True)
class Champion:
    """The served version as the run read it: its name and token (for the compare-and-swap
    promotion) and the model, when it is usable here (else ``None``, and a note says why).
    ``embedder``: its own encoder when it carries one (``None``: the served encoder's
    vectors are its vectors); ``encoded`` caches the evaluation sets it re-encoded."""

    name: str | None
    token: str | None
    model: IntentModel | None
    embedder: Embedder | None = None
    encoded: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class Challenger:
    """One challenger as the retrain made it (step 5 and 6), the head-only one or the tuned
    one: the rows it was fitted on, the model as fitted and as served, the result of
    re-tuning its cutoffs (:func:`training.cutoffs.retune`) and the fit's seconds.
    ``step``: the encoder tuning it carries (``None``: the head-only challenger, on the
    served encoder's vectors)."""

    ts: TrainingSet               # its training rows (the tuned one's re-encoded by its encoder)
    fitted: IntentModel           # as fitted: the cross-validation thresholds
    model: IntentModel            # with the re-tuned cutoffs: what is evaluated and saved
    cutoffs: dict[str, Any]       # how the cutoffs were re-tuned (report ``thresholds.tuning``)
    t_fit: float
    step: TunedStep | None = None  # the tuned encoder and its rows (None: head-only)


@dataclass
class Trial:
    """The challengers and what they were made from: everything a (re-)gate needs."""

    ts: TrainingSet
    head_only: Challenger         # on the served encoder's vectors
    run_at: float
    t_start: float
    t_data: float
    notes_before_gate: int = 0    # job.notes up to here hold for any champion
    moves: list[tuple[str | None, str | None]] = field(default_factory=list)  # (expected, found) per move
    tuned: Challenger | None = None   # the tuned challenger (encoder tuning on, and it worked)
    tune_report: dict[str, Any] | None = None   # the encoder tuning step's report (None: tuning off)
    pick: str | None = None       # the challenger put forward at the first gate ("head_only" / "tuned")


def intent_change(intents: IntentSet, champion: IntentModel, ts: TrainingSet) -> Change | None:
    """How ``intents`` differs from the champion's bundled intent set (``None``: not at
    all). ``seen``: the champion's intent examples its own split did not hold out (all of
    them for a champion the retrain did not train), and the new examples it may have
    trained on as logged teacher rows (teacher texts outside the recent holdout)."""
    old, new = champion.intents, intents
    if intents_to_doc(old) == intents_to_doc(new):
        return None
    old_texts, old_labels = old.training_pairs()
    old_keys = {normalise_key(t) for t in old_texts}
    held = held_out_examples(old_texts, old_labels) if champion.manifest.metrics.get("eval_split") == SPLIT_ID \
        else set()
    new_keys = {normalise_key(t) for t in new.training_pairs()[0]} - old_keys
    seen = (old_keys - held) | {k for k in new_keys if k in ts.logged_keys and split_value(k) >= RECENT_HOLDOUT_SHARE}
    dropped = ts.report.get("dropped_unknown_intent", {}).get("by_label", {})
    return Change(tuple(sorted(set(new.labels) - set(old.labels))), tuple(sorted(set(old.labels) - set(new.labels))),
                  frozenset(set(new.labels) & set(old.labels)), frozenset(seen), dict(dropped))
