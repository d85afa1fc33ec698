from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIER_UNSPECIFIED: _ClassVar[Tier]
    TIER_CONFIDENT: _ClassVar[Tier]
    TIER_AMBIGUOUS: _ClassVar[Tier]
    TIER_WEAK: _ClassVar[Tier]
    TIER_NO_MATCH: _ClassVar[Tier]

class Layer(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LAYER_UNSPECIFIED: _ClassVar[Layer]
    LAYER_DECLARED: _ClassVar[Layer]
    LAYER_RULES: _ClassVar[Layer]
    LAYER_EMBEDDING: _ClassVar[Layer]
    LAYER_LLM: _ClassVar[Layer]
TIER_UNSPECIFIED: Tier
TIER_CONFIDENT: Tier
TIER_AMBIGUOUS: Tier
TIER_WEAK: Tier
TIER_NO_MATCH: Tier
LAYER_UNSPECIFIED: Layer
LAYER_DECLARED: Layer
LAYER_RULES: Layer
LAYER_EMBEDDING: Layer
LAYER_LLM: Layer

class ClassifyRequest(_message.Message):
    __slots__ = ("text", "session_id", "declared_type", "history", "request_id")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DECLARED_TYPE_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    text: str
    session_id: str
    declared_type: str
    history: _containers.RepeatedCompositeFieldContainer[HistoryEntry]
    request_id: str
    def __init__(self, text: _Optional[str] = ..., session_id: _Optional[str] = ..., declared_type: _Optional[str] = ..., history: _Optional[_Iterable[_Union[HistoryEntry, _Mapping]]] = ..., request_id: _Optional[str] = ...) -> None: ...

class HistoryEntry(_message.Message):
    __slots__ = ("label", "snippet")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SNIPPET_FIELD_NUMBER: _ClassVar[int]
    label: str
    snippet: str
    def __init__(self, label: _Optional[str] = ..., snippet: _Optional[str] = ...) -> None: ...

class ClassifyResponse(_message.Message):
    __slots__ = ("decision",)
    DECISION_FIELD_NUMBER: _ClassVar[int]
    decision: Decision
    def __init__(self, decision: _Optional[_Union[Decision, _Mapping]] = ...) -> None: ...

class ClassifyBatchRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[ClassifyRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[ClassifyRequest, _Mapping]]] = ...) -> None: ...

class ClassifyBatchResponse(_message.Message):
    __slots__ = ("decisions",)
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[Decision]
    def __init__(self, decisions: _Optional[_Iterable[_Union[Decision, _Mapping]]] = ...) -> None: ...

class FeedbackRequest(_message.Message):
    __slots__ = ("decision_id", "label")
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    label: str
    def __init__(self, decision_id: _Optional[str] = ..., label: _Optional[str] = ...) -> None: ...

class FeedbackResponse(_message.Message):
    __slots__ = ("decision_id", "label")
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    label: str
    def __init__(self, decision_id: _Optional[str] = ..., label: _Optional[str] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("version", "encoder", "labels", "thresholds", "created_at", "training_size", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ENCODER_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    THRESHOLDS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    TRAINING_SIZE_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    version: str
    encoder: Encoder
    labels: _containers.RepeatedCompositeFieldContainer[LabelInfo]
    thresholds: Thresholds
    created_at: str
    training_size: int
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, version: _Optional[str] = ..., encoder: _Optional[_Union[Encoder, _Mapping]] = ..., labels: _Optional[_Iterable[_Union[LabelInfo, _Mapping]]] = ..., thresholds: _Optional[_Union[Thresholds, _Mapping]] = ..., created_at: _Optional[str] = ..., training_size: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class Encoder(_message.Message):
    __slots__ = ("id", "backend", "model", "dim")
    ID_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    id: str
    backend: str
    model: str
    dim: int
    def __init__(self, id: _Optional[str] = ..., backend: _Optional[str] = ..., model: _Optional[str] = ..., dim: _Optional[int] = ...) -> None: ...

class LabelInfo(_message.Message):
    __slots__ = ("name", "description", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Thresholds(_message.Message):
    __slots__ = ("confident", "ambiguous_ratio", "oos", "oos_confident", "per_intent", "defer", "set_cutoff", "coverage")
    class PerIntentEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    CONFIDENT_FIELD_NUMBER: _ClassVar[int]
    AMBIGUOUS_RATIO_FIELD_NUMBER: _ClassVar[int]
    OOS_FIELD_NUMBER: _ClassVar[int]
    OOS_CONFIDENT_FIELD_NUMBER: _ClassVar[int]
    PER_INTENT_FIELD_NUMBER: _ClassVar[int]
    DEFER_FIELD_NUMBER: _ClassVar[int]
    SET_CUTOFF_FIELD_NUMBER: _ClassVar[int]
    COVERAGE_FIELD_NUMBER: _ClassVar[int]
    confident: float
    ambiguous_ratio: float
    oos: float
    oos_confident: float
    per_intent: _containers.ScalarMap[str, float]
    defer: float
    set_cutoff: float
    coverage: float
    def __init__(self, confident: _Optional[float] = ..., ambiguous_ratio: _Optional[float] = ..., oos: _Optional[float] = ..., oos_confident: _Optional[float] = ..., per_intent: _Optional[_Mapping[str, float]] = ..., defer: _Optional[float] = ..., set_cutoff: _Optional[float] = ..., coverage: _Optional[float] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("id", "label", "confidence", "tier", "layer", "alternatives", "reason", "model_version", "latency_ms", "metadata", "degraded", "language")
    class LatencyMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    ALTERNATIVES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    id: str
    label: str
    confidence: float
    tier: Tier
    layer: Layer
    alternatives: _containers.RepeatedCompositeFieldContainer[Candidate]
    reason: str
    model_version: str
    latency_ms: _containers.ScalarMap[str, float]
    metadata: _containers.ScalarMap[str, str]
    degraded: str
    language: str
    def __init__(self, id: _Optional[str] = ..., label: _Optional[str] = ..., confidence: _Optional[float] = ..., tier: _Optional[_Union[Tier, str]] = ..., layer: _Optional[_Union[Layer, str]] = ..., alternatives: _Optional[_Iterable[_Union[Candidate, _Mapping]]] = ..., reason: _Optional[str] = ..., model_version: _Optional[str] = ..., latency_ms: _Optional[_Mapping[str, float]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., degraded: _Optional[str] = ..., language: _Optional[str] = ...) -> None: ...

class Candidate(_message.Message):
    __slots__ = ("label", "confidence")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    label: str
    confidence: float
    def __init__(self, label: _Optional[str] = ..., confidence: _Optional[float] = ...) -> None: ...
