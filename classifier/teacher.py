"""Layer 3: an LLM teacher served by Ollama, behind a circuit breaker.

:class:`OllamaTeacher` implements :class:`classifier.protocols.Teacher`. It asks the
model for ``{"label": ...}`` constrained by a JSON schema whose ``label`` is an enum
of the offered intent names, then validates the answer anyway. Every failure is a
:class:`~classifier.errors.TeacherError` with one of the kinds ``unavailable``,
``timeout``, ``malformed``, ``unknown_label``, ``circuit_open`` or ``error``; no raw
``httpx``/``ollama`` exception ever escapes.

A :class:`CircuitBreaker` stops calling a dead server: after a few consecutive
transport failures (unreachable, timeout, HTTP 5xx, model not found) calls fail at once
with ``circuit_open`` until a cool-down has passed, then one probe is let through.

What every backend shares lives here, so there is one copy of it: the prompt
(:func:`build_messages`, options in a per-text shuffled order, :func:`option_order`),
the answer schema (:func:`response_schema`), the answer parser (:func:`parse_answer`),
the breaker, and :class:`ChatTeacher`, the base that runs one call through the breaker.
:mod:`classifier.openai_teacher` is the other backend. A teacher's ``check()`` says,
without raising, whether its server answers and has the model (:class:`TeacherStatus`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence
from urllib.parse import urlsplit, urlunsplit

from flywheel.classifier.errors import ConfigError, InvalidInputError, TeacherError
from flywheel.classifier.intents import SYSTEM_PROMPT_MODES
from flywheel.classifier.labels import OUT_OF_SCOPE, parse_label
from flywheel.classifier.protocols import LabelOption, TeacherAnswer, TeacherRequest

if TYPE_CHECKING:  # pragma: no cover
    import ollama


DEFAULT_HOST = "http://127.0.0.1:11434"
HISTORY_RULE = ("the history only resolves references such as 'this' or 'that function' "
                "in the query; it must not bias the label")

__all__ = ["DEFAULT_HOST", "HISTORY_RULE", "ChatTeacher", "CircuitBreaker", "OllamaTeacher",
           "TeacherStatus", "build_messages", "option_order", "parse_answer", "redact_url",
           "resolve_host", "response_schema", "shorten"]


@dataclass(frozen=True)
class TeacherStatus:
    """What a teacher's ``check()`` found: ``ok`` when its server answered and has the
    model (or cannot say, see the backend), ``detail`` a one-line explanation for logs."""

    ok: bool
    detail: str


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


def option_order(request: TeacherRequest) -> tuple[LabelOption, ...]:
    """The offered options in the order the prompt and the schema list them.

    Small LLMs favour the first-listed label, so the order is a shuffle seeded by a hash
    of the request's text (BLAKE2b): the same text always gets the same order, different
    texts get different ones. ``OUT_OF_SCOPE`` is not an option; it is always listed last.

    Parameters
    ----------
    request : TeacherRequest
        The query and its offered options.

    Returns
    -------
    tuple of LabelOption
        ``request.options`` reordered.
    """
    options = list(request.options)
    digest = hashlib.blake2b(request.text.encode("utf-8", "surrogatepass"), digest_size=8,
                             person=b"flywheel-options").digest()
    random.Random(int.from_bytes(digest, "big")).shuffle(options)
    return tuple(options)


def _options_block(options: Sequence[LabelOption], allow_out_of_scope: bool) -> str:
    lines: list[str] = []
    for opt in options:
        desc = " ".join(opt.description.split()) or "(no description)"
        lines.append(f"- {opt.name}: {desc}")
        if opt.examples:
            lines.append("  examples: " + "; ".join(
                json.dumps(e, ensure_ascii=False) for e in opt.examples))
    if allow_out_of_scope:
        lines.append(f"- {OUT_OF_SCOPE}: the query matches none of the intents above.")
    return "\n".join(lines)


def build_messages(request: TeacherRequest, system_prompt: str = "system") -> list[dict[str, str]]:
    """Build the chat messages for one labelling request.

    Parameters
    ----------
    request : TeacherRequest
        The query, the offered labels (with descriptions and examples), the compact
        history and whether ``OUT_OF_SCOPE`` is allowed. The intents are listed in
        :func:`option_order`, ``OUT_OF_SCOPE`` last.
    system_prompt : {"system", "user"}
        ``"system"``: the instructions are a system message; ``"user"``: they open the
        one user message (for chat templates that drop the system role).

    Returns
    -------
    list of dict
        ``[{"role": "system", ...}, {"role": "user", ...}]``, or one ``user`` message.
    """
    if system_prompt not in SYSTEM_PROMPT_MODES:
        raise ConfigError(f"teacher system_prompt must be one of {', '.join(SYSTEM_PROMPT_MODES)}, "
                          f"got {system_prompt!r}")
    options = option_order(request)
    names = [o.name for o in options]
    if request.allow_out_of_scope:
        names.append(OUT_OF_SCOPE)
    system = (
        "You are an intent classifier. Pick exactly one label for the user's query "
        "from the intents below.\n\n"
        f"Intents:\n{_options_block(options, request.allow_out_of_scope)}\n\n"
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
    user = "\n".join(parts)
    if system_prompt == "user":
        return [{"role": "user", "content": f"{system}\n\n{user}"}]
    return [{"role": "system", "content": system},
            {"role": "user", "content": user}]


def response_schema(labels: Sequence[str], allow_out_of_scope: bool) -> dict[str, Any]:
    """JSON schema for the answer: an object whose ``label`` is one of ``labels``.

    Parameters
    ----------
    labels : sequence of str
        The offered intent names, in the order the enum lists them (a teacher passes
        :func:`option_order`'s).
    allow_out_of_scope : bool
        Whether ``OUT_OF_SCOPE`` is added (last) to the enum.

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


def shorten(text: Any, limit: int = 120) -> str:
    """``text`` on one line, cut to ``limit`` characters (for error messages)."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def redact_url(url: str) -> str:
    """``url`` without user info, query or fragment: what logs, errors and reprs show."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<invalid URL>"
    if not parts.scheme or not parts.netloc:
        return url.split("?", 1)[0].split("#", 1)[0]
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def parse_answer(content: str, names: Sequence[str], allow_out_of_scope: bool) -> str | None:
    """Validate a teacher's answer ``{"label": "<NAME>"}``.

    Returns
    -------
    str or None
        An offered name, or ``None`` for ``OUT_OF_SCOPE`` (when allowed).

    Raises
    ------
    TeacherError
        ``malformed`` when ``content`` is not a JSON object with a string ``label``;
        ``unknown_label`` when the label is not offered.
    """
    names = list(names)
    try:
        data = json.loads(content)
    except (json.JSONDecodeError, ValueError):
        raise TeacherError("malformed", f"answer is not JSON: {shorten(content, 60)!r}") from None
    if not isinstance(data, dict) or "label" not in data:
        raise TeacherError("malformed", f'answer has no "label": {shorten(content, 60)!r}')
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
                       f"{shorten(label, 60)!r} is not one of {', '.join(offered)}")


class ChatTeacher:
    """The part every chat-model teacher shares: settings, the breaker around one call,
    the prompt, the answer check. A backend implements :meth:`_call` (and ``check()``).

    Parameters
    ----------
    model : str
        The model's name on the server.
    timeout_s : float
        HTTP timeout (connect, read, write) of one call, in seconds.
    breaker : CircuitBreaker or None
        Shared breaker; a default ``CircuitBreaker()`` when ``None``.
    temperature : float
        Sampling temperature.
    system_prompt : {"system", "user"}
        Where the instructions go (:func:`build_messages`).

    Notes
    -----
    ``unavailable`` and ``timeout`` count as the server's failures for the breaker;
    any other answer (even a malformed one) shows the server is up.
    """

    host: str = ""

    def __init__(self, model: str, timeout_s: float = 5.0, breaker: CircuitBreaker | None = None,
                 temperature: float = 0.0, system_prompt: str = "system") -> None:
        if not model:
            raise ConfigError("teacher model must be a non-empty string")
        if not timeout_s > 0:
            raise ConfigError(f"teacher timeout_s must be > 0, got {timeout_s!r}")
        if system_prompt not in SYSTEM_PROMPT_MODES:
            raise ConfigError(f"teacher system_prompt must be one of {', '.join(SYSTEM_PROMPT_MODES)}, "
                              f"got {system_prompt!r}")
        self._model = model
        self.timeout_s = float(timeout_s)
        self.breaker = breaker if breaker is not None else CircuitBreaker()
        self.temperature = float(temperature)
        self.system_prompt = system_prompt

    @property
    def model(self) -> str:
        """The model name."""
        return self._model

    @property
    def where(self) -> str:
        """The server's address as errors and logs show it (:func:`redact_url`)."""
        return redact_url(self.host)

    def prompt(self, request: TeacherRequest) -> tuple[list[dict[str, str]], dict[str, Any]]:
        """The messages and the answer schema for ``request``, both in :func:`option_order`."""
        names = [o.name for o in option_order(request)]
        return (build_messages(request, self.system_prompt),
                response_schema(names, request.allow_out_of_scope))

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
                               f"teacher {self._model!r} at {self.where} failed repeatedly; "
                               f"retry in {max(1, math.ceil(wait))} s")
        start = time.perf_counter()
        try:
            content = self._call(request)
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
        return TeacherAnswer(label=parse_answer(content, names, request.allow_out_of_scope),
                             model=self._model, latency_ms=latency_ms, raw=content)

    def _call(self, request: TeacherRequest) -> str:
        """One chat call; returns the answer content or raises a classified TeacherError."""
        raise NotImplementedError


class OllamaTeacher(ChatTeacher):
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
    keep_alive : str, float or None
        How long Ollama keeps the model loaded after a call (``"30m"``; ``"-1s"``:
        forever; ``None``: the server's default, 5 minutes), so bursts do not pay a reload.
    system_prompt : {"system", "user"}
        Where the instructions go (:func:`build_messages`).

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
        self._client: ollama.Client | None = None
        self._client_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"OllamaTeacher(model={self._model!r}, host={self.where!r}, timeout_s={self.timeout_s})"

    _parse = staticmethod(parse_answer)

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
