"""The gRPC sidecar end to end, in process: real grpc servers on 127.0.0.1 (or a Unix
socket) built on the fake embedder, driven through :class:`service.client.FlywheelClient`,
raw channels and the reflection service.

Every server is stopped in a ``finally`` (see ``serving`` in tests/support/sidecar.py);
every load loop is bounded in count and time; the slow paths use an embedder that sleeps
a few hundred milliseconds.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Sequence

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from flywheel.classifier import Layer, Tier
from flywheel.classifier.encoders import CachedEmbedder
from flywheel.classifier.errors import TeacherError
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.protocols import DelegatingEmbedder
from flywheel.classifier.settings.config import load_config
from flywheel.classifier.settings.intents import parse_intents
from flywheel.classifier.versions.registry import ModelRegistry
from flywheel.logstore import LogStore
from flywheel.service.batcher import MicroBatcher
from flywheel.service.client import FlywheelClient
from flywheel.service.core import BatchOptions
from flywheel.service.server import TEACHER_HEALTH, ServerOptions, SidecarServer, create_server
from tests.support.docs import ALWAYS_SURE, ALWAYS_UNSURE, DOC
from tests.support.fakes import HashEmbedder, ScriptedTeacher
from tests.support.sidecar import LOCAL, client, serving

SERVICE = "flywheel.v1.IntentClassifier"
HEALTH = health_pb2.HealthCheckResponse
METADATA = {"RETRIEVAL": {"rag": "true"}, "PLATFORM": {"route": "billing", "team": "payments"}}


# ----------------------------------------------------------------------------- helpers
def _doc(thresholds: dict[str, float], extra_examples: Sequence[str] = ()) -> dict[str, Any]:
    d = copy.deepcopy(DOC)
    d["thresholds"] = dict(thresholds)
    for intent in d["intents"]:
        intent["metadata"] = dict(METADATA[intent["name"]])
        if intent["name"] == "PLATFORM":
            intent["examples"] = [*intent["examples"], *extra_examples]
    return d


def _fit(thresholds: dict[str, float], version: str, extra_examples: Sequence[str] = ()):
    return fit_model(parse_intents(_doc(thresholds, extra_examples)), embedder=HashEmbedder(), version=version)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """Model version directories fitted once for the whole file (fitting takes ~0.5 s)."""
    root = tmp_path_factory.mktemp("sidecar-models")
    return {"sure": _fit(ALWAYS_SURE, "sure-v1").save(root / "sure"),
            "unsure": _fit(ALWAYS_UNSURE, "unsure-v1").save(root / "unsure")}


class SlowEmbedder(DelegatingEmbedder):
    """HashEmbedder whose ``encode`` sleeps ``delay_s`` (settable at any time) and records
    the size of every batch it is given."""

    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__(HashEmbedder())
        self.delay_s = delay_s
        self.batches: list[int] = []
        self._lock = threading.Lock()

    def encode(self, texts, *, batch_size=None, progress=False):
        with self._lock:
            self.batches.append(len(texts))
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.inner.encode(texts, batch_size=batch_size, progress=progress)

    def reset(self) -> None:
        with self._lock:
            self.batches.clear()


class ThreadRecordingTeacher(ScriptedTeacher):
    """A ScriptedTeacher that remembers which thread each call ran on."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.threads: list[str] = []

    def label(self, request):
        self.threads.append(threading.current_thread().name)
        return super().label(request)


def rpc_code(fn: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    """The status code and details of a call that must fail."""
    with pytest.raises(grpc.RpcError) as info:
        fn()
    return info.value.code(), info.value.details() or ""


def health_of(server: SidecarServer, service: str) -> int:
    """Ask the health servicer object directly (works before start and during stop)."""
    return server.health.Check(health_pb2.HealthCheckRequest(service=service), None).status


def metric(server: SidecarServer, name: str, labels: dict[str, str] | None = None) -> float:
    return server.metrics.registry.get_sample_value(name, labels or {}) or 0.0


def handled_codes(server: SidecarServer) -> dict[str, float]:
    """``grpc_server_handled_total`` summed by code."""
    out: dict[str, float] = {}
    for fam in server.metrics.registry.collect():
        for s in fam.samples:
            if s.name == "grpc_server_handled_total":
                out[s.labels["grpc_code"]] = out.get(s.labels["grpc_code"], 0.0) + s.value
    return out


def burst(fn: Callable[[int], Any], n: int, timeout_s: float = 15.0) -> list[tuple[str, Any, float]]:
    """Run ``fn(0..n-1)`` in ``n`` threads released together; ``(code name, result or
    error, seconds)`` per call, in index order."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait(timeout_s)
        t0 = time.monotonic()
        try:
            out: tuple[str, Any] = ("OK", fn(i))
        except grpc.RpcError as exc:
            out = (exc.code().name, exc)
        results[i] = (*out, time.monotonic() - t0)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert all(r is not None for r in results), "a call in the burst did not finish in time"
    return results


def wait_until(cond: Callable[[], bool], timeout_s: float, what: str, step_s: float = 0.02) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, f"timed out after {timeout_s}s waiting for {what}"
        time.sleep(step_s)


def assert_serves(fw: FlywheelClient) -> None:
    d = fw.classify("show my invoices")
    assert d.label == "PLATFORM" and d.layer is Layer.EMBEDDING


# ----------------------------------------------------------------------------- 1. health
def test_health_and_readiness_before_start(models):
    with serving(models["sure"], start=False) as server:
        for name in ("", SERVICE):
            assert health_of(server, name) == HEALTH.NOT_SERVING
        server.server.start()           # the port answers, but no warm-up: not ready yet
        with client(server) as fw:
            stub = health_pb2_grpc.HealthStub(fw.channel)
            for name in ("", SERVICE):
                assert stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status == HEALTH.NOT_SERVING
            code, details = rpc_code(lambda: fw.classify("show my invoices"))
            assert code is grpc.StatusCode.UNAVAILABLE and "not ready" in details
            code, _ = rpc_code(lambda: fw.classify_batch(["show my invoices"]))
            assert code is grpc.StatusCode.UNAVAILABLE


def test_health_serving_after_start_and_not_serving_after_stop(models):
    with serving(models["sure"]) as server:
        with client(server) as fw:
            stub = health_pb2_grpc.HealthStub(fw.channel)
            for name in ("", SERVICE):
                assert stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status == HEALTH.SERVING
            assert_serves(fw)
            server.stop(grace_s=1.0)
            for name in ("", SERVICE):
                assert health_of(server, name) == HEALTH.NOT_SERVING
            code, _ = rpc_code(lambda: fw.classify("show my invoices", timeout_s=2.0))
            assert code is grpc.StatusCode.UNAVAILABLE
            code, _ = rpc_code(lambda: stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2.0))
            assert code is grpc.StatusCode.UNAVAILABLE      # the port is closed: grpc says so itself


# ----------------------------------------------------------------------------- 2. happy paths
def test_classify_batch_feedback_and_model_info(models):
    with serving(models["sure"]) as server, client(server) as fw:
        version = server.runtime.classifier.model_version
        assert version == "sure-v1"

        d = fw.classify("show my invoices", session_id="s1", request_id="r1")
        assert (d.label, d.tier, d.layer, d.model_version) == ("PLATFORM", Tier.CONFIDENT, Layer.EMBEDDING, version)
        assert d.metadata == METADATA["PLATFORM"]
        assert d.id and 0.0 <= d.confidence <= 1.0
        assert {"embedding", "total"} <= set(d.latency_ms) and d.latency_ms["total"] >= 0.0

        rule = fw.classify("how much quota do I have")
        assert (rule.label, rule.layer, rule.reason) == ("PLATFORM", Layer.RULES, "rule quota-rule")
        declared = fw.classify("anything", declared_type="RETRIEVAL")
        assert (declared.label, declared.layer, declared.metadata) == ("RETRIEVAL", Layer.DECLARED, {"rag": "true"})
        oos = fw.classify("anything", declared_type="OUT_OF_SCOPE")
        assert (oos.label, oos.tier, oos.metadata) == (None, Tier.NO_MATCH, {})

        texts = ["show my invoices", "what is addvar", "how much quota do I have", "explain addparam"]
        singles = [fw.classify(t).label for t in texts]
        batch = fw.classify_batch([*texts, {"text": "x", "declared_type": "OUT_OF_SCOPE"},
                                   {"text": "y", "declared_type": "PLATFORM", "session_id": "s2"}])
        assert [b.label for b in batch] == [*singles, None, "PLATFORM"]
        assert [b.layer for b in batch][-3:] == [Layer.EMBEDDING, Layer.DECLARED, Layer.DECLARED]
        assert len({b.id for b in batch}) == len(batch)
        assert all(b.model_version == version for b in batch)

        assert fw.feedback(d.id, "RETRIEVAL") == "RETRIEVAL"
        assert fw.feedback(batch[0].id, None) is None               # out of scope
        assert fw.feedback(batch[1].id, "OUT_OF_SCOPE") is None

        info = fw.model_info()
        assert info["version"] == version
        assert info["encoder"]["id"] == "fake:hash-256" and info["encoder"]["dim"] == 256
        assert [lab["name"] for lab in info["labels"]] == ["RETRIEVAL", "PLATFORM"]
        assert {lab["name"]: lab["metadata"] for lab in info["labels"]} == METADATA
        assert {lab["name"]: lab["description"] for lab in info["labels"]} == {"RETRIEVAL": "docs",
                                                                               "PLATFORM": "account"}
        th = info["thresholds"]
        assert (th["confident"], th["ambiguous_ratio"], th["oos"]) == (0.0, 1.0, 1.0)
        assert info["training_size"] > 0


# ----------------------------------------------------------------------------- 3. error mapping
def test_every_bad_input_maps_to_its_status_and_never_internal(models):
    emb = SlowEmbedder()
    opts = ServerOptions(address=LOCAL, max_message_bytes=2048)
    with serving(models["sure"], opts, embedder=emb) as server, client(server) as fw:
        good = fw.classify("show my invoices")
        INVALID = grpc.StatusCode.INVALID_ARGUMENT
        cases: list[tuple[str, Callable[[], Any], grpc.StatusCode, str]] = [
            ("empty text", lambda: fw.classify(""), INVALID, "text"),
            ("blank text", lambda: fw.classify("   \n"), INVALID, "text"),
            ("unknown declared type", lambda: fw.classify("x", declared_type="BILLING"), INVALID,
             "unknown declared type 'BILLING'"),
            ("one bad batch item", lambda: fw.classify_batch(["show my invoices", "", "what is addvar"]), INVALID,
             "requests[1]"),
            ("bad declared type in a batch", lambda: fw.classify_batch(["a", "b", {"text": "c", "declared_type": "X"}]),
             INVALID, "requests[2]"),
            ("empty batch", lambda: fw.classify_batch([]), INVALID, "requests must not be empty"),
            ("unknown feedback label", lambda: fw.feedback(good.id, "BILLING"), INVALID, "feedback label"),
            ("empty decision id", lambda: fw.feedback("  ", "PLATFORM"), INVALID, "decision_id"),
            ("unknown decision id", lambda: fw.feedback("no-such-decision", "PLATFORM"),
             grpc.StatusCode.NOT_FOUND, "no-such-decision"),
            ("oversized message", lambda: fw.classify("a" * 3000), INVALID, "2,048"),
            ("oversized batch", lambda: fw.classify_batch(["b" * 1000] * 3), INVALID, "2,048"),
            ("request id echoed", lambda: fw.classify("", request_id="req-42"), INVALID, "req-42"),
        ]
        for what, call, want, needle in cases:
            code, details = rpc_code(call)
            assert code is want, f"{what}: got {code} ({details})"
            assert needle in details, f"{what}: {details!r} does not mention {needle!r}"
            assert_serves(fw)

        # over grpc's own receive limit (kept above ours: max(2x, limit + 1 MiB)) grpc itself
        # refuses the message with RESOURCE_EXHAUSTED before the servicer sees it; documented
        code, details = rpc_code(lambda: fw.classify("c" * (2048 + (1 << 20) + 1024)))
        assert code is grpc.StatusCode.RESOURCE_EXHAUSTED, details
        assert_serves(fw)

        # a short client deadline on a slow path (the encoder takes 0.6 s)
        emb.delay_s = 0.6
        try:
            t0 = time.monotonic()
            code, _ = rpc_code(lambda: fw.classify("what does addresult return", timeout_s=0.2))
            assert code is grpc.StatusCode.DEADLINE_EXCEEDED
            assert time.monotonic() - t0 < 0.55
        finally:
            emb.delay_s = 0.0
        assert_serves(fw)

        codes = handled_codes(server)
        assert "INTERNAL" not in codes and "UNKNOWN" not in codes, codes
        assert codes.get("INVALID_ARGUMENT", 0) >= 10 and codes.get("NOT_FOUND", 0) == 1


def test_feedback_without_traffic_log_is_failed_precondition(models):
    with serving(models["sure"], log_decisions=False) as server, client(server) as fw:
        d = fw.classify("show my invoices")
        code, details = rpc_code(lambda: fw.feedback(d.id, "PLATFORM"))
        assert code is grpc.StatusCode.FAILED_PRECONDITION and "traffic log" in details
        assert_serves(fw)
        assert "INTERNAL" not in handled_codes(server)


def test_not_found_tells_the_client_the_id_and_not_the_servers_paths(models, _isolated_home):
    with serving(models["sure"]) as server, client(server) as fw:
        log_path = str(load_config().log_path)
        code, details = rpc_code(lambda: fw.feedback("no-such-decision", "PLATFORM"))
        assert code is grpc.StatusCode.NOT_FOUND and "unknown decision id 'no-such-decision'" in details
        assert log_path not in details and str(_isolated_home) not in details and "/" not in details, details
        assert_serves(fw)


def test_a_busy_log_tells_the_client_to_retry_and_not_the_servers_paths(caplog):
    from flywheel.logstore.errors import LogStoreBusyError
    from flywheel.service.protos.flywheel.v1 import classifier_pb2 as pb
    from flywheel.service.servicer import IntentClassifierServicer

    class Context:
        def abort(self, code, details):
            raise grpc.RpcError(code, details)

    secret = "/srv/flywheel/log/flywheel.duckdb"
    with pytest.raises(grpc.RpcError) as info:
        with IntentClassifierServicer(None)._mapped(Context(), pb.FeedbackRequest()):   # type: ignore[arg-type]
            raise LogStoreBusyError(f"log database is busy: {secret} stayed locked by another process for 5s")
    code, details = info.value.args
    assert code is grpc.StatusCode.UNAVAILABLE and "busy" in details and secret not in details
    assert secret in caplog.text   # the server's own log keeps it


def test_serve_logging_has_no_line_per_http_request(caplog):
    """``flywheel serve`` logs at INFO; httpx would add one ``HTTP Request: POST ...`` line
    per teacher call (issue 26). Its warnings stay."""
    import logging
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import httpx

    from flywheel.service.cli import CHATTY_LOGGERS, configure_logging

    class Ok(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    saved = {name: logging.getLogger(name).level for name in CHATTY_LOGGERS}
    try:
        configure_logging()
        with caplog.at_level(logging.INFO):
            assert httpx.get(f"http://127.0.0.1:{http.server_address[1]}/api/tags", timeout=5).status_code == 200
            logging.getLogger("httpx").warning("an httpx warning")
            logging.getLogger("flywheel.sidecar").info("a flywheel line")
        names = [(r.name, r.getMessage()) for r in caplog.records]
        assert ("httpx", "an httpx warning") in names and ("flywheel.sidecar", "a flywheel line") in names
        assert not [m for n, m in names if m.startswith("HTTP Request")], names
    finally:
        http.shutdown()
        http.server_close()
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


# ----------------------------------------------------------------------------- 4. overload
def test_overload_is_refused_fast_and_recovers(models):
    delay = 0.4
    emb = SlowEmbedder()
    opts = ServerOptions(address=LOCAL, batch=BatchOptions(max_queue=1, max_batch=1))
    with serving(models["sure"], opts, embedder=emb) as server, client(server, timeout_s=10.0) as fw:
        emb.delay_s = delay
        results = burst(lambda i: fw.classify(f"show my invoices number {i}"), 8)
        codes = [r[0] for r in results]
        assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}, codes
        refused = [r for r in results if r[0] == "RESOURCE_EXHAUSTED"]
        ok = [r for r in results if r[0] == "OK"]
        assert refused and ok, codes
        # one query encoding + one queued at most: the rest are refused at once
        assert len(ok) <= 4, codes
        for _, err, seconds in refused:
            assert seconds < delay / 2, f"a refusal took {seconds:.3f}s"
            assert "overloaded" in err.details()
        for _, d, seconds in ok:
            assert d.label == "PLATFORM" and seconds >= delay * 0.9
        emb.delay_s = 0.0
        assert_serves(fw)                                                    # recovery
        assert "INTERNAL" not in handled_codes(server)


# ----------------------------------------------------------------------------- 5. micro-batching
def test_concurrent_queries_share_encoder_passes_and_a_lone_one_is_not_delayed(models):
    emb = SlowEmbedder()
    opts = ServerOptions(address=LOCAL, batch=BatchOptions(max_wait_ms=500))
    texts = ["show my invoices", "what is addvar", "explain addparam", "cancel subscription",
             "what plan am i on", "payment method", "how do loops work", "what types exist"]
    with serving(models["sure"], opts, embedder=emb) as server, client(server, timeout_s=10.0) as fw:
        emb.reset()
        emb.delay_s = 0.3
        results = burst(lambda i: fw.classify(texts[i]), len(texts))
        assert [r[0] for r in results] == ["OK"] * len(texts)
        assert sum(emb.batches) == len(texts)
        assert len(emb.batches) < len(texts) and max(emb.batches) > 1, emb.batches
        n_batches = metric(server, "flywheel_batch_size_count")
        singles = metric(server, "flywheel_batch_size_bucket", {"le": "1.0"})
        assert n_batches == len(emb.batches) and n_batches - singles >= 1       # a batch of more than one

        emb.delay_s = 0.0
        t0 = time.monotonic()
        d = fw.classify("upgrade my plan")
        lone = time.monotonic() - t0
        assert d.label == "PLATFORM"
        assert lone < 0.4, f"a lone request took {lone:.3f}s with max_wait_ms=500"
        assert emb.batches[-1] == 1


def test_batcher_survives_callers_that_give_up():
    """A request whose deadline passes cancels its future (SidecarCore._wait); the worker
    must neither crash on it nor compute a query nobody waits for."""
    started, release = threading.Event(), threading.Event()
    scored: list[Any] = []

    class Blocking:
        def score(self, pending):
            started.set()
            release.wait(5.0)
            scored.extend(pending)

    batcher = MicroBatcher(Blocking(), max_wait_s=0.0)                  # type: ignore[arg-type]
    try:
        first = batcher.submit("first")
        assert started.wait(5.0)
        queued = batcher.submit("queued")
        first.cancel()                     # being scored: too late to cancel, the result is still set
        assert queued.cancel()             # still queued: dropped, never scored
        release.set()
        later = batcher.submit("later")
        assert later.result(timeout=5.0) == "later"
        assert scored == ["first", "later"]
    finally:
        release.set()
        batcher.close(timeout=5.0)


# ----------------------------------------------------------------------------- 6. cache
def test_embedding_cache_hit_is_answered_inline(models):
    inner = HashEmbedder()
    with serving(models["sure"], embedder=CachedEmbedder(inner)) as server, client(server) as fw:
        calls, hits, misses = inner.calls, metric(server, "flywheel_embedding_cache_hits_total"), \
            metric(server, "flywheel_embedding_cache_misses_total")
        first = fw.classify("what plan am i on")
        assert inner.calls == calls + 1
        assert metric(server, "flywheel_embedding_cache_misses_total") == misses + 1
        batches = metric(server, "flywheel_batch_size_count")
        second = fw.classify("what plan am i on")
        assert inner.calls == calls + 1                                        # not encoded again
        assert metric(server, "flywheel_embedding_cache_hits_total") == hits + 1
        assert metric(server, "flywheel_embedding_cache_misses_total") == misses + 1
        assert metric(server, "flywheel_batch_size_count") == batches           # never reached the batcher
        assert (second.label, second.layer, second.tier) == (first.label, first.layer, first.tier)
        assert second.id != first.id


# ----------------------------------------------------------------------------- 7. teacher
def test_teacher_runs_off_the_encoder_within_the_deadline(models):
    teacher = ThreadRecordingTeacher(answer=lambda req: "RETRIEVAL", delay_s=2.0)
    with serving(models["unsure"], teacher=teacher) as server, client(server) as fw:
        def outcome(name: str) -> float:
            return metric(server, "flywheel_teacher_calls_total", {"outcome": name})

        t0 = time.monotonic()
        d = fw.classify("explain addparam", timeout_s=0.5)                # the teacher takes 2 s
        took = time.monotonic() - t0
        assert took < 0.5
        assert (d.tier, d.layer) == (Tier.WEAK, Layer.EMBEDDING)
        assert "llm skipped" in d.reason and "deadline" in d.reason
        assert d.label in ("RETRIEVAL", "PLATFORM")
        assert outcome("timeout") == 1

        def degraded(reason: str) -> float:
            return metric(server, "flywheel_degraded_decisions_total", {"reason": reason})

        assert degraded("timeout") == 1 and degraded("skipped_deadline") == 0   # the SLO sees the skipped answer
        wait_until(lambda: len(teacher.threads) == 1, 2.0, "the teacher call to start")
        assert teacher.threads[0].startswith("flywheel-teacher")            # never the batcher's thread

        d = fw.classify("explain addparam", timeout_s=0.2)                # too little left to ask at all
        assert d.layer is Layer.EMBEDDING and "llm skipped" in d.reason
        assert outcome("skipped_deadline") == 1 and len(teacher.threads) == 1
        assert degraded("skipped_deadline") == 1

        teacher.delay_s = 0.0
        # another question: the first one's answer (its call ran on past the deadline) is in the teacher cache
        d = fw.classify("what is addvar")
        assert (d.label, d.layer, d.tier) == ("RETRIEVAL", Layer.LLM, Tier.CONFIDENT)
        assert d.metadata == METADATA["RETRIEVAL"] and "llm" in d.latency_ms
        assert outcome("ok") == 1
        assert degraded("timeout") + degraded("skipped_deadline") == 2     # a teacher answer is not degraded

        teacher.error = TeacherError("unavailable", "ollama is down")
        d = fw.classify("how do loops work")
        assert (d.tier, d.layer) == (Tier.WEAK, Layer.EMBEDDING)
        assert "llm unavailable" in d.reason
        assert outcome("unavailable") == 1
        assert outcome("ok") == 1 and outcome("timeout") == 1
        assert all(name.startswith("flywheel-teacher") for name in teacher.threads)
        assert metric(server, "flywheel_decisions_total", {"layer": "llm", "tier": "confident"}) == 1
        assert metric(server, "flywheel_decisions_total", {"layer": "embedding", "tier": "weak"}) == 3


class CheckedTeacher(ScriptedTeacher):
    """A ScriptedTeacher with a readiness ``check()`` that returns ``status``."""

    def __init__(self, status, **kwargs) -> None:
        super().__init__(**kwargs)
        self.status = status

    def check(self):
        return self.status


def test_a_missing_teacher_model_warns_once_and_layer_2_keeps_serving(models, caplog):
    from flywheel.classifier.protocols import TeacherStatus

    teacher = CheckedTeacher(TeacherStatus(False, "model 'm:1' not found; pull it first"),
                             error=TeacherError("unavailable", "model 'm:1' not found"))
    with caplog.at_level("WARNING", logger="flywheel.sidecar"):
        with serving(models["unsure"], teacher=teacher) as server, client(server) as fw:
            assert server.teacher_checked.wait(5.0)
            assert health_of(server, "") == HEALTH.SERVING and health_of(server, SERVICE) == HEALTH.SERVING
            assert health_of(server, TEACHER_HEALTH) == HEALTH.NOT_SERVING
            assert metric(server, "flywheel_teacher_ready") == 0
            d = fw.classify("explain addparam")
            assert (d.tier, d.layer) == (Tier.WEAK, Layer.EMBEDDING) and "llm unavailable" in d.reason
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and "teacher not ready" in r.getMessage()]
    assert len(warnings) == 1 and "pull it first" in warnings[0].getMessage()


def test_a_ready_teacher_sets_the_gauge(models):
    from flywheel.classifier.protocols import TeacherStatus

    teacher = CheckedTeacher(TeacherStatus(True, "served"), answer=lambda req: "RETRIEVAL")
    with serving(models["unsure"], teacher=teacher) as server:
        assert server.teacher_checked.wait(5.0)
        assert metric(server, "flywheel_teacher_ready") == 1
        assert health_of(server, TEACHER_HEALTH) == HEALTH.SERVING
    with serving(models["sure"]) as server:   # no teacher: nothing to check, not ready
        assert server.teacher_check is None and metric(server, "flywheel_teacher_ready") == 0


def test_the_teacher_health_entry_follows_the_teacher_both_ways(models, caplog):
    """Down at start, up without the model, the model pulled, down again: the real health
    service's flywheel.teacher entry and flywheel_teacher_ready follow each step."""
    from flywheel.classifier.teachers.ollama import OllamaTeacher
    from tests.support.servers import free_port, wait_for
    from tests.support.simulated_ollama import SimulatedOllama

    sim = SimulatedOllama({"what is addvar": "RETRIEVAL"}, latency_scale=0, port=free_port(), model="other:1b")
    teacher = OllamaTeacher("small:1b", host=f"http://127.0.0.1:{sim._port}", timeout_s=1.0)
    opts = ServerOptions(address=LOCAL, teacher_check_s=0.05)
    try:
        with caplog.at_level("INFO", logger="flywheel.sidecar"), \
                serving(models["unsure"], opts, teacher=teacher) as server, \
                grpc.insecure_channel(server.target) as channel:
            probe = health_pb2_grpc.HealthStub(channel)

            def status() -> int:
                return probe.Check(health_pb2.HealthCheckRequest(service=TEACHER_HEALTH), timeout=2.0).status

            def settles_at(want: int) -> bool:   # bounded in time: at most 10 s of checks
                settled = wait_for(lambda: status() == want, 10.0)
                return settled and metric(server, "flywheel_teacher_ready") == (want == HEALTH.SERVING)

            assert wait_for(lambda: "teacher not ready" in caplog.text, 5.0)   # the first check is in
            assert status() == HEALTH.NOT_SERVING and metric(server, "flywheel_teacher_ready") == 0   # down
            sim.start()                                                   # up, without the model
            assert wait_for(lambda: sim.counts.get("http", 0) >= 2, 5.0)
            assert status() == HEALTH.NOT_SERVING
            sim.model = "small:1b"                                        # pulled
            assert settles_at(HEALTH.SERVING)
            sim.stop()                                                    # down again
            assert settles_at(HEALTH.NOT_SERVING)
            sim.start()
            assert settles_at(HEALTH.SERVING) and health_of(server, "") == HEALTH.SERVING
    finally:
        sim.stop()
    said = [(r.levelname, r.getMessage().split(":")[0]) for r in caplog.records if "teacher" in r.getMessage()]
    assert said == [("WARNING", "teacher not ready"), ("INFO", "teacher ready"),
                    ("WARNING", "teacher not ready"), ("INFO", "teacher ready")]


def test_answered_calls_make_the_teacher_ready_without_a_check(models, caplog):
    from flywheel.classifier.protocols import TeacherStatus
    from tests.support.servers import wait_for

    teacher = CheckedTeacher(TeacherStatus(False, "no /api/show here"), answer=lambda req: "RETRIEVAL")
    with caplog.at_level("WARNING", logger="flywheel.sidecar"), \
            serving(models["unsure"], ServerOptions(address=LOCAL, teacher_check_s=60.0), teacher=teacher) as server, \
            client(server) as fw:
        assert wait_for(lambda: "teacher not ready" in caplog.text, 5.0)
        assert health_of(server, TEACHER_HEALTH) == HEALTH.NOT_SERVING
        assert fw.classify("what is addvar").layer is Layer.LLM
        assert health_of(server, TEACHER_HEALTH) == HEALTH.SERVING and metric(server, "flywheel_teacher_ready") == 1


# ----------------------------------------------------------------------------- 8. admin token
def test_feedback_needs_the_admin_token(models):
    opts = ServerOptions(address=LOCAL, admin_token="s3cret")
    with serving(models["sure"], opts) as server:
        with client(server) as anon, client(server, admin_token="wrong") as wrong, \
                client(server, admin_token="s3cret") as admin:
            d = anon.classify("show my invoices")                          # Classify needs no token
            assert d.label == "PLATFORM"
            for fw in (anon, wrong):
                code, details = rpc_code(lambda: fw.feedback(d.id, "RETRIEVAL"))
                assert code is grpc.StatusCode.UNAUTHENTICATED and "admin token" in details
            assert admin.feedback(d.id, "RETRIEVAL") == "RETRIEVAL"
            assert admin.classify_batch(["what is addvar"])[0].layer is Layer.EMBEDDING
            assert admin.model_info()["version"] == "sure-v1"
        store = server.runtime.store
    rows = store.query("SELECT human_label FROM decision_labels WHERE decision_id = ?", [d.id])
    assert rows == [("RETRIEVAL",)]                                          # only the authorised label


# ----------------------------------------------------------------------------- 9. TLS
def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    try:
        import cryptography  # noqa: F401
    except ImportError:
        pass
    else:
        return _self_signed_cryptography(cert, key)
    if shutil.which("openssl") is None:
        pytest.skip("neither the cryptography package nor openssl is available")
    proc = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-days", "1"],
        capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        pytest.skip(f"openssl could not make a certificate: {proc.stderr.strip()[:200]}")
    return cert, key


def _self_signed_cryptography(cert_path: Path, key_path: Path) -> tuple[Path, Path]:  # pragma: no cover
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_tls_with_a_self_signed_certificate(models, tmp_path):
    cert, key = _self_signed(tmp_path)
    opts = ServerOptions(address=LOCAL, tls_cert=str(cert), tls_key=str(key))
    with serving(models["sure"], opts) as server:
        creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        with client(server, credentials=creds) as fw:
            assert_serves(fw)
            stub = health_pb2_grpc.HealthStub(fw.channel)
            assert stub.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=5).status == HEALTH.SERVING
        with client(server, timeout_s=2.0) as plain:
            code, _ = rpc_code(lambda: plain.classify("show my invoices"))
            assert code is grpc.StatusCode.UNAVAILABLE
        untrusted = grpc.ssl_channel_credentials()                              # system roots only
        with client(server, credentials=untrusted, timeout_s=2.0) as stranger:
            code, _ = rpc_code(lambda: stranger.classify("show my invoices"))
            assert code is grpc.StatusCode.UNAVAILABLE


# ----------------------------------------------------------------------------- 10. UDS
def test_unix_domain_socket(models, tmp_path):
    sock = tmp_path / "fw.sock"
    short_dir = None
    if len(str(sock)) > 100:                                                 # sun_path is ~108 bytes
        short_dir = tempfile.mkdtemp(prefix="fw")
        sock = Path(short_dir) / "fw.sock"
    try:
        with serving(models["sure"], ServerOptions(uds=str(sock))) as server:
            assert server.target == f"unix:{sock}" and sock.exists()
            with FlywheelClient("unix:" + str(sock), timeout_s=5.0) as fw:
                assert_serves(fw)
                assert [d.label for d in fw.classify_batch(["show my invoices", "how much quota"])] == \
                    ["PLATFORM", "PLATFORM"]
                assert fw.model_info()["version"] == "sure-v1"
    finally:
        if short_dir is not None:
            shutil.rmtree(short_dir, ignore_errors=True)


# ----------------------------------------------------------------------------- 11. reflection
def _reflect(stub: reflection_pb2_grpc.ServerReflectionStub,
             request: reflection_pb2.ServerReflectionRequest) -> reflection_pb2.ServerReflectionResponse:
    responses = list(stub.ServerReflectionInfo(iter([request]), timeout=5))
    assert len(responses) == 1
    assert not responses[0].HasField("error_response"), responses[0].error_response
    return responses[0]


def test_reflection_only_client_makes_a_real_call(models):
    """A client that knows no generated flywheel code: everything comes from reflection."""
    with serving(models["sure"]) as server, grpc.insecure_channel(server.target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        listed = _reflect(stub, reflection_pb2.ServerReflectionRequest(list_services=""))
        names = {s.name for s in listed.list_services_response.service}
        assert {SERVICE, "grpc.health.v1.Health"} <= names

        files = _reflect(stub, reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE))
        protos = [descriptor_pb2.FileDescriptorProto.FromString(b)
                  for b in files.file_descriptor_response.file_descriptor_proto]
        pool = descriptor_pool.DescriptorPool()
        todo = {p.name: p for p in protos}
        while todo:                                                          # dependencies first
            ready = [p for p in todo.values() if all(dep not in todo for dep in p.dependency)]
            assert ready, f"unresolvable dependencies among {sorted(todo)}"
            for p in ready:
                pool.Add(p)
                del todo[p.name]

        service = pool.FindServiceByName(SERVICE)
        method = service.methods_by_name["Classify"]
        request_cls = message_factory.GetMessageClass(method.input_type)
        response_cls = message_factory.GetMessageClass(method.output_type)
        classify = channel.unary_unary(f"/{SERVICE}/Classify", request_serializer=request_cls.SerializeToString,
                                       response_deserializer=response_cls.FromString)
        response = classify(request_cls(text="show my invoices", request_id="refl-1"), timeout=5)
        assert response.decision.label == "PLATFORM"
        assert response.decision.model_version == "sure-v1"
        assert dict(response.decision.metadata) == METADATA["PLATFORM"]
        layer = pool.FindEnumTypeByName("flywheel.v1.Layer").values_by_number[response.decision.layer].name
        assert layer == "LAYER_EMBEDDING"

        with pytest.raises(grpc.RpcError) as info:
            classify(request_cls(text=""), timeout=5)
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT


# ----------------------------------------------------------------------------- 12. metrics
METRIC_NAMES = (
    "grpc_server_started_total", "grpc_server_handled_total", "grpc_server_handling_seconds",
    "flywheel_decisions_total", "flywheel_decision_labels_total", "flywheel_layer_seconds",
    "flywheel_batch_size", "flywheel_queue_depth", "flywheel_embedding_cache_hits_total",
    "flywheel_embedding_cache_misses_total", "flywheel_teacher_calls_total", "flywheel_teacher_breaker_open",
    "flywheel_teacher_ready", "flywheel_model_info", "flywheel_model_reloads_total", "flywheel_log_buffered_rows",
)


def _exposed_names(text: str) -> set[str]:
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(line.split("{", 1)[0].split(" ", 1)[0])
    return names


def test_metrics_endpoint_exposes_every_name(models):
    opts = ServerOptions(address=LOCAL, metrics_port=0)
    with serving(models["sure"], opts) as server, client(server) as fw:
        assert server.metrics_port
        fw.classify("show my invoices")
        rpc_code(lambda: fw.classify(""))
        with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5) as resp:
            assert resp.status == 200
            text = resp.read().decode("utf-8")
        names = _exposed_names(text)
        counters_as_typed = {n.removesuffix("_total") for n in names}
        missing = [n for n in METRIC_NAMES if n not in names and n.removesuffix("_total") not in counters_as_typed]
        assert not missing, missing
        assert 'grpc_server_handled_total{grpc_code="OK",grpc_method="Classify"' in text
        assert 'grpc_code="INVALID_ARGUMENT"' in text
        assert 'flywheel_model_info{encoder="fake:hash-256",version="sure-v1"} 1.0' in text
        # the server feeds the decision metrics and binds the gauges (not just declares them)
        assert 'flywheel_decisions_total{layer="embedding",tier="confident"} 1.0' in text
        assert 'flywheel_decision_labels_total{label="PLATFORM"} 1.0' in text
        assert 'flywheel_layer_seconds_count{layer="embedding"} 1.0' in text
        assert "\nflywheel_queue_depth 0.0" in text
        assert "\nflywheel_log_buffered_rows " in text
        port = server.metrics_port
    with pytest.raises(OSError):                                           # closed with the server
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


# ----------------------------------------------------------------------------- 13. hot reload
def test_hot_reload_follows_promotions_and_refuses_a_corrupt_version(models, tmp_path):
    home = tmp_path / "models"
    reg = ModelRegistry(home)
    _fit(ALWAYS_SURE, "v1").save(reg.version_dir("v1"))
    reg.promote("v1")
    with serving(home) as server, client(server) as fw:
        assert fw.classify("show my invoices").model_version == "v1"
        v2_doc = _doc(ALWAYS_SURE, ["refund my last charge"])
        v2_doc["intents"].append({"name": "SMALLTALK", "examples": ["how are you today", "nice weather we have"]})
        fit_model(parse_intents(v2_doc), embedder=HashEmbedder(), version="v2").save(reg.version_dir("v2"))
        reg.promote("v2")

        seen: list[str] = []
        end = time.monotonic() + 15.0
        for _ in range(600):                                # every call must succeed meanwhile
            d = fw.classify("show my invoices")
            seen.append(d.model_version)
            if d.model_version == "v2" or time.monotonic() > end:
                break
            time.sleep(0.025)
        assert seen[-1] == "v2", f"still {seen[-1]} after {len(seen)} calls"
        assert set(seen) <= {"v1", "v2"}
        assert fw.model_info()["version"] == "v2"
        assert metric(server, "flywheel_model_reloads_total", {"outcome": "ok"}) == 1
        assert metric(server, "flywheel_model_info", {"version": "v2", "encoder": "fake:hash-256"}) == 1
        assert metric(server, "flywheel_model_info", {"version": "v1", "encoder": "fake:hash-256"}) == 0
        # the new intent is counted under its own label, not as "other"
        assert fw.classify("how are you today").label == "SMALLTALK"
        assert metric(server, "flywheel_decision_labels_total", {"label": "SMALLTALK"}) == 1
        assert metric(server, "flywheel_decision_labels_total", {"label": "other"}) == 0

        v3 = reg.version_dir("v3")
        shutil.copytree(reg.version_dir("v2"), v3)
        (v3 / "head.joblib").write_bytes(b"this is not a model head")
        reg.promote("v3", verify=False)

        def refused() -> bool:
            assert fw.classify("show my invoices").model_version == "v2"
            return metric(server, "flywheel_model_reloads_total", {"outcome": "refused"}) >= 1

        wait_until(refused, 15.0, "the corrupt version to be refused", step_s=0.05)
        for _ in range(5):
            assert fw.classify("what is addvar").model_version == "v2"
        assert metric(server, "flywheel_model_reloads_total", {"outcome": "refused"}) == 1
        assert metric(server, "flywheel_model_reloads_total", {"outcome": "ok"}) == 1
        assert fw.model_info()["version"] == "v2"
        assert "INTERNAL" not in handled_codes(server)


# ----------------------------------------------------------------------------- 14. graceful stop
def test_graceful_stop_finishes_calls_in_flight_and_logs_them(models):
    emb = SlowEmbedder()
    texts = ["show my invoices", "what is addvar", "explain addparam", "cancel subscription"]
    server = create_server(load_config(teacher="off", model=str(models["sure"])), ServerOptions(address=LOCAL),
                           embedder=emb)
    stopper: threading.Thread | None = None
    try:
        server.start()
        log_path = server.runtime.store.path
        with client(server, timeout_s=10.0) as fw:
            emb.delay_s = 0.4
            results: list[Any] = [None] * len(texts)

            def call(i: int) -> None:
                try:
                    results[i] = ("OK", fw.classify(texts[i]))
                except grpc.RpcError as exc:
                    results[i] = (exc.code().name, exc)

            callers = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(len(texts))]
            for t in callers:
                t.start()
            wait_until(lambda: server.core.in_flight == len(texts), 5.0, "every call to be in flight")

            stopper = threading.Thread(target=server.stop, kwargs={"grace_s": 5.0}, daemon=True)
            stopper.start()
            wait_until(lambda: server.core.stopping, 5.0, "the stop to begin")
            for name in ("", SERVICE):
                assert health_of(server, name) == HEALTH.NOT_SERVING
            # new calls are refused: UNAVAILABLE once the client has seen grpc's GOAWAY (the
            # port is closed); in the first moment of the shutdown grpc core itself cancels an
            # RPC that reaches the stopping server, so CANCELLED is what the client gets then
            code, _ = rpc_code(lambda: fw.classify("upgrade my plan", timeout_s=2.0))
            assert code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), code

            for t in callers:
                t.join(10.0)
            stopper.join(10.0)
            assert not stopper.is_alive() and server.wait(0)
        assert [r[0] for r in results] == ["OK"] * len(texts), results
        answered = {r[1].id for r in results}
    finally:
        server.stop(grace_s=1.0)
        if stopper is not None:
            stopper.join(10.0)

    logged = {row[0] for row in LogStore(log_path).query("SELECT decision_id FROM decisions")}
    assert answered <= logged
    assert len(logged) == len(texts)                  # the refused call and the warm-up are not logged


def test_an_address_in_use_is_a_clear_error_and_leaks_no_threads(models):
    with serving(models["sure"]) as first:
        before = {t.name for t in threading.enumerate()}
        batchers = sum(t.name == "flywheel-batcher" for t in threading.enumerate())
        cfg = load_config(teacher="off", model=str(models["sure"]))
        with pytest.raises(Exception, match="cannot listen on 127.0.0.1") as info:
            create_server(cfg, ServerOptions(address=f"127.0.0.1:{first.port}"), embedder=HashEmbedder())
        assert type(info.value).__name__ == "ConfigError"
        assert sum(t.name == "flywheel-batcher" for t in threading.enumerate()) == batchers
        assert {t.name for t in threading.enumerate()} <= before | {"MainThread"}
