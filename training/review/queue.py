"""The review queue (issue 25): the logged decisions most worth a person's minute, ranked.

:func:`review_queue` reads the traffic log (named reads of :mod:`logstore.reads`: the
candidates, :meth:`~logstore.reads.NamedReads.review_candidates`, and two counts; a fleet's
mirrored log reads the same, since labels ship) and returns :class:`ReviewItem` rows, best
first. A decision is in the queue for one or more *reasons*
(:data:`REASONS`, each with its weight in :data:`REASON_WEIGHTS`):

==================  ========================================================================
``unsure``          the teacher answered with a candidate set or "cannot tell" (never a label):
                    inline, in an audit or in a back-fill (its latest answer)
``teacher_vs_l2``   layer 3 answered something else than layer 2's top intent
``audit_vs_l2``     a background audit disagreed with layer 2's confident answer
``shadow_vs_l2``    the shadow version answered something else than the champion
``degraded``        the answer did not get the layer it needed (the teacher was down, ...), and
                    no back-filled teacher answer agreeing with layer 2 and the served one
                    settled it since
``pending``         it still waits for the teacher (no back-filled answer, not resolved)
``corrected``       a person already corrected it (``flywheel feedback``): a second look
==================  ========================================================================

Decisions with a human label are left out, except for ``corrected`` (which is shown only
when asked for with ``reasons=("corrected",)``), and so are decisions whose text a person
already labelled on another decision (the same text after stripping blanks: a newer
decision repeating it is not asked about again) and decisions whose text retention erased.

**What a label is worth** (:attr:`ReviewItem.worth`), the product of:

- the weight of its strongest reason;
- ``sqrt((traffic + 1) / (labels + 1))`` of the intent at stake (the teacher's answer,
  else the served one): the intents with the most traffic and the fewest labels (human
  and valid teacher) gain most from one more;
- ``1.5`` when its two intents (served and teacher/shadow) are among the pairs people
  corrected most (:data:`CONFUSED_PAIRS` pairs: confusable intents);
- ``0.5 ** (age_days / HALF_LIFE_DAYS)``: recent items first.

Identical texts (the same text after stripping blanks) are merged into one item, the
highest-worth decision representing them (:attr:`ReviewItem.decision_ids` lists every one,
the representative first): one label answers them all.

Every intent of the served set may be given to any item: :attr:`ReviewItem.choices` are the
likely ones, :func:`all_choices` the likely ones followed by the rest of the served set.

Filters (:class:`ReviewFilters`): intent (served, layer-2 or teacher label), tier, layer,
reason, confidence range, a time window and the query's language (``decisions.language``,
migration 6: a declared language code or ``unknown``; rows logged before it have none and
never match a language filter). Each item carries its ``language``.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Sequence

from flywheel.classifier.errors import InvalidInputError
from flywheel.classifier.settings.label_names import OUT_OF_SCOPE, label_name

if TYPE_CHECKING:
    from flywheel.logstore.reads import LogReader, ReviewCandidate

__all__ = ["CONFUSED_PAIRS", "HALF_LIFE_DAYS", "REASONS", "REASON_WEIGHTS", "ReviewError", "ReviewFilters",
           "ReviewItem", "all_choices", "review_queue"]

REASONS = ("unsure", "teacher_vs_l2", "audit_vs_l2", "shadow_vs_l2", "degraded", "pending", "corrected")
REASON_WEIGHTS = {"unsure": 3.0, "teacher_vs_l2": 2.0, "audit_vs_l2": 2.0, "shadow_vs_l2": 1.5,
                  "degraded": 1.0, "pending": 1.0, "corrected": 0.5}
HALF_LIFE_DAYS = 7.0
CONFUSED_PAIRS = 10     # the most corrected intent pairs that count as confusable
SCAN_LIMIT = 20_000     # newest candidate decisions ranked per call


_LANGUAGE = re.compile(r"^(?:[a-z]{2,3}(?:-[a-z0-9]{2,8})*|unknown)$")


class ReviewError(InvalidInputError, ValueError):
    """A filter that cannot be applied (named in the message; exit code 2 on the CLI)."""


@dataclass(frozen=True)
class ReviewFilters:
    """Which decisions the queue shows (``None``: any). ``intent`` matches the served,
    layer-2 or teacher label (``OUT_OF_SCOPE`` for out of scope); ``since``/``until`` are
    unix seconds; ``language`` a logged language (``en``, ``es``, ``unknown``)."""

    intent: str | None = None
    tier: str | None = None
    layer: str | None = None
    reasons: tuple[str, ...] = ()
    min_confidence: float | None = None
    max_confidence: float | None = None
    since: float | None = None
    until: float | None = None
    language: str | None = None

    def check(self) -> "ReviewFilters":
        bad = [r for r in self.reasons if r not in REASONS]
        if bad:
            raise ReviewError(f"unknown review reason(s) {', '.join(map(repr, bad))} (known: {', '.join(REASONS)})")
        for name in ("min_confidence", "max_confidence"):
            v = getattr(self, name)
            if v is not None and not 0.0 <= v <= 1.0:
                raise ReviewError(f"{name} must be between 0 and 1, got {v!r}")
        if self.min_confidence is not None and self.max_confidence is not None \
                and self.min_confidence > self.max_confidence:
            raise ReviewError("min_confidence is above max_confidence")
        if self.language is not None and not _LANGUAGE.match(self.language):
            raise ReviewError(f"language must be a language code such as 'en', 'es' or 'unknown', "
                              f"got {self.language!r}")
        return self


@dataclass(frozen=True)
class ReviewItem:
    """One decision worth reviewing (or several with the same text). Labels are names,
    ``None`` = out of scope; ``teacher_answered`` tells the teacher's valid out-of-scope
    answer (``teacher_label`` ``None``) from no valid answer (it is set whenever
    ``teacher_label`` is not ``None``), and ``l2_answered`` layer 2's out-of-scope answer
    from none (rules or a declared type decided: layer 2 did not run), ``l2_confidence`` its
    confidence (``None`` with no answer). ``decision_ids``: every
    decision this item answers, the representative ``decision_id`` first (``()``: just
    ``decision_id``)."""

    decision_id: str
    created_at: float
    text: str
    label: str | None
    confidence: float | None
    tier: str | None
    layer: str
    l2_label: str | None
    teacher_label: str | None
    shadow_label: str | None
    human_label: str | None
    candidates: tuple[str | None, ...]
    reasons: tuple[str, ...]
    worth: float
    choices: tuple[str | None, ...] = field(default=())
    teacher_answered: bool = False
    decision_ids: tuple[str, ...] = ()
    l2_answered: bool = False
    language: str | None = None
    l2_confidence: float | None = None

    def __post_init__(self) -> None:
        if self.teacher_label is not None and not self.teacher_answered:
            object.__setattr__(self, "teacher_answered", True)
        if self.l2_label is not None and not self.l2_answered:
            object.__setattr__(self, "l2_answered", True)
        if not self.decision_ids:
            object.__setattr__(self, "decision_ids", (self.decision_id,))
        elif self.decision_ids[0] != self.decision_id:
            raise ValueError("decision_ids must start with decision_id")

    @property
    def count(self) -> int:
        """How many decisions a label on this item answers (at least 1)."""
        return max(1, len(self.decision_ids))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("label", "l2_label", "teacher_label", "shadow_label", "human_label"):
            d[k] = label_name(d[k]) if (d[k] is not None or k == "label") else None
        d["teacher_label"] = label_name(self.teacher_label) if self.teacher_answered else None
        d["l2_label"] = label_name(self.l2_label) if self.l2_answered else None
        d["decision_ids"] = list(self.decision_ids)
        d["count"] = self.count
        d["candidates"] = [label_name(c) for c in self.candidates]
        d["reasons"] = list(self.reasons)
        d["choices"] = [label_name(c) for c in self.choices]
        d["created_at"] = datetime.fromtimestamp(self.created_at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        d["worth"] = round(self.worth, 4)
        return d


def _pair(a: str | None, b: str | None) -> tuple[str | None, str | None]:
    return tuple(sorted((a, b), key=lambda v: (v is None, v or "")))  # type: ignore[return-value]


def _reasons(c: ReviewCandidate) -> tuple[str, ...]:
    out = []
    if c.candidates is not None:
        out.append("unsure")
    if c.has_teacher and c.teacher_label != c.l2:
        out.append("audit_vs_l2" if c.audit else "teacher_vs_l2")
    if c.shadow_label is not None and c.shadow_label != c.label:
        out.append("shadow_vs_l2")
    if c.degraded is not None:
        out.append("degraded")
    if c.pending:
        out.append("pending")
    if c.has_human:
        out.append("corrected")
    return tuple(out)


def review_queue(store: LogReader, filters: ReviewFilters | None = None, *, limit: int = 50,
                 now: float | None = None, labels: Sequence[str] | None = None) -> list[ReviewItem]:
    """The ``limit`` decisions most worth reviewing under ``filters``, best first (see the
    module docs). ``store`` is a :class:`logstore.LogStore` (its named reads
    ``review_candidates``, ``label_coverage`` and ``human_corrections``).
    ``labels``: the intents a label may be today; an item's ``choices`` keep only those
    (a logged alternative of an intent since removed is not offered)."""
    f = (filters or ReviewFilters()).check()
    if limit < 1:
        raise ReviewError(f"limit must be at least 1, got {limit!r}")
    now = time.time() if now is None else now
    rows = store.review_candidates(f.since if f.since is not None else 0.0,
                                   f.until if f.until is not None else now + 86_400, f.language, limit=SCAN_LIMIT)
    traffic: dict[str | None, int] = {}
    labelled: dict[str | None, int] = {}
    for cov in store.label_coverage():
        traffic[cov.label], labelled[cov.label] = cov.n, cov.n_labelled
    corrected = Counter({_pair(c.served, c.human): c.n for c in store.human_corrections()})
    confusable = {p for p, _ in corrected.most_common(CONFUSED_PAIRS)}
    items = []
    for row in rows:
        reasons = _reasons(row)
        wanted = f.reasons or tuple(r for r in REASONS if r != "corrected")
        shown = tuple(r for r in reasons if r in wanted)
        if not shown or ("corrected" in reasons and "corrected" not in wanted):
            continue
        item = _item(row, shown, traffic, labelled, confusable, now, labels)
        if _keep(item, f):
            items.append(item)
    items.sort(key=lambda it: (-it.worth, -it.created_at, it.decision_id))
    return _merge_identical(items)[:limit]


def _merge_identical(items: Sequence[ReviewItem]) -> list[ReviewItem]:
    """``items`` (best first) with identical texts (after strip) merged into the first, best one."""
    groups: dict[str, list[ReviewItem]] = {}
    for it in items:
        groups.setdefault(it.text.strip(), []).append(it)
    out = []
    for group in groups.values():
        head = group[0]
        ids = tuple(dict.fromkeys(i for it in group for i in it.decision_ids))
        out.append(head if len(ids) == head.count else replace(head, decision_ids=ids))
    return out


def all_choices(item: ReviewItem, labels: Sequence[str] | None) -> tuple[str, ...]:
    """Every intent a reviewer may give ``item``: its likely ``choices`` first, then the rest
    of the served set ``labels`` in their order (``None``: the served set is unknown, the
    choices alone). Out of scope is not among them (every front end has its own key)."""
    likely = [c for c in item.choices if c is not None and (not labels or c in labels)]
    return tuple(dict.fromkeys([*likely, *(labels or ())]))


def _item(row: ReviewCandidate, reasons: tuple[str, ...], traffic: dict, labelled: dict, confusable: set,
          now: float, labels: Sequence[str] | None) -> ReviewItem:
    (did, created, text, label, conf, tier, layer, l2, teacher, t_valid, unsure, _, _, _, shadow, human, _,
     alts, l2_ran, language, l2_conf) = row
    cands: tuple[str | None, ...] = tuple(unsure or ())
    other = teacher if t_valid else shadow if shadow is not None else (cands[0] if cands else l2)
    stake = teacher if t_valid else label
    worth = max(REASON_WEIGHTS[r] for r in reasons)
    worth *= math.sqrt((traffic.get(stake, 0) + 1) / (labelled.get(stake, 0) + 1))
    if other != label and _pair(label, other) in confusable:
        worth *= 1.5
    worth *= 0.5 ** (max(0.0, now - float(created)) / 86_400 / HALF_LIFE_DAYS)
    choices = list(dict.fromkeys([c for c in (*cands, teacher if t_valid else None, shadow, label, l2, *alts)
                                  if c is not None and (labels is None or c in labels)]))
    return ReviewItem(decision_id=did, created_at=float(created), text=text, label=label, confidence=conf,
                      tier=tier, layer=layer, l2_label=l2 if l2_ran else None,
                      teacher_label=teacher if t_valid else None,
                      shadow_label=shadow, human_label=human, candidates=cands, reasons=reasons, worth=worth,
                      choices=tuple(choices[:9]), teacher_answered=bool(t_valid), l2_answered=bool(l2_ran),
                      language=language, l2_confidence=l2_conf if l2_ran else None)


def _keep(item: ReviewItem, f: ReviewFilters) -> bool:
    if f.intent is not None:
        want = None if f.intent.upper() == OUT_OF_SCOPE else f.intent
        said = (item.label, *((item.l2_label,) if item.l2_answered else ()),
                *((item.teacher_label,) if item.teacher_answered else ()))
        if want not in said:
            return False
    if f.tier is not None and item.tier != f.tier:
        return False
    if f.layer is not None and item.layer != f.layer:
        return False
    c = item.confidence
    if f.min_confidence is not None and (c is None or c < f.min_confidence):
        return False
    return not (f.max_confidence is not None and (c is None or c > f.max_confidence))
