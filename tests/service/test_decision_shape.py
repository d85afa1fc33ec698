"""One shape, one owner: the decision's public fields are
:data:`classifier.decision.PUBLIC_FIELDS`, and ``Decision.to_dict`` (the CLI's JSON), the
gRPC ``flywheel.v1.Decision`` message and the conversions of ``service.convert`` carry
exactly those, so a field added to one and forgotten in another fails here."""

from __future__ import annotations

import dataclasses
import json
from concurrent import futures

import grpc

from flywheel.classifier.decision import (
    DEGRADED_REASONS,
    PUBLIC_FIELDS,
    Candidate,
    Decision,
    Layer,
    TeacherCall,
    Tier,
)
from flywheel.service.client import FlywheelClient
from flywheel.service.convert import decision_from_proto, decision_to_proto
from flywheel.service.protos.flywheel.v1 import classifier_pb2 as pb
from flywheel.service.protos.flywheel.v1 import classifier_pb2_grpc as pb_grpc
from tests.support.paths import ROOT

# what the message numbered before ``degraded``: old clients read these numbers, never renumber
_WIRE_NUMBERS = {"id": 1, "label": 2, "confidence": 3, "tier": 4, "layer": 5, "alternatives": 6, "reason": 7,
                 "model_version": 8, "latency_ms": 9, "metadata": 10, "degraded": 11,
                 "language": 12}


def _full() -> Decision:
    """A decision whose every public field holds a value that is not its default."""
    return Decision(label="RETRIEVAL", confidence=0.40625, tier=Tier.WEAK, layer=Layer.EMBEDDING,
                    reason="confidence 0.41 < cutoff 0.59; llm unavailable (timeout): slow",
                    alternatives=[Candidate("RETRIEVAL", 0.40625), Candidate(None, 0.25)],
                    model_version="v20261126-000000-000001", latency_ms={"embedding": 3.5, "llm": 800.0},
                    metadata={"rag": "true"}, degraded="timeout", language="es", pending=True,
                    id="0123456789abcdef" * 2,
                    teacher=TeacherCall(model="m", label=None, valid=False, latency_ms=800.0, error="timeout"))


def test_public_fields_are_to_dicts_keys_in_order():
    d = _full()
    assert tuple(d.to_dict()) == PUBLIC_FIELDS
    assert len(set(PUBLIC_FIELDS)) == len(PUBLIC_FIELDS)
    attributes = {f.name for f in dataclasses.fields(Decision)}
    assert set(PUBLIC_FIELDS) <= attributes and {"teacher", "pending"} == attributes - set(PUBLIC_FIELDS)
    assert json.loads(json.dumps(d.to_dict()))["degraded"] == "timeout"
    assert Decision(label=None, confidence=0.9, tier=Tier.NO_MATCH, layer=Layer.RULES,
                    reason="rule x").to_dict()["degraded"] is None


def test_the_proto_message_has_exactly_the_public_fields_and_keeps_its_numbers():
    fields = pb.Decision.DESCRIPTOR.fields_by_name
    assert set(fields) == set(PUBLIC_FIELDS)
    assert {name: f.number for name, f in fields.items()} == _WIRE_NUMBERS
    assert fields["degraded"].type == fields["degraded"].TYPE_STRING


def test_decision_to_proto_fills_every_public_field():
    m = decision_to_proto(_full())
    assert {f.name for f, _ in m.ListFields()} == set(PUBLIC_FIELDS)
    assert m.degraded == "timeout"
    assert decision_to_proto(dataclasses.replace(_full(), degraded=None)).degraded == ""


def test_round_trip_keeps_every_public_field_and_drops_the_log_only_ones():
    d = _full()
    back = decision_from_proto(pb.Decision.FromString(decision_to_proto(d).SerializeToString()))
    assert back.to_dict() == d.to_dict()
    assert all(getattr(back, n) == getattr(d, n) for n in PUBLIC_FIELDS)
    assert (back.teacher, back.pending) == (None, False)       # traffic log only: they do not travel
    for reason in (*DEGRADED_REASONS, None):
        assert decision_from_proto(decision_to_proto(dataclasses.replace(d, degraded=reason))).degraded == reason


def test_the_language_travels_and_an_older_servers_message_has_none():
    m = decision_to_proto(_full())
    assert (m.language, _full().to_dict()["language"]) == ("es", "es")
    assert decision_from_proto(pb.Decision.FromString(m.SerializeToString())).language == "es"
    m.ClearField("language")                                    # a server without field 12
    assert decision_from_proto(pb.Decision.FromString(m.SerializeToString())).language is None


def test_a_message_from_an_older_server_reads_as_not_degraded():
    m = decision_to_proto(_full())
    m.ClearField("degraded")                                    # what a server without field 11 sends
    assert decision_from_proto(pb.Decision.FromString(m.SerializeToString())).degraded is None


class _DegradedServicer(pb_grpc.IntentClassifierServicer):
    def Classify(self, request, context):
        return pb.ClassifyResponse(decision=decision_to_proto(dataclasses.replace(_full(), reason=request.text)))

    def ClassifyBatch(self, request, context):
        return pb.ClassifyBatchResponse(decisions=[self.Classify(r, context).decision for r in request.requests])


def test_the_client_hands_degraded_back():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_IntentClassifierServicer_to_server(_DegradedServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with FlywheelClient(f"127.0.0.1:{port}") as fw:
            d = fw.classify("x")
            assert d.degraded == "timeout" and d.to_dict() == dataclasses.replace(_full(), reason="x").to_dict()
            assert [x.degraded for x in fw.classify_batch(["a", "b"])] == ["timeout", "timeout"]
    finally:
        server.stop(None)


def test_the_proto_documents_every_degraded_reason():
    proto = (ROOT / "service/protos/flywheel/v1/classifier.proto").read_text(encoding="utf-8")
    comment = proto[proto.index("message Decision {"):proto.index("string degraded = 11;")]
    assert [r for r in DEGRADED_REASONS if f'"{r}"' not in comment] == []
