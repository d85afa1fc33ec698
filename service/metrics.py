"""Prometheus metrics for the gRPC sidecar (``flywheel serve``).

Everything lives on a :class:`ServerMetrics`, which owns its OWN
:class:`prometheus_client.CollectorRegistry` (never the process-wide default), so
tests and several servers in one process do not collide. The metric names are a
public contract (dashboards and alerts read them); ``tests/service/test_metrics.py`` checks
them.

gRPC metrics follow the go-grpc-prometheus convention and are recorded by
:class:`MetricsInterceptor`; the rest are fed by the server through the small
``observe_*`` / ``set_*`` / ``bind_*`` methods, which are cheap enough for the request path
(label children are cached, so a call is a dict lookup plus an atomic increment).

:func:`start_metrics_http` serves ``/metrics`` for the registry on a loopback port by
default.

Notes on the exposition (prometheus_client 0.26):

* Counters are exposed with the ``_total`` suffix, histograms as
  ``_bucket``/``_sum``/``_count``; unlabelled counters and histograms also emit a
  ``<name>_created`` gauge (the client's default; disabling it is process-global,
  so it is left on).
* A labelled metric with no children yet still renders its ``# HELP`` and
  ``# TYPE`` lines, with no samples.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Mapping, Protocol

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from flywheel.classifier.audit import AUDIT_OUTCOMES
from flywheel.classifier.decision import DEGRADED_REASONS, Decision
from flywheel.classifier.errors import ConfigError
from flywheel.classifier.language import UNKNOWN, language_labels
from flywheel.classifier.settings.label_names import OUT_OF_SCOPE, label_name
from flywheel.classifier.settings.listen import check_listen, check_port
from flywheel.classifier.shadow import LOAD_OUTCOMES, SHADOW_OUTCOMES
from flywheel.classifier.teachers.budget import BudgetedTeacher
from flywheel.classifier.teachers.cache import CACHE_OUTCOMES, TeacherCache

if TYPE_CHECKING:
    from flywheel.classifier.anchoring import AnchoringMonitor
    from flywheel.classifier.protocols import Registry
    from flywheel.classifier.shadow import ShadowScorer
    from flywheel.fleet.sync import RegistrySync
    from flywheel.logstore.sink import SpoolSink

__all__ = [
    "LATENCY_BUCKETS",
    "BATCH_BUCKETS",
    "OTHER_LABEL",
    "TEACHER_OUTCOMES",
    "SYNC_OUTCOMES",
    "ServerMetrics",
    "MetricsInterceptor",
    "start_metrics_http",
    "stop_metrics_http",
]

# seconds, 0.5 ms .. 10 s
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)

OTHER_LABEL = "other"  # any label outside the set given to ``set_labels``

# pre-created at 0 so rate() works from the first scrape; other outcomes are still accepted
TEACHER_OUTCOMES = ("ok", "timeout", "unavailable", "malformed", "unknown_label", "circuit_open",
                    "budget", "skipped_deadline", "pool_full", "error")
RELOAD_OUTCOMES = ("ok", "refused")
# what a replica's poll of the fleet's CURRENT pointer found (fleet.sync.RegistrySync)
SYNC_OUTCOMES = ("not_modified", "unchanged", "new", "refused", "error")


class ServerMetrics:
    """All metrics of one sidecar, on a registry of its own (``self.registry``).

    Thread-safe: the request path calls these methods from gRPC worker threads.
    """

    def __init__(self, labels: Iterable[str] | None = None, registry: CollectorRegistry | None = None,
                 languages: Iterable[str] | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry

        # --- gRPC (go-grpc-prometheus names) ---
        self.grpc_started = Counter(
            "grpc_server_started_total", "Total number of RPCs started on the server.",
            ["grpc_type", "grpc_service", "grpc_method"], registry=r)
        self.grpc_handled = Counter(
            "grpc_server_handled_total", "Total number of RPCs completed on the server, regardless of success.",
            ["grpc_type", "grpc_service", "grpc_method", "grpc_code"], registry=r)
        self.grpc_handling_seconds = Histogram(
            "grpc_server_handling_seconds", "Response latency (seconds) of gRPC handled by the server.",
            ["grpc_type", "grpc_service", "grpc_method"], buckets=LATENCY_BUCKETS, registry=r)

        # --- decisions ---
        self.decisions = Counter(
            "flywheel_decisions_total", "Decisions made, by deciding layer and tier.",
            ["layer", "tier"], registry=r)
        self.decision_labels = Counter(
            "flywheel_decision_labels_total",
            f"Decisions by label ({OUT_OF_SCOPE} for out of scope, '{OTHER_LABEL}' outside the known label set).",
            ["label"], registry=r)
        self.degraded = Counter(
            "flywheel_degraded_decisions_total",
            "Answers that did not get the layer they needed (layer 2 was unsure and the teacher did not "
            "answer), by reason.", ["reason"], registry=r)
        self.decision_languages = Counter(
            "flywheel_decision_languages_total",
            f"Decisions by the query's language: the intent set's declared languages and '{UNKNOWN}' "
            "(bounded: anything else counts as unknown).", ["language"], registry=r)
        self.layer_seconds = Histogram(
            "flywheel_layer_seconds", "Time spent per classifier layer that ran (seconds).",
            ["layer"], buckets=LATENCY_BUCKETS, registry=r)

        # --- serving ---
        self.batch_size = Histogram(
            "flywheel_batch_size", "Queries per classified batch.", buckets=BATCH_BUCKETS, registry=r)
        self.queue_depth = Gauge("flywheel_queue_depth", "Requests waiting to be batched.", registry=r)
        self.cache_hits = Counter(
            "flywheel_embedding_cache_hits_total", "Embedding cache hits.", registry=r)
        self.cache_misses = Counter(
            "flywheel_embedding_cache_misses_total", "Embedding cache misses.", registry=r)

        # --- teacher ---
        self.teacher_calls = Counter(
            "flywheel_teacher_calls_total", "LLM teacher calls by outcome.", ["outcome"], registry=r)
        self.teacher_breaker_open = Gauge(
            "flywheel_teacher_breaker_open", "1 while the teacher's circuit breaker is open, else 0.", registry=r)
        self.teacher_ready = Gauge(
            "flywheel_teacher_ready", "1 while the teacher is ready: its last check found its server and model, or "
            "a teacher call has succeeded since; else 0 (no teacher, check failed or not run yet).", registry=r)

        # --- model and log ---
        self.model_info = Gauge(
            "flywheel_model_info", "The served model: 1 for the current version and encoder.",
            ["version", "encoder"], registry=r)
        self.model_reloads = Counter(
            "flywheel_model_reloads_total", "Model reloads by outcome (ok, refused).", ["outcome"], registry=r)
        self.other_intent_set = Gauge(
            "flywheel_serving_other_intent_set", "1 while the served version was trained on another intent set "
            "than the configured file (started with --serve-last-good); 0 otherwise.", registry=r)
        self.log_buffered_rows = Gauge(
            "flywheel_log_buffered_rows", "Traffic-log rows buffered, not yet flushed.", registry=r)
        # what a deployment that never retrained is judged by (flywheel_last_retrain_timestamp_seconds
        # is absent until a retrain ran): the FlywheelRetrainOverdue alert reads both
        self.start_time = Gauge(
            "flywheel_start_time_seconds", "Unix time this process's metrics were created (it started serving).",
            registry=r)
        self.start_time.set(time.time())

        # caches of label children (label lookups take a lock in prometheus_client)
        self._decision_children: dict[tuple[str, str], Any] = {}
        self._label_children: dict[str, Any] = {}
        self._layer_children: dict[str, Any] = {}
        self._teacher_children: dict[str, Any] = {}
        self._degraded_children: dict[str, Any] = {r_: self.degraded.labels(r_) for r_ in DEGRADED_REASONS}
        self._known_labels: frozenset[str] = frozenset()
        self._language_children: dict[str, Any] = {}
        self._model_lock = threading.Lock()
        self._model: tuple[str, str] | None = None
        self._teacher_lock = threading.Lock()
        self._teacher_is_ready = False
        self._teacher_answers = 0
        self._teacher_listener: Callable[[bool], None] | None = None

        for outcome in TEACHER_OUTCOMES:
            self._teacher_child(outcome)
        for outcome in RELOAD_OUTCOMES:
            self.model_reloads.labels(outcome)
        self.set_labels(labels or ())
        self.set_languages(languages or ("en",))

    # ------------------------------------------------------------ decisions
    def set_labels(self, labels: Iterable[str]) -> None:
        """The known decision labels; any other label is counted as ``other``.

        Until this is called every in-scope label counts as ``other`` (the label
        set stays bounded). Series of labels dropped later stay (counters are never
        removed, so rates do not jump).
        """
        known = frozenset(str(x) for x in labels)
        for name in (*sorted(known), OUT_OF_SCOPE, OTHER_LABEL):
            self._label_child(name)
        self._known_labels = known  # one atomic swap

    def set_languages(self, languages: Iterable[str]) -> None:
        """The intent set's declared languages: the ``language`` label's values (and
        ``unknown``), pre-created at 0; a decision in any other counts as ``unknown``, so the
        series stay as few as the set's languages. Series of languages dropped later stay."""
        children = dict(self._language_children)
        for name in language_labels(tuple(str(x) for x in languages)):
            if name not in children:
                children[name] = self.decision_languages.labels(name)
        self._language_children = children   # one atomic swap

    def _label_child(self, name: str) -> Any:
        child = self._label_children.get(name)
        if child is None:
            child = self._label_children[name] = self.decision_labels.labels(name)
        return child

    def observe_decision(self, decision: Decision) -> None:
        """Count one decision (layer, tier, label) and its per-layer latencies."""
        layer = decision.layer.value
        tier = decision.tier.value
        key = (layer, tier)
        child = self._decision_children.get(key)
        if child is None:
            child = self._decision_children[key] = self.decisions.labels(layer, tier)
        child.inc()

        reason = decision.degraded
        if reason is not None:
            d = self._degraded_children.get(reason)
            if d is None:
                d = self._degraded_children[reason] = self.degraded.labels(reason)
            d.inc()

        name = label_name(decision.label)  # OUT_OF_SCOPE for None
        self._label_child(name if name == OUT_OF_SCOPE or name in self._known_labels else OTHER_LABEL).inc()

        langs = self._language_children
        lang = langs.get(decision.language or UNKNOWN)
        (lang if lang is not None else langs[UNKNOWN]).inc()

        for lay, ms in decision.latency_ms.items():
            if lay == "total":
                continue
            h = self._layer_children.get(lay)
            if h is None:
                h = self._layer_children[lay] = self.layer_seconds.labels(lay)
            h.observe(ms / 1000.0)

    # ------------------------------------------------------------ serving
    def observe_batch(self, n: int) -> None:
        self.batch_size.observe(n)

    def bind_queue_depth(self, fn: Callable[[], float]) -> None:
        """Compute the queue depth at scrape time from ``fn()``."""
        self.queue_depth.set_function(lambda: float(fn()))

    def cache_hit(self, n: int = 1) -> None:
        if n:
            self.cache_hits.inc(n)

    def cache_miss(self, n: int = 1) -> None:
        if n:
            self.cache_misses.inc(n)

    # ------------------------------------------------------------ teacher
    def _teacher_child(self, outcome: str) -> Any:
        child = self._teacher_children.get(outcome)
        if child is None:
            child = self._teacher_children[outcome] = self.teacher_calls.labels(outcome)
        return child

    def teacher_call(self, outcome: str) -> None:
        self._teacher_child(outcome).inc()
        if outcome == "ok":  # the teacher answered: ready, whatever an earlier check said
            self.set_teacher_ready(True, answered=True)

    @property
    def teacher_is_ready(self) -> bool:
        """What ``flywheel_teacher_ready`` says now."""
        return self._teacher_is_ready

    @property
    def teacher_answers(self) -> int:
        """Teacher calls that answered (outcome ``ok``) since this process started."""
        return self._teacher_answers

    def set_teacher_ready(self, ready: bool, *, answered: bool = False) -> None:
        """Record the teacher's readiness (a check's ``TeacherStatus.ok``, or ``answered``: a
        call got an answer); a change is passed on to :meth:`bind_teacher_ready`'s listener,
        in the same order as the gauge's."""
        value = ready is True
        with self._teacher_lock:
            changed, self._teacher_is_ready = value != self._teacher_is_ready, value
            self._teacher_answers += int(answered)
            self.teacher_ready.set(1.0 if value else 0.0)
            if changed and self._teacher_listener is not None:
                self._teacher_listener(value)

    def bind_teacher_ready(self, listener: Callable[[bool], None]) -> None:
        """Call ``listener(ready)`` whenever ``flywheel_teacher_ready`` changes (the sidecar's
        ``flywheel.teacher`` health entry follows it)."""
        self._teacher_listener = listener

    def bind_breaker_open(self, fn: Callable[[], bool]) -> None:
        """Compute the breaker gauge at scrape time: 1 when ``fn()`` is truthy."""
        self.teacher_breaker_open.set_function(lambda: 1.0 if fn() else 0.0)

    # ------------------------------------------------------------ model and log
    def set_model(self, version: str, encoder: str) -> None:
        """Mark ``(version, encoder)`` as served; the previous series is removed."""
        new = (str(version), str(encoder))
        with self._model_lock:
            old = self._model
            if old is not None and old != new:
                try:
                    self.model_info.remove(*old)
                except KeyError:
                    pass
            self.model_info.labels(*new).set(1)
            self._model = new

    def model_reload(self, outcome: str) -> None:
        """Count a reload: ``ok`` or ``refused``."""
        self.model_reloads.labels(outcome).inc()

    def bind_fleet(self, *, spool: SpoolSink | None = None, sync: RegistrySync | None = None) -> None:
        """Expose fleet mode's shipping (``spool``: a :class:`logstore.SpoolSink`) and model
        sync (``sync``: a :class:`fleet.sync.RegistrySync`), read at scrape time."""
        self.registry.register(_FleetCollector(spool, sync))

    def bind_serving(self, *, classifier: ServedClassifier, shadow: ShadowScorer | None = None,
                     registry: Registry | None = None) -> None:
        """Expose, read at scrape time: the classifier's audit outcomes
        (``flywheel_audit_answers_total{outcome}``), the shadow scorer's outcomes and loads
        (``flywheel_shadow_decisions_total{outcome}``, ``flywheel_shadow_loads_total{outcome}``,
        ``flywheel_shadow_info{version}``), the models home's last retrain
        (``flywheel_last_retrain_timestamp_seconds``, absent until one has run; and its teacher-noise
        estimate, ``flywheel_teacher_noise_ratio``, absent until a run had a decision with both a
        teacher and a human label) and, when the
        classifier's teacher is a :class:`~classifier.teachers.budget.BudgetedTeacher`, the calls its
        budget has left (``flywheel_teacher_budget_remaining{window}``, ``minute`` and ``day``,
        each only when that limit is set), and the teacher answer cache's lookups
        (``flywheel_teacher_cache_total{outcome}``, ``hit`` or ``miss``; 0 without a cache) and
        size (``flywheel_teacher_cache_entries``)."""
        self.registry.register(_ServingCollector(classifier, shadow, registry))

    def bind_log_buffered(self, fn: Callable[[], float]) -> None:
        """Compute the buffered-row gauge at scrape time from ``fn()``."""
        self.log_buffered_rows.set_function(lambda: float(fn()))

    # ------------------------------------------------------------ gRPC
    def interceptor(self) -> MetricsInterceptor:
        """A :class:`MetricsInterceptor` recording into these metrics."""
        return MetricsInterceptor(self)

    # ------------------------------------------------------------ teacher anchoring (ADR RC-03)
    def bind_anchoring(self, monitor: AnchoringMonitor | None) -> None:
        """Expose a :class:`classifier.anchoring.AnchoringMonitor` (the classifier's
        ``anchoring``), read at scrape time: ``flywheel_anchoring_rate{history}`` (NaN while
        its count is 0) and ``flywheel_anchoring_observed_total{history}``, ``history`` being
        ``with`` or ``without``. ``None`` (anchoring not measured) binds nothing."""
        if monitor is not None:
            self.registry.register(_AnchoringCollector(monitor))


def _split_method(full_method: str) -> tuple[str, str]:
    """``/package.Service/Method`` -> ``("package.Service", "Method")``."""
    parts = full_method.lstrip("/").split("/", 1)
    if len(parts) == 2:
        return parts[0], parts[1]
    return "unknown", parts[0]


def _code_name(code: Any) -> str:
    name = getattr(code, "name", None)
    return name if isinstance(name, str) else str(code)


class MetricsInterceptor(grpc.ServerInterceptor):
    """Records ``grpc_server_started_total``, ``grpc_server_handled_total`` and
    ``grpc_server_handling_seconds`` for unary-unary methods (``grpc_type="unary"``).

    The code is ``OK`` when the behavior returns normally (or the status it set with
    ``context.set_code``); when it raises (``context.abort`` raises too) it is
    ``context.code()`` if set, else ``UNKNOWN``, which is what gRPC sends.

    Streaming handlers (and unknown methods, for which gRPC answers UNIMPLEMENTED
    itself) are passed through unwrapped and not counted.
    """

    def __init__(self, metrics: ServerMetrics) -> None:
        self._m = metrics
        # full method -> (service, method, started child, histogram child)
        self._children: dict[str, tuple[str, str, Any, Any]] = {}
        self._handled: dict[tuple[str, str], Any] = {}

    def _method_children(self, full_method: str) -> tuple[str, str, Any, Any]:
        c = self._children.get(full_method)
        if c is None:
            service, method = _split_method(full_method)
            c = (service, method,
                 self._m.grpc_started.labels("unary", service, method),
                 self._m.grpc_handling_seconds.labels("unary", service, method))
            self._children[full_method] = c
        return c

    def _handled_child(self, full_method: str, service: str, method: str, code: str) -> Any:
        key = (full_method, code)
        child = self._handled.get(key)
        if child is None:
            child = self._handled[key] = self._m.grpc_handled.labels("unary", service, method, code)
        return child

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        if handler is None or handler.request_streaming or handler.response_streaming:
            return handler
        behavior = handler.unary_unary
        if behavior is None:
            return handler
        full_method = handler_call_details.method
        service, method, started, seconds = self._method_children(full_method)

        def observed(request: Any, context: grpc.ServicerContext) -> Any:
            started.inc()
            t0 = time.perf_counter()
            try:
                response = behavior(request, context)
            except BaseException:
                code = _context_code(context)
                seconds.observe(time.perf_counter() - t0)
                self._handled_child(full_method, service, method, code or "UNKNOWN").inc()
                raise
            seconds.observe(time.perf_counter() - t0)
            self._handled_child(full_method, service, method, _context_code(context) or "OK").inc()
            return response

        return grpc.unary_unary_rpc_method_handler(
            observed,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def _context_code(context: Any) -> str | None:
    """The status name the handler set on ``context``, or None."""
    try:
        code = context.code()
    except Exception:  # a context without a readable code
        return None
    return None if code is None else _code_name(code)


def start_metrics_http(metrics: ServerMetrics, port: int, addr: str = "127.0.0.1") -> tuple[Any, threading.Thread]:
    """Serve ``/metrics`` for ``metrics.registry`` on ``addr:port`` in a daemon thread.

    Returns ``(server, thread)``; ``server.server_port`` is the bound port (use port
    0 for any free one). Stop it with :func:`stop_metrics_http`. Binds to loopback
    unless told otherwise. A port or address it cannot listen on is a one-line
    :class:`~classifier.errors.ConfigError` (:func:`~classifier.settings.listen.check_listen`'s
    words; ``flywheel serve`` checks it before anything is loaded, this is the last word).
    """
    check_port(port, "--metrics-port")
    try:
        return start_http_server(port, addr=addr, registry=metrics.registry)
    except OSError as exc:   # taken since the early check, or gone: say why in the one line
        check_listen(addr, port, "--metrics-address/--metrics-port")
        raise ConfigError(f"cannot listen on {addr}:{port} (--metrics-address/--metrics-port): "
                          f"{exc.strerror or exc}") from None


def stop_metrics_http(server: Any, thread: threading.Thread | None = None, timeout: float = 5.0) -> None:
    """Stop a server from :func:`start_metrics_http` and close its socket."""
    server.shutdown()
    server.server_close()
    if thread is not None:
        thread.join(timeout)


class _FleetCollector:
    """Counters and gauges that live on the spool sink and the registry sync; read when
    Prometheus scrapes, so the request path pays nothing for them."""

    def __init__(self, spool: SpoolSink | None, sync: RegistrySync | None) -> None:
        self.spool, self.sync = spool, sync

    def collect(self) -> Iterator[Metric]:
        s = self.spool
        if s is not None:
            yield _counter("flywheel_log_shipped_rows", "Traffic-log rows acknowledged by the log's destination "
                           "(the object store in fleet mode, else the local DuckDB).", s.drained)
            yield _counter("flywheel_log_dropped_rows", "Traffic-log rows dropped because the spool was past "
                           "its disk bound (spool_max_mb).", s.dropped)
            yield _counter("flywheel_log_ship_errors", "Failed attempts to ship or ingest spool segments.",
                           s.drain_errors)
            yield _gauge("flywheel_log_spool_bytes", "Bytes of traffic log waiting in the spool.", s.spool_bytes)
            yield _gauge("flywheel_log_spool_segments", "Segments waiting in the spool.", s.spool_segments)
        if self.sync is not None:
            fleet = GaugeMetricFamily("flywheel_fleet_model_info", "The version the fleet's models/CURRENT named "
                                      "at this replica's last successful poll (1).", labels=["version"])
            if self.sync.fleet_version is not None:
                fleet.add_metric([self.sync.fleet_version], 1.0)
            yield fleet
            polls = CounterMetricFamily("flywheel_registry_polls", "Polls of the fleet's CURRENT model pointer "
                                        "by outcome.", labels=["outcome"])
            counts = dict(self.sync.polls)
            for outcome in sorted(set(SYNC_OUTCOMES) | set(counts)):
                polls.add_metric([outcome], float(counts.get(outcome, 0)))
            yield polls


class ServedClassifier(Protocol):
    """What the serving metrics read of the classifier, at each scrape
    (:class:`classifier.pipeline.Classifier` has it)."""

    @property
    def audit_outcomes(self) -> Mapping[str, int]: ...

    @property
    def teacher(self) -> Any: ...

    @property
    def teacher_cache(self) -> TeacherCache | None: ...


class _ServingCollector:
    """Audit outcomes, the shadow scorer, the last retrain, the teacher's call budget and
    its answer cache, read when Prometheus scrapes."""

    def __init__(self, classifier: ServedClassifier, shadow: ShadowScorer | None, registry: Registry | None) -> None:
        self.classifier, self.shadow, self.models = classifier, shadow, registry

    def collect(self) -> Iterator[Metric]:
        yield _labelled_counter("flywheel_audit_answers", "Teacher audits of confident layer-2 decisions by "
                                "outcome (agree, disagree, failed, unsure).", "outcome",
                                dict(self.classifier.audit_outcomes), AUDIT_OUTCOMES)
        sh = self.shadow
        counts = dict(sh.counts) if sh is not None else {}
        yield _labelled_counter("flywheel_shadow_decisions", "Layer-2 queries offered to the shadow version, by "
                                "outcome (scored, busy: skipped because the backlog was full, sampled_out, error).",
                                "outcome", counts, SHADOW_OUTCOMES)
        yield _labelled_counter("flywheel_shadow_loads", "Shadow versions loaded (ok) or refused.", "outcome",
                                dict(sh.loads) if sh is not None else {}, LOAD_OUTCOMES)
        info = GaugeMetricFamily("flywheel_shadow_info", "The shadow version scored beside the served one (1).",
                                 labels=["version"])
        if sh is not None and sh.version is not None:
            info.add_metric([sh.version], 1.0)
        yield info
        last = self.models.last_retrain() if self.models is not None else None
        when = last.get("finished_at") if last else None
        if isinstance(when, (int, float)) and not isinstance(when, bool):
            yield _gauge("flywheel_last_retrain_timestamp_seconds", "Unix time the last retrain run finished "
                         "(promoted, shadowed or kept), as recorded in the models registry.", when)
        noise = last.get("teacher_noise") if last else None
        ratio = noise.get("estimate") if isinstance(noise, dict) else None
        if isinstance(ratio, (int, float)) and not isinstance(ratio, bool):
            yield _gauge("flywheel_teacher_noise_ratio", "Share of the teacher's labels a human label on the same "
                         "decision contradicts, as the last retrain estimated it (its 95% interval and count are "
                         "in the retrain report's teacher_noise).", ratio)
        teacher = self.classifier.teacher
        if isinstance(teacher, BudgetedTeacher):
            left = {w: n for w, n in teacher.budget.remaining().items() if n is not None}
            if left:
                fam = GaugeMetricFamily("flywheel_teacher_budget_remaining", "LLM teacher calls this process may "
                                        "still make: in the sliding minute (teacher.max_calls_per_minute) and "
                                        "the UTC day (teacher.daily_budget); a window without a limit is absent.",
                                        labels=["window"])
                for window in sorted(left):
                    fam.add_metric([window], float(left[window]))
                yield fam
        cache = self.classifier.teacher_cache
        yield _labelled_counter("flywheel_teacher_cache", "Layer-3 lookups in this process's teacher answer "
                                "cache: hit (answered without an LLM call) or miss (the teacher was asked).",
                                "outcome", cache.counts if cache is not None else {}, CACHE_OUTCOMES)
        yield _gauge("flywheel_teacher_cache_entries", "Teacher answers held in this process's answer cache "
                     "(at most teacher.cache_size).", len(cache) if cache is not None else 0)


def _labelled_counter(name: str, doc: str, label: str, counts: dict[str, int],
                      always: Iterable[str]) -> CounterMetricFamily:
    fam = CounterMetricFamily(name, doc, labels=[label])
    for key in sorted(set(always) | set(counts)):
        fam.add_metric([key], float(counts.get(key, 0)))
    return fam


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=float(value))


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=float(value))


class _AnchoringCollector:
    """The teacher's history anchoring (:mod:`classifier.anchoring`), reported by the
    monitor when Prometheus scrapes; a rate that has no observations yet is NaN."""

    def __init__(self, monitor: AnchoringMonitor) -> None:
        self.monitor = monitor

    def collect(self) -> Iterator[Metric]:
        r = self.monitor.report()
        rate = GaugeMetricFamily("flywheel_anchoring_rate", "Share of teacher answers anchored on the history: "
                                 "with a history, the answer is the history's dominant label and layer 2's is "
                                 "not; without, the chance baseline of that (classifier.anchoring).",
                                 labels=["history"])
        seen = CounterMetricFamily("flywheel_anchoring_observed", "Teacher answers observed by the anchoring "
                                   "monitor, with and without a history.", labels=["history"])
        for side, value, n in (("with", r.rate_with, r.n_with), ("without", r.rate_without, r.n_without)):
            rate.add_metric([side], float("nan") if value is None else float(value))
            seen.add_metric([side], float(n))
        yield rate
        yield seen
