"""Layer 3 on an OpenAI-compatible server: vLLM, llama.cpp's server, llama-cpp-python,
LM Studio, a hosted API.

:class:`OpenAITeacher` implements :class:`classifier.protocols.ManagedTeacher` with the
same prompt, answer schema, answer parser, circuit breaker and error kinds as
:class:`classifier.teachers.ollama.OllamaTeacher` (it is a
:class:`~classifier.teachers.base.ChatTeacher`).
It posts ``{host}/chat/completions`` with ``httpx``; ``host`` is the API's base URL
(``http://127.0.0.1:8000/v1``).

The answer is constrained by ``response_format``: ``json_schema`` (the label enum, strict:
every property required, so the model always writes ``candidates`` and ``cannot_tell``),
``json_object_schema`` (``{"type": "json_object", "schema": …}``, the label enum as
llama-cpp-python's server takes it), ``json_object`` (any JSON), or ``none``. ``auto`` (the
default) starts with ``json_schema``; when the server refuses a format (HTTP 400, 422 or
500 naming ``response_format``: llama-cpp-python answers 500) the call is retried with
the next one, ``json_object_schema`` then ``json_object``, which the instance then keeps
using. Without the enum a small model often answers a label that was not offered.

The API key comes from the ``OPENAI_API_KEY`` environment variable only (never from an
intent file) and is sent as ``Authorization: Bearer``. It never appears in a repr, an
error or a log line.

Error kinds: no connection (refused, DNS, connect timeout), HTTP 5xx, 404 (model or
endpoint not found) and 429 (rate limited) are ``unavailable``; a read timeout is
``timeout``; 401/403 and other 4xx are ``error``; a body that is not JSON or has no
``choices[0].message.content`` is ``malformed``; a label not offered is ``unknown_label``.
"""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING, Any

from flywheel.classifier.errors import ConfigError, TeacherError
from flywheel.classifier.protocols import TeacherRequest, TeacherStatus
from flywheel.classifier.settings.intents import TEACHER_RESPONSE_FORMATS
from flywheel.classifier.teachers.base import ChatTeacher, CircuitBreaker, shorten

if TYPE_CHECKING:  # pragma: no cover
    import httpx

__all__ = ["API_KEY_ENV", "OpenAITeacher"]

#: The one place the API key is read from.
API_KEY_ENV = "OPENAI_API_KEY"
_REDACTED = "<redacted>"

log = logging.getLogger("flywheel.teacher")

#: ``auto``: the format tried after the server refuses one
AUTO_FALLBACK = {"json_schema": "json_object_schema", "json_object_schema": "json_object"}
#: statuses with which servers refuse a ``response_format`` (400; 422 from FastAPI
#: validation; 500 from llama-cpp-python), when the body names it
REFUSED_STATUS = (400, 422, 500)


class _Secret:
    """A string that does not show itself in a repr or a str."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return _REDACTED

    __str__ = __repr__


class OpenAITeacher(ChatTeacher["httpx.Client"]):
    """A :class:`~classifier.protocols.ManagedTeacher` on an OpenAI-compatible chat API.

    Parameters
    ----------
    model : str
        The model's id on the server (what ``GET {host}/models`` lists).
    host : str
        The API's base URL, e.g. ``http://127.0.0.1:8000/v1``; required (no default).
    timeout_s : float
        HTTP timeout (connect, read, write) of one call, in seconds.
    breaker : CircuitBreaker or None
        Shared breaker; a default ``CircuitBreaker()`` when ``None``.
    temperature : float
        Sampling temperature.
    response_format : {"auto", "json_schema", "json_object", "none"}
        How the answer is constrained (see the module docs).
    system_prompt : {"system", "user"}
        ``"user"`` folds the instructions into the user turn, for servers whose chat
        templates drop the system role.
    max_tokens : int, optional
        Sent as ``max_tokens`` when set (default: not sent). A cap for servers whose JSON
        grammar lets a small model emit whitespace until its context is full.

    Notes
    -----
    ``__init__`` reads ``OPENAI_API_KEY`` and makes no connection: the ``httpx.Client`` is
    created on the first call. Instances are safe to share between threads.
    """

    def __init__(self, model: str, host: str, timeout_s: float = 5.0, breaker: CircuitBreaker | None = None,
                 temperature: float = 0.0, response_format: str = "auto", system_prompt: str = "system",
                 max_tokens: int | None = None) -> None:
        super().__init__(model, timeout_s, breaker, temperature, system_prompt)
        self.max_tokens = max_tokens
        base = (host or "").strip().rstrip("/")
        if not base:
            raise ConfigError("the openai teacher needs the server's base URL: set teacher.host "
                              "(e.g. http://127.0.0.1:8000/v1)")
        if not base.startswith(("http://", "https://")):
            raise ConfigError(f"teacher.host must be an http:// or https:// URL, got {shorten(base, 60)!r}")
        if response_format not in TEACHER_RESPONSE_FORMATS:
            raise ConfigError(f"teacher response_format must be one of {', '.join(TEACHER_RESPONSE_FORMATS)}, "
                              f"got {response_format!r}")
        self.host = base
        self.response_format = response_format
        # what the next call sends; "auto" starts with json_schema and may fall back once
        self._format = "json_schema" if response_format == "auto" else response_format
        key = os.environ.get(API_KEY_ENV, "").strip()
        self._api_key = _Secret(key) if key else None

    def __repr__(self) -> str:
        return (f"OpenAITeacher(model={self._model!r}, host={self.where!r}, timeout_s={self.timeout_s}, "
                f"response_format={self.response_format!r}, api_key={'set' if self._api_key else 'unset'})")

    @property
    def sent_format(self) -> str:
        """The ``response_format`` the next call sends (``json_object`` after a fallback)."""
        return self._format

    # -- HTTP
    def _new_client(self) -> httpx.Client:
        import httpx

        return httpx.Client(timeout=httpx.Timeout(self.timeout_s))

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self._api_key is not None:
            headers["Authorization"] = f"Bearer {self._api_key.reveal()}"
        return headers

    def _scrub(self, text: str) -> str:
        """``text`` with the API key (should a server echo it) replaced."""
        if self._api_key is not None and self._api_key.reveal() in text:
            text = text.replace(self._api_key.reveal(), _REDACTED)
        return text

    def _send(self, method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        """One HTTP exchange; a transport failure becomes a classified TeacherError."""
        import httpx

        try:
            return self._get_client().request(method, f"{self.host}{path}", json=body, headers=self._headers())
        except httpx.ConnectTimeout:
            raise TeacherError("unavailable", f"no connection to {self.where} within {self.timeout_s} s") from None
        except httpx.TimeoutException:
            raise TeacherError("timeout", f"no answer within {self.timeout_s} s") from None
        except httpx.ConnectError as exc:
            raise TeacherError("unavailable", f"connection refused by {self.where} "
                                              f"({self._scrub(shorten(exc, 80))})") from None
        except (httpx.TransportError, OSError) as exc:
            raise TeacherError("unavailable", f"{type(exc).__name__}: {self._scrub(shorten(exc))}") from None
        except Exception as exc:  # an invalid URL & co.: never leak it raw
            raise TeacherError("error", f"{type(exc).__name__}: {self._scrub(shorten(exc))}") from None

    def _reason(self, resp: httpx.Response) -> str:
        """The server's error message (OpenAI: ``{"error": {"message": ...}}``), shortened."""
        try:
            data = resp.json()
        except ValueError:
            data = None
        msg: Any = None
        if isinstance(data, dict):
            err = data.get("error", data.get("detail", data.get("message")))
            msg = err.get("message") if isinstance(err, dict) else err
        if msg is None:
            msg = resp.text
        return self._scrub(shorten(msg if isinstance(msg, str) else json.dumps(msg))) or "no reason given"

    def _status_error(self, resp: httpx.Response) -> TeacherError:
        status = resp.status_code
        if status in (401, 403):  # no server text: some echo the key they refused
            hint = "check" if self._api_key is not None else "set"
            return TeacherError("error", f"HTTP {status}: authentication failed at {self.where} "
                                         f"({hint} the {API_KEY_ENV} environment variable)")
        reason = self._reason(resp)
        if status == 404:
            return TeacherError("unavailable", f"HTTP 404 {reason}: model {self._model!r} or the chat endpoint "
                                               f"is not served at {self.where} (check teacher.model and teacher.host)")
        if status == 429:
            return TeacherError("unavailable", f"HTTP 429 {reason} (rate limited)")
        if status >= 500:
            return TeacherError("unavailable", f"HTTP {status} {reason}")
        return TeacherError("error", f"HTTP {status} {reason}")

    # -- labelling
    def _body(self, messages: list[dict[str, str]], schema: dict[str, Any], fmt: str) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self._model, "messages": messages, "temperature": self.temperature,
                                "stream": False}
        if fmt == "json_schema":  # strict mode wants every object closed and every property required
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "intent", "schema": {**schema, "required": list(schema["properties"]),
                                             "additionalProperties": False}, "strict": True}}
        elif fmt == "json_object_schema":
            body["response_format"] = {"type": "json_object", "schema": schema}
        elif fmt == "json_object":
            body["response_format"] = {"type": "json_object"}
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        return body

    def _call(self, request: TeacherRequest) -> str:
        messages, schema = self.prompt(request)
        fmt = self._format
        resp = self._send("POST", "/chat/completions", self._body(messages, schema, fmt))
        while (self.response_format == "auto" and fmt in AUTO_FALLBACK and resp.status_code in REFUSED_STATUS
               and "response_format" in resp.text.lower()):
            refused, fmt = fmt, AUTO_FALLBACK[fmt]
            self._format = fmt
            log.warning("the teacher server at %s refused response_format %s (HTTP %d); using %s from now on",
                        self.where, refused, resp.status_code, fmt)
            resp = self._send("POST", "/chat/completions", self._body(messages, schema, fmt))
        if not 200 <= resp.status_code < 300:
            raise self._status_error(resp)
        try:
            data = resp.json()
        except ValueError:
            raise TeacherError("malformed", "the server's reply is not JSON") from None
        try:
            content = data["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise TeacherError("malformed", "the reply has no choices[0].message.content") from None
        if not isinstance(content, str):
            raise TeacherError("malformed", "the reply's message content is not a string")
        return content

    # -- readiness
    def check(self) -> TeacherStatus:
        """Whether the server answers and serves the model (``GET {host}/models``); never raises.

        ``ok`` when the model id is listed, or when it cannot be verified (the server lists
        no models, or has no ``/models`` endpoint). Bounded by ``timeout_s`` per HTTP phase;
        does not touch the breaker.
        """
        who = f"teacher {self._model!r} at {self.where}"
        try:
            resp = self._send("GET", "/models")
        except TeacherError as exc:
            return TeacherStatus(False, f"{who}: {exc}")
        if resp.status_code in (404, 405, 501):
            return TeacherStatus(True, f"{who}: not verifiable (the server has no /models endpoint)")
        if not 200 <= resp.status_code < 300:
            return TeacherStatus(False, f"{who}: {self._status_error(resp)}")
        try:
            listed = resp.json().get("data")
            ids = [m["id"] for m in listed if isinstance(m, dict) and isinstance(m.get("id"), str)]
        except (ValueError, AttributeError, TypeError):
            ids = []
        if not ids:
            return TeacherStatus(True, f"{who}: not verifiable (the server lists no models)")
        if self._model in ids:
            return TeacherStatus(True, f"{who}: served")
        shown = ", ".join(repr(i) for i in ids[:5]) + (", ..." if len(ids) > 5 else "")
        return TeacherStatus(False, f"{who}: the server does not serve this model (it serves {shown}); "
                                    "check teacher.model")
