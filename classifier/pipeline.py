"""The three-layer pipeline: declared type / rules -> embeddings -> LLM teacher.

:class:`Classifier` holds one immutable runtime bundle (model, encoder, rules,
thresholds: :class:`~classifier.bundle.ModelBundle`) that :meth:`Classifier.swap_model`
replaces in a single assignment, so a request in flight finishes on the model (and the
encoder) it started with while new ones use the new one. A version that carries its own
encoder brings it into the bundle
(:class:`~classifier.encoders.version_encoder.VersionEncoderEmbedder`), built and warmed
before the swap. Served from a models home, it is built with what it follows (``follow``).

Layer 3 and the background audits build the teacher's request the same way
(:meth:`Classifier._request`: :func:`~classifier.teachers.base.offered_options`, layer 2's
top candidates with the decided label among them), so an audit asks the question layer 3
would have asked. Layer 3 goes through the :class:`~classifier.teachers.cache.TeacherCache`
(``teacher.cache_size`` / ``teacher.cache_ttl_s`` of the intent set): a repeated question
is answered without an LLM call and logged as an ``llm`` decision whose reason says
``cached``, with no teacher call (so it is not a second teacher label for the retrain).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from flywheel.classifier.anchoring import AnchoringMonitor
from flywheel.classifier.audit import AUDIT_OUTCOMES, DEFAULT_MAX_PENDING, AuditQueue
from flywheel.classifier.bundle import ModelBundle, new_embedder, warmed_bundle
from flywheel.classifier.decision import Candidate, Decision, Layer, Layer2Answer, TeacherCall, Tier
from flywheel.classifier.errors import NOT_CALLED_KINDS, FlywheelError, InvalidInputError, TeacherError
from flywheel.classifier.followup import Followup, FollowupDetector, followup_results
from flywheel.classifier.history import SessionHistory, coerce_history
from flywheel.classifier.layer2.shift import shifted_rows
from flywheel.classifier.layer2.tiers import Layer2Result, tier_rows
from flywheel.classifier.protocols import (
    CachingEmbedder,
    DecisionRecord,
    Embedder,
    HistoryEntry,
    LoadTimed,
    LogSink,
    Teacher,
    TeacherAnswer,
    TeacherRequest,
)
from flywheel.classifier.settings.followups import FOLLOWUP_MODES
from flywheel.classifier.settings.intents import IntentSet
from flywheel.classifier.settings.label_names import label_name, parse_label
from flywheel.classifier.shadow import ShadowScorer
from flywheel.classifier.teachers.base import offered_options
from flywheel.classifier.teachers.cache import TeacherCache
from flywheel.classifier.text import CleanText, clean_text
from flywheel.classifier.versions.model import IntentModel
from flywheel.classifier.versions.registry import WATCH_INTERVAL_S, ModelRegistry, ModelWatcher

log = logging.getLogger("flywheel.classifier")

# Teacher failures that mean "ask again later" (the query is marked pending); ``budget``:
# the LLM call budget (classifier.teachers.budget) was spent, ``flywheel label`` asks later.
RETRYABLE_TEACHER_ERRORS = frozenset({"unavailable", "timeout", "circuit_open", "budget"})


def _encoded(p: "Pending") -> np.ndarray:
    """``p``'s vector, once :meth:`Classifier._assign_layer2` has encoded it."""
    assert p.vector is not None, "encoded before scoring"
    return p.vector


def _scored(p: "Pending") -> Layer2Result:
    """``p``'s layer-2 result, once :meth:`Classifier._assign_layer2` has scored it."""
    assert p.layer2 is not None, "scored by _assign_layer2"
    return p.layer2


@dataclass(frozen=True)
class Query:
    """One query with its own context (see :meth:`Classifier.classify_queries`)."""

    text: str
    history: Iterable[Any] | None = None
    declared_type: str | None = None
    session_id: str | None = None


@dataclass(eq=False)
class Pending:
    """One query on its way through the layers.

    :meth:`Classifier.begin` makes it (and decides it by declared type or rule);
    :meth:`Classifier.score` sets ``vector`` and ``layer2`` (and decides it when layer 2
    is sure); :meth:`Classifier.finish` records ``decision``. ``rt`` is the model bundle
    it started with: a hot swap never changes a query in flight.
    """

    rt: ModelBundle
    clean: CleanText
    history: tuple[HistoryEntry, ...] | None    # given by the caller (else the session's)
    declared: str | None                        # the declared type as logged
    session_id: str | None
    t_start: float
    latency: dict[str, float] = field(default_factory=dict)
    decision: Decision | None = None
    vector: np.ndarray | None = None
    layer2: Layer2Result | None = None
    followup: Followup | None = None            # the turn it leans on, when it is a follow-up
    language: str | None = None                 # detected before finish() when scoring needed it


class Classifier:
    """The flywheel classifier.

    Parameters
    ----------
    model : IntentModel
        A fitted model version (see :meth:`load`).
    embedder : Embedder, optional
        Defaults to the version's own encoder when it carries one
        (:class:`~classifier.encoders.version_encoder.VersionEncoderEmbedder`), else the
        model's encoder settings; built lazily (no model loading here). The encoder is part
        of the served bundle: :meth:`swap_model` brings the new version's.
    teacher : Teacher or None
        The LLM for what layer 2 is unsure of. ``None``: layer 2 always answers.
    log_sink : LogSink, optional
        Receives a :class:`DecisionRecord` for every decision.
    on_long : {"truncate", "reject"}
        What to do with text over the intent set's ``max_chars``.
    audit_rate : float
        Share of confident layer-2 decisions also sent to the teacher in the
        background (``audit_callback`` receives ``(record, TeacherCall)``).
    max_pending_audits : int
        Audits waiting at most; when that many wait, a new one is dropped and
        counted in :attr:`audits_dropped` (the decision is logged as not audited).
    cache_root : path, optional
        Where the encoder built from the model's settings keeps what it builds once (a
        resolved home's ``cache``: :attr:`classifier.settings.config.Config.cache_root`); default
        the environment's home. Unused with ``embedder``.
    follow : ModelRegistry, optional
        The models home ``model`` was promoted in: :attr:`watcher` (a
        :class:`~classifier.versions.registry.ModelWatcher` built here) follows its ``CURRENT``
        and hands each newly promoted version to :meth:`swap_model` (one that fails to load
        is refused and the old one keeps serving). It checks at most every
        ``follow_interval_s`` seconds before a request, until ``watcher.start()`` runs it
        on a thread of its own (a long-running process); :meth:`close` stops it.
    shadow : ShadowScorer, optional
        Offered every query that reached layer 2 (a shadow version scored beside this one).
    teacher_cache : TeacherCache, None or "auto"
        Layer 3's answer cache (:attr:`teacher_cache`). ``"auto"`` (the default): one built
        from the model's intent set (``teacher.cache_size`` answers for
        ``teacher.cache_ttl_s`` seconds; none when the size is 0), read once, here; ``None``:
        no cache.
    ask_twice : bool or None
        Whether layer 3 asks the teacher a second time, the options in another order, when
        its answer differs from layer 2's label; two different answers make a candidate
        set, never a training label (:attr:`second_asks` counts the extra calls). ``None``
        (the default): the served intent set's ``teacher.ask_twice`` (default off).
    followups : {"resolve", "defer", "off"} or None
        What layer 2 does with a query that leans on the previous turn
        (:mod:`classifier.followup`); ``None`` (the default): the intent set's ``followups``.

    Examples
    --------
    >>> clf = Classifier.load("models/starter")            # doctest: +SKIP
    >>> clf.classify("What is addVar in AVAP?").label      # doctest: +SKIP
    'RETRIEVAL'
    """

    def __init__(self, model: IntentModel, *, embedder: Embedder | None = None,
                 teacher: Teacher | None = None, log_sink: LogSink | None = None,
                 on_long: str = "truncate", max_sessions: int = 10_000,
                 audit_rate: float = 0.0,
                 audit_callback: Callable[[DecisionRecord, TeacherCall], None] | None = None,
                 max_pending_audits: int = DEFAULT_MAX_PENDING,
                 rng: random.Random | None = None,
                 redact: Callable[[str], str] | None = None,
                 cache_root: str | Path | None = None,
                 follow: ModelRegistry | None = None,
                 follow_interval_s: float = WATCH_INTERVAL_S,
                 shadow: ShadowScorer | None = None,
                 teacher_cache: TeacherCache | None | str = "auto",
                 ask_twice: bool | None = None, followups: str | None = None) -> None:
        if on_long not in ("truncate", "reject"):
            raise ValueError(f"on_long must be 'truncate' or 'reject', got {on_long!r}")
        if not 0.0 <= audit_rate <= 1.0:
            raise ValueError(f"audit_rate must be between 0 and 1, got {audit_rate!r}")
        if followups not in (None, *FOLLOWUP_MODES):
            raise ValueError(f"followups must be one of {', '.join(FOLLOWUP_MODES)} or None, got {followups!r}")
        self._given_embedder = embedder     # the caller's: reused by any version trained on it
        self._cache_root = cache_root
        if embedder is None:
            embedder = new_embedder(model, cache_root)
        self._rt = ModelBundle.build(model, embedder)
        self.teacher = teacher
        self.log_sink = log_sink
        self.on_long = on_long
        self.sessions = SessionHistory(model.intents.teacher.history_size, max_sessions)
        self.audit_rate = audit_rate
        self.audit_callback = audit_callback
        self.redact = redact  # applied to logged text and history snippets only (classifier.masking)
        self._rng = rng or random.Random()
        self._audits = AuditQueue(max_pending_audits)
        self._lock = threading.Lock()
        self.watcher = (ModelWatcher(follow, self._swap_promoted, follow_interval_s, current=model.version)
                        if follow is not None else None)   # serving from a models home
        self.shadow = shadow
        # teacher audits of confident layer-2 decisions by outcome (read by the metrics)
        self.audit_outcomes: dict[str, int] = dict.fromkeys(AUDIT_OUTCOMES, 0)
        # history anchoring of the teacher's answers (ADR RC-03); None: not measured
        self.anchoring: AnchoringMonitor | None = AnchoringMonitor()
        if isinstance(teacher_cache, str):
            if teacher_cache != "auto":
                raise ValueError(f"teacher_cache must be a TeacherCache, None or 'auto', got {teacher_cache!r}")
            ts = model.intents.teacher
            teacher_cache = TeacherCache(ts.cache_size, ts.cache_ttl_s) if ts.cache_size > 0 else None
        # layer 3's answers by question (a hit is no LLM call); read by the metrics
        self.teacher_cache: TeacherCache | None = teacher_cache
        # ask the teacher again when it disagrees with layer 2 (None: the served intent set's
        # teacher.ask_twice); second_asks counts those extra calls (read by the metrics)
        self.ask_twice = ask_twice
        self.second_asks = 0
        self.followups = followups   # None: the served intent set's
        self.followup_detector = FollowupDetector()

    # ----------------------------------------------------------- model access
    @classmethod
    def load(cls, path: str | Path, **kwargs: Any) -> "Classifier":
        """Load a saved model version directory."""
        return cls(IntentModel.load(path), **kwargs)

    @classmethod
    def from_registry(cls, home: str | Path, *, watch: bool = True, interval_s: float = WATCH_INTERVAL_S,
                      background: bool = False, **kwargs: Any) -> "Classifier":
        """Serve the ``CURRENT`` version of a models home; with ``watch``, a newly promoted
        version is swapped in without a restart (``follow``), checked at most every
        ``interval_s``: before a ``classify`` call (a short-lived process needs no thread), or
        with ``background`` on the watcher's thread, so no request pays for a reload."""
        reg = ModelRegistry(home)
        clf = cls(reg.load_current(), follow=reg if watch else None, follow_interval_s=interval_s, **kwargs)
        if background and clf.watcher is not None:
            clf.watcher.start()
        return clf

    @property
    def model(self) -> IntentModel:
        return self._rt.model

    @property
    def model_version(self) -> str:
        return self._rt.model.version

    @property
    def intents(self) -> IntentSet:
        return self._rt.model.intents

    @property
    def embedder(self) -> Embedder:
        """The encoder of the served bundle (it changes with :meth:`swap_model` when the new
        version carries its own encoder, or was trained on another)."""
        return self._rt.embedder

    def check_encoder(self, model: IntentModel) -> None:
        """Raise :class:`~classifier.errors.ModelError` if ``model`` needs another encoder than
        the one serving now (a shadow version scores the champion's vectors)."""
        model.check_encoder(self.embedder.id, self.embedder.dim)

    def _swap_promoted(self, model: IntentModel | None) -> None:
        """The ``CURRENT`` watcher's callback (it reports ``None`` only for a cleared ``SHADOW``)."""
        if model is not None:
            self.swap_model(model)

    def swap_model(self, model: IntentModel) -> None:
        """Serve ``model`` from now on, with its encoder.

        The new bundle (model and encoder: the one serving now or the caller's when the id
        is the same, else the version's own, else its settings'; a version's own encoder has
        a content id, so the same id is the same, already checked, encoder) is built and warmed (the
        encoder loaded and checked, one scoring pass) before the swap, on the caller's
        thread; queries already begun finish on the bundle they started with. Refuses with
        :class:`~classifier.errors.ModelError`, and changes nothing, a model whose encoder
        cannot be built, loaded or verified, or is not the one its head was trained with
        (:func:`~classifier.bundle.warmed_bundle`)."""
        rt = warmed_bundle(model, (self._rt.embedder, self._given_embedder), self._cache_root)
        with self._lock:
            self._rt = rt
        log.info("now serving model %s (encoder %s)", model.version, rt.embedder.id)

    # ------------------------------------------------------------- classify
    def classify(self, text: str, *, history: Iterable[Any] | None = None,
                 declared_type: str | None = None, session_id: str | None = None) -> Decision:
        """Classify one query; see the module docs for the layers and tiers."""
        return self.classify_many([text], history=history, declared_type=declared_type,
                                  session_id=session_id)[0]

    def classify_many(self, texts: Sequence[str], *, history: Iterable[Any] | None = None,
                      declared_type: str | None = None, session_id: str | None = None) -> list[Decision]:
        """Classify several queries; layer 2 encodes them in batches.

        Raises :class:`~classifier.errors.InvalidInputError` (naming the item) if any
        text is unusable; nothing is classified or logged in that case.
        """
        if isinstance(texts, str):
            raise InvalidInputError("classify_many takes a list of texts, not a string")
        return self.classify_queries([Query(t, history, declared_type, session_id) for t in texts])

    def classify_queries(self, queries: Sequence[Query]) -> list[Decision]:
        """Classify queries that each carry their own history, declared type and session.

        The stages, which a server may also run itself (see :class:`Pending`):
        :meth:`begin` each query (declared type, rules), :meth:`score` the rest in one
        encoder pass, :meth:`ask_teacher` for what layer 2 is unsure of, then
        :meth:`finish` (log, session history). Raises
        :class:`~classifier.errors.InvalidInputError` naming the item if any query is
        unusable; nothing is classified or logged then.
        """
        watcher = self.watcher
        if watcher is not None and not watcher.running:
            watcher.poll()
        pending = self.begin_all(queries)
        self.score(pending)
        single = len(pending) == 1
        return [self.finish(p, None if p.decision is not None else self.ask_teacher(p), total=single)
                for p in pending]

    # ------------------------------------------------------------- stages
    def begin(self, query: Query) -> "Pending":
        """Check and clean one query; decide it by its declared type or a rule when one
        applies (then ``pending.decision`` is set). Raises
        :class:`~classifier.errors.InvalidInputError` for an unusable text or declared type."""
        rt = self._rt
        c = clean_text(query.text, rt.model.intents.embedder.max_chars, on_long=self.on_long)
        history = (coerce_history(query.history, rt.model.intents.teacher.history_size)
                   if query.history is not None else None)
        declared_label, declared = None, None
        if query.declared_type is not None:
            declared_label = parse_label(query.declared_type, rt.labels, what="declared type")
            declared = label_name(declared_label)
        p = Pending(rt, c, history, declared, query.session_id, time.perf_counter())
        t0 = time.perf_counter()
        if declared is not None:
            tier = Tier.NO_MATCH if declared_label is None else Tier.CONFIDENT
            p.decision = self._decision(rt, declared_label, 1.0, tier, Layer.DECLARED, f"declared type {declared}",
                                        c, {"declared": _ms(t0)})
            return p
        m = rt.rules.match(c.text)
        p.latency["rules"] = _ms(t0)
        if m is not None:
            p.decision = self._decision(rt, m.intent, 1.0, Tier.CONFIDENT, Layer.RULES, f"rule {m.rule_id}", c,
                                        p.latency)
        return p

    def begin_all(self, queries: Sequence[Query], item: str = "text #{n}") -> list["Pending"]:
        """:meth:`begin` every query, or none: an unusable one raises
        :class:`~classifier.errors.InvalidInputError` naming it (``item`` formats its
        1-based number ``n``, e.g. ``"requests[{i}]"`` with ``i = n - 1``) when there are several."""
        out = []
        for n, q in enumerate(queries, 1):
            try:
                out.append(self.begin(q))
            except InvalidInputError as exc:
                if len(queries) == 1:
                    raise
                raise type(exc)(f"{item.format(n=n, i=n - 1)}: {exc}") from None
        return out

    def cached_vector(self, text: str, pending: "Pending | None" = None) -> np.ndarray | None:
        """The embedder's cached vector for the cleaned ``text``, if it has one (no encoding):
        the encoder of ``pending``'s bundle when given (a swap may have happened since it
        began), else the serving one."""
        embedder = pending.rt.embedder if pending is not None else self.embedder
        return embedder.lookup(text) if isinstance(embedder, CachingEmbedder) else None

    def score(self, pending: Sequence["Pending"]) -> None:
        """Layer 2 for every query not decided yet, in one encoder pass (vectors already
        set on a pending query are used as they are). A query layer 2 is sure of, or
        that has no teacher to ask, is decided here."""
        todo = [p for p in pending if p.decision is None and p.layer2 is None]
        if not todo:
            return
        t0 = time.perf_counter()
        self._assign_layer2(todo)
        total = _ms(t0)
        load = earlier = 0.0    # loading the encoder is not query latency
        for emb in {id(p.rt.embedder): p.rt.embedder for p in todo}.values():
            if isinstance(emb, LoadTimed):
                load += emb.pop_load_ms()
                earlier += emb.pop_earlier_load_ms()   # paid before this pass: not taken off it
        per_item = max(total - load, 0.0) / len(todo)
        for p in todo:
            if load + earlier > 0:
                p.latency["load"] = load + earlier
            p.latency["embedding"] = per_item
            res = _scored(p)
            if res.sure:
                p.decision = self._from_layer2(p.rt, res, p.clean, p.latency)
            elif self.teacher is None:   # keeps layer 2's tier: there is no teacher to fail
                p.decision = self._from_layer2(p.rt, res, p.clean, p.latency, "; no LLM teacher configured",
                                               degraded="no_teacher")

    def _assign_layer2(self, todo: Sequence["Pending"]) -> None:
        """Encode the queries without a vector (one call per bundle) and set ``layer2`` on each."""
        by_rt: dict[int, list[Pending]] = {}
        for p in todo:  # a swap between begin() and score() leaves two runtimes in one batch
            by_rt.setdefault(id(p.rt), []).append(p)
        for group in by_rt.values():
            rt = group[0].rt
            missing = [p for p in group if p.vector is None]
            if missing:   # each bundle's own encoder: its head scores that encoder's vectors
                for p, v in zip(missing, rt.embedder.encode([p.clean.text for p in missing])):
                    p.vector = v
            s = rt.model.head.scores(np.stack([_encoded(p) for p in group]))

            def score(texts: list[str], rt: ModelBundle = rt) -> list[Layer2Result]:
                return tier_rows(rt.model.head.scores(rt.embedder.encode(texts)), rt.labels, rt.thresholds)
            languages = [rt.language.detect(p.clean.text) for p in group] if rt.thresholds.undertrained else None
            for p, lang in zip(group, languages or ()):   # detected once: finish() logs the same answer
                p.language = lang
            shifted = shifted_rows(languages, rt.thresholds.undertrained)
            alone = tier_rows(s, rt.labels, rt.thresholds, shifted)
            mode = self.followups or rt.model.intents.followups
            for p, (res, f) in zip(group, followup_results(mode, self.followup_detector, [p.clean.text for p in group],
                                                           [self._history(p) for p in group], alone, score)):
                p.layer2, p.followup = res, f

    def _history(self, p: "Pending") -> tuple[HistoryEntry, ...]:
        """The history ``p`` is classified with: the caller's, else its session's."""
        return p.history if p.history is not None else (self.sessions.get(p.session_id) if p.session_id else ())

    def ask_teacher(self, p: "Pending") -> Decision:
        """Layer 3 for a scored query layer 2 is unsure of: the teacher's answer, or layer
        2's best guess (tier ``weak``) with the reason when the teacher fails. Returns the
        decision without recording it on ``p`` (a server may have given up waiting)."""
        assert p.layer2 is not None and self.teacher is not None, "ask_teacher needs a scored, unsure query"
        return self._layer3(p.rt, p.clean, p.layer2, self._history(p), dict(p.latency))

    def without_teacher(self, p: "Pending", why: str, reason: str = "skipped_deadline") -> Decision:
        """Layer 2's best guess for an unsure query whose teacher call was not made or not
        waited for (``why`` goes into the reason, ``reason`` is the degraded reason, one of
        :data:`~classifier.decision.DEGRADED_REASONS`); it is logged as pending, so
        ``flywheel label`` asks the teacher later."""
        assert p.layer2 is not None, "without_teacher needs a scored query"
        return self._from_layer2(p.rt, p.layer2, p.clean, p.latency, f"; llm skipped: {why}", degraded=reason,
                                 pending=True)

    def finish(self, p: "Pending", decision: Decision | None = None, *, total: bool = True) -> Decision:
        """Record the query's decision (``decision``, else the one set on ``p``): session
        history, traffic log, audit sampling. Returns it completed with what is known only
        now (the one copy a decision gets, set on ``p``): the query's ``language`` and, with
        ``total``, the whole call's latency as ``latency_ms["total"]``."""
        made = decision if decision is not None else p.decision
        assert made is not None, "finish needs a decision"
        language = p.language if p.language is not None else p.rt.language.detect(p.clean.text)
        d = replace(made, language=language,
                    latency_ms={**made.latency_ms, "total": _ms(p.t_start)} if total else made.latency_ms)
        p.decision = d
        l2 = Layer2Answer(p.layer2.label, p.layer2.confidence, p.layer2.tier) if p.layer2 is not None else None
        self._after(p.rt, d, p.clean, p.history, p.declared, p.session_id, p.vector, l2, p.layer2)
        shadow = self.shadow
        if shadow is not None and p.vector is not None and l2 is not None:   # a deque append; scored off this thread
            shadow.offer(d.id, p.vector, p.rt.model.version, p.rt.embedder.id, p.clean.text)
        return d

    # ------------------------------------------------------------- internals
    def _decision(self, rt: ModelBundle, label: str | None, confidence: float, tier: Tier, layer: Layer,
                  reason: str, c: CleanText, latency: dict[str, float],
                  alternatives: list[Candidate] | None = None, teacher: TeacherCall | None = None, *,
                  degraded: str | None = None, pending: bool = False) -> Decision:
        """The one place a stage builds its :class:`Decision`, every field known (a copy of
        ``latency``: the query's own dict goes on changing); :meth:`finish` adds the rest."""
        if c.truncated:
            reason += f"; text truncated from {c.original_chars} to {len(c.text)} characters"
        return Decision(label=label, confidence=float(confidence), tier=tier, layer=layer, reason=reason,
                        alternatives=alternatives or [], model_version=rt.model.version,
                        latency_ms=dict(latency), teacher=teacher,
                        metadata=dict(rt.metadata.get(label, {})) if label is not None else {},
                        degraded=degraded, pending=pending)

    def _from_layer2(self, rt: ModelBundle, res: Layer2Result, c: CleanText, lat: dict[str, float],
                     suffix: str = "", teacher: TeacherCall | None = None, degraded: str | None = None,
                     pending: bool = False) -> Decision:
        """Layer 2's answer as the decision; ``degraded`` (a reason) when layer 2 was unsure
        and the teacher it deferred to did not answer (failed, skipped, over budget): the answer
        is then served as a best guess, tier ``weak``, even where layer 2 said ``ambiguous`` (its
        prediction set stays in the alternatives), so a host that acts on ``ambiguous`` never acts
        on an answer that was meant to be checked and was not. Without a teacher (``no_teacher``)
        layer 2's tier is kept: there layer 2 is the final word, not a fallback. ``pending``: the
        teacher is to be asked later (``flywheel label``)."""
        tier = res.tier
        if degraded not in (None, "no_teacher") and tier in (Tier.CONFIDENT, Tier.AMBIGUOUS):
            tier = Tier.WEAK  # the teacher was needed and failed: layer 2's answer is a best guess
        alts = res.alternatives if tier is not Tier.CONFIDENT else []
        if tier is Tier.WEAK and not alts and res.label is not None:
            alts = [c_ for c_ in res.candidates[:3]]
        return self._decision(rt, res.label, res.confidence, tier, Layer.EMBEDDING, res.reason + suffix, c, lat,
                              alts, teacher, degraded=degraded, pending=pending)

    def _layer3(self, rt: ModelBundle, c: CleanText, res: Layer2Result, history: tuple[HistoryEntry, ...],
                lat: dict[str, float]) -> Decision:
        teacher = self.teacher
        assert teacher is not None
        req = self._request(rt, c.text, res, history)
        cache = self.teacher_cache
        twice = self.ask_twice if self.ask_twice is not None else rt.model.intents.teacher.ask_twice

        def ask() -> TeacherAnswer:
            first = teacher.label(req)
            if not twice or first.unsure or first.label == res.label:
                return first
            return self._ask_again(teacher, req, first)

        t0 = time.perf_counter()
        try:
            if cache is None:
                ans, cached = ask(), False
            else:   # one LLM call per question, also for repeats asked at the same time
                key = cache.key(req, revision=rt.revision, model=teacher.model)
                ans, cached = cache.answer(key, ask)
        except TeacherError as exc:
            lat["llm"] = _ms(t0)
            call = TeacherCall(model=teacher.model, label=None, valid=False, latency_ms=lat["llm"],
                               error=str(exc)) if exc.kind not in NOT_CALLED_KINDS else None  # no call made
            return self._from_layer2(rt, res, c, lat, f"; {exc.reason()}", call, degraded=exc.kind,
                                     pending=exc.kind in RETRYABLE_TEACHER_ERRORS)
        except Exception as exc:  # noqa: BLE001 - a third-party teacher must never break serving
            lat["llm"] = _ms(t0)
            log.exception("teacher raised an unexpected error")
            call = TeacherCall(teacher.model, None, False, lat["llm"], f"error: {exc}")
            return self._from_layer2(rt, res, c, lat, f"; llm failed: {type(exc).__name__}", call, degraded="error")
        conf = rt.model.intents.teacher.confidence
        if cached:
            # served from the cache: no LLM call, so no TeacherCall. The log's teacher label
            # comes from a decision's valid call; the answer is the training label of the
            # decision that asked, never a second one (the retrain merges texts anyway).
            lat["llm_cache"] = _ms(t0)
            call, how = None, "cached; "
        else:
            lat["llm"] = _ms(t0)
            call, how = TeacherCall(model=ans.model, label=ans.label, valid=True, latency_ms=lat["llm"]), ""
        if ans.asks > 1:
            how += "asked twice; "
        if ans.unsure:
            return self._unsure(rt, c, res, ans, call, how, lat)
        if ans.label is None:
            return self._decision(rt, None, conf, Tier.NO_MATCH, Layer.LLM,
                                  f"llm {ans.model}: out of scope ({how}layer 2: {res.reason})", c, lat, [], call)
        return self._decision(rt, ans.label, conf, Tier.CONFIDENT, Layer.LLM,
                              f"llm {ans.model} chose {ans.label} ({how}layer 2: {res.reason})", c, lat, [], call)

    def _ask_again(self, teacher: Teacher, req: TeacherRequest, first: TeacherAnswer) -> TeacherAnswer:
        """``teacher.ask_twice``: the teacher disagreed with layer 2, so ask again with the
        options in another order (``order_seed=1``). The same label: ``first`` (``asks=2``);
        another one: a candidate set of both; an unsure second answer: that one. When the
        second call fails, the first answer stands."""
        with self._lock:
            self.second_asks += 1
        try:
            second = teacher.label(replace(req, order_seed=1))
        except Exception as exc:  # noqa: BLE001 - the first answer stands
            log.info("second teacher ask failed (%s); keeping the first answer", exc)
            return first
        latency, raw = first.latency_ms + second.latency_ms, f"{first.raw}\n{second.raw}"
        if second.unsure:
            return replace(second, latency_ms=latency, raw=raw, asks=2)
        if second.label == first.label:
            return replace(first, latency_ms=latency, raw=raw, asks=2)
        return replace(first, candidates=(first.label, second.label), latency_ms=latency, raw=raw, asks=2)

    def _unsure(self, rt: ModelBundle, c: CleanText, res: Layer2Result, ans: TeacherAnswer,
                call: TeacherCall | None, how: str, lat: dict[str, float]) -> Decision:
        """The decision for an unsure teacher answer (a candidate set, or cannot tell):
        layer 2's best guess among the candidates when it ranks one of them (tier
        ``ambiguous``, the alternatives: those candidates as layer 2 ranks them), else layer 2's
        best guess (tier ``weak``, layer 2's alternatives). The teacher's call is
        logged as not valid with the set as data (:attr:`TeacherCall.candidates`, the
        log's ``teacher_candidates``), so it is never a training label."""
        picks: dict[str | None, Candidate] = {}
        for c_ in (Candidate(res.label, res.confidence), *res.candidates):   # best first
            if c_.label in ans.candidates:
                picks.setdefault(c_.label, c_)
        ranked = list(picks.values())
        if ranked:
            label, conf, tier, which = ranked[0].label, ranked[0].confidence, Tier.AMBIGUOUS, " among them"
        else:
            label, conf, tier = res.label, res.confidence, Tier.WEAK
            which = " (it ranks none of them)" if ans.candidates else ""
        if call is not None:
            call = TeacherCall(model=call.model, label=None, valid=False, latency_ms=call.latency_ms,
                               candidates=ans.candidate_set)
        reason = f"llm {ans.model}: {ans.unsure_reason()}; layer 2's best guess{which} ({how}layer 2: {res.reason})"
        alts = ranked or res.alternatives   # as for layer 2's own unsure answers: the served label first
        return self._decision(rt, label, conf, tier, Layer.LLM, reason, c, lat, alts, call)

    def teacher_requests(self, texts: Sequence[str],
                         histories: Sequence[tuple[HistoryEntry, ...]] | None = None) -> list[TeacherRequest]:
        """The requests the pipeline would send the teacher for ``texts`` (layer 2's top
        candidates with a large label set); used to back-fill pending decisions."""
        rt = self._rt
        now = time.perf_counter()
        pending = [Pending(rt, clean_text(t, rt.model.intents.embedder.max_chars), None, None, None, now)
                   for t in texts]
        self._assign_layer2(pending)
        return [self._request(rt, t, _scored(p), tuple(histories[j]) if histories else ())
                for j, (t, p) in enumerate(zip(texts, pending))]

    def _request(self, rt: ModelBundle, text: str, res: Layer2Result, history: tuple[HistoryEntry, ...],
                 decided: str | None = None) -> TeacherRequest:
        """The teacher's request for ``text``: the one way layer 3, the audits and the
        back-fill build it. The options are :func:`~classifier.teachers.base.offered_options`
        of layer 2's ranking (``res.candidates``) with ``decided`` (default: layer 2's own
        label) among them; the prompt's order then follows from them and the text."""
        options = offered_options(rt.options, [c_.label for c_ in res.candidates],
                                  rt.model.intents.teacher.max_candidates,
                                  res.label if decided is None else decided)
        return TeacherRequest(text=text, options=options, history=history, allow_out_of_scope=True)

    def _after(self, rt: ModelBundle, d: Decision, c: CleanText, hist_arg: tuple[HistoryEntry, ...] | None,
               declared: str | None, session_id: str | None, vector: np.ndarray | None,
               layer2: Layer2Answer | None, ranked: Layer2Result | None = None) -> None:
        history = hist_arg if hist_arg is not None else (self.sessions.get(session_id) if session_id else ())
        if (self.anchoring is not None and d.layer is Layer.LLM and layer2 is not None    # the teacher answered,
                and d.tier in (Tier.CONFIDENT, Tier.NO_MATCH)):  # and was sure (an unsure answer is weak/ambiguous)
            self.anchoring.observe(d.label, layer2.label, [h.label for h in history])
        if session_id:
            self.sessions.add(session_id, d.label, c.text)
        audit = (self.audit_rate > 0 and self.teacher is not None and d.layer is Layer.EMBEDDING
                 and d.tier is Tier.CONFIDENT and ranked is not None and self._rng.random() < self.audit_rate
                 and self._audits.reserve())
        if self.log_sink is None and not audit:
            return
        raw_history = tuple(history)
        text, history = c.text, raw_history
        if self.redact is not None:
            text = self.redact(text)
            history = tuple(HistoryEntry(h.label, self.redact(h.snippet)) for h in raw_history)
        record = DecisionRecord(decision=d, text=text, created_at=time.time(), session_id=session_id,
                                declared_type=declared, history=history,
                                encoder_id=rt.embedder.id if vector is not None else None,
                                embedding=vector, audit=audit,
                                pending=d.pending, layer2=layer2)
        if self.log_sink is not None:
            try:
                self.log_sink.write(record)
            except FlywheelError as exc:  # the log must never fail a request
                log.error("decision %s not logged: %s", d.id, exc)
        if audit:
            assert ranked is not None
            self._submit_audit(rt, record, c.text, raw_history, ranked)

    @property
    def audits_dropped(self) -> int:
        """Audits dropped because the backlog was full."""
        return self._audits.dropped

    def _submit_audit(self, rt: ModelBundle, record: DecisionRecord, text: str,
                      history: tuple[HistoryEntry, ...], ranked: Layer2Result) -> None:
        """Queue a teacher audit of ``record``: the request layer 3 would have sent for this
        query (:meth:`_request`: layer 2's top candidates, the decided label among them).
        The teacher sees the raw ``text`` and ``history`` even when the logged copy is
        masked. Audits bypass the answer cache: each is a real teacher call."""
        req = self._request(rt, text, ranked, history, record.decision.label)
        self._audits.submit(self._run_audit, record, req)

    def _run_audit(self, record: DecisionRecord, req: TeacherRequest) -> None:
        assert self.teacher is not None
        t0 = time.perf_counter()
        try:
            ans = self.teacher.label(req)
            call = (TeacherCall(ans.model, None, False, ans.latency_ms, candidates=ans.candidate_set)
                    if ans.unsure else TeacherCall(ans.model, ans.label, True, ans.latency_ms))
        except TeacherError as exc:
            call = TeacherCall(self.teacher.model, None, False, _ms(t0), str(exc))
        except Exception as exc:  # noqa: BLE001
            call = TeacherCall(self.teacher.model, None, False, _ms(t0), f"error: {exc}")
        outcome = ("unsure" if call.unsure else "failed" if not call.valid
                   else "agree" if call.label == record.decision.label else "disagree")
        with self._lock:
            self.audit_outcomes[outcome] += 1
        if self.audit_callback is not None:
            try:
                self.audit_callback(record, call)
            except Exception:  # noqa: BLE001
                log.exception("audit callback failed")

    def close(self, *, close_sink: bool = True) -> None:
        """Stop the model watcher, finish background audits and (unless the caller closes
        it itself, ``close_sink=False``) close the log sink."""
        if self.watcher is not None:
            self.watcher.stop()
        self._audits.close()
        if close_sink and self.log_sink is not None:
            self.log_sink.close()


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0
