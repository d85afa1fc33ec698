"""The traffic log's schema: numbered migrations, each applied in its own transaction.

A column added by a migration is also a field of
:data:`logstore.segments.SEGMENT_SCHEMA` (the Arrow schema of the spool segments,
which mirrors the ``decisions`` table plus the ``embedding`` column) and is filled by
:func:`logstore.segments.records_to_table` (by column name: it refuses a schema column
that nothing fills). ``tests/logstore/test_segment_schema.py`` checks that the three agree
(names and types, against a log made by these migrations).

``MIGRATIONS`` is an ordered list of ``(number, sql)``. :func:`apply_migrations`
records each applied number in ``schema_version`` inside the same transaction as
the migration itself, so applying is idempotent and a crash half-way leaves either
the old or the new version, never a mix. A database whose recorded version is newer
than :data:`SCHEMA_VERSION` (written by a newer flywheel) is refused with a
:class:`~logstore.errors.LogStoreError` instead of being half-understood.

Rules for adding a migration: append ``(SCHEMA_VERSION + 1, sql)``; never edit or
reorder an applied one. Spool segments written by older code are ingested with
``INSERT ... BY NAME``, so new columns must be nullable or have a default.

Tables (all timestamps are naive UTC ``TIMESTAMP``):

- ``decisions``: one row per logged decision (the :class:`DecisionRecord`, flattened;
  ``teacher_*`` is the inline LLM call, kept even when invalid, with
  ``teacher_valid``; ``l2_label``/``l2_confidence``/``l2_tier`` is layer 2's own
  answer, also when the LLM or a degraded fallback decided; NULL when layer 2 did
  not run).
- ``embeddings``: the layer-2 vector of a decision with the encoder that made it.
- ``labels``: append-only human labels and back-filled teacher labels
  (``label`` NULL = out of scope; ``valid`` false rows are kept for stats only).
- ``resolutions``: pending decisions that the retrain job has dealt with.
- ``ingested_segments``: bookkeeping that makes spool ingestion exactly-once (a name is
  forgotten once its file is gone: spool names are never reused).
- ``ingested_objects`` (migration 3): every object key (a bucket key of a shipped
  segment) whose rows are in, kept forever, written in the same transaction as the rows
  (:func:`logstore.segments.insert_objects`), because a key can be mirrored again.

Migration 3 also gives ``labels`` a ``label_uid`` (the id of a
:class:`~logstore.label_records.LabelRecord`, which makes a label shipped or mirrored twice
count once; NULL for older rows) and ``logged_at`` (when the label reached this
database; NULL for older rows, read as ``created_at``).

Migration 4 adds ``decisions.degraded`` (why an answer did not get the layer it needed,
:data:`classifier.decision.DEGRADED_REASONS`; NULL when it did, and for older rows) and,
for shadow answers (``labels.source = 'shadow'``, ``model`` = the shadow version),
``labels.confidence``, ``labels.tier`` and ``labels.sure``. Readers of training labels
select ``source IN ('human', 'teacher')``; a shadow answer is never a training label.

Migration 5 makes a teacher's unsure answer data: ``decisions.teacher_candidates`` and
``labels.teacher_candidates`` (``VARCHAR[]``; NULL: the teacher was sure or did not
answer; ``[]``: "cannot tell"; else the candidates it could not pick between, NULL among
them for out of scope), on the inline call, an audit's answer and a back-filled one. An
unsure answer is never valid and its ``teacher_error`` is NULL. Rows logged before it
held the set as prose in ``teacher_error`` (``unsure: teacher unsure between A, B``);
:data:`UNSURE_FROM_ERROR` turns those into the column once (and rows of older segments as
they arrive, :func:`logstore.segments.insert_segments`), the only place that reads it.
The view ``unsure_answers`` (decision_id, candidates, model, created_at, ord) lists every
unsure answer from both tables, oldest first by ``created_at, ord``.

Migration 6 adds ``decisions.language``: the query's language as the classifier detected
it (:mod:`classifier.language`: one of the intent set's declared ``languages``, or
``unknown``); NULL for rows logged before it (and rows of older segments).

Labels may name a decision that is not (yet) in ``decisions``: a label made at one
replica for a decision logged at another, whose segment arrives later. They are kept;
every reader starts from ``decisions`` and joins, so such a label counts only once its
decision is in.

View (migration 2), the one definition of "the labels of a decision" that the store
and ``flywheel stats`` read (it may hold ids of decisions not in yet; join it to
``decisions``):

- ``decision_labels``: one row per decision with any label. ``teacher_labels`` /
  ``teacher_models``: every *valid* teacher answer (inline or back-filled), oldest
  first; ``teacher_label`` the latest (NULL = out of scope), ``has_teacher``,
  ``teacher_at``. ``human_labels`` / ``human_authors``: every human label, oldest
  first; ``human_label`` the latest, ``has_human``, ``human_at``. A human label
  always wins over the teacher's; readers apply that rule.
"""

from __future__ import annotations

from datetime import datetime, timezone

import duckdb

from flywheel.logstore.connection import scalar
from flywheel.logstore.errors import LogStoreError

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "UNSURE_FROM_ERROR", "apply_migrations", "current_version", "utcnow"]

_DECISION_LABELS_VIEW = """
CREATE VIEW decision_labels AS
WITH tl AS (
    SELECT decision_id, teacher_label AS label, teacher_model AS model,
           created_at AS ts, 0::BIGINT AS ord
    FROM decisions WHERE teacher_valid
    UNION ALL
    SELECT decision_id, label, model, created_at, label_id
    FROM labels WHERE source = 'teacher' AND valid
), t AS (
    SELECT decision_id, list(label ORDER BY ts, ord) AS teacher_labels,
           list(model ORDER BY ts, ord) AS teacher_models, max(ts) AS teacher_at
    FROM tl GROUP BY decision_id
), h AS (
    SELECT decision_id, list(label ORDER BY created_at, label_id) AS human_labels,
           list(author ORDER BY created_at, label_id) AS human_authors,
           max(created_at) AS human_at
    FROM labels WHERE source = 'human' GROUP BY decision_id
)
SELECT coalesce(t.decision_id, h.decision_id) AS decision_id,
       t.teacher_labels, t.teacher_models, t.teacher_at,
       t.teacher_labels[-1] AS teacher_label, t.decision_id IS NOT NULL AS has_teacher,
       h.human_labels, h.human_authors, h.human_at,
       h.human_labels[-1] AS human_label, h.decision_id IS NOT NULL AS has_human
FROM t FULL OUTER JOIN h ON h.decision_id = t.decision_id;
"""

#: Frozen with migration 5: the unsure answers of rows written before it (their set as prose
#: in ``teacher_error``, ``unsure: teacher unsure between A, B`` or ``unsure: teacher cannot
#: tell``, or cut to ``unsure`` by retention) moved into ``teacher_candidates`` (``[]`` when
#: it names none), ``teacher_error`` cleared. Never edit it: it reads what old code wrote.
UNSURE_FROM_ERROR = """
UPDATE decisions SET
    teacher_candidates = CASE WHEN starts_with(teacher_error, 'unsure: teacher unsure between ')
        THEN list_transform(
            list_filter(string_split(teacher_error[length('unsure: teacher unsure between ') + 1:], ','),
                        lambda n: trim(n) <> ''),
            lambda n: nullif(trim(n), 'OUT_OF_SCOPE'))
        ELSE []::VARCHAR[] END,
    teacher_error = NULL
WHERE teacher_valid = false AND teacher_candidates IS NULL
  AND (teacher_error = 'unsure' OR starts_with(teacher_error, 'unsure:'));
"""

_UNSURE_ANSWERS_VIEW = """
CREATE VIEW unsure_answers AS
SELECT decision_id, teacher_candidates AS candidates, teacher_model AS model, created_at, 0::BIGINT AS ord
FROM decisions WHERE teacher_candidates IS NOT NULL
UNION ALL
SELECT decision_id, teacher_candidates, model, created_at, label_id
FROM labels WHERE source = 'teacher' AND teacher_candidates IS NOT NULL;
"""

MIGRATIONS: list[tuple[int, str]] = [
    (1, """
CREATE TABLE decisions (
    decision_id        VARCHAR NOT NULL,
    created_at         TIMESTAMP NOT NULL,
    session_id         VARCHAR,
    text               VARCHAR NOT NULL,
    history            STRUCT(label VARCHAR, snippet VARCHAR)[],
    declared_type      VARCHAR,
    layer              VARCHAR NOT NULL,
    label              VARCHAR,
    confidence         DOUBLE,
    tier               VARCHAR,
    reason             VARCHAR,
    alternatives       STRUCT(label VARCHAR, confidence DOUBLE)[],
    model_version      VARCHAR,
    encoder_id         VARCHAR,
    latency_ms         MAP(VARCHAR, DOUBLE),
    teacher_model      VARCHAR,
    teacher_label      VARCHAR,
    teacher_valid      BOOLEAN,
    teacher_latency_ms DOUBLE,
    teacher_error      VARCHAR,
    audit              BOOLEAN NOT NULL DEFAULT FALSE,
    pending            BOOLEAN NOT NULL DEFAULT FALSE,
    l2_label           VARCHAR,
    l2_confidence      DOUBLE,
    logged_at          TIMESTAMP
);
CREATE TABLE embeddings (
    decision_id VARCHAR NOT NULL,
    encoder_id  VARCHAR NOT NULL,
    dim         INTEGER NOT NULL,
    vector      FLOAT[] NOT NULL
);
CREATE SEQUENCE labels_seq;
CREATE TABLE labels (
    label_id    BIGINT NOT NULL DEFAULT nextval('labels_seq'),
    decision_id VARCHAR NOT NULL,
    source      VARCHAR NOT NULL CHECK (source IN ('human', 'teacher')),
    label       VARCHAR,
    model       VARCHAR,
    valid       BOOLEAN NOT NULL,
    latency_ms  DOUBLE,
    author      VARCHAR,
    created_at  TIMESTAMP NOT NULL
);
CREATE TABLE resolutions (
    decision_id VARCHAR NOT NULL,
    resolved_at TIMESTAMP NOT NULL
);
CREATE TABLE ingested_segments (
    name        VARCHAR PRIMARY KEY,
    rows        BIGINT NOT NULL,
    ingested_at TIMESTAMP NOT NULL
);
"""),
    (2, "ALTER TABLE decisions ADD COLUMN l2_tier VARCHAR;\n" + _DECISION_LABELS_VIEW),
    (3, """
CREATE TABLE ingested_objects (
    key         VARCHAR PRIMARY KEY,
    kind        VARCHAR NOT NULL,
    rows        BIGINT NOT NULL,
    ingested_at TIMESTAMP NOT NULL
);
ALTER TABLE labels ADD COLUMN label_uid VARCHAR;
ALTER TABLE labels ADD COLUMN logged_at TIMESTAMP;
"""),
    # labels is rebuilt: its CHECK on ``source`` gains 'shadow' (DuckDB cannot alter a CHECK)
    (4, """
ALTER TABLE decisions ADD COLUMN degraded VARCHAR;
DROP VIEW decision_labels;
CREATE TABLE labels_v4 (
    label_id    BIGINT NOT NULL DEFAULT nextval('labels_seq'),
    decision_id VARCHAR NOT NULL,
    source      VARCHAR NOT NULL CHECK (source IN ('human', 'teacher', 'shadow')),
    label       VARCHAR,
    model       VARCHAR,
    valid       BOOLEAN NOT NULL,
    latency_ms  DOUBLE,
    author      VARCHAR,
    created_at  TIMESTAMP NOT NULL,
    label_uid   VARCHAR,
    logged_at   TIMESTAMP,
    confidence  DOUBLE,
    tier        VARCHAR,
    sure        BOOLEAN
);
INSERT INTO labels_v4 (label_id, decision_id, source, label, model, valid, latency_ms, author, created_at,
                       label_uid, logged_at)
    SELECT label_id, decision_id, source, label, model, valid, latency_ms, author, created_at, label_uid, logged_at
    FROM labels;
DROP TABLE labels;
ALTER TABLE labels_v4 RENAME TO labels;
""" + _DECISION_LABELS_VIEW),
    (5, """
ALTER TABLE decisions ADD COLUMN teacher_candidates VARCHAR[];
ALTER TABLE labels ADD COLUMN teacher_candidates VARCHAR[];
""" + UNSURE_FROM_ERROR + _UNSURE_ANSWERS_VIEW),
    (6, "ALTER TABLE decisions ADD COLUMN language VARCHAR;"),
]

SCHEMA_VERSION: int = MIGRATIONS[-1][0]


def _check_list() -> None:
    numbers = [n for n, _ in MIGRATIONS]
    if numbers != list(range(1, len(numbers) + 1)):
        raise RuntimeError(f"MIGRATIONS must be numbered 1..n in order, got {numbers}")


_check_list()


def current_version(con: duckdb.DuckDBPyConnection) -> int:
    """The schema version recorded in the open database (0 for a new file)."""
    exists = scalar(con, "SELECT count(*) FROM information_schema.tables "
                         "WHERE table_schema = 'main' AND table_name = 'schema_version'")
    if not exists:
        return 0
    row = con.execute("SELECT max(version) FROM schema_version").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def apply_migrations(con: duckdb.DuckDBPyConnection, path: str = "<database>") -> list[int]:
    """Bring the database on ``con`` up to :data:`SCHEMA_VERSION`; return the numbers applied.

    Raises :class:`~logstore.errors.LogStoreError` when the file was written by a
    newer schema than this code knows.
    """
    con.execute("CREATE TABLE IF NOT EXISTS schema_version ("
                "version INTEGER PRIMARY KEY, applied_at TIMESTAMP NOT NULL)")
    version = current_version(con)
    if version > SCHEMA_VERSION:
        raise LogStoreError(
            f"log database {path} has schema version {version}, newer than this flywheel "
            f"knows ({SCHEMA_VERSION}); upgrade flywheel or use another log path")
    applied: list[int] = []
    for number, sql in MIGRATIONS:
        if number <= version:
            continue
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(sql)
            con.execute("INSERT INTO schema_version VALUES (?, ?)", [number, utcnow()])
            con.execute("COMMIT")
        except Exception as exc:
            con.execute("ROLLBACK")
            raise LogStoreError(f"log database {path}: migration {number} failed: {exc}") from exc
        applied.append(number)
    return applied


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)
