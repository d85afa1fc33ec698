"""The gRPC servicer: converts messages and maps errors to status codes, nothing else.

| error | status |
|---|---|
| :class:`~classifier.errors.InvalidInputError` (empty text, unknown declared type or | ``INVALID_ARGUMENT`` |
| feedback label, bad history), an oversized message | |
| :class:`~logstore.errors.UnknownDecisionError` | ``NOT_FOUND`` |
| :class:`~service.errors.Overloaded` | ``RESOURCE_EXHAUSTED`` |
| :class:`~service.errors.NotServing`, :class:`~logstore.errors.LogStoreBusyError` | ``UNAVAILABLE`` |
| :class:`~service.errors.DeadlineExceeded` | ``DEADLINE_EXCEEDED`` |
| :class:`~service.errors.NoTrafficLog` | ``FAILED_PRECONDITION`` |
| anything else (a bug, a broken model) | ``INTERNAL``, logged with its traceback |

``Feedback``'s ``UNAUTHENTICATED`` comes from :class:`service.auth.AdminTokenInterceptor`.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Iterator

import grpc
from google.protobuf.message import Message

from flywheel.classifier.errors import FlywheelError, InvalidInputError
from flywheel.classifier.pipeline import Query
from flywheel.classifier.settings.label_names import label_name
from flywheel.logstore.errors import LogStoreBusyError, UnknownDecisionError
from flywheel.service.convert import decision_to_proto, history_from_proto, model_info_to_proto
from flywheel.service.core import SidecarCore
from flywheel.service.errors import DeadlineExceeded, NoTrafficLog, NotServing, Overloaded
from flywheel.service.options import ServerOptions
from flywheel.service.protos.flywheel.v1 import classifier_pb2 as pb
from flywheel.service.protos.flywheel.v1 import classifier_pb2_grpc as pb_grpc

log = logging.getLogger("flywheel.sidecar")

__all__ = ["IntentClassifierServicer", "SERVICE_NAME"]

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["IntentClassifier"].full_name

_CODES: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (UnknownDecisionError, grpc.StatusCode.NOT_FOUND),
    (LogStoreBusyError, grpc.StatusCode.UNAVAILABLE),
    (InvalidInputError, grpc.StatusCode.INVALID_ARGUMENT),
    (Overloaded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (NotServing, grpc.StatusCode.UNAVAILABLE),
    (DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED),
    (NoTrafficLog, grpc.StatusCode.FAILED_PRECONDITION),
)


def status_for(exc: BaseException) -> grpc.StatusCode:
    """The status code for an error raised while serving a call."""
    for kind, code in _CODES:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


class IntentClassifierServicer(pb_grpc.IntentClassifierServicer):
    """``flywheel.v1.IntentClassifier`` over a :class:`~service.core.SidecarCore`."""

    def __init__(self, core: SidecarCore, *, max_message_bytes: int = ServerOptions.max_message_bytes) -> None:
        self.core = core
        self.max_message_bytes = max_message_bytes

    def Classify(self, request: pb.ClassifyRequest, context: grpc.ServicerContext) -> pb.ClassifyResponse:
        with self._mapped(context, request):
            d = self.core.classify(_query(request), _deadline(context))
            return pb.ClassifyResponse(decision=decision_to_proto(d))

    def ClassifyBatch(self, request: pb.ClassifyBatchRequest,
                      context: grpc.ServicerContext) -> pb.ClassifyBatchResponse:
        with self._mapped(context, request):
            if not request.requests:
                raise InvalidInputError("requests must not be empty")
            ds = self.core.classify_batch([_query(r) for r in request.requests], _deadline(context))
            return pb.ClassifyBatchResponse(decisions=[decision_to_proto(d) for d in ds])

    def Feedback(self, request: pb.FeedbackRequest, context: grpc.ServicerContext) -> pb.FeedbackResponse:
        with self._mapped(context, request):
            stored = self.core.feedback(request.decision_id, request.label)
            return pb.FeedbackResponse(decision_id=request.decision_id.strip(),
                                       label="" if stored is None else label_name(stored))

    def GetModelInfo(self, request: pb.GetModelInfoRequest, context: grpc.ServicerContext) -> pb.ModelInfo:
        with self._mapped(context, request):
            return model_info_to_proto(self.core.model())

    @contextmanager
    def _mapped(self, context: grpc.ServicerContext, request: Message) -> Iterator[None]:
        try:
            size = request.ByteSize()
            if size > self.max_message_bytes:
                raise InvalidInputError(f"message is {size:,} bytes, over the server's limit of "
                                        f"{self.max_message_bytes:,} (--max-message-bytes)")
            yield
        except FlywheelError as exc:
            code = status_for(exc)
            rid = getattr(request, "request_id", "")
            if code is grpc.StatusCode.INTERNAL:
                log.error("%s failed%s: %s", type(exc).__name__, f" (request_id {rid})" if rid else "", exc)
            detail = _client_detail(exc)
            context.abort(code, f"{detail} (request_id {rid})" if rid else detail)
        except Exception as exc:  # noqa: BLE001 - a bug must not take the server down
            log.exception("unexpected error while serving a call")
            context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}")


def _client_detail(exc: FlywheelError) -> str:
    """What a client is told: the error's text without the server's file paths (an unknown
    decision id says which id, not which log file; a busy log says so, the server's log has
    the rest)."""
    if isinstance(exc, UnknownDecisionError):
        return exc.message
    if isinstance(exc, LogStoreBusyError):
        log.warning("%s", exc)
        return "the traffic log is busy (locked by another process); try again"
    return str(exc)


def _query(r: pb.ClassifyRequest) -> Query:
    return Query(text=r.text, history=history_from_proto(r.history) if len(r.history) else None,
                 declared_type=r.declared_type or None, session_id=r.session_id or None)


def _deadline(context: grpc.ServicerContext) -> float | None:
    left = context.time_remaining()
    return None if left is None else time.monotonic() + left
