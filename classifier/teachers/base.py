"""What every teacher backend shares, one copy of it: which intents a query offers the
teacher (:func:`offered_options`, for layer 3 and the audits alike), the prompt
(:func:`build_messages`, options in a per-text shuffled order, :func:`option_order`), the answer schema
(:func:`response_schema`: one label, or a candidate set / "cannot tell" when the teacher is
unsure), the answer parser (:func:`read_answer`), the
:class:`CircuitBreaker`, the helpers for errors and logs (:func:`shorten`,
:func:`redact_url`) and :class:`ChatTeacher`, the base that runs one call through the
breaker. A backend (:mod:`~classifier.teachers.ollama`, :mod:`~classifier.teachers.openai`)
implements the call itself, ``check()`` and ``close()``.

Every failure is a :class:`~classifier.errors.TeacherError` with one of the kinds
``unavailable``, ``timeout``, ``malformed``, ``unknown_label``, ``circuit_open`` or
``error``; no raw ``httpx``/``ollama`` exception ever escapes.

A :class:`CircuitBreaker` stops calling a dead server: after a few consecutive
transport failures (unreachable, timeout, HTTP 5xx, model not found) calls fail at once
with ``circuit_open`` until a cool-down has passed, then one probe is let through.

Imports nothing but the standard library and :mod:`classifier`; no client is created here.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import threading
import time
from typing import Any, Callable, Generic, Iterable, Mapping, NamedTuple, Protocol, Sequence, TypeVar
from urllib.parse import urlsplit, urlunsplit

from flywheel.classifier.errors import ConfigError, InvalidInputError, TeacherError
from flywheel.classifier.protocols import LabelOption, TeacherAnswer, TeacherRequest
from flywheel.classifier.settings.intents import SYSTEM_PROMPT_MODES
from flywheel.classifier.settings.label_names import OUT_OF_SCOPE, parse_label

HISTORY_RULE = ("the history only resolves references such as 'this' or 'that function' "
                "in the query; it must not bias the label")

__all__ = ["HISTORY_RULE", "MAX_CANDIDATES", "MIN_CANDIDATES", "ChatTeacher", "CircuitBreaker", "ParsedAnswer",
           "build_messages", "offered_options", "option_order", "parse_answer", "read_answer", "redact_url",
           "response_schema", "shorten"]


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


def offered_options(options: Mapping[str, LabelOption], ranking: Iterable[str | None], max_candidates: int,
                    decided: str | None = None) -> tuple[LabelOption, ...]:
    """The intents one query offers the teacher: the one rule for layer 3, the background
    audits and the back-fill, so an audit asks the teacher the question layer 3 would have.

    With at most ``max_candidates`` intents, all of them (in the intent set's order).
    With more, layer 2's top ``max_candidates`` (``ranking``: its in-scope labels, best
    first; ``None`` entries, out of scope, are skipped), and ``decided`` (the label the
    pipeline decided, e.g. the confident layer-2 answer an audit checks) always among them:
    when it is not in the top ones it takes the last place. Out of scope is never an option
    here (a request allows it separately). The order returned is the one the request
    carries; the prompt then lists them in :func:`option_order`, which depends only on
    this tuple and the text, so the same query gets the same prompt from either caller.

    Parameters
    ----------
    options : mapping of str to LabelOption
        Every intent of the set, by name, in the intent set's order.
    ranking : iterable of str or None
        Layer 2's labels for this query, best first.
    max_candidates : int
        ``teacher.max_candidates``.
    decided : str or None
        A label that must be offered (``None``: none; out of scope needs no place).

    Examples
    --------
    >>> opts = {n: LabelOption(n, "") for n in "ABCDE"}
    >>> [o.name for o in offered_options(opts, ["C", "A", "E", "B", "D"], 2)]
    ['C', 'A']
    >>> [o.name for o in offered_options(opts, ["C", "A", "E", "B", "D"], 2, decided="D")]
    ['C', 'D']
    """
    if max_candidates < 1:
        raise ValueError(f"max_candidates must be >= 1, got {max_candidates}")
    if len(options) <= max_candidates:
        return tuple(options.values())
    top = [n for n in dict.fromkeys(ranking) if n is not None and n in options][:max_candidates]
    if decided is not None and decided in options and decided not in top:
        top = top[: max_candidates - 1] + [decided]
    return tuple(options[n] for n in top)


def option_order(request: TeacherRequest) -> tuple[LabelOption, ...]:
    """The offered options in the order the prompt and the schema list them.

    Small LLMs favour the first-listed label, so the order is a shuffle seeded by a hash
    of the request's text (BLAKE2b): the same text always gets the same order, different
    texts get different ones. ``OUT_OF_SCOPE`` is not an option; it is always listed last.
    A request with another ``order_seed`` (a second ask, ``teacher.ask_twice``) gets
    another order (never the seed-0 one, when there are two options or more).

    Parameters
    ----------
    request : TeacherRequest
        The query and its offered options.

    Returns
    -------
    tuple of LabelOption
        ``request.options`` reordered.
    """
    return _shuffled(request.options, request.text, request.order_seed)


def _shuffled(options_in: Sequence[LabelOption], text: str, seed: int) -> tuple[LabelOption, ...]:
    options = list(options_in)
    key = text if seed == 0 else f"{seed}\x1f{text}"   # seed 0: the order every prompt had before
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8,
                             person=b"flywheel-options").digest()
    random.Random(int.from_bytes(digest, "big")).shuffle(options)
    if seed != 0 and len(options) > 1 and tuple(options) == _shuffled(options_in, text, 0):
        options = options[1:] + options[:1]   # another seed must give another order
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
    system += (' If you cannot choose between two or three of them, add "candidates": the list of those '
               'two or three names (with "label" your best guess among them); if you cannot tell at all, '
               'add "cannot_tell": true. Otherwise leave "candidates" empty and "cannot_tell" false.')
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
    """JSON schema for the answer: an object whose ``label`` is one of ``labels``, with an
    optional ``candidates`` (the 2 or 3 labels the teacher cannot pick between; the parser
    checks the count) and an optional ``cannot_tell`` (true: it cannot tell at all).

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
            "properties": {"label": {"type": "string", "enum": enum},
                           "candidates": {"type": "array", "items": {"type": "string", "enum": list(enum)}},
                           "cannot_tell": {"type": "boolean"}},
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


#: How many labels a candidate set (an unsure answer) holds at least and at most.
MIN_CANDIDATES, MAX_CANDIDATES = 2, 3


class ParsedAnswer(NamedTuple):
    """A checked answer: ``label`` (``None``: out of scope) and, when the teacher is unsure,
    ``candidates`` (2 or 3 labels) or ``cannot_tell``."""

    label: str | None
    candidates: tuple[str | None, ...] = ()
    cannot_tell: bool = False


def _one_label(label: str, names: list[str], allow_out_of_scope: bool) -> str | None:
    try:  # the one label parser: an offered name, or out of scope (None)
        parsed = parse_label(label, names, what="teacher label")
        if parsed is not None or allow_out_of_scope:
            return parsed
    except InvalidInputError:
        pass
    offered = names + ([OUT_OF_SCOPE] if allow_out_of_scope else [])
    raise TeacherError("unknown_label",
                       f"{shorten(label, 60)!r} is not one of {', '.join(offered)}")


def read_answer(content: str, names: Sequence[str], allow_out_of_scope: bool) -> ParsedAnswer:
    """Validate a teacher's answer: ``{"label": "<NAME>"}``, optionally with
    ``"candidates": [2 or 3 names]`` (unsure between them) or ``"cannot_tell": true``.

    An empty or missing ``candidates`` and a false or missing ``cannot_tell`` are a
    confident answer. With ``cannot_tell`` true, ``candidates`` is not read.

    Raises
    ------
    TeacherError
        ``malformed`` when ``content`` is not a JSON object with a string ``label``, when
        ``cannot_tell`` is not a boolean, or when ``candidates`` is not a list of 2 or 3
        distinct offered labels (one label, too many, an unknown one, a repeat);
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
    cannot_tell = data.get("cannot_tell", False)
    if cannot_tell is None:
        cannot_tell = False
    if not isinstance(cannot_tell, bool):
        raise TeacherError("malformed", f'"cannot_tell" is not a boolean: {cannot_tell!r}')
    raw_set = data.get("candidates") or []
    if cannot_tell:
        try:
            lean = _one_label(label, names, allow_out_of_scope)
        except TeacherError:
            lean = None   # the lean of a teacher that cannot tell is never used
        return ParsedAnswer(lean, (), True)
    parsed = _one_label(label, names, allow_out_of_scope)
    if not raw_set:
        return ParsedAnswer(parsed)
    if not isinstance(raw_set, list) or not all(isinstance(c, str) for c in raw_set):
        raise TeacherError("malformed", f'"candidates" is not a list of labels: {shorten(raw_set, 60)!r}')
    if not MIN_CANDIDATES <= len(raw_set) <= MAX_CANDIDATES:
        raise TeacherError("malformed", f'"candidates" must hold {MIN_CANDIDATES} to {MAX_CANDIDATES} labels, '
                                        f"got {len(raw_set)}: {shorten(raw_set, 60)!r}")
    cands: list[str | None] = []
    for c in raw_set:
        try:
            cands.append(_one_label(c, names, allow_out_of_scope))
        except TeacherError:
            raise TeacherError("malformed", f'"candidates" names {shorten(c, 60)!r}, which is not offered') from None
    if len(set(cands)) != len(cands):
        raise TeacherError("malformed", f'"candidates" repeats a label: {shorten(raw_set, 60)!r}')
    return ParsedAnswer(parsed, tuple(cands))


def parse_answer(content: str, names: Sequence[str], allow_out_of_scope: bool) -> str | None:
    """The label of a teacher's answer (:func:`read_answer`, which checks it): an offered
    name, or ``None`` for ``OUT_OF_SCOPE`` (when allowed); an unsure answer's lean."""
    return read_answer(content, names, allow_out_of_scope).label


class _Closeable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=_Closeable)


class ChatTeacher(Generic[C]):
    """The part every chat-model teacher shares: settings, the breaker around one call,
    the prompt, the answer check, and one HTTP client ``C`` made on first use (thread-safe;
    :meth:`close` closes it). A backend implements :meth:`_call`, :meth:`_new_client` and
    ``check()`` (a :class:`~classifier.protocols.ManagedTeacher`).

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
        self._client: C | None = None
        self._client_lock = threading.Lock()

    def _new_client(self) -> C:
        """A new HTTP client for this backend (called once, under the lock)."""
        raise NotImplementedError

    def _get_client(self) -> C:
        client = self._client
        if client is None:
            with self._client_lock:
                if self._client is None:
                    self._client = self._new_client()
                client = self._client
        return client

    def close(self) -> None:
        """Close the underlying HTTP client, if one was created."""
        with self._client_lock:
            if self._client is not None:
                self._client.close()
                self._client = None

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
        parsed = read_answer(content, names, request.allow_out_of_scope)
        return TeacherAnswer(label=parsed.label, model=self._model, latency_ms=latency_ms, raw=content,
                             candidates=parsed.candidates, cannot_tell=parsed.cannot_tell)

    def _call(self, request: TeacherRequest) -> str:
        """One chat call; returns the answer content or raises a classified TeacherError."""
        raise NotImplementedError
