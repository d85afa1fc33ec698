"""Layer 3 on an Ollama server: :class:`OllamaTeacher`, behind a circuit breaker.

It asks the model for ``{"label": ...}`` constrained by a JSON schema whose ``label`` is
an enum of the offered intent names (``format``), then validates the answer anyway
(:class:`~classifier.teachers.base.ChatTeacher`). The ``ollama`` client is imported and
created on the first call, never at import time.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from flywheel.classifier.errors import TeacherError
from flywheel.classifier.protocols import TeacherRequest, TeacherStatus
from flywheel.classifier.teachers.base import ChatTeacher, CircuitBreaker, parse_answer, shorten

if TYPE_CHECKING:  # pragma: no cover
    import ollama

DEFAULT_HOST = "http://127.0.0.1:11434"

__all__ = ["DEFAULT_HOST", "OllamaTeacher", "resolve_host"]


def resolve_host(explicit: str | None) -> str:
    """Return the Ollama host to use.

    Parameters
    ----------
    explicit : str or None
        A host given in configuration or on the command line.

    Returns
    -------
    str
        ``explicit`` when non-empty, else the ``OLLAMA_HOST`` environment variable
        when non-empty, else ``http://127.0.0.1:11434``.
    """
    if explicit and explicit.strip():
        return explicit.strip()
    env = os.environ.get("OLLAMA_HOST", "").strip()
    return env or DEFAULT_HOST


class OllamaTeacher(ChatTeacher["ollama.Client"]):
    """A :class:`~classifier.protocols.ManagedTeacher` backed by an Ollama server.

    Parameters
    ----------
    model : str
        Ollama model name, e.g. ``llama3.1:8b``.
    host : str or None
        Server URL; resolved with :func:`resolve_host`.
    timeout_s : float
        HTTP timeout (connect, read, write) of one call, in seconds.
    breaker : CircuitBreaker or None
        Shared breaker; a default ``CircuitBreaker()`` when ``None``.
    temperature : float
        Sampling temperature sent in ``options``.
    keep_alive : str, float or None
        How long Ollama keeps the model loaded after a call (``"30m"``; ``"-1s"``:
        forever; ``None``: the server's default, 5 minutes), so bursts do not pay a reload.
    system_prompt : {"system", "user"}
        Where the instructions go (:func:`~classifier.teachers.base.build_messages`).

    Notes
    -----
    ``__init__`` makes no connection: the ``ollama.Client`` is created on the first
    :meth:`label` or :meth:`check` call. Instances are safe to share between threads.
    HTTP 404 (the model is not pulled) is ``unavailable``: the decision is pending and
    ``flywheel label`` asks again once the model is there.
    """

    def __init__(self, model: str, host: str | None = None, timeout_s: float = 5.0,
                 breaker: CircuitBreaker | None = None, temperature: float = 0.0,
                 keep_alive: str | float | None = "30m", system_prompt: str = "system") -> None:
        super().__init__(model, timeout_s, breaker, temperature, system_prompt)
        self.host = resolve_host(host)
        self.keep_alive = keep_alive

    def __repr__(self) -> str:
        return f"OllamaTeacher(model={self._model!r}, host={self.where!r}, timeout_s={self.timeout_s})"

    _parse = staticmethod(parse_answer)

    def _new_client(self) -> ollama.Client:
        import httpx
        import ollama

        return ollama.Client(host=self.host, timeout=httpx.Timeout(self.timeout_s))

    def check(self) -> TeacherStatus:
        """Whether the server answers and has the model (``POST /api/show``); never raises.

        Bounded by ``timeout_s`` per HTTP phase; does not touch the breaker.
        """
        try:
            self._get_client().show(self._model)
        except Exception as exc:  # noqa: BLE001 - a check reports, it never raises
            return TeacherStatus(False, f"teacher {self._model!r} at {self.where}: {self._error(exc)}")
        return TeacherStatus(True, f"teacher {self._model!r} is available at {self.where}")

    def _call(self, request: TeacherRequest) -> str:
        messages, schema = self.prompt(request)
        try:
            resp = self._get_client().chat(
                model=self._model, messages=messages, format=schema,
                options={"temperature": self.temperature}, stream=False, keep_alive=self.keep_alive)
        except Exception as exc:  # every client failure becomes a classified TeacherError
            raise self._error(exc) from None
        content = resp.message.content if resp.message is not None else None
        if not isinstance(content, str):
            raise TeacherError("malformed", "answer has no message content")
        return content

    def _error(self, exc: Exception) -> TeacherError:
        """The :class:`TeacherError` for an exception of the ollama client."""
        import httpx
        import ollama
        from pydantic import ValidationError

        if isinstance(exc, ollama.ResponseError):
            status = exc.status_code
            reason = shorten(exc.error) or "no reason given"
            if status == 404:  # Ollama: model "x" not found, try pulling it first
                return TeacherError("unavailable", f"model {self._model!r} not found on {self.where} "
                                    f"(HTTP 404: {reason}); pull it first: ollama pull {self._model}")
            if status >= 500:
                return TeacherError("unavailable", f"HTTP {status} {reason}")
            return TeacherError("error", f"HTTP {status} {reason}")
        if isinstance(exc, httpx.ConnectTimeout):
            return TeacherError("unavailable", f"no connection to {self.where} within {self.timeout_s} s")
        if isinstance(exc, httpx.TimeoutException):
            return TeacherError("timeout", f"no answer within {self.timeout_s} s")
        if isinstance(exc, ConnectionError):  # ollama turns httpx.ConnectError into the builtin
            return TeacherError("unavailable", f"connection refused by {self.where}")
        if isinstance(exc, (httpx.TransportError, OSError)):
            return TeacherError("unavailable", f"{type(exc).__name__}: {shorten(exc)}")
        if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError, ValidationError)):
            return TeacherError("malformed", "the server's reply is not an Ollama response")
        return TeacherError("error", f"{type(exc).__name__}: {shorten(exc)}")  # never leak it raw
