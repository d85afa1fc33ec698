"""The sidecar's Prometheus metrics: names (a public contract), the gRPC interceptor
on a real in-process server, decision counting, and the /metrics endpoint.

Everything listens on 127.0.0.1 only, and every wait is bounded.
"""

from __future__ import annotations

import socket
import time
import urllib.request
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from flywheel.classifier.decision import Decision, Layer, Tier
from flywheel.service.metrics import MetricsInterceptor, ServerMetrics, start_metrics_http, stop_metrics_http

TIMEOUT = 5.0
HEALTH = ("unary", "grpc.health.v1.Health", "Check")

# the public contract: every metric family name as exposed in the text format
COUNTERS = [
    "grpc_server_started_total", "grpc_server_handled_total", "flywheel_decisions_total",
    "flywheel_decision_labels_total", "flywheel_embedding_cache_hits_total",
    "flywheel_embedding_cache_misses_total", "flywheel_teacher_calls_total", "flywheel_model_reloads_total",
    "flywheel_decision_languages_total",
]
HISTOGRAMS = ["grpc_server_handling_seconds", "flywheel_layer_seconds", "flywheel_batch_size"]
GAUGES = ["flywheel_queue_depth", "flywheel_teacher_breaker_open", "flywheel_teacher_ready", "flywheel_model_info",
          "flywheel_log_buffered_rows", "flywheel_start_time_seconds"]


def _labels(grpc_type, service, method, code=None):
    d = {"grpc_type": grpc_type, "grpc_service": service, "grpc_method": method}
    if code is not None:
        d["grpc_code"] = code
    return d


def _abort(request, context):
    context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad query")


def _boom(request, context):
    raise RuntimeError("boom")


def _stream(request, context):
    yield b"a"
    yield b"b"


@pytest.fixture
def grpc_server():
    metrics = ServerMetrics()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), interceptors=[MetricsInterceptor(metrics)])
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", {
        "Abort": grpc.unary_unary_rpc_method_handler(_abort),
        "Boom": grpc.unary_unary_rpc_method_handler(_boom),
        "Stream": grpc.unary_stream_rpc_method_handler(_stream),
    }),))
    port = server.add_insecure_port("127.0.0.1:0")
    assert port
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield metrics, channel
    finally:
        channel.close()
        server.stop(None).wait(TIMEOUT)


def test_interceptor_counts_ok_and_not_found(grpc_server):
    metrics, channel = grpc_server
    stub = health_pb2_grpc.HealthStub(channel)
    resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT)
    assert resp.status == health_pb2.HealthCheckResponse.SERVING  # (de)serializers preserved
    with pytest.raises(grpc.RpcError) as err:
        stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=TIMEOUT)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND

    get = metrics.registry.get_sample_value
    assert get("grpc_server_started_total", _labels(*HEALTH)) == 2
    assert get("grpc_server_handled_total", _labels(*HEALTH, "OK")) == 1
    assert get("grpc_server_handled_total", _labels(*HEALTH, "NOT_FOUND")) == 1
    assert get("grpc_server_handling_seconds_count", _labels(*HEALTH)) == 2
    assert get("grpc_server_handling_seconds_sum", _labels(*HEALTH)) > 0
    assert get("grpc_server_handling_seconds_bucket", {**_labels(*HEALTH), "le": "+Inf"}) == 2


def test_interceptor_abort_raise_and_streaming(grpc_server):
    metrics, channel = grpc_server
    with pytest.raises(grpc.RpcError) as err:
        channel.unary_unary("/test.Echo/Abort")(b"x", timeout=TIMEOUT)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as err:
        channel.unary_unary("/test.Echo/Boom")(b"x", timeout=TIMEOUT)
    assert err.value.code() == grpc.StatusCode.UNKNOWN
    assert list(channel.unary_stream("/test.Echo/Stream")(b"x", timeout=TIMEOUT)) == [b"a", b"b"]

    get = metrics.registry.get_sample_value
    assert get("grpc_server_handled_total", _labels("unary", "test.Echo", "Abort", "INVALID_ARGUMENT")) == 1
    assert get("grpc_server_handled_total", _labels("unary", "test.Echo", "Boom", "UNKNOWN")) == 1
    assert get("grpc_server_handling_seconds_count", _labels("unary", "test.Echo", "Boom")) == 1
    # streaming handlers pass through unwrapped and uncounted
    for t in ("unary", "server_stream"):
        assert get("grpc_server_started_total", _labels(t, "test.Echo", "Stream")) is None


def _decision(label, layer, tier, language=None, **lat):
    return Decision(label=label, confidence=0.9, tier=tier, layer=layer, reason="test", latency_ms=lat,
                    language=language)


def test_observe_decision_bounded_labels():
    m = ServerMetrics()
    m.set_labels(["billing", "refund"])
    get = m.registry.get_sample_value
    assert get("flywheel_decision_labels_total", {"label": "billing"}) == 0  # pre-created
    m.observe_decision(_decision("billing", Layer.RULES, Tier.CONFIDENT, rules=0.5, total=0.6))
    m.observe_decision(_decision("billing", Layer.EMBEDDING, Tier.CONFIDENT, rules=0.5, embedding=4.0, total=5))
    m.observe_decision(_decision(None, Layer.EMBEDDING, Tier.NO_MATCH, rules=0.5, embedding=3.0))
    m.observe_decision(_decision("surprise", Layer.LLM, Tier.WEAK, rules=0.5, embedding=3.0, llm=800.0))

    assert get("flywheel_decisions_total", {"layer": "rules", "tier": "confident"}) == 1
    assert get("flywheel_decisions_total", {"layer": "embedding", "tier": "confident"}) == 1
    assert get("flywheel_decisions_total", {"layer": "embedding", "tier": "no_match"}) == 1
    assert get("flywheel_decisions_total", {"layer": "llm", "tier": "weak"}) == 1
    assert get("flywheel_decision_labels_total", {"label": "billing"}) == 2
    assert get("flywheel_decision_labels_total", {"label": "OUT_OF_SCOPE"}) == 1
    assert get("flywheel_decision_labels_total", {"label": "other"}) == 1
    assert get("flywheel_decision_labels_total", {"label": "surprise"}) is None
    assert get("flywheel_layer_seconds_count", {"layer": "rules"}) == 4
    assert get("flywheel_layer_seconds_count", {"layer": "embedding"}) == 3
    assert get("flywheel_layer_seconds_sum", {"layer": "llm"}) == pytest.approx(0.8)
    assert get("flywheel_layer_seconds_count", {"layer": "total"}) is None


def test_the_language_label_is_bounded_by_the_declared_languages():
    m = ServerMetrics(languages=("en", "es"))
    get = m.registry.get_sample_value
    assert [get("flywheel_decision_languages_total", {"language": x}) for x in ("en", "es", "unknown")] == [0, 0, 0]
    for lang in ("es", "es", "en", "unknown", "fr", "x" * 40, None):
        m.observe_decision(_decision("billing", Layer.EMBEDDING, Tier.CONFIDENT, language=lang))
    assert [get("flywheel_decision_languages_total", {"language": x}) for x in ("en", "es", "unknown")] == [1, 2, 4]
    assert get("flywheel_decision_languages_total", {"language": "fr"}) is None     # never a new series
    m.set_languages(("en", "fr"))                                                   # a promotion adds French
    assert get("flywheel_decision_languages_total", {"language": "fr"}) == 0
    assert get("flywheel_decision_languages_total", {"language": "es"}) == 2      # kept, like dropped labels


def test_model_swap_leaves_one_series_and_simple_setters():
    m = ServerMetrics()
    m.set_model("v1", "minilm")
    m.set_model("v2", "minilm")
    m.set_model("v2", "minilm")  # idempotent
    series = [s for fam in m.registry.collect() if fam.name == "flywheel_model_info" for s in fam.samples]
    assert [(s.labels, s.value) for s in series] == [({"version": "v2", "encoder": "minilm"}, 1.0)]

    m.model_reload("ok")
    m.model_reload("refused")
    m.teacher_call("timeout")
    m.observe_batch(3)
    m.cache_hit(5)
    m.cache_miss()
    get = m.registry.get_sample_value
    assert get("flywheel_model_reloads_total", {"outcome": "ok"}) == 1
    assert get("flywheel_model_reloads_total", {"outcome": "refused"}) == 1
    assert get("flywheel_teacher_calls_total", {"outcome": "timeout"}) == 1
    assert get("flywheel_teacher_calls_total", {"outcome": "pool_full"}) == 0
    assert get("flywheel_batch_size_bucket", {"le": "2.0"}) == 0
    assert get("flywheel_batch_size_bucket", {"le": "4.0"}) == 1
    assert get("flywheel_embedding_cache_hits_total") == 5
    assert get("flywheel_embedding_cache_misses_total") == 1

    depth, buffered, is_open = [3], [10], [False]
    m.bind_queue_depth(lambda: depth[0])
    m.bind_log_buffered(lambda: buffered[0])
    m.bind_breaker_open(lambda: is_open[0])
    depth[0], buffered[0] = 9, 11
    assert (get("flywheel_queue_depth"), get("flywheel_log_buffered_rows"), get("flywheel_teacher_breaker_open")) \
        == (9, 11, 0)


def test_teacher_ready_follows_the_check_and_a_successful_call():
    m = ServerMetrics()
    get = m.registry.get_sample_value
    assert get("flywheel_teacher_ready") == 0
    m.set_teacher_ready(True)
    assert get("flywheel_teacher_ready") == 1
    m.set_teacher_ready(False)
    m.teacher_call("unavailable")
    assert get("flywheel_teacher_ready") == 0
    m.teacher_call("ok")   # the model was pulled after the startup check
    assert get("flywheel_teacher_ready") == 1


def test_registries_are_separate():
    a, b = ServerMetrics(), ServerMetrics()  # no duplicate-registration error
    a.cache_hit()
    assert b.registry.get_sample_value("flywheel_embedding_cache_hits_total") == 0


def test_metrics_http_exposes_every_name():
    m = ServerMetrics(labels=["billing"])
    m.cache_hit()
    server, thread = start_metrics_http(m, 0)
    try:
        port = server.server_port
        assert port > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=TIMEOUT) as resp:
            assert resp.status == 200
            text = resp.read().decode("utf-8")
    finally:
        stop_metrics_http(server, thread, timeout=TIMEOUT)
    assert not thread.is_alive()
    # prometheus_client 0.26 renders a labelled family with no children yet as its
    # HELP/TYPE lines only, so the contract is checked on the TYPE lines
    for name in COUNTERS:
        assert f"# TYPE {name} counter\n" in text, name
    for name in HISTOGRAMS:
        assert f"# TYPE {name} histogram\n" in text, name
    for name in GAUGES:
        assert f"# TYPE {name} gauge\n" in text, name
    # families with samples show them under the documented suffixes
    assert "flywheel_embedding_cache_hits_total 1.0\n" in text
    assert 'flywheel_decision_labels_total{label="billing"} 0.0\n' in text
    assert 'flywheel_batch_size_bucket{le="+Inf"} 0.0\n' in text
    assert "flywheel_batch_size_count 0.0\n" in text


class _Spool:
    """The numbers a SpoolSink exposes, as the fleet collector reads them."""

    drained, dropped, drain_errors, spool_bytes, spool_segments = 120, 7, 3, 4096, 2


class _Sync:
    polls = {"not_modified": 5, "new": 1, "refused": 1}
    fleet_version = "v2"


def test_fleet_metrics_are_read_at_scrape_time():
    m = ServerMetrics()
    spool = _Spool()
    m.bind_fleet(spool=spool, sync=_Sync())
    get = m.registry.get_sample_value
    assert get("flywheel_log_shipped_rows_total") == 120
    assert get("flywheel_log_dropped_rows_total") == 7
    assert get("flywheel_log_ship_errors_total") == 3
    assert get("flywheel_log_spool_bytes") == 4096 and get("flywheel_log_spool_segments") == 2
    assert get("flywheel_registry_polls_total", {"outcome": "new"}) == 1
    assert get("flywheel_registry_polls_total", {"outcome": "error"}) == 0   # every outcome, from the start
    assert get("flywheel_fleet_model_info", {"version": "v2"}) == 1
    spool.spool_bytes = 0
    assert get("flywheel_log_spool_bytes") == 0


def test_fleet_metrics_without_a_registry_sync():
    m = ServerMetrics()
    m.bind_fleet(spool=_Spool())
    assert m.registry.get_sample_value("flywheel_log_shipped_rows_total") == 120
    assert m.registry.get_sample_value("flywheel_registry_polls_total", {"outcome": "new"}) is None


def test_the_start_time_is_exported_from_the_start():
    before = time.time()
    m = ServerMetrics()
    assert before - 1 <= m.registry.get_sample_value("flywheel_start_time_seconds") <= time.time()


def test_registry_poll_errors_count_while_the_store_is_down(tmp_path):
    # a replica whose every poll fails keeps serving (and reporting) its last good version;
    # flywheel_registry_polls_total{outcome="error"} is what FlywheelRegistryPollsFailing reads
    from flywheel.classifier.versions.registry import ModelRegistry
    from flywheel.fleet.config import StoreConfig
    from flywheel.fleet.objects import ObjectStore
    from flywheel.fleet.sync import RegistrySync

    with socket.socket() as s:   # a loopback port nothing listens on: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = StoreConfig.parse("s3://flywheel-down/t", env={
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_REGION": "us-east-1"})
    sync = RegistrySync(ObjectStore(cfg, timeout_s=2.0, max_retries=0), ModelRegistry(tmp_path / "replica"))
    m = ServerMetrics()
    m.bind_fleet(sync=sync)
    get = m.registry.get_sample_value
    assert get("flywheel_registry_polls_total", {"outcome": "error"}) == 0
    assert [sync.poll(), sync.poll(), sync.poll()] == ["error"] * 3
    assert get("flywheel_registry_polls_total", {"outcome": "error"}) == 3
    assert sum(get("flywheel_registry_polls_total", {"outcome": o}) for o in ("not_modified", "unchanged", "new")) == 0
