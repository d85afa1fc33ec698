"""The gRPC sidecar: ``create_server(...)`` builds it (tests bind port 0), ``serve()``
runs it until SIGTERM or SIGINT.

Lifecycle:

1. :func:`create_server` opens the runtime (model, traffic log, teacher, watcher on its
   own thread) and binds; health reports ``NOT_SERVING`` for ``""`` and
   ``flywheel.v1.IntentClassifier``.
2. :meth:`SidecarServer.start` serves, runs a warm-up pass, then reports ``SERVING``, and
   checks the teacher's server and model on a thread of its own (each check bounded by the
   teacher's timeout), at once and then every ``teacher_check_s`` (skipped while calls get
   answers). ``flywheel_teacher_ready`` and the health service's ``flywheel.teacher`` entry
   follow the teacher both ways: 1 and ``SERVING`` once a check passes or a call is answered,
   0 and ``NOT_SERVING`` when a check fails; a change of the check's verdict is one log line
   (WARNING when it fails). The classifier's own entries stay ``SERVING``: layer 2 keeps
   serving and what needed the teacher is logged pending.
3. :meth:`SidecarServer.stop`: health goes ``NOT_SERVING`` and new calls get
   ``UNAVAILABLE`` while the port stays open for calls in flight (and at least
   ``drain_s``), all within the grace period; then the port closes, the batcher and the
   teacher pool stop, and the traffic log is flushed and closed. (A call that arrives in
   the very moment the port closes can get ``CANCELLED`` from grpc itself,
   grpc/grpc#41785; like ``UNAVAILABLE`` it is safe to retry.)
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any, Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from flywheel.classifier.errors import ConfigError
from flywheel.classifier.protocols import Embedder, ManagedTeacher, Teacher
from flywheel.classifier.settings.config import Config
from flywheel.classifier.settings.listen import check_listen, split_address
from flywheel.service.auth import AdminTokenInterceptor
from flywheel.service.core import SidecarCore
from flywheel.service.metrics import ServerMetrics, start_metrics_http, stop_metrics_http
from flywheel.service.options import DEFAULT_ADDRESS, ServerOptions
from flywheel.service.protos.flywheel.v1 import classifier_pb2_grpc as pb_grpc
from flywheel.service.runtime import Runtime, open_runtime
from flywheel.service.servicer import SERVICE_NAME, IntentClassifierServicer

log = logging.getLogger("flywheel.sidecar")

__all__ = ["ServerOptions", "SidecarServer", "check_address", "check_metrics_address", "create_server", "serve",
           "DEFAULT_ADDRESS"]

FEEDBACK_METHOD = f"/{SERVICE_NAME}/Feedback"
TEACHER_HEALTH = "flywheel.teacher"   # the health service's entry for the teacher's readiness


class SidecarServer:
    """A bound, not yet started sidecar; see the module docs for the lifecycle."""

    def __init__(self, runtime: Runtime, options: ServerOptions = ServerOptions()) -> None:
        self.options = options
        self.runtime = runtime
        clf = runtime.classifier
        self.metrics = ServerMetrics(labels=clf.model.manifest.labels, languages=clf.intents.languages)
        self.core = SidecarCore(runtime, options.batch, self.metrics)
        self.health = health.HealthServicer()
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()
        self._metrics_http: tuple[Any, Any] | None = None
        self.teacher_check: threading.Thread | None = None   # the thread that checks the teacher
        self.teacher_checked = threading.Event()              # set once the first check has answered
        self._teacher_stop = threading.Event()
        try:
            self.server = self._grpc_server()
            self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
            self.port = self._bind()
        except BaseException:  # e.g. the address is taken: stop the batcher and the teacher pool
            self.core.close()  # (and the runtime)
            raise
        self._wire_metrics()

    @property
    def target(self) -> str:
        """What a client dials."""
        return f"unix:{self.options.uds}" if self.options.uds else f"{self._host()}:{self.port}"

    @property
    def metrics_port(self) -> int | None:
        return self._metrics_http[0].server_port if self._metrics_http else None

    def start(self) -> "SidecarServer":
        """Serve, warm up, then report ``SERVING``."""
        self.server.start()
        if self.options.metrics_port is not None:
            self._metrics_http = start_metrics_http(self.metrics, self.options.metrics_port,
                                                    self.options.metrics_address)
        self.core.warm_up()
        self._set_health(health_pb2.HealthCheckResponse.SERVING)
        log.info("flywheel sidecar serving model %s on %s", self.runtime.classifier.model_version, self.target)
        self._start_teacher_check()
        return self

    def stop(self, grace_s: float | None = None) -> None:
        """Graceful shutdown (idempotent): see the module docs."""
        with self._stop_lock:
            if self._stopped.is_set():
                return
            self._teacher_stop.set()
            self.health.enter_graceful_shutdown()
            self.core.begin_shutdown()             # from here new calls get UNAVAILABLE
            grace = self.options.grace_s if grace_s is None else grace_s
            end = time.monotonic() + grace
            drain_until = time.monotonic() + min(self.options.drain_s, grace)
            # keep the port open while calls in flight finish, and for at least drain_s so
            # health checkers see NOT_SERVING and new calls get a clean UNAVAILABLE
            while (self.core.in_flight or time.monotonic() < drain_until) and time.monotonic() < end:
                time.sleep(0.01)
            self.server.stop(max(0.0, end - time.monotonic())).wait()
            # batcher, teacher pool, then flush the log and ship it with what is left of the grace
            self.core.close(grace_s=max(1.0, end - time.monotonic()))
            if self._metrics_http is not None:
                stop_metrics_http(*self._metrics_http)
            self._stopped.set()
            log.info("flywheel sidecar stopped")

    def wait(self, timeout: float | None = None) -> bool:
        """Block until :meth:`stop` has finished."""
        return self._stopped.wait(timeout)

    # -- building
    def _grpc_server(self) -> grpc.Server:
        o = self.options
        interceptors: list[grpc.ServerInterceptor] = [self.metrics.interceptor()]
        if o.admin_token:
            interceptors.append(AdminTokenInterceptor(o.admin_token, {FEEDBACK_METHOD}))
        # grpc refuses messages over its own limit with RESOURCE_EXHAUSTED; keep that limit
        # above ours so an oversized request gets INVALID_ARGUMENT naming the limit
        hard = max(2 * o.max_message_bytes, o.max_message_bytes + (1 << 20))
        server = grpc.server(ThreadPoolExecutor(max_workers=o.max_workers, thread_name_prefix="flywheel-grpc"),
                             interceptors=interceptors,
                             options=[("grpc.max_receive_message_length", hard),
                                      ("grpc.max_send_message_length", hard),
                                      ("grpc.so_reuseport", 0)])
        pb_grpc.add_IntentClassifierServicer_to_server(
            IntentClassifierServicer(self.core, max_message_bytes=o.max_message_bytes), server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            server)
        return server

    def _bind(self) -> int:
        o = self.options
        target = f"unix:{o.uds}" if o.uds else o.address
        creds = _tls_credentials(o.tls_cert, o.tls_key)
        if not o.uds:
            check_address(o.address)
        try:
            port = (self.server.add_secure_port(target, creds) if creds is not None
                    else self.server.add_insecure_port(target))
        except RuntimeError:   # its reason went to grpc's own log line, not into the exception
            port = 0
        if port == 0:
            raise ConfigError(f"cannot listen on {target}: grpc could not bind it (in use, or not an "
                              "address of this machine)")
        return port

    def _host(self) -> str:
        host = self.options.address.rsplit(":", 1)[0]
        return "127.0.0.1" if host in ("", "0.0.0.0", "[::]") else host

    def _set_health(self, status: int) -> None:
        for name in ("", SERVICE_NAME):
            self.health.set(name, status)

    def _wire_metrics(self) -> None:
        m, clf = self.metrics, self.runtime.classifier
        m.set_model(clf.model_version, clf.embedder.id)
        m.other_intent_set.set(1 if self.runtime.other_intent_set else 0)
        m.bind_queue_depth(lambda: self.core.batcher.depth)
        sink = self.runtime.sink
        if sink is not None:  # the traffic log's sink reports its buffer, spool and shipping
            m.bind_log_buffered(lambda: sink.buffered)
        if sink is not None or self.runtime.sync is not None:
            m.bind_fleet(spool=sink, sync=self.runtime.sync)
        m.bind_anchoring(clf.anchoring)  # the teacher's history anchoring (ADR RC-03)
        m.bind_serving(classifier=clf, shadow=self.runtime.shadow,
                       registry=clf.watcher.registry if clf.watcher is not None else None)
        breaker = clf.teacher.breaker if isinstance(clf.teacher, ManagedTeacher) else None
        if breaker is not None:
            m.bind_breaker_open(lambda: breaker.state == "open")
        if isinstance(clf.teacher, ManagedTeacher):   # not ready until a check passes
            self.health.set(TEACHER_HEALTH, health_pb2.HealthCheckResponse.NOT_SERVING)
        m.bind_teacher_ready(self._on_teacher_ready)
        if clf.watcher is not None:
            clf.watcher.listeners.append(self._on_reload)

    def _start_teacher_check(self) -> None:
        """Check the teacher (when it is a :class:`~classifier.protocols.ManagedTeacher`) on a
        daemon thread until :meth:`stop`: serving never waits for it, and the teacher's own
        timeout bounds each check."""
        teacher = self.runtime.classifier.teacher
        if not isinstance(teacher, ManagedTeacher):
            return
        self.teacher_check = threading.Thread(target=self._watch_teacher, args=(teacher.check,),
                                              name="flywheel-teacher-check", daemon=True)
        self.teacher_check.start()

    def _watch_teacher(self, check: Callable[[], Any]) -> None:
        """Check now, then every ``teacher_check_s``; while the teacher is ready, a call answered
        since the last round stands for a passed check (no flapping when the two disagree)."""
        answers, first = -1, True
        while not self._teacher_stop.is_set():
            if answers == self.metrics.teacher_answers or not self.metrics.teacher_is_ready:
                self._check_teacher(check, first)
                first = False
            answers = self.metrics.teacher_answers
            self.teacher_checked.set()
            self._teacher_stop.wait(self.options.teacher_check_s)

    def _check_teacher(self, check: Callable[[], Any], first: bool) -> None:
        """One check: the gauge (and with it the health entry) follows it; the first verdict
        and each one that changes the teacher's readiness is one log line."""
        try:
            status = check()
            ok, detail = status.ok is True, str(status.detail)
        except Exception as exc:  # noqa: BLE001 - a teacher's check must report, not raise
            ok, detail = False, f"the teacher's check failed with {type(exc).__name__}"
        if self._teacher_stop.is_set():
            return
        was = self.metrics.teacher_is_ready
        self.metrics.set_teacher_ready(ok)
        if ok and not was:
            log.info("teacher ready: %s", detail)
        elif not ok and (was or first):
            log.warning("teacher not ready: %s. Layer 2 keeps serving; queries it is unsure of get its best "
                        "guess and are logged pending (flywheel label asks the teacher later)", detail)

    def _on_teacher_ready(self, ready: bool) -> None:
        # the standard health service's own entry (grpc_health_probe -service=flywheel.teacher)
        # follows flywheel_teacher_ready; the classifier's entries stay SERVING without the teacher
        self.health.set(TEACHER_HEALTH, health_pb2.HealthCheckResponse.SERVING if ready
                        else health_pb2.HealthCheckResponse.NOT_SERVING)

    def _on_reload(self, version: str, error: str | None) -> None:
        self.metrics.model_reload("ok" if error is None else "refused")
        if error is None:
            clf = self.runtime.classifier
            self.metrics.set_model(version, clf.embedder.id)
            self.metrics.other_intent_set.set(0)   # the home's check let it in: the configured set's
            self.metrics.set_labels(clf.model.manifest.labels)  # a promotion may add or drop intents
            self.metrics.set_languages(clf.intents.languages)


def check_address(address: str, what: str = "--address") -> None:
    """Raise a one-line :class:`ConfigError` when ``host:port`` cannot be listened on here
    (a port outside 0-65535, ``address already in use (port N)``, or the system's reason),
    before grpc tries: grpc's core logs the reason on a line of its own and raises without
    it, and takes a port over 65535 modulo 65536. See :func:`classifier.settings.listen.check_listen`."""
    host, port = split_address(address, what)
    check_listen(host, port, shown=address)


def check_metrics_address(options: ServerOptions) -> None:
    """:func:`check_address` for ``/metrics`` (``--metrics-address``, ``--metrics-port``), when on."""
    if options.metrics_port is not None:
        check_listen(options.metrics_address, options.metrics_port, "--metrics-address/--metrics-port")


def _tls_credentials(cert: str | None, key: str | None) -> grpc.ServerCredentials | None:
    if cert is None and key is None:
        return None
    if not cert or not key:
        raise ConfigError("TLS needs both --tls-cert and --tls-key")
    try:
        pair = (Path(key).expanduser().read_bytes(), Path(cert).expanduser().read_bytes())
    except OSError as exc:
        raise ConfigError(f"cannot read the TLS key or certificate: {exc}") from None
    return grpc.ssl_server_credentials([pair])


def create_server(cfg: Config, options: ServerOptions = ServerOptions(), *, log_decisions: bool = True,
                  embedder: Embedder | None = None, teacher: Teacher | None = None) -> SidecarServer:
    """Open what ``flywheel classify`` would serve (same config, registry, log and teacher)
    and bind the sidecar; call :meth:`SidecarServer.start` to serve. ``embedder`` and
    ``teacher`` replace the configured ones, as :func:`~service.runtime.open_runtime` takes
    them. A TCP address (the sidecar's or ``/metrics``') that is taken, or a port out of
    range, is refused before anything is opened."""
    if not options.uds:
        check_address(options.address)
    check_metrics_address(options)
    runtime = open_runtime(cfg, log_decisions=log_decisions, progress=False, background_reload=True,
                           embedder=embedder, teacher=teacher)
    try:
        return SidecarServer(runtime, options)
    except BaseException:
        runtime.close()  # a second close is harmless if the server closed it already
        raise


def serve(cfg: Config, options: ServerOptions = ServerOptions(), *, log_decisions: bool = True) -> int:
    """Run the sidecar until SIGTERM or SIGINT, then shut down gracefully; returns 0."""
    server = create_server(cfg, options, log_decisions=log_decisions)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("received %s: shutting down (grace %.1fs)", signal.Signals(signum).name, options.grace_s)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.start()
        while not stop.wait(0.5):   # a short timeout keeps the main thread responsive to signals
            pass
    finally:
        server.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0
