"""The retrain job's data: distil the traffic log (teacher labels, human corrections on
top) plus the intent examples into a training set, and the FIXED evaluation split.

:func:`build_training_set` returns a :class:`TrainingSet`: the rows the new layer-2
head is fitted on (``texts``, ``labels`` with ``None`` = out of scope, ``vectors``,
``sources``; the intent examples of ``fit_intents`` first, then the logged rows), the
evaluation sets ``eval`` and ``recent``, the reduced intent set ``fit_intents`` (the
intent set without the held-out examples), and a ``report`` of counts (what was
merged, dropped and why, how many embeddings were reused). The rows go to
:func:`classifier.layer2.fitter.fit_from_vectors` as they are, vectors included.

The steps, in order (each a function here):

1. ``_read_log``: ingest the spool, then read the labelled rows (each with its latest
   human label's time) and the invalid teacher answers; rows whose text retention removed
   are kept apart (``_textless_rows``); a logged follow-up's text becomes what layer 2
   scored for it, its anchor's snippet and the query (:func:`training.followups.as_scored`);
2. ``_collect_groups``: merge intent examples and log rows by normalised text;
3. ``_resolve_labels``: one label per text (the rules below);
4. ``_fixed_split``: training, evaluation or recent-traffic holdout by hash;
5. ``_attach_vectors``: reuse logged vectors, embed the misses in one batch;
6. ``_self_training``: add layer 2's confident decisions (opt-in);
7. ``_report``: the counts.

The noisy-teacher guard below (teacher labels the champion and the intent examples both
contradict) is part of the retrain's one teacher-label filter step, after this one
(:func:`training.teacher_noise.check_training_set`, reported as ``teacher_filter``).

Rules
-----
- **Follow-ups.** A logged query the follow-up detector fires on, given its logged history,
  is a row of its resolved text (the anchor turn's snippet and the query, as layer 2 scores
  it); its logged vector (of the query alone) is never reused. Self-contained queries, and
  every query when the intent set's ``followups`` is ``off``, keep their own text (RC-03).
  Counted in the report's ``followups``.
- **Duplicates.** Texts are merged by :func:`classifier.text.normalise_key`; one
  merged text is one row.
- **Which label.** An intent example's label is the definition and wins over anything
  logged for the same text (disagreements are counted). Otherwise the latest human
  label wins; otherwise the majority of the *valid* teacher answers (a tie drops the
  text, counted). Invalid/failed teacher answers never become labels (the log store
  reports only valid ones; their number is in the report).
- **Removed intents.** A text whose resolved label names an intent that is no longer
  in the intent set is dropped (counted by label).
- **Self-training rows (opt-in, ``self_training_max > 0``).** Layer 2's own
  *confident* in-scope decisions, newest first, become training rows with source
  ``"layer2"`` (their logged vectors; nothing is re-embedded), unless the text has any
  other label (intent example, teacher or human, which always win) or names an intent
  no longer defined, or was a follow-up (its logged vector is of the query alone). The
  retrain job fits them at a lower weight and never uses them to fit the temperature,
  the gate or the cutoffs (see ``IntentHead.fit(fit_only=...)``):
  they are the easy queries, not a sample of the traffic. They are not evaluation rows
  and not counted in ``train_keys`` (the LLM-budget sample keeps them as traffic).
- **Noisy-teacher guard.** A *teacher* label (never a human one) on a training row is
  dropped when the champion's layer 2 is sure of a different label (``sure`` with its
  serving thresholds) AND the majority of the ``GUARD_K`` = 5 nearest training intent
  examples (cosine) is a different label too. Both have to disagree, so the guard
  cannot entrench the champion's own mistakes on its own.

The fixed evaluation split
--------------------------
Membership depends only on a hash of the normalised text (:func:`split_value`, a
number in [0, 1) from sha256), so it never changes between runs and a text never
moves from evaluation into training when more traffic arrives:

- intent examples: ``split_value < 0.20`` -> ``eval`` (but an intent, or out of scope,
  keeps every example when holding out would leave it fewer than 2 to train on; an
  example text listed under two intents always stays in training);
- human-labelled texts: ``split_value < 0.50`` -> ``eval``;
- teacher-labelled texts: ``split_value < 0.10`` -> held out; the most recent
  ``RECENT_MAX`` = 2,000 of them (by latest decision time) form ``recent``, the
  "recent traffic" slice. Older held-out texts are used for nothing.

Because the thresholds are nested (0.10 < 0.20 < 0.50), a teacher-labelled text that
is held out stays held out when a human labels it later. The noisy-teacher guard is
applied to training rows only; evaluation labels are never filtered by a model.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from flywheel.classifier.layer2.negatives import synthetic_negatives
from flywheel.classifier.settings.intents import IntentSet
from flywheel.classifier.text import normalise_key
from flywheel.training.followups import as_scored, followups_among
from flywheel.training.rows import SOURCES, LabelledSet, TrainingSet

if TYPE_CHECKING:
    from flywheel.classifier.protocols import Embedder
    from flywheel.training.protocols import TrafficLog

__all__ = ["SPLIT_ID", "EXAMPLE_EVAL_SHARE", "HUMAN_EVAL_SHARE", "RECENT_HOLDOUT_SHARE", "RECENT_MAX",
           "SELF_TRAINING_MAX", "build_training_set", "held_out_examples", "split_value", "split_role"]

#: Recorded in the manifests of models trained by the retrain job: they never saw
#: the evaluation rows of this split.
SPLIT_ID = "flywheel-hash-v1"
EXAMPLE_EVAL_SHARE = 0.20
HUMAN_EVAL_SHARE = 0.50
RECENT_HOLDOUT_SHARE = 0.10
RECENT_MAX = 2000
SELF_TRAINING_MAX = 20000   # default cap on self-training rows read from the log (the newest)


def split_value(text: str) -> float:
    """A fixed pseudo-random number in [0, 1) for the normalised ``text``.

    >>> split_value("Hello  World") == split_value("hello world")
    True
    """
    h = hashlib.sha256(("flywheel-split\x00" + normalise_key(text)).encode("utf-8")).digest()
    return int.from_bytes(h[:8], "big") / 2.0 ** 64


def split_role(text: str, source: str) -> str:
    """``"eval"``, ``"train"`` or ``"holdout"`` (teacher rows for the recent slice) by the
    hash rule alone (the per-intent minimum for intent examples is applied on top)."""
    u = split_value(text)
    if source == "intent_example":
        return "eval" if u < EXAMPLE_EVAL_SHARE else "train"
    if source == "human":
        return "eval" if u < HUMAN_EVAL_SHARE else "train"
    if source == "teacher":
        return "holdout" if u < RECENT_HOLDOUT_SHARE else "train"
    raise ValueError(f"unknown source {source!r} (known: {', '.join(SOURCES)})")


def held_out_examples(texts: Sequence[str], labels: Sequence[str | None]) -> set[str]:
    """The normalised intent examples the fixed split holds out for evaluation (see the
    module docs: ``split_value < 0.20``, unless that leaves the intent fewer than 2 to train
    on; an example listed under two intents stays in training). ``texts`` and ``labels``:
    an intent set's :meth:`~classifier.settings.intents.IntentSet.training_pairs`."""
    labels_of: dict[str, list[str | None]] = {}
    for text, label in zip(texts, labels):
        seen = labels_of.setdefault(normalise_key(text), [])
        if label not in seen:
            seen.append(label)
    by_label: dict[Any, list[str]] = {}
    for key, labs in labels_of.items():
        for lab in labs:
            by_label.setdefault(lab, []).append(key)
    held: set[str] = set()
    for keys in by_label.values():
        cand = {k for k in keys if len(labels_of[k]) == 1 and split_value(k) < EXAMPLE_EVAL_SHARE}
        if len(set(keys)) - len(cand) >= 2:
            held |= cand
    return held


@dataclass
class _Group:
    key: str
    text: str
    example_labels: list[str | None] = field(default_factory=list)
    humans: list[tuple[float, str | None, str]] = field(default_factory=list)  # (label time, label, id)
    votes: list[str | None] = field(default_factory=list)                        # valid teacher answers
    decisions: list[tuple[float, str]] = field(default_factory=list)             # (created_at, id)
    latest: float = float("-inf")


# ------------------------------------------------------------------- building
def _say(progress: bool) -> Callable[[str], None]:
    def say(msg: str) -> None:
        if progress:
            print(f"flywheel retrain: {msg}", file=sys.stderr, flush=True)
    return say


def _empty(dim: int) -> LabelledSet:
    return LabelledSet([], [], np.zeros((0, dim), dtype=np.float32), [], [])


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()


@dataclass
class _Log:
    """What was read from the traffic log."""

    rows: list                   # labelled rows (LogStore.labelled_rows) that still have their text
    until: float                 # unix time at which the log was read
    invalid: int                 # invalid/failed teacher answers (never labels)
    unsure: int = 0              # of them, unsure ones: a candidate set or "cannot tell"
    textless: list = field(default_factory=list)   # labelled rows whose text retention removed
    followups: frozenset = frozenset()   # ids of follow-ups trained on their resolved text (vectors not reused)
    followup_report: dict = field(default_factory=dict)


@dataclass
class _Resolved:
    """One label per normalised text (``labels``: key -> (label, source)) and what it cost."""

    labels: dict[str, tuple[str | None, str]]
    conflicts: Counter
    dropped_unknown: Counter


@dataclass
class _Split:
    """The fixed split, as normalised keys."""

    held_examples: set[str]      # intent examples held out for evaluation
    fit_intents: IntentSet       # the intent set without them
    eval_example_keys: list[str]  # held-out examples, in intent-file order
    train_log: list[str]         # logged texts to train on
    eval_log: list[str]          # held-out human-labelled texts
    holdout: list[str]           # held-out teacher-labelled texts, oldest first
    recent_keys: list[str]       # the newest RECENT_MAX of those


@dataclass
class _Parts:
    """The rows with their vectors, before the noisy-teacher guard."""

    examples: LabelledSet        # intent examples of ``fit_intents``
    train_log: LabelledSet
    eval: LabelledSet
    recent: LabelledSet
    embeddings: dict[str, Any]   # reused / computed counts and seconds
    negatives: np.ndarray | None  # vectors of the intent set's synthetic negatives (classifier.layer2.negatives)


def build_training_set(store: TrafficLog | None, intents: IntentSet, *, embedder: Embedder,
                       since: Any = None, progress: bool = False, self_training_max: int = 0) -> TrainingSet:
    """Build the training rows and the fixed evaluation split (see the module docs).

    Parameters
    ----------
    store : logstore.LogStore or None
        The traffic log (``None``: intent examples only).
    intents : IntentSet
        The intent set to train; labels outside it are dropped.
    embedder : Embedder
        Vectors logged with ``embedder.id`` are reused; only the misses are encoded, in
        one ``encode`` call.
    since : float or datetime, optional
        Only log rows whose decision or labels are that new (passed to
        :meth:`LogStore.labelled_rows`).
    self_training_max : int
        Add up to this many of layer 2's newest confident decisions as ``"layer2"``
        rows (0: none; see the module docs).
    """
    if self_training_max < 0:
        raise ValueError(f"self_training_max must be >= 0, got {self_training_max}")
    say = _say(progress)
    t_start = time.perf_counter()
    examples = intents.training_pairs()
    log = _read_log(store, since, intents.followups)
    groups = _collect_groups(examples, log)
    say(f"read {len(log.rows):,} labelled decisions from the log and {len(examples[0]):,} intent examples")
    resolved = _resolve_labels(groups, set(intents.labels))
    split = _fixed_split(groups, resolved, intents, examples[0])
    parts = _attach_vectors(store, embedder, groups, resolved, split, log.followups)
    e = parts.embeddings
    say(f"embeddings: {e['reused']:,} reused from the log, {e['computed']:,} computed ({e['seconds']:.2f}s)")
    train = parts.examples.concat(parts.train_log)
    train_keys = frozenset(normalise_key(t) for t in train.texts)   # before self-training: see module docs
    self_info, layer2_rows = _self_training(store, embedder, int(embedder.dim), groups, set(intents.labels),
                                            self_training_max, intents.followups)
    if len(layer2_rows):
        train = train.concat(layer2_rows)
        say(f"self-training: {len(layer2_rows):,} confident layer-2 decisions added")
    textless = _textless_rows(store, embedder, log.textless, set(intents.labels))
    if len(textless):
        train = train.concat(textless)
        say(f"{len(textless):,} decisions whose text retention removed train on their logged vectors")
    report = _report(len(examples[0]), log, groups, resolved, split, parts, self_info, train, t_start)
    report["text_removed"] = {"labelled_rows": len(log.textless), "trained": len(textless)}
    report["followups"] = log.followup_report
    say(_summary(train, parts))
    return TrainingSet(train.texts, train.labels, train.vectors, train.sources, train.decision_ids,
                       report=report, eval=parts.eval, recent=parts.recent, fit_intents=split.fit_intents,
                       log_until=log.until, train_keys=train_keys,
                       logged_keys=frozenset(k for k, g in groups.items() if g.decisions),
                       negatives=parts.negatives)


def _read_log(store: TrafficLog | None, since: Any, followups: str = "off") -> _Log:
    """The labelled rows (each with its latest human label's time; a follow-up's text as
    layer 2 scores it under the ``followups`` mode), the invalid teacher answers, and apart
    the labelled rows whose text retention removed."""
    if store is None:
        return _Log([], time.time(), 0, followup_report=as_scored([], followups).report())
    store.ingest()          # so that everything logged before ``until`` is in the tables
    until = time.time()
    rows = store.labelled_rows(since=since)
    invalid = store.invalid_teacher_answers()
    scored = as_scored([r for r in rows if r.text], followups)
    return _Log(scored.rows, until, invalid, unsure=store.unsure_teacher_answers(),
                textless=[r for r in rows if not r.text], followups=scored.rewritten,
                followup_report=scored.report())


def _textless_rows(store: TrafficLog | None, embedder: Embedder, rows: list, known: set[str]) -> LabelledSet:
    """Training-only rows for labelled decisions whose text retention removed: keyed by
    decision id (never merged, never held out), with their logged vector of this encoder
    (rows without one are skipped: there is no text to embed) and their own label (the
    latest human label, else the valid teacher majority; ties and removed intents dropped)."""
    dim = int(embedder.dim)
    picked = []
    for r in rows:
        if r.has_human_label:
            label, source = r.human_label, "human"
        else:
            ranked = Counter(r.teacher_labels).most_common()
            if not ranked or (len(ranked) > 1 and ranked[0][1] == ranked[1][1]):
                continue
            label, source = ranked[0][0], "teacher"
        if label is None or label in known:
            picked.append((r.decision_id, label, source))
    vecs = store.embeddings(embedder.id, [d for d, _, _ in picked]) if picked and store is not None else {}
    picked = [p for p in picked if p[0] in vecs and vecs[p[0]].size == dim]
    if not picked:
        return _empty(dim)
    return LabelledSet([""] * len(picked), [lab for _, lab, _ in picked],
                       np.stack([vecs[d] for d, _, _ in picked]).astype(np.float32, copy=False),
                       [src for _, _, src in picked], [d for d, _, _ in picked])


def _collect_groups(examples: tuple[list[str], list[str | None]], log: _Log) -> dict[str, _Group]:
    """Merge the intent examples, then the log rows, by normalised text."""
    groups: dict[str, _Group] = {}
    for text, label in zip(*examples):
        key = normalise_key(text)
        g = groups.get(key)
        if g is None:
            g = groups[key] = _Group(key, text)
        if label not in g.example_labels:
            g.example_labels.append(label)
    for r in log.rows:
        key = normalise_key(r.text)
        g = groups.get(key)
        if g is None:
            g = groups[key] = _Group(key, r.text)
        g.decisions.append((r.created_at, r.decision_id))
        if r.created_at >= g.latest:
            g.latest = r.created_at
            if not g.example_labels:
                g.text = r.text
        if r.has_human_label:
            g.humans.append((r.human_at or r.created_at, r.human_label, r.decision_id))
        g.votes.extend(r.teacher_labels)
    return groups


def _resolve_labels(groups: dict[str, _Group], known: set[str]) -> _Resolved:
    """One label per text: intent example > latest human label > valid teacher majority."""
    conflicts = Counter({"human_over_teacher": 0, "teacher_majority": 0, "teacher_tie_dropped": 0,
                         "log_vs_intent_example": 0, "example_in_several_intents": 0})
    dropped_unknown: Counter = Counter()
    resolved: dict[str, tuple[str | None, str]] = {}
    for key, g in groups.items():
        log_label, log_source = _log_label(g, conflicts)
        if g.example_labels:
            if len(g.example_labels) > 1:
                conflicts["example_in_several_intents"] += 1
            if log_label is not _MISSING and log_label not in g.example_labels:
                conflicts["log_vs_intent_example"] += 1
            resolved[key] = (g.example_labels[0], "intent_example")
        elif log_label is _MISSING:
            continue
        elif log_label is not None and log_label not in known:
            dropped_unknown[log_label] += 1
        else:
            resolved[key] = (log_label, str(log_source))
    return _Resolved(resolved, conflicts, dropped_unknown)


def _log_label(g: _Group, conflicts: Counter) -> tuple[Any, str | None]:
    """The logged label of one text (``_MISSING``: none, or a teacher tie) and its source."""
    if g.humans:
        _, label, _ = max(g.humans, key=lambda h: (h[0], h[2]))
        if any(v != label for v in g.votes):
            conflicts["human_over_teacher"] += 1
        return label, "human"
    if not g.votes:
        return _MISSING, None
    ranked = Counter(g.votes).most_common()
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
        if not g.example_labels:
            conflicts["teacher_tie_dropped"] += 1
        return _MISSING, None
    if len(ranked) > 1:
        conflicts["teacher_majority"] += 1
    return ranked[0][0], "teacher"


def _fixed_split(groups: dict[str, _Group], resolved: _Resolved, intents: IntentSet,
                 ex_texts: Sequence[str]) -> _Split:
    """Assign every text to training, evaluation or the recent-traffic holdout by its hash."""
    held_examples = held_out_examples(*intents.training_pairs())
    roles: dict[str, list[str]] = {"train": [], "eval": [], "holdout": []}
    for key, (_, source) in resolved.labels.items():
        if source != "intent_example":
            roles[split_role(key, source)].append(key)
    holdout = sorted(roles["holdout"], key=lambda k: (groups[k].latest, k))
    first_at = {normalise_key(t): n for n, t in reversed(list(enumerate(ex_texts)))}
    return _Split(held_examples, _reduced(intents, held_examples),
                  sorted(held_examples, key=lambda k: first_at.get(k, 0)),
                  roles["train"], roles["eval"], holdout, holdout[-RECENT_MAX:])


def _attach_vectors(store: TrafficLog | None, embedder: Embedder, groups: dict[str, _Group], resolved: _Resolved,
                    split: _Split, not_reused: frozenset = frozenset()) -> _Parts:
    """Vectors for every row: logged ones reused (but never those of the decisions in
    ``not_reused``: follow-ups, whose logged vector is of the query alone), the misses
    embedded in one batch."""
    dim = int(embedder.dim)
    fit_texts, fit_labels = split.fit_intents.training_pairs()
    neg_texts = list(synthetic_negatives(split.fit_intents.synthetic_negatives))
    log_keys = split.train_log + split.eval_log + split.recent_keys
    needed = list(fit_texts) + [groups[k].text for k in split.eval_example_keys + log_keys] + neg_texts
    t0 = time.perf_counter()
    vectors, reused, computed = _vectors(store, embedder, dim, groups, needed, not_reused)
    seconds = time.perf_counter() - t0

    def rows(keys: list[str]) -> LabelledSet:
        if not keys:
            return _empty(dim)
        texts = [groups[k].text for k in keys]
        return LabelledSet(texts, [resolved.labels[k][0] for k in keys], _stack(vectors, texts, dim),
                           [resolved.labels[k][1] for k in keys],
                           [max(groups[k].decisions)[1] if groups[k].decisions else None for k in keys])

    examples = LabelledSet(list(fit_texts), list(fit_labels), _stack(vectors, fit_texts, dim),
                           ["intent_example"] * len(fit_texts), [None] * len(fit_texts))
    return _Parts(examples, rows(split.train_log), rows(split.eval_example_keys).concat(rows(split.eval_log)),
                  rows(split.recent_keys),
                  {"encoder_id": embedder.id, "reused": reused, "computed": computed, "seconds": round(seconds, 3)},
                  _stack(vectors, neg_texts, dim) if neg_texts else None)


def _stack(vectors: dict[str, np.ndarray], texts: Sequence[str], dim: int) -> np.ndarray:
    if not len(texts):
        return np.zeros((0, dim), np.float32)
    return np.stack([vectors[t] for t in texts]).astype(np.float32, copy=False)


def _report(n_examples: int, log: _Log, groups: dict[str, _Group], resolved: _Resolved, split: _Split,
            parts: _Parts, self_info: dict[str, Any], train: LabelledSet,
            t_start: float) -> dict[str, Any]:
    """The counts of the training-set report (see ``TrainingSet.report``)."""
    ev, recent = parts.eval, parts.recent
    n_human = sum(1 for r in log.rows if r.has_human_label)
    return {
        "intent_examples": n_examples,
        "intent_examples_held_out": len(split.held_examples),
        "log_rows": len(log.rows),
        "log_rows_human": n_human,
        "log_rows_teacher": sum(1 for r in log.rows if not r.has_human_label and r.has_teacher_label),
        "unique_texts": len(groups),
        "duplicates_merged": n_examples + len(log.rows) - len(groups),
        "invalid_teacher_answers_ignored": log.invalid,
        "teacher_unsure": log.unsure,
        "conflicts": dict(resolved.conflicts),
        "dropped_unknown_intent": {"total": int(sum(resolved.dropped_unknown.values())),
                                   "by_label": dict(sorted(resolved.dropped_unknown.items()))},
        "self_training": self_info,
        "train": {"n": len(train), "by_source": train.counts(), "n_out_of_scope": train.n_out_of_scope},
        "eval": {"n": len(ev), "by_source": ev.counts(), "n_out_of_scope": ev.n_out_of_scope},
        "recent": {"n": len(recent), "held_out_teacher_texts": len(split.holdout),
                   "n_out_of_scope": recent.n_out_of_scope},
        "embeddings": dict(parts.embeddings),
        "split": {"id": SPLIT_ID, "intent_example_eval_share": EXAMPLE_EVAL_SHARE,
                  "human_eval_share": HUMAN_EVAL_SHARE, "teacher_holdout_share": RECENT_HOLDOUT_SHARE,
                  "recent_max": RECENT_MAX},
        "seconds": round(time.perf_counter() - t_start, 3),
    }


def _summary(train: LabelledSet, parts: _Parts) -> str:
    by = train.counts()
    return (f"training set: {len(train):,} rows ({by['intent_example']:,} intent examples, "
            f"{by['teacher']:,} teacher, {by['human']:,} human, {by['layer2']:,} layer 2); "
            f"eval {len(parts.eval):,}, recent {len(parts.recent):,}")


def _reduced(intents: IntentSet, held: set[str]) -> IntentSet:
    """``intents`` without the held-out examples and with duplicates (by normalised key)
    within one intent removed."""
    def keep(examples: Sequence[str]) -> tuple[str, ...]:
        seen: set[str] = set()
        out = []
        for e in examples:
            k = normalise_key(e)
            if k in held or k in seen:
                continue
            seen.add(k)
            out.append(e)
        return tuple(out)

    return replace(intents, intents=tuple(replace(i, examples=keep(i.examples)) for i in intents.intents),
                   oos_examples=keep(intents.oos_examples))


def _decisions(groups: dict[str, _Group], text: str) -> list:
    """The logged decisions of ``text`` (none for a text that was never logged)."""
    g = groups.get(normalise_key(text))
    return g.decisions if g is not None else []


def _vectors(store: TrafficLog | None, embedder: Embedder, dim: int, groups: dict[str, _Group],
             texts: list[str], not_reused: frozenset = frozenset()) -> tuple[dict[str, np.ndarray], int, int]:
    """text -> vector for every text: the newest logged vector of its normalised text made
    by ``embedder.id`` (by a decision not in ``not_reused``), else encoded (all misses in one
    call)."""
    out: dict[str, np.ndarray] = {}
    uniq = list(dict.fromkeys(texts))
    stored: dict[str, np.ndarray] = {}
    if store is not None:
        ids = [did for t in uniq for _, did in _decisions(groups, t) if did not in not_reused]
        if ids:
            stored = store.embeddings(embedder.id, ids)
    reused = 0
    missing: list[str] = []
    for t in uniq:
        vec = None
        for _, did in sorted(_decisions(groups, t), reverse=True):
            v = stored.get(did)
            if v is not None and v.shape == (dim,) and np.isfinite(v).all():
                vec = v
                break
        if vec is None:
            missing.append(t)
        else:
            out[t] = vec
            reused += 1
    if missing:
        X = np.asarray(embedder.encode(missing), dtype=np.float32)
        for t, v in zip(missing, X):
            out[t] = v
    return out, reused, len(missing)


def _self_training(store: TrafficLog | None, embedder: Embedder, dim: int, groups: dict[str, _Group], known: set[str],
                   limit: int, followups: str = "off") -> tuple[dict[str, Any], LabelledSet]:
    """Layer 2's newest confident in-scope decisions whose text has no other label and that
    were no follow-up (their logged vector is of the query alone, not what layer 2 scored)."""
    info: dict[str, Any] = {"max": int(limit), "read": 0, "rows": 0, "skipped_labelled": 0, "skipped_followup": 0,
                            "duplicates_merged": 0, "dropped_unknown_intent": 0, "dropped_bad_vector": 0}
    if store is None or limit <= 0:
        return info, _empty(dim)
    ids, texts, labels, vecs = store.confident_layer2(embedder.id, limit)
    info["read"] = len(ids)
    hist = store.decision_histories(ids) if followups != "off" and ids else {}
    leans = followups_among(texts, [hist.get(d, ()) for d in ids], followups)
    keep: list[int] = []
    seen: set[str] = set()
    for i, (text, label) in enumerate(zip(texts, labels)):    # newest first: the newest label wins
        key = normalise_key(text)
        if leans[i]:
            info["skipped_followup"] += 1
        elif key in groups:
            info["skipped_labelled"] += 1
        elif key in seen:
            info["duplicates_merged"] += 1
        elif label not in known:
            info["dropped_unknown_intent"] += 1
        elif vecs[i].shape != (dim,) or not np.isfinite(vecs[i]).all():
            info["dropped_bad_vector"] += 1
        else:
            seen.add(key)
            keep.append(i)
    info["rows"] = len(keep)
    if not keep:
        return info, _empty(dim)
    return info, LabelledSet([texts[i] for i in keep], [labels[i] for i in keep],
                             np.stack([vecs[i] for i in keep]).astype(np.float32, copy=False),
                             ["layer2"] * len(keep),
                             [ids[i] for i in keep])
