"""The log's named reads: every question the offline side asks of the traffic log's tables,
each one SQL statement kept here, and the :class:`LogReader` protocol they make up.

No SQL lives outside :mod:`logstore` (``tests/test_architecture.py`` checks it): the
statistics (:mod:`training.stats`), the review queue, page and dashboard
(:mod:`training.review`) and the teacher-noise estimate (:mod:`training.teacher_noise`)
call a read by what it answers and get typed rows back (a :class:`~typing.NamedTuple` per
row; ``None`` is SQL's NULL, which for a label means out of scope). Each read:

- is **one statement**, so it sees one consistent snapshot of the log (two reads may not:
  a decision logged between them is counted by one and not the other);
- **binds** every value it is given (``?``/``$n`` parameters; the SQL text is assembled
  only from this module's own fragments, never from a caller's value);
- goes through the store like every read: open, ingest the spool, query, fetch, close
  (:mod:`logstore.store`).

:class:`NamedReads` implements them on top of one primitive, ``_rows(sql, params)``;
:class:`~logstore.store.LogStore` is one (and so a :class:`LogReader`). The tables and the
``decision_labels`` view they read are described in :mod:`logstore.schema`; the
definitions each read counts by are the ones its caller documents (``flywheel stats``'
sections, the review queue's reasons).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, NamedTuple, Protocol, Sequence, runtime_checkable

__all__ = ["PERIODS", "TRAFFIC_COUNTS", "AnchoringCount", "ErrorDirections", "HumanCorrection", "LabelCoverage",
           "LabelPair", "LanguageCounts", "LogReader", "NamedReads", "ReviewCandidate", "ShadowAgreement",
           "TrafficCount"]

#: the calendar windows :meth:`NamedReads.traffic_by_window` groups by (UTC)
PERIODS = ("hour", "day", "week")
#: the per-window counts of a :class:`TrafficCount` (``kind == "window"``)
TRAFFIC_COUNTS = ("audited", "audit_labelled", "audit_agree", "pending_flagged", "pending",
                  "teacher_calls", "teacher_labelled", "human_labelled", "human_corrected", "degraded")


# --------------------------------------------------------------------------- the rows

class TrafficCount(NamedTuple):
    """One row of :meth:`NamedReads.traffic_by_window`.

    ``scope`` is ``"window"`` (a row of window ``w``) or ``"total"`` (the whole log; ``w``
    ``None``). ``kind`` says which fields are set, the others are ``None``:

    - ``"window"``: ``n``, ``first_at``/``last_at`` and every count of
      :data:`TRAFFIC_COUNTS` (on the total row also ``n_windows``, the windows in the log);
    - ``"layer"``, ``"tier"``, ``"degraded"``: ``k1`` (a layer, tier or degraded reason) and
      ``n``;
    - ``"l2_teacher"``: ``k1`` layer 2's label, ``k2`` the teacher's label that differs, ``n``;
    - ``"human_served"``: ``k1`` the served label, ``k2`` the human label that differs, ``n``.
    """

    scope: str
    kind: str
    w: datetime | int | None
    k1: str | None
    k2: str | None
    n: int | None
    n_windows: int | None
    first_at: datetime | None
    last_at: datetime | None
    audited: int | None
    audit_labelled: int | None
    audit_agree: int | None
    pending_flagged: int | None
    pending: int | None
    teacher_calls: int | None
    teacher_labelled: int | None
    human_labelled: int | None
    human_corrected: int | None
    degraded: int | None


class LanguageCounts(NamedTuple):
    """One logged language of :meth:`NamedReads.language_breakdown` (``"none"``: rows logged
    before the column): its decisions, those the teacher decided (``llm``), at tier
    ``confident``, degraded, with both layer 2's answer and a teacher label (``judged``), of
    those where the two agree, and those served out of scope (no label)."""

    language: str
    n: int
    llm: int
    confident: int
    degraded: int
    judged: int
    agree: int
    out_of_scope: int


class AnchoringCount(NamedTuple):
    """``n`` teacher decisions alike (:meth:`NamedReads.anchoring_observations`): the
    teacher's label, layer 2's, and the labels of the history the teacher was shown, oldest
    first (``None``: no history column)."""

    teacher_label: str | None
    l2_label: str | None
    history_labels: tuple[str | None, ...] | None
    n: int


class ShadowAgreement(NamedTuple):
    """A shadow version against the champion (:meth:`NamedReads.shadow_agreement`): the
    decisions it answered (``n``), how many it answered permissive, abstaining, flipped,
    the disagreements with a reference label and on how many of those the champion's
    served label and the shadow's were right, on how many each side was unsure, and the
    times of the first and last counted answers (``None`` when there is none)."""

    n: int
    permissive: int
    abstaining: int
    flips: int
    disagreements_labelled: int
    champion_right: int
    shadow_right: int
    champion_unsure: int
    shadow_unsure: int
    first: datetime | None
    last: datetime | None


class ErrorDirections(NamedTuple):
    """The dashboard's errors by direction (:meth:`NamedReads.error_directions`)."""

    teacher_calls: int               # decisions the teacher decided with a valid answer
    teacher_calls_layer2_had: int    # ... where layer 2 had answered the same
    confident_layer2: int            # decisions layer 2 made at tier confident
    confident_layer2_corrected: int  # ... whose human label differs from the served one


class ReviewCandidate(NamedTuple):
    """A decision the review queue may show (:meth:`NamedReads.review_candidates`).

    ``l2`` is layer 2's own answer (the served label when layer 2 did not run; see
    ``l2_answered``), ``teacher_label`` the latest valid teacher label (``has_teacher``),
    ``candidates`` the latest unsure teacher answer's set that no valid answer followed
    (``None``: there is none), ``shadow_label`` the latest shadow answer (any version),
    ``human_label`` the latest human label (``has_human``), ``alternatives`` the labels of
    the logged alternatives, ``created_at`` unix seconds, ``pending`` whether it still waits
    for the teacher, ``degraded`` its degraded reason while no back-filled teacher answer
    agreeing with layer 2 and the served answer settled it, ``l2_confidence`` layer 2's
    confidence in ``l2`` (``None`` when layer 2 did not answer)."""

    decision_id: str
    created_at: float
    text: str
    label: str | None
    confidence: float | None
    tier: str | None
    layer: str
    l2: str | None
    teacher_label: str | None
    has_teacher: bool
    candidates: list[str | None] | None
    audit: bool
    pending: bool
    degraded: str | None
    shadow_label: str | None
    human_label: str | None
    has_human: bool
    alternatives: list[str | None]
    l2_answered: bool
    language: str | None
    l2_confidence: float | None = None


class LabelCoverage(NamedTuple):
    """One served label (:meth:`NamedReads.label_coverage`): its decisions and how many of
    them have a human or a valid teacher label."""

    label: str | None
    n: int
    n_labelled: int


class HumanCorrection(NamedTuple):
    """``n`` decisions whose served label a person corrected to ``human``
    (:meth:`NamedReads.human_corrections`)."""

    served: str | None
    human: str | None
    n: int


class LabelPair(NamedTuple):
    """``n`` decisions with the latest valid teacher label ``teacher`` and the latest human
    label ``human`` (:meth:`NamedReads.teacher_human_pairs`)."""

    teacher: str | None
    human: str | None
    n: int


# --------------------------------------------------------------------------- the statements

# Built on the log's ``decision_labels`` view (logstore.schema): the one definition of a
# decision's latest teacher and human label, shared with LogStore.labelled_rows/pending.
# A pending decision's inline teacher call failed, so any valid teacher label it has was
# back-filled: ``has_teacher`` is what takes it off the pending list.
_TRAFFIC_BASE = """
WITH res AS (
    SELECT DISTINCT decision_id FROM resolutions
), base AS MATERIALIZED (
    SELECT d.created_at, d.layer, d.tier, d.label, d.l2_label,
           d.l2_confidence IS NOT NULL AS has_l2,
           d.audit, d.pending, d.degraded,
           d.pending AND res.decision_id IS NULL AND NOT coalesce(l.has_teacher, false) AS pending_open,
           d.teacher_model IS NOT NULL AS teacher_called,
           coalesce(l.has_teacher, false) AS has_t, l.teacher_label AS t_label,
           coalesce(l.has_human, false) AS has_h, l.human_label AS h_label,
           {window} AS w
    FROM decisions d
    LEFT JOIN decision_labels l ON l.decision_id = d.decision_id
    LEFT JOIN res ON res.decision_id = d.decision_id
)
"""
# the window of a decision: its calendar period ($1 'hour', 'day' or 'week'), or its block of
# $1 decisions in (created_at, decision_id) order
_BY_PERIOD = "date_trunc($1, d.created_at)::TIMESTAMP"
_BY_COUNT = "(row_number() OVER (ORDER BY d.created_at, d.decision_id) - 1) // $1"
# only the last $2 windows are kept (the totals still cover the whole log)
_LAST_WINDOWS = "w >= (SELECT min(w) FROM (SELECT DISTINCT w FROM base ORDER BY w DESC LIMIT $2))"

_WINDOW_AGG = {
    "n": "count(*)",
    "first_at": "min(created_at)",
    "last_at": "max(created_at)",
    "audited": "count(*) FILTER (WHERE audit)",
    "audit_labelled": "count(*) FILTER (WHERE audit AND has_t)",
    "audit_agree": "count(*) FILTER (WHERE audit AND has_t AND has_l2 "
                   "AND l2_label IS NOT DISTINCT FROM t_label)",
    "pending_flagged": "count(*) FILTER (WHERE pending)",
    "pending": "count(*) FILTER (WHERE pending_open)",
    "teacher_calls": "count(*) FILTER (WHERE teacher_called)",
    "teacher_labelled": "count(*) FILTER (WHERE has_t)",
    "human_labelled": "count(*) FILTER (WHERE has_h)",
    "human_corrected": "count(*) FILTER (WHERE has_h AND h_label IS DISTINCT FROM label)",
    "degraded": "count(*) FILTER (WHERE degraded IS NOT NULL)",
}

_TRAFFIC_BRANCHES = (
    ("window", _WINDOW_AGG, "", ""),
    ("layer", {"k1": "layer", "n": "count(*)"}, "", "layer"),
    ("tier", {"k1": "tier", "n": "count(*)"}, "", "tier"),
    ("degraded", {"k1": "degraded", "n": "count(*)"}, "degraded IS NOT NULL", "degraded"),
    ("l2_teacher", {"k1": "l2_label", "k2": "t_label", "n": "count(*)"},
     "has_l2 AND has_t AND l2_label IS DISTINCT FROM t_label", "l2_label, t_label"),
    ("human_served", {"k1": "label", "k2": "h_label", "n": "count(*)"},
     "has_h AND h_label IS DISTINCT FROM label", "label, h_label"),
)


def _traffic_select(scope: str, kind: str, cols: dict[str, str], where: str, keys: str) -> str:
    """One branch of the UNION: ``scope`` "window" (grouped by ``w``, over the kept
    windows) or "total" (the whole log, ``w`` NULL); columns as :class:`TrafficCount`."""
    exprs = []
    for c in TrafficCount._fields:
        if c == "scope":
            exprs.append(f"'{scope}' AS scope")
        elif c == "kind":
            exprs.append(f"'{kind}' AS kind")
        elif c == "w":
            exprs.append("w" if scope == "window" else "NULL AS w")
        elif c == "n_windows" and scope == "total" and kind == "window":
            exprs.append("count(DISTINCT w) AS n_windows")
        elif c in cols:
            exprs.append(f"{cols[c]} AS {c}")
        elif c in ("k1", "k2"):
            exprs.append(f"NULL::VARCHAR AS {c}")
        elif c in ("first_at", "last_at"):
            exprs.append(f"NULL::TIMESTAMP AS {c}")
        else:
            exprs.append(f"NULL::BIGINT AS {c}")
    group = ", ".join(g for g in (("w" if scope == "window" else ""), keys) if g)
    src = "kept" if scope == "window" else "base"
    return (f"SELECT {', '.join(exprs)} FROM {src}" + (f" WHERE {where}" if where else "")
            + (f" GROUP BY {group}" if group else ""))


def _traffic_sql(by_period: bool, keep_last: bool) -> str:
    """:meth:`NamedReads.traffic_by_window`'s statement: windows by calendar period or by
    decision count, every window kept or only the last ``$2``."""
    parts = [_traffic_select(scope, kind, cols, where, keys)
             for scope in ("window", "total") for kind, cols, where, keys in _TRAFFIC_BRANCHES]
    return (_TRAFFIC_BASE.format(window=_BY_PERIOD if by_period else _BY_COUNT)
            + f", kept AS (SELECT * FROM base WHERE {_LAST_WINDOWS if keep_last else 'TRUE'})\n"
            + "\nUNION ALL\n".join(parts))


_TRAFFIC_SQL = {(p, k): _traffic_sql(p, k) for p in (True, False) for k in (True, False)}

_LANGUAGE_SQL = """
SELECT coalesce(d.language, 'none') AS lang, count(*) AS n,
       count(*) FILTER (WHERE d.layer = 'llm') AS llm,
       count(*) FILTER (WHERE d.tier = 'confident') AS confident,
       count(*) FILTER (WHERE d.degraded IS NOT NULL) AS degraded,
       count(*) FILTER (WHERE d.l2_confidence IS NOT NULL AND coalesce(l.has_teacher, false)) AS judged,
       count(*) FILTER (WHERE d.l2_confidence IS NOT NULL AND coalesce(l.has_teacher, false)
                        AND d.l2_label IS NOT DISTINCT FROM l.teacher_label) AS agree,
       count(*) FILTER (WHERE d.label IS NULL) AS out_of_scope
FROM decisions d LEFT JOIN decision_labels l ON l.decision_id = d.decision_id
GROUP BY 1 ORDER BY n DESC, lang
"""

_ANCHORING_SQL = """
SELECT label, l2_label, list_transform(history, lambda h: h.label) AS history_labels, count(*) AS n
FROM decisions
WHERE layer = 'llm' AND l2_confidence IS NOT NULL
GROUP BY ALL
"""

_SHADOW_ANSWERED_SQL = """
SELECT count(DISTINCT l.decision_id) FROM labels l
WHERE l.source = 'shadow' AND l.model = ?
  AND EXISTS (SELECT 1 FROM decisions d WHERE d.decision_id = l.decision_id)
"""

_SHADOW_AGREEMENT_SQL = """
WITH s AS (
    SELECT decision_id, label, coalesce(sure, false) AS sure, created_at
    FROM labels
    WHERE source = 'shadow' AND model = ?
    QUALIFY row_number() OVER (PARTITION BY decision_id ORDER BY created_at DESC, label_id DESC) = 1
), j AS (
    SELECT s.created_at AS answered_at, s.sure AS s_sure, s.label AS s_label,
           (d.layer = 'embedding' AND d.degraded IS NULL) AS c_sure, d.label AS c_label,
           coalesce(l.has_human, false) OR coalesce(l.has_teacher, false) AS has_ref,
           CASE WHEN coalesce(l.has_human, false) THEN l.human_label ELSE l.teacher_label END AS ref
    FROM s
    JOIN decisions d ON d.decision_id = s.decision_id
    LEFT JOIN decision_labels l ON l.decision_id = s.decision_id
), k AS (
    SELECT *, CASE WHEN s_sure AND NOT c_sure THEN 'permissive'
                   WHEN c_sure AND NOT s_sure THEN 'abstaining'
                   WHEN c_sure AND s_sure AND s_label IS DISTINCT FROM c_label THEN 'flip'
                   ELSE 'agree' END AS kind
    FROM j
)
SELECT count(*),
       count(*) FILTER (WHERE kind = 'permissive'),
       count(*) FILTER (WHERE kind = 'abstaining'),
       count(*) FILTER (WHERE kind = 'flip'),
       count(*) FILTER (WHERE kind <> 'agree' AND has_ref),
       count(*) FILTER (WHERE kind <> 'agree' AND has_ref AND c_label IS NOT DISTINCT FROM ref),
       count(*) FILTER (WHERE kind <> 'agree' AND has_ref AND s_label IS NOT DISTINCT FROM ref),
       count(*) FILTER (WHERE NOT c_sure),
       count(*) FILTER (WHERE NOT s_sure),
       min(answered_at), max(answered_at)
FROM k
"""

_TEACHER_HUMAN_PAIRS_SQL = """
SELECT l.teacher_label, l.human_label, count(*) AS n
FROM decisions d JOIN decision_labels l ON l.decision_id = d.decision_id
WHERE l.has_teacher AND l.has_human
GROUP BY ALL
"""

_ERROR_DIRECTIONS_SQL = """
SELECT count(*) FILTER (WHERE layer = 'llm' AND teacher_valid),
       count(*) FILTER (WHERE layer = 'llm' AND teacher_valid AND l2_confidence IS NOT NULL
                          AND d.teacher_label IS NOT DISTINCT FROM l2_label),
       count(*) FILTER (WHERE tier = 'confident' AND layer = 'embedding'),
       count(*) FILTER (WHERE tier = 'confident' AND layer = 'embedding' AND coalesce(dl.has_human, false)
                          AND dl.human_label IS DISTINCT FROM d.label)
FROM decisions d LEFT JOIN decision_labels dl USING (decision_id)
"""

_REVIEW_CANDIDATES_SQL = """
WITH sh AS (
    SELECT decision_id, arg_max(label, created_at) AS shadow_label FROM labels
    WHERE source = 'shadow' GROUP BY decision_id
), u AS (   -- the latest unsure teacher answer (inline, an audit's, a back-filled one) no valid one followed
    SELECT ua.decision_id, arg_max(ua.candidates, ua.created_at) AS candidates
    FROM unsure_answers ua LEFT JOIN decision_labels t USING (decision_id)
    WHERE t.teacher_at IS NULL OR ua.created_at >= t.teacher_at
    GROUP BY ua.decision_id
), res AS (
    SELECT DISTINCT decision_id FROM resolutions
), ht AS (  -- the texts (blanks stripped) a person labelled on some decision
    SELECT DISTINCT regexp_replace(x.text, '^\\s+|\\s+$', '', 'g') AS t
    FROM decisions x JOIN decision_labels xl USING (decision_id) WHERE xl.has_human AND x.text <> ''
), d AS (   -- l2: layer 2's own answer (the served one when layer 2 decided)
    SELECT *, CASE WHEN l2_confidence IS NOT NULL THEN l2_label ELSE label END AS l2 FROM decisions
), c AS (
    SELECT d.decision_id, d.created_at, d.text, d.label, d.confidence, d.tier, d.layer, d.l2, d.audit,
           d.alternatives, d.l2_confidence, d.language,
           dl.teacher_label, coalesce(dl.has_teacher, false) AS has_teacher, dl.human_label,
           coalesce(dl.has_human, false) AS has_human, u.candidates, sh.shadow_label,
           -- a back-filled teacher answer takes a decision off the pending list (as in the traffic counts)
           d.pending AND res.decision_id IS NULL AND NOT coalesce(dl.has_teacher, false) AS pending_open,
           -- degraded is settled once layer 2, the (back-filled) teacher and the served answer agree
           CASE WHEN coalesce(dl.has_teacher, false) AND dl.teacher_label IS NOT DISTINCT FROM d.l2
                     AND d.l2 IS NOT DISTINCT FROM d.label THEN NULL ELSE d.degraded END AS degraded_open,
           ht.t IS NOT NULL AS text_labelled
    FROM d
    LEFT JOIN decision_labels dl USING (decision_id)
    LEFT JOIN sh USING (decision_id)
    LEFT JOIN u USING (decision_id)
    LEFT JOIN res USING (decision_id)
    LEFT JOIN ht ON ht.t = regexp_replace(d.text, '^\\s+|\\s+$', '', 'g')
    WHERE d.text <> '' AND d.created_at >= ? AND d.created_at <= ? AND (?::VARCHAR IS NULL OR d.language = ?)
)
SELECT decision_id, epoch(created_at), text, label, confidence, tier, layer, l2,
       teacher_label, has_teacher, candidates, audit, pending_open, degraded_open,
       shadow_label, human_label, has_human,
       [a.label FOR a IN coalesce(alternatives, [])],
       l2_confidence IS NOT NULL OR layer = 'embedding',  -- layer 2 answered (not rules, declared)
       language,
       CASE WHEN l2_confidence IS NOT NULL THEN l2_confidence WHEN layer = 'embedding' THEN confidence END
FROM c
WHERE (has_human OR NOT text_labelled)  -- a text a person labelled is not asked about again
  AND (candidates IS NOT NULL
       OR (has_teacher AND teacher_label IS DISTINCT FROM l2)   -- inline, an audit's, a back-fill's
       OR (shadow_label IS NOT NULL AND shadow_label IS DISTINCT FROM label)
       OR degraded_open IS NOT NULL OR pending_open OR has_human)
ORDER BY created_at DESC, decision_id DESC
LIMIT ?
"""

_LABEL_COVERAGE_SQL = """
SELECT d.label, count(*), count(*) FILTER (WHERE dl.has_human OR dl.has_teacher)
FROM decisions d LEFT JOIN decision_labels dl USING (decision_id) GROUP BY d.label
"""

_HUMAN_CORRECTIONS_SQL = """
SELECT d.label, dl.human_label, count(*) FROM decisions d JOIN decision_labels dl USING (decision_id)
WHERE dl.has_human AND dl.human_label IS DISTINCT FROM d.label GROUP BY 1, 2
"""

_LOGGED_LANGUAGES_SQL = "SELECT DISTINCT language FROM decisions WHERE language IS NOT NULL ORDER BY 1"


def _utc(ts: float) -> datetime:
    """Unix seconds as the naive UTC ``TIMESTAMP`` the tables hold."""
    return datetime.fromtimestamp(float(ts), timezone.utc).replace(tzinfo=None)


# --------------------------------------------------------------------------- the reads

class NamedReads:
    """The named reads (the module docstring), for a store that runs one read-only
    statement with :meth:`_rows`; :class:`~logstore.store.LogStore` is one."""

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one read-only statement with ``params`` bound and return all its rows."""
        raise NotImplementedError

    def traffic_by_window(self, window: str | int, last: int | None = None) -> list[TrafficCount]:
        """``flywheel stats``' counts, per window and over the whole log, in one statement:
        decisions, audits, pending, teacher and human labels, degraded, and the counts by
        layer, tier, degraded reason and confused label pair (:class:`TrafficCount`; the
        definitions are :mod:`training.stats.traffic`'s). ``window``: a calendar period of
        :data:`PERIODS` (UTC; ``w`` its start) or a number of decisions (consecutive blocks
        in ``(created_at, decision_id)`` order; ``w`` the block's 0-based index). ``last``:
        only the last ``last`` windows get window rows (the total rows still cover the whole
        log). Rows come in no particular order."""
        if isinstance(window, bool) or not (window in PERIODS or isinstance(window, int) and window >= 1):
            raise ValueError(f"window must be one of {', '.join(PERIODS)} or a positive integer, got {window!r}")
        if last is not None and (isinstance(last, bool) or last < 1):
            raise ValueError(f"last must be at least 1, got {last!r}")
        params: list[Any] = [window if isinstance(window, str) else int(window)]
        if last is not None:
            params.append(int(last))
        sql = _TRAFFIC_SQL[(isinstance(window, str), last is not None)]
        return [TrafficCount(*r) for r in self._rows(sql, params)]

    def language_breakdown(self) -> list[LanguageCounts]:
        """Per logged language (``decisions.language``; ``"none"`` for rows logged before
        it), over the whole log: :class:`LanguageCounts`, most decisions first (ties by
        language)."""
        return [LanguageCounts(str(r[0]), *(int(x) for x in r[1:])) for r in self._rows(_LANGUAGE_SQL)]

    def anchoring_observations(self) -> list[AnchoringCount]:
        """The teacher's decisions (``layer = 'llm'``) that have layer 2's own answer,
        grouped by ``(teacher label, layer 2 label, history labels)`` with their count
        (:class:`AnchoringCount`; the observations of :mod:`classifier.anchoring`)."""
        return [AnchoringCount(t, l2, None if h is None else tuple(h), int(n))
                for t, l2, h, n in self._rows(_ANCHORING_SQL)]

    def shadow_answered(self, version: str) -> int:
        """How many decisions in the log shadow ``version`` answered (a decision answered
        twice counts once)."""
        return int(self._rows(_SHADOW_ANSWERED_SQL, [version])[0][0])

    def shadow_agreement(self, version: str) -> ShadowAgreement:
        """Shadow ``version`` against the champion over the whole log, each decision by its
        latest answer of that version (:class:`ShadowAgreement`; the definitions are
        :mod:`training.stats.shadow`'s): champion sure = ``layer = 'embedding'`` and not
        degraded, shadow sure = the answer's ``sure``; the reference label is the human
        label, else the valid teacher label."""
        row = self._rows(_SHADOW_AGREEMENT_SQL, [version])[0]
        counts = [int(x or 0) for x in row[:9]]
        return ShadowAgreement(counts[0], counts[1], counts[2], counts[3], counts[4], counts[5], counts[6],
                               counts[7], counts[8], first=row[9], last=row[10])

    def teacher_human_pairs(self) -> list[LabelPair]:
        """Decisions with both a valid teacher label and a human label (the latest of each),
        counted per ``(teacher, human)`` pair (:class:`LabelPair`), in no particular order."""
        return [LabelPair(t, h, int(n)) for t, h, n in self._rows(_TEACHER_HUMAN_PAIRS_SQL)]

    def error_directions(self) -> ErrorDirections:
        """Errors by direction over the whole log (:class:`ErrorDirections`): teacher calls
        whose answer layer 2 already had, and confident layer-2 answers people corrected."""
        return ErrorDirections(*(int(x or 0) for x in self._rows(_ERROR_DIRECTIONS_SQL)[0]))

    def review_candidates(self, since: float, until: float, language: str | None = None, *,
                          limit: int) -> list[ReviewCandidate]:
        """The newest ``limit`` decisions created from ``since`` to ``until`` (unix seconds,
        both included) that may deserve a review, newest first (ties by decision id,
        descending): an unsure teacher answer no valid one followed, a valid teacher label
        other than layer 2's answer, a shadow answer other than the served label, degraded
        (unless a back-filled teacher answer agrees with layer 2 and the served one: then
        ``degraded`` is ``None``), pending (still open: no resolution, no back-filled teacher
        answer), or a human label. Decisions whose text retention erased are left out, and so
        are those without a human label whose text (blanks stripped) a person labelled on
        another decision; with ``language``, only decisions logged in it
        (:class:`ReviewCandidate`)."""
        rows = self._rows(_REVIEW_CANDIDATES_SQL, [_utc(since), _utc(until), language, language, int(limit)])
        return [ReviewCandidate(*r) for r in rows]

    def label_coverage(self) -> list[LabelCoverage]:
        """Per served label (``None``: out of scope), its decisions and how many of them have
        a human or a valid teacher label (:class:`LabelCoverage`), in no particular order."""
        return [LabelCoverage(lab, int(n), int(k)) for lab, n, k in self._rows(_LABEL_COVERAGE_SQL)]

    def human_corrections(self) -> list[HumanCorrection]:
        """Per ``(served, human)`` pair, the decisions whose latest human label differs from
        the served label (:class:`HumanCorrection`), in no particular order."""
        return [HumanCorrection(a, b, int(n)) for a, b, n in self._rows(_HUMAN_CORRECTIONS_SQL)]

    def logged_languages(self) -> list[str]:
        """Every language a decision was logged in (``decisions.language``), sorted."""
        return [str(r[0]) for r in self._rows(_LOGGED_LANGUAGES_SQL)]


# --------------------------------------------------------------------------- the protocol

@runtime_checkable
class LogReader(Protocol):
    """The traffic log as the offline side's statistics, review and teacher-noise code read
    it: the named reads, each one consistent statement returning typed rows.

    :class:`~logstore.store.LogStore` implements it (through :class:`NamedReads`, whose
    methods hold each read's full contract); so does any store a caller passes instead (a
    mirrored log is a :class:`~logstore.store.LogStore` too). Callers type against this, not
    against a probe for a method: a store either is a :class:`LogReader` or is not one.
    Labels are names, ``None`` out of scope; times are naive UTC or unix seconds as stated.
    """

    def traffic_by_window(self, window: str | int, last: int | None = None) -> list[TrafficCount]:
        """Per-window and whole-log counts for ``flywheel stats`` (only the last ``last``
        windows' rows)."""
        ...

    def language_breakdown(self) -> list[LanguageCounts]:
        """Per logged language: decisions, teacher-decided, confident, degraded, layer 2 vs
        teacher, served out of scope."""
        ...

    def anchoring_observations(self) -> list[AnchoringCount]:
        """The teacher's decisions with layer 2's answer, grouped with their history labels."""
        ...

    def shadow_answered(self, version: str) -> int:
        """How many decisions in the log shadow ``version`` answered."""
        ...

    def shadow_agreement(self, version: str) -> ShadowAgreement:
        """Shadow ``version`` against the champion over the whole log."""
        ...

    def teacher_human_pairs(self) -> list[LabelPair]:
        """``(teacher, human, n)`` over decisions with both a valid teacher and a human label."""
        ...

    def error_directions(self) -> ErrorDirections:
        """Teacher calls layer 2 already had; confident layer-2 answers people corrected."""
        ...

    def review_candidates(self, since: float, until: float, language: str | None = None, *,
                          limit: int) -> list[ReviewCandidate]:
        """The newest ``limit`` decisions in ``[since, until]`` that may deserve a review."""
        ...

    def label_coverage(self) -> list[LabelCoverage]:
        """Per served label: decisions, and those with a human or valid teacher label."""
        ...

    def human_corrections(self) -> list[HumanCorrection]:
        """Per ``(served, human)`` pair: the decisions a person corrected."""
        ...

    def logged_languages(self) -> list[str]:
        """Every logged language, sorted."""
        ...
