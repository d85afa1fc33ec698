"""A thin typed client for the flywheel gRPC sidecar (``flywheel serve``).

>>> from flywheel.service.client import FlywheelClient                  # doctest: +SKIP
>>> with FlywheelClient("localhost:50051") as fw:                # doctest: +SKIP
...     d = fw.classify("what is addVar?", session_id="s1")
...     d.label, d.tier.value, d.metadata
('RETRIEVAL', 'confident', {'rag': 'true'})

Calls return flywheel's own types (:class:`classifier.Decision`, ``str | None`` for a
label with ``None`` for out of scope, plain dicts). Errors are not swallowed: a failed
call raises :class:`grpc.RpcError` exactly as grpc does (``err.code()`` is e.g.
``grpc.StatusCode.INVALID_ARGUMENT``, ``UNAVAILABLE`` or ``DEADLINE_EXCEEDED``), and
nothing is retried beyond grpc's own defaults. ``UNAVAILABLE`` and ``RESOURCE_EXHAUSTED``
are safe to retry with backoff, and so is ``CANCELLED`` for a call sent while the
server was shutting down (grpc can answer a call that arrives the moment the port closes
that way, grpc/grpc#41785). Arguments of the wrong shape raise :class:`TypeError` before
anything is sent.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import grpc

from flywheel.classifier.decision import Decision
from flywheel.classifier.errors import InvalidInputError
from flywheel.classifier.history import history_entries
from flywheel.classifier.protocols import HistoryEntry
from flywheel.classifier.settings.label_names import OUT_OF_SCOPE
from flywheel.service.convert import decision_from_proto, history_to_proto, model_info_to_dict
from flywheel.service.protos.flywheel.v1 import classifier_pb2 as pb
from flywheel.service.protos.flywheel.v1.classifier_pb2_grpc import IntentClassifierStub

__all__ = ["FlywheelClient"]


class _Default:
    def __repr__(self) -> str:
        return "<the client's timeout>"


#: ``timeout_s`` of a call left out: use the client's ``timeout_s``.
DEFAULT = _Default()
_REQUEST_KEYS = frozenset({"text", "session_id", "declared_type", "history", "request_id"})


def _history_entries(history: Iterable[Any] | None) -> list[HistoryEntry]:
    """:func:`classifier.history.history_entries`, snippets whole (the sidecar cuts them),
    with a ``TypeError`` for a malformed argument, as for the client's other arguments."""
    try:
        return history_entries(history, max_chars=None)
    except InvalidInputError as exc:
        raise TypeError(str(exc)) from None


def _request(text: str, *, session_id: str | None = None, declared_type: str | None = None,
             history: Iterable[Any] | None = None, request_id: str | None = None) -> pb.ClassifyRequest:
    if not isinstance(text, str):
        raise TypeError(f"text must be a string, got {type(text).__name__}")
    return pb.ClassifyRequest(text=text, session_id=session_id or "", declared_type=declared_type or "",
                              history=history_to_proto(_history_entries(history)), request_id=request_id or "")


class FlywheelClient:
    """A connection to a flywheel sidecar.

    Every call raises :class:`grpc.RpcError` when the RPC fails; the client never
    retries on its own.

    Parameters
    ----------
    target : str
        ``host:port`` or ``unix:/path/to/socket`` (any grpc target).
    credentials : grpc.ChannelCredentials, optional
        TLS credentials (``grpc.ssl_channel_credentials(...)``); without them the
        channel is plaintext.
    admin_token : str, optional
        Sent as ``authorization: Bearer <token>`` metadata with :meth:`feedback`
        (only there). Over a plaintext channel it travels in the clear.
    timeout_s : float or None
        The deadline of each call, in seconds (``None``: no deadline); a call's own
        ``timeout_s`` overrides it.
    options : sequence of (str, value), optional
        grpc channel options, e.g. ``[("grpc.max_receive_message_length", 8 << 20)]``.
    """

    def __init__(self, target: str, *, credentials: grpc.ChannelCredentials | None = None,
                 admin_token: str | None = None, timeout_s: float | None = 5.0,
                 options: Sequence[tuple[str, Any]] | None = None) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self._admin_token = admin_token
        opts = list(options) if options is not None else None
        if credentials is None:
            self._channel = grpc.insecure_channel(target, options=opts)
        else:
            self._channel = grpc.secure_channel(target, credentials, options=opts)
        self._stub = IntentClassifierStub(self._channel)

    @property
    def channel(self) -> grpc.Channel:
        """The underlying channel (e.g. for the standard health service's stub)."""
        return self._channel

    def _timeout(self, timeout_s: Any) -> float | None:
        return self.timeout_s if timeout_s is DEFAULT else timeout_s

    def classify(self, text: str, *, session_id: str | None = None, declared_type: str | None = None,
                 history: Iterable[Any] | None = None, request_id: str | None = None,
                 timeout_s: Any = DEFAULT) -> Decision:
        """Classify one query.

        ``history`` is a list, oldest first, of ``(label, snippet)`` pairs or
        :class:`~classifier.protocols.HistoryEntry` objects (label ``None``: out of
        scope); ``declared_type`` an intent name or ``"OUT_OF_SCOPE"``.
        """
        req = _request(text, session_id=session_id, declared_type=declared_type, history=history,
                       request_id=request_id)
        resp = self._stub.Classify(req, timeout=self._timeout(timeout_s))
        return decision_from_proto(resp.decision)

    def classify_batch(self, items: Iterable[str | Mapping[str, Any]], *,
                       timeout_s: Any = DEFAULT) -> list[Decision]:
        """Classify several queries in one call; the decisions are in ``items`` order.

        Each item is a text, or a dict with the keys of :meth:`classify` (``text``
        required; ``session_id``, ``declared_type``, ``history``, ``request_id``).
        """
        reqs = []
        for n, it in enumerate(items):
            if isinstance(it, str):
                reqs.append(_request(it))
            elif isinstance(it, Mapping):
                unknown = sorted(set(it) - _REQUEST_KEYS)
                if unknown or "text" not in it:
                    raise TypeError(f"batch item #{n + 1}: " + (f"unknown key {unknown[0]!r}" if unknown
                                                                 else "no 'text'"))
                reqs.append(_request(**it))
            else:
                raise TypeError(f"batch item #{n + 1} must be a string or a dict, got {type(it).__name__}")
        resp = self._stub.ClassifyBatch(pb.ClassifyBatchRequest(requests=reqs), timeout=self._timeout(timeout_s))
        return [decision_from_proto(m) for m in resp.decisions]

    def feedback(self, decision_id: str, label: str | None, *, timeout_s: Any = DEFAULT) -> str | None:
        """Label an earlier decision (by its ``id``) with an intent name, or out of scope
        (``None`` or ``"OUT_OF_SCOPE"``); return the stored label (``None``: out of scope)."""
        metadata = (("authorization", f"Bearer {self._admin_token}"),) if self._admin_token else None
        req = pb.FeedbackRequest(decision_id=decision_id, label=OUT_OF_SCOPE if label is None else label)
        resp = self._stub.Feedback(req, timeout=self._timeout(timeout_s), metadata=metadata)
        return resp.label or None

    def model_info(self, *, timeout_s: Any = DEFAULT) -> dict[str, Any]:
        """The served model as a plain dict: ``version``, ``encoder``, ``labels``,
        ``thresholds``, ``created_at``, ``training_size``, ``metrics``."""
        return model_info_to_dict(self._stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=self._timeout(timeout_s)))

    def close(self) -> None:
        """Close the channel (idempotent)."""
        self._channel.close()

    def __enter__(self) -> "FlywheelClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
