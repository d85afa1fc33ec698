"""Layer 3: an LLM teacher served by Ollama, behind a circuit breaker.

:class:`OllamaTeacher` implements :class:`classifier.protocols.Teacher`. It asks the
model for ``{"label": ...}`` constrained by a JSON schema whose ``label`` is an enum
of the offered intent names, then validates the answer anyway. Every failure is a
:class:`~classifier.errors.TeacherError` with one of the kinds ``unavailable``,
``timeout``, ``malformed``, ``unknown_label``, ``circuit_open`` or ``error``; no raw
``httpx``/``ollama`` exception ever escapes.

A :class:`CircuitBreaker` stops calling a dead server: after a few consecutive
transport failures (unreachable, timeout, HTTP 5xx) calls fail at once with
``circuit_open`` until a cool-down has passed, then one probe is let through.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

from classifier.errors import ConfigError, InvalidInputError, TeacherError
from classifier.labels import OUT_OF_SCOPE, parse_label
from classifier.protocols import TeacherAnswer, TeacherRequest

if TYPE_CHECKING:  # pragma: no cover
    import ollama


DEFAULT_HOST = "http://127.0.0.1:11434"
HISTORY_RULE = ("the history only resolves references such as 'this' or 'that function' "
                "in the query; it must not bias the label")

__all__ = ["DEFAULT_HOST", "HISTORY_RULE", "CircuitBreaker", "OllamaTeacher",
           "build_messages", "resolve_host", "response_schema"]


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


class CircuitBreaker:
    """A thread-safe closed / open / half-open circuit breaker.

    Parameters
    ----------
    failures : int
        Consecutive failures that open the circuit.
    reset_s : float
        Seconds the circuit stays open before one probe call is allowed.
    clock : callable
        Monotonic clock returning seconds (injectable for tests).

    Notes
    -----
    Callers ask :meth:`allow` before each call and report the outcome with
    :meth:`record_success` or :meth:`record_failure`. While open, :meth:`allow`
    returns ``False`` so no call (and no timeout) is paid. Once ``reset_s`` has
    passed the breaker is half-open: exactly one caller gets ``True``; its success
    closes the circuit, its failure re-opens it for another ``reset_s``.
    """

    def __init__(self, failures: int = 3, reset_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if failures < 1:
            raise ValueError("failures must be >= 1")
        if reset_s < 0:
            raise ValueError("reset_s must be >= 0")
        self.failures = int(failures)
        self.reset_s = float(reset_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._state = "closed"
        self._consecutive = 0
        self._opened_at = 0.0
        self._probe_in_flight = False

    @property
    def state(self) -> str:
        """``"closed"``, ``"open"`` or ``"half_open"`` (cool-down over, probe allowed or running)."""
        with self._lock:
            if self._state == "open" and self._clock() - self._opened_at >= self.reset_s:
                return "half_open"
            return self._state

    def retry_in(self) -> float:
        """Seconds until a probe will be allowed (0 when not open)."""
        with self._lock:
            if self._state != "open":
                return 0.0
            return max(0.0, self._opened_at + self.reset_s - self._clock())

    def allow(self) -> bool:
        """Whether a call may go through now; in half-open state, only one probe may."""
        with self._lock:
            if self._state == "closed":
                return True
            if self._state == "open":
                if self._clock() - self._opened_at < self.reset_s:
                    return False
                self._state = "half_open"
                self._probe_in_flight = False
            if self._probe_in_flight:
                return False
            self._probe_in_flight = True
            return True

    def record_success(self) -> None:
        """Report a call that reached a working server; closes the circuit."""
        with self._lock:
            self._state = "closed"
            self._consecutive = 0
            self._probe_in_flight = False

    def record_failure(self) -> None:
        """Report a transport failure; opens the circuit after enough of them."""
        with self._lock:
            self._consecutive += 1
            self._probe_in_flight = False
            if self._state == "half_open" or self._consecutive >= self.failures:
                self._state = "open"
                self._opened_at = self._clock()


def _options_block(request: TeacherRequest) -> str:
    lines: list[str] = []
    for opt in request.options:
        desc = " ".join(opt.description.split()) or "(no description)"
        lines.append(f"- {opt.name}: {desc}")
        if opt.examples:
            lines.append("  examples: " + "; ".join(
                json.dumps(e, ensure_ascii=False) for e in opt.examples))
    if request.allow_out_of_scope:
        lines.append(f"- {OUT_OF_SCOPE}: the query matches none of the intents above.")
    return "\n".join(lines)


def build_messages(request: TeacherRequest) -> list[dict[str, str]]:
    """Build the system and user chat messages for one labelling request.

    Parameters
    ----------
    request : TeacherRequest
        The query, the offered labels (with descriptions and examples), the compact
        history and whether ``OUT_OF_SCOPE`` is allowed.

    Returns
    -------
    list of dict
        ``[{"role": "system", ...}, {"role": "user", ...}]``.
    """
    names = [o.name for o in request.options]
    if request.allow_out_of_scope:
        names.append(OUT_OF_SCOPE)
    system = (
        "You are an intent classifier. Pick exactly one label for the user's query "
        "from the intents below.\n\n"
        f"Intents:\n{_options_block(request)}\n\n"
        'Answer with JSON only, in the form {"label": "<NAME>"}, where <NAME> is exactly '
        "one of: " + ", ".join(names) + "."
    )
    if request.allow_out_of_scope:
        system += f" Use {OUT_OF_SCOPE} when no intent fits."
    parts: list[str] = []
    if request.history:
        parts.append(f"Rule: {HISTORY_RULE}.")
        parts.append("History (oldest first, label: snippet):")
        for h in request.history:
            label = h.label if h.label is not None else OUT_OF_SCOPE
            parts.append(f"- {label}: {json.dumps(h.snippet, ensure_ascii=False)}")
        parts.append("")
    parts.append(f"Query: {json.dumps(request.text, ensure_ascii=False)}")
    return [{"role": "system", "content": system},
            {"role": "user", "content": "\n".join(parts)}]


def response_schema(labels: Sequence[str], allow_out_of_scope: bool) -> dict[str, Any]:
    """JSON schema for the answer: an object whose ``label`` is one of ``labels``.

    Parameters
    ----------
    labels : sequence of str
        The offered intent names.
    allow_out_of_scope : bool
        Whether ``OUT_OF_SCOPE`` is added to the enum.

    Returns
    -------
    dict
        A JSON schema usable as Ollama's ``format`` argument.
    """
    enum = list(dict.fromkeys(labels))
    if allow_out_of_scope and OUT_OF_SCOPE not in enum:
        enum.append(OUT_OF_SCOPE)
    return {"type": "object",
            "properties": {"label": {"type": "string", "enum": enum}},
            "required": ["label"]}


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class OllamaTeacher:
    """A :class:`~classifier.protocols.Teacher` backed by an Ollama server.

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

    Notes
    -----
    ``__init__`` makes no connection: the ``ollama.Client`` is created on the first
    :meth:`label` call. Instances are safe to share between threads.
    """

    def __init__(self, model: str, host: str | None = None, timeout_s: float = 5.0,
                 breaker: CircuitBreaker | None = None, temperature: float = 0.0) -> None:
        if not model:
            raise ConfigError("teacher model must be a non-empty string")
        if timeout_s <= 0:
            raise ConfigError(f"teacher timeout_s must be > 0, got {timeout_s!r}")
        self._model = model
        self.host = resolve_host(host)
        self.timeout_s = float(timeout_s)
        self.breaker = breaker if breaker is not None else CircuitBreaker()
        self.temperature = float(temperature)
        self._client: ollama.Client | None = None
        self._client_lock = threading.Lock()

    @property
    def model(self) -> str:
        """The Ollama model name."""
        return self._model

    def __repr__(self) -> str:
        return f"OllamaTeacher(model={self._model!r}, host={self.host!r}, timeout_s={self.timeout_s})"

    def _get_client(self) -> ollama.Client:
        client = self._client
        if client is None:
            with self._client_lock:
                if self._client is None:
                    import httpx
                    import ollama

                    self._client = ollama.Client(host=self.host,
                                                 timeout=httpx.Timeout(self.timeout_s))
                client = self._client
        return client

    def close(self) -> None:
        """Close the underlying HTTP client, if one was created."""
        with self._client_lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def label(self, request: TeacherRequest) -> TeacherAnswer:
        """Label one query.

        Parameters
        ----------
        request : TeacherRequest
            The query and the labels it may receive.

        Returns
        -------
        TeacherAnswer
            ``label`` is an offered name, or ``None`` for ``OUT_OF_SCOPE``.

        Raises
        ------
        TeacherError
            ``circuit_open`` without calling the server while the breaker is open;
            ``unavailable``, ``timeout``, ``malformed``, ``unknown_label`` or
            ``error`` otherwise.
        """
        names = [o.name for o in request.options]
        if not names and not request.allow_out_of_scope:
            raise TeacherError("error", "the request offers no labels")
        if not self.breaker.allow():
            wait = self.breaker.retry_in()
            raise TeacherError("circuit_open",
                               f"teacher {self._model!r} at {self.host} failed repeatedly; "
                               f"retry in {max(1, math.ceil(wait))} s")
        start = time.perf_counter()
        try:
            content = self._call(request, names)
        except TeacherError as exc:
            if exc.kind in ("unavailable", "timeout"):
                self.breaker.record_failure()
            else:
                self.breaker.record_success()
            raise
        except BaseException:  # KeyboardInterrupt & co.: free a half-open probe slot
            self.breaker.record_failure()
            raise
        self.breaker.record_success()  # the server answered; bad content is not its outage
        latency_ms = (time.perf_counter() - start) * 1000.0
        return TeacherAnswer(label=self._parse(content, names, request.allow_out_of_scope),
                             model=self._model, latency_ms=latency_ms, raw=content)

    def _call(self, request: TeacherRequest, names: list[str]) -> str:
        """One chat call; returns the answer content or raises a classified TeacherError."""
        import httpx
        import ollama
        from pydantic import ValidationError

        try:
            client = self._get_client()
            resp = client.chat(model=self._model, messages=build_messages(request),
                               format=response_schema(names, request.allow_out_of_scope),
                               options={"temperature": self.temperature}, stream=False)
        except ollama.ResponseError as exc:
            status = exc.status_code
            reason = _short(exc.error) or "no reason given"
            if status >= 500:
                raise TeacherError("unavailable", f"HTTP {status} {reason}") from None
            raise TeacherError("error", f"HTTP {status} {reason}") from None
        except httpx.ConnectTimeout:
            raise TeacherError("unavailable",
                               f"no connection to {self.host} within {self.timeout_s} s") from None
        except httpx.TimeoutException:
            raise TeacherError("timeout", f"no answer within {self.timeout_s} s") from None
        except ConnectionError:  # ollama turns httpx.ConnectError into the builtin
            raise TeacherError("unavailable", f"connection refused by {self.host}") from None
        except (httpx.TransportError, OSError) as exc:
            raise TeacherError("unavailable", f"{type(exc).__name__}: {_short(exc)}") from None
        except (json.JSONDecodeError, UnicodeDecodeError, ValidationError):
            raise TeacherError("malformed", "the server's reply is not an Ollama chat response") from None
        except Exception as exc:  # anything else from the client: never leak it raw
            raise TeacherError("error", f"{type(exc).__name__}: {_short(exc)}") from None
        content = resp.message.content if resp.message is not None else None
        if not isinstance(content, str):
            raise TeacherError("malformed", "answer has no message content")
        return content

    @staticmethod
    def _parse(content: str, names: list[str], allow_out_of_scope: bool) -> str | None:
        try:
            data = json.loads(content)
        except (json.JSONDecodeError, ValueError):
            raise TeacherError("malformed", f"answer is not JSON: {_short(content, 60)!r}") from None
        if not isinstance(data, dict) or "label" not in data:
            raise TeacherError("malformed", f'answer has no "label": {_short(content, 60)!r}')
        label = data["label"]
        if not isinstance(label, str):
            raise TeacherError("malformed", f'"label" is not a string: {label!r}')
        try:  # the one label parser: an offered name, or out of scope (None)
            parsed = parse_label(label, names, what="teacher label")
            if parsed is not None or allow_out_of_scope:
                return parsed
        except InvalidInputError:
            pass
        offered = names + ([OUT_OF_SCOPE] if allow_out_of_scope else [])
        raise TeacherError("unknown_label",
                           f"{_short(label, 60)!r} is not one of {', '.join(offered)}")
