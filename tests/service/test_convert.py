"""The gRPC contract's Python side: conversions (service.convert), the generated
modules being current, and the thin client (service.client) against a fake servicer."""

from __future__ import annotations

import copy
from concurrent import futures

import grpc
import pytest

from flywheel.classifier.decision import PUBLIC_FIELDS, Candidate, Decision, Layer, Tier
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.layer2.tiers import Thresholds
from flywheel.classifier.protocols import HistoryEntry
from flywheel.classifier.settings.intents import parse_intents
from flywheel.service.client import FlywheelClient
from flywheel.service.convert import (
    decision_from_proto,
    decision_to_proto,
    history_from_proto,
    history_to_proto,
    model_info_to_dict,
    model_info_to_proto,
)
from flywheel.service.protos.flywheel.v1 import classifier_pb2 as pb
from flywheel.service.protos.flywheel.v1 import classifier_pb2_grpc as pb_grpc
from tests.support.docs import DOC
from tests.support.fakes import HashEmbedder
from tests.support.paths import ROOT


def _decision(**kw) -> Decision:
    base = dict(label="RETRIEVAL", confidence=0.8125, tier=Tier.AMBIGUOUS, layer=Layer.EMBEDDING,
                reason="2 intents within ratio 0.50 of the top",
                alternatives=[Candidate("RETRIEVAL", 0.8125), Candidate("PLATFORM", 0.5), Candidate(None, 0.25)],
                model_version="v20261122-104901-123456", latency_ms={"rules": 0.01, "embedding": 3.5},
                metadata={"rag": "true", "model_slot": "docs"})
    base.update(kw)
    return Decision(**base)


def _public(d: Decision) -> tuple:
    return tuple(getattr(d, n) for n in PUBLIC_FIELDS)


def _round_trip(d: Decision) -> Decision:
    wire = decision_to_proto(d).SerializeToString()
    return decision_from_proto(pb.Decision.FromString(wire))


def test_decision_round_trip_is_exact():
    d = _decision(confidence=0.1 + 0.2)  # a double that is not a short decimal
    back = _round_trip(d)
    assert _public(back) == _public(d) and back.to_dict() == d.to_dict()
    m = decision_to_proto(d)
    assert (m.label, m.tier, m.layer, m.id) == ("RETRIEVAL", pb.TIER_AMBIGUOUS, pb.LAYER_EMBEDDING, d.id)
    assert [(c.label, c.confidence) for c in m.alternatives] == [("RETRIEVAL", 0.8125), ("PLATFORM", 0.5), ("", 0.25)]


def test_out_of_scope_empty_alternatives_and_no_version():
    d = _decision(label=None, tier=Tier.NO_MATCH, layer=Layer.LLM, alternatives=[], model_version=None,
                  latency_ms={}, metadata={}, reason="")
    m = decision_to_proto(d)
    assert (m.label, m.model_version, len(m.alternatives), dict(m.metadata)) == ("", "", 0, {})
    back = _round_trip(d)
    assert _public(back) == _public(d)
    assert back.label is None and back.model_version is None and back.alternatives == []


@pytest.mark.parametrize("tier", list(Tier))
@pytest.mark.parametrize("layer", list(Layer))
def test_every_tier_and_layer(tier, layer):
    d = _decision(tier=tier, layer=layer)
    m = decision_to_proto(d)
    assert pb.Tier.Name(m.tier) == f"TIER_{tier.name}" and pb.Layer.Name(m.layer) == f"LAYER_{layer.name}"
    back = _round_trip(d)
    assert (back.tier, back.layer) == (tier, layer)


def test_every_enum_value_is_mapped():
    assert {f"TIER_{t.name}" for t in Tier} == set(pb.Tier.keys()) - {"TIER_UNSPECIFIED"}
    assert {f"LAYER_{x.name}" for x in Layer} == set(pb.Layer.keys()) - {"LAYER_UNSPECIFIED"}


def test_unspecified_enums_are_refused():
    m = decision_to_proto(_decision())
    m.tier = pb.TIER_UNSPECIFIED
    with pytest.raises(ValueError, match="TIER_UNSPECIFIED"):
        decision_from_proto(m)
    m = decision_to_proto(_decision())
    m.layer = pb.LAYER_UNSPECIFIED
    with pytest.raises(ValueError, match="LAYER_UNSPECIFIED"):
        decision_from_proto(m)


def test_history_round_trip():
    entries = (HistoryEntry("CODE_GENERATION", "write a loop"), HistoryEntry(None, "weather?"),
               HistoryEntry("RETRIEVAL", ""))
    msgs = history_to_proto(entries)
    assert [(e.label, e.snippet) for e in msgs] == [("CODE_GENERATION", "write a loop"), ("", "weather?"),
                                                   ("RETRIEVAL", "")]
    req = pb.ClassifyRequest.FromString(pb.ClassifyRequest(text="x", history=msgs).SerializeToString())
    assert history_from_proto(req.history) == entries
    assert history_from_proto(pb.ClassifyRequest().history) == ()


def _model(**thresholds):
    d = copy.deepcopy(DOC)
    d["intents"][0]["metadata"] = {"rag": "true", "model_slot": "docs"}
    d["thresholds"] = {"per_intent": {"PLATFORM": 0.7}, **thresholds}
    return fit_model(parse_intents(d), embedder=HashEmbedder())


def test_model_info_carries_the_risk_rules_defer_cutoff():
    model = _model(deferral="risk", coverage=0.9)
    th = Thresholds.for_model(model)
    assert th.defer is not None and th.set_cutoff is not None
    m = pb.ModelInfo.FromString(model_info_to_proto(model).SerializeToString())
    info = model_info_to_dict(m)["thresholds"]
    assert info["defer"] == pytest.approx(th.defer) and info["set_cutoff"] == pytest.approx(th.set_cutoff)
    assert info["coverage"] == pytest.approx(0.9)
    tiers = model_info_to_dict(model_info_to_proto(_model()))["thresholds"]
    assert tiers["defer"] is None and tiers["coverage"] == pytest.approx(0.95)   # unset on the wire: None


def test_model_info_from_a_fitted_model():
    model = _model()
    model.manifest.metrics["note"] = "not a number"
    model.manifest.metrics["flag"] = True
    m = pb.ModelInfo.FromString(model_info_to_proto(model).SerializeToString())
    assert m.version == model.version and m.created_at == model.manifest.created_at
    assert m.training_size == model.manifest.training_size == 16
    assert (m.encoder.id, m.encoder.backend, m.encoder.model, m.encoder.dim) == ("fake:hash-256", "minilm", "", 256)
    assert [(x.name, x.description, dict(x.metadata)) for x in m.labels] == [
        ("RETRIEVAL", "docs", {"rag": "true", "model_slot": "docs"}), ("PLATFORM", "account", {})]
    th = Thresholds.for_model(model)
    assert (m.thresholds.confident, m.thresholds.ambiguous_ratio, m.thresholds.oos, m.thresholds.oos_confident,
            dict(m.thresholds.per_intent)) == (th.confident, th.ambiguous_ratio, th.oos, th.oos_confident,
                                               {"PLATFORM": 0.7})
    numeric = {k: float(v) for k, v in model.manifest.metrics.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert dict(m.metrics) == numeric and "note" not in m.metrics and "flag" not in m.metrics
    assert "fit_seconds" in m.metrics

    info = model_info_to_dict(m)
    assert info["encoder"] == {"id": "fake:hash-256", "backend": "minilm", "model": None, "dim": 256}
    assert info["thresholds"] == {**th.to_dict(), "per_intent": {"PLATFORM": 0.7}}
    assert info["labels"][0] == {"name": "RETRIEVAL", "description": "docs",
                                 "metadata": {"rag": "true", "model_slot": "docs"}}
    assert (info["version"], info["training_size"], info["metrics"]) == (model.version, 16, numeric)
    assert type(info["metrics"]) is dict and type(info["labels"][0]["metadata"]) is dict


def test_generated_modules_are_current(tmp_path):
    pytest.importorskip("grpc_tools")
    from flywheel.service.protos.regenerate import GENERATED, main

    assert main(["--out", str(tmp_path)]) == 0
    here = ROOT / "service/protos/flywheel/v1"
    stale = [n for n in GENERATED
             if (tmp_path / "service/protos/flywheel/v1" / n).read_bytes() != (here / n).read_bytes()]
    assert stale == [], "run `python -m flywheel.service.protos.regenerate` and commit the result"
    grpc_src = (here / "classifier_pb2_grpc.py").read_text()
    # the generated code names the installed (namespaced) module, never a bare one
    assert "from flywheel.service.protos.flywheel.v1 import classifier_pb2" in grpc_src
    assert "flywheel.v1 import" not in grpc_src.replace("flywheel.service.protos.flywheel.v1 import", "")


# --- the client, against a fake servicer -------------------------------------------------

class FakeServicer(pb_grpc.IntentClassifierServicer):
    def __init__(self, model):
        self.model = model
        self.requests = []
        self.metadata = []

    def Classify(self, request, context):
        self.requests.append(request)
        if not request.text:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "text must be a non-empty string")
        label = request.declared_type or None
        d = _decision(label=label, metadata={}, reason=request.text,
                      tier=Tier.NO_MATCH if label is None else Tier.CONFIDENT)
        return pb.ClassifyResponse(decision=decision_to_proto(d))

    def ClassifyBatch(self, request, context):
        return pb.ClassifyBatchResponse(decisions=[self.Classify(r, context).decision for r in request.requests])

    def Feedback(self, request, context):
        self.metadata.append(dict(context.invocation_metadata()))
        return pb.FeedbackResponse(decision_id=request.decision_id,
                                   label="" if request.label == "OUT_OF_SCOPE" else request.label)

    def GetModelInfo(self, request, context):
        return model_info_to_proto(self.model)


@pytest.fixture(scope="module")
def served():
    servicer = FakeServicer(_model())
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_IntentClassifierServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(None)


def test_client_round_trips(served):
    servicer, target = served
    with FlywheelClient(target, admin_token="s3cret") as fw:
        d = fw.classify("hello", session_id="s1", declared_type="PLATFORM",
                        history=[("RETRIEVAL", "what is addvar"), (None, "weather"), HistoryEntry("PLATFORM", "x")],
                        request_id="r1")
        assert isinstance(d, Decision) and (d.label, d.tier, d.reason) == ("PLATFORM", Tier.CONFIDENT, "hello")
        req = servicer.requests[-1]
        assert (req.session_id, req.declared_type, req.request_id) == ("s1", "PLATFORM", "r1")
        assert [(h.label, h.snippet) for h in req.history] == [("RETRIEVAL", "what is addvar"), ("", "weather"),
                                                               ("PLATFORM", "x")]
        out = fw.classify_batch(["a", {"text": "b", "declared_type": "RETRIEVAL"}, "c"])
        assert [(x.reason, x.label) for x in out] == [("a", None), ("b", "RETRIEVAL"), ("c", None)]
        assert fw.feedback("abc", "PLATFORM") == "PLATFORM"
        assert fw.feedback("abc", None) is None
        assert servicer.metadata[-1]["authorization"] == "Bearer s3cret"
        info = fw.model_info()
        assert info["labels"][0]["name"] == "RETRIEVAL" and info["encoder"]["dim"] == 256
        with pytest.raises(TypeError, match="unknown key 'txt'"):
            fw.classify_batch([{"txt": "a"}])


def test_client_raises_rpc_errors(served):
    servicer, target = served
    with FlywheelClient(target) as fw:
        with pytest.raises(grpc.RpcError) as err:
            fw.classify("")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        fw.feedback("abc", "PLATFORM")
        assert "authorization" not in servicer.metadata[-1]
    with FlywheelClient("127.0.0.1:1", timeout_s=0.5) as fw:
        with pytest.raises(grpc.RpcError) as err:
            fw.classify("x")
        assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
