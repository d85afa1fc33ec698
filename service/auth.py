"""Who may write labels: ``Feedback`` needs ``authorization: Bearer <token>`` when an
admin token is set (a label from ``Feedback`` always wins over the teacher's, so it is
a way to poison training data)."""

from __future__ import annotations

import hmac
from typing import Any, Callable, Iterable

import grpc

__all__ = ["AdminTokenInterceptor"]


class AdminTokenInterceptor(grpc.ServerInterceptor):
    """Refuses calls to ``methods`` (full names, ``/package.Service/Method``) without the
    token, with ``UNAUTHENTICATED``; other methods pass untouched."""

    def __init__(self, token: str, methods: Iterable[str]) -> None:
        if not token:
            raise ValueError("an admin token must not be empty")
        self._token = token.encode("utf-8")
        self.methods = frozenset(methods)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        if handler_call_details.method not in self.methods:
            return continuation(handler_call_details)
        if self._authorized(handler_call_details.invocation_metadata or ()):
            return continuation(handler_call_details)
        return grpc.unary_unary_rpc_method_handler(_refuse)

    def _authorized(self, metadata: Iterable[tuple[str, str | bytes]]) -> bool:
        for key, value in metadata:
            if key == "authorization":
                text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
                scheme, _, given = text.partition(" ")
                if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode("utf-8"), self._token):
                    return True
        return False


def _refuse(request: object, context: grpc.ServicerContext) -> None:
    context.abort(grpc.StatusCode.UNAUTHENTICATED,
                  "Feedback needs 'authorization: Bearer <admin token>' in the call's metadata")
