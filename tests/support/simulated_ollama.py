"""A simulated Ollama server: a teacher LLM with a known accuracy, for benchmarks and tests.

:class:`SimulatedOllama` speaks enough of Ollama's HTTP API for
:class:`classifier.teachers.ollama.OllamaTeacher` (``POST /api/chat`` without streaming,
``GET /api/tags``, ``POST /api/show``, ``GET /api/version``, ``GET /``). It runs on a stdlib
:class:`http.server.ThreadingHTTPServer` bound to ``127.0.0.1`` (no new dependencies).

How it answers
--------------
The query is read from the last ``user`` message: the line ``Query: "<json string>"``
that :func:`classifier.teachers.base.build_messages` writes (falling back to the whole
message when there is no such line). The offered labels are the ``enum`` of the
``label`` property in the request's ``format`` JSON schema (falling back to the
"exactly one of: A, B, OUT_OF_SCOPE." list in the system prompt). The *true* label
is looked up in ``truth`` (text -> label; ``None``, ``"oos"`` or ``"OUT_OF_SCOPE"``
mean out of scope), first by exact text, then by a normalised key (NFC, control
characters to spaces, whitespace collapsed, casefolded) because the classifier
cleans texts before asking. A text missing from ``truth`` is treated as out of scope
(and counted in ``counts["unknown_text"]``).

Every query gets its own RNG seeded with ``blake2b(seed, text)``, so the same query
gets the same answer every time (for the same set of offered labels). With
probability ``accuracy`` the teacher is *right*, otherwise *wrong*:

====================================  ==========================  =====================================
true label                            right                       wrong
====================================  ==========================  =====================================
an intent that is offered             that intent                 ``OUT_OF_SCOPE`` with probability
                                                                  ``wrong_oos_rate`` (default 0.3),
                                                                  else a uniformly random *other*
                                                                  offered intent
an intent that is *not* offered       ``OUT_OF_SCOPE`` (no        a uniformly random offered intent
(the client sent only top candidates) offered intent fits; a
                                      good LLM says so)
out of scope (or unknown text)        ``OUT_OF_SCOPE``            a uniformly random offered intent
====================================  ==========================  =====================================

So ``accuracy`` is the accuracy on queries whose right label is offered; a client that
offers only its top candidates and misses the right one sees a lower accuracy (as it
would with a real LLM). When ``OUT_OF_SCOPE`` is not in the enum, answers that would be ``OUT_OF_SCOPE``
become a random offered intent; when there is no other choice the answer is the only
one possible. "Random" choices draw from the offered labels sorted by name, so they
depend only on the *set* offered, not its order.

An unsure teacher: with ``unsure_rate`` (default 0) a *wrong* answer is instead unsure, when
the request's schema has a ``candidates`` property (what :func:`classifier.teachers.base.response_schema`
sends): ``{"label": <wrong>, "candidates": [<right>, <wrong>]}`` when the right label is
offered, else ``{"label": <wrong>, "cannot_tell": true}``; counted in ``counts["unsure"]``.

A teacher with a position bias: with ``position_bias`` (default 0) a *wrong* answer is
instead the first offered label (in the request's order), whatever it is (right only by
luck), the way a small real LLM picked the first option 40-100% of the time (BENCHMARKS.md §12.7).
Those are the only answers that depend on the order of the options, so asking again with
them in another order (``teacher.ask_twice``) gets another answer exactly for them.
Counted in ``counts["first_option"]``; its draw is its own per text, like the unsure one.

A request with ``stream`` true gets the same single JSON object, which is also a valid
one-line NDJSON stream (``done: true``).

Latency: each answer sleeps ``latency_s * latency_scale * exp(latency_sigma * N(0,1))``
seconds (a lognormal with median ``latency_s * latency_scale``; default 0.3 s,
sigma 0.35, capped at 10x the median), or ``latency_fn(rng) * latency_scale`` when a
``latency_fn`` is given (the draws come from one RNG seeded with ``seed``, in arrival
order, so only the answers, not the latencies, are reproducible per query).
``latency_scale=0.05`` shrinks the median to 15 ms for
benchmarks, ``0`` removes the sleep. ``max_parallel`` limits how many chat requests
are served at once (a real Ollama serves ``OLLAMA_NUM_PARALLEL`` at a time; the rest
queue); ``None`` serves all at once.

Failure modes (``sim.mode = ...`` or :meth:`SimulatedOllama.set_mode`, switchable at
run time, optionally for the next ``times`` requests only), each mapped by
``OllamaTeacher`` to a :class:`~classifier.errors.TeacherError` kind:

- ``"down"``: read the request, then close the connection without answering -> ``unavailable``;
- ``"slow"``: wait ``slow_s`` (default 30 s; cut short by :meth:`stop`) before answering -> ``timeout``;
- ``"garbage"``: HTTP 200 whose message content is not JSON -> ``malformed``;
- ``"http500"``: HTTP 500 with an Ollama-style ``{"error": ...}`` body -> ``unavailable``;
- ``"unknown_label"``: answer a label that is not in the enum -> ``unknown_label``;
- ``None`` / ``"ok"``: normal operation.

``down``, ``slow`` and ``http500`` apply to every endpoint; ``garbage`` and
``unknown_label`` only to ``/api/chat``.

Command line (serves CLINC150 labels: every list of ``data_full.json``, i.e. ``train``,
``val``, ``test`` and their ``oos_*`` lists; ``"oos"`` means out of scope; runs until
Ctrl-C or ``--duration``)::

    python -m tests.support.simulated_ollama --clinc data_full.json --accuracy 0.9 --port 11435
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import re
import signal
import sys
import threading
import time
import unicodedata
from collections import deque
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Mapping

__all__ = ["MODES", "OUT_OF_SCOPE", "SimulatedOllama", "load_clinc_truth", "main"]

OUT_OF_SCOPE = "OUT_OF_SCOPE"  # the name classifier.teachers uses (kept literal: no import cycle)
MODES = ("ok", "down", "slow", "garbage", "http500", "unknown_label")
_OOS_VALUES = {None, "oos", OUT_OF_SCOPE}
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_SPACE = re.compile(r"\s+")
_ONE_OF = re.compile(r"exactly one of: (.+?)\.(?:\s|$)")
_MAX_BODY = 8 * 1024 * 1024
VERSION = "0.0.0-simulated"


def _key(text: str) -> str:
    """Normalised lookup key (mirrors ``classifier.text.clean_text`` plus casefold)."""
    text = unicodedata.normalize("NFC", _CONTROL.sub(" ", text))
    return _SPACE.sub(" ", text).strip().casefold()


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def query_from_messages(messages: Any) -> str | None:
    """The query text of a chat request: the JSON string after ``Query: `` in the last
    user message (the whole message when that line is missing); ``None`` if no user
    message."""
    if not isinstance(messages, list):
        return None
    for msg in reversed(messages):
        if isinstance(msg, dict) and msg.get("role") == "user" and isinstance(msg.get("content"), str):
            content = msg["content"]
            for line in reversed(content.splitlines()):
                if line.startswith("Query: "):
                    rest = line[len("Query: "):]
                    try:
                        q = json.loads(rest)
                    except json.JSONDecodeError:
                        return rest.strip()
                    return q if isinstance(q, str) else str(q)
            return content.strip()
    return None


def offered_labels(body: Mapping[str, Any]) -> list[str]:
    """The labels a chat request allows: the schema enum, else the system prompt's list."""
    fmt = body.get("format")
    if isinstance(fmt, dict):
        try:
            enum = fmt["properties"]["label"]["enum"]
        except (KeyError, TypeError):
            enum = None
        if isinstance(enum, list) and enum:
            return [str(e) for e in enum]
    for msg in body.get("messages") or []:
        if isinstance(msg, dict) and msg.get("role") == "system" and isinstance(msg.get("content"), str):
            m = _ONE_OF.search(msg["content"])
            if m:
                return [s.strip() for s in m.group(1).split(",") if s.strip()]
    return []


class SimulatedOllama:
    """A local HTTP server that answers like an Ollama teacher with a given accuracy.

    Parameters
    ----------
    truth : dict
        Query text -> true label (``None``, ``"oos"`` or ``"OUT_OF_SCOPE"`` = out of scope).
    accuracy : float
        Probability (per query, deterministic given ``seed``) that the answer is right.
    latency_s : float
        Median simulated answer time in seconds (before ``latency_scale``).
    latency_scale : float
        Multiplier on every sleep (``0.05`` -> 15 ms median; ``0`` -> no sleep).
    seed : int
        Seeds the per-query answers and the latency draws.
    host, port : str, int
        Where to listen; ``port=0`` picks a free port (see :attr:`url`).
    latency_sigma : float
        Sigma of the lognormal latency (default 0.35).
    latency_fn : callable, optional
        ``rng -> seconds``; replaces the lognormal (still multiplied by ``latency_scale``).
    wrong_oos_rate : float
        Share of wrong answers on an offered in-scope query that are ``OUT_OF_SCOPE``.
    unsure_rate : float
        Share of wrong answers given as unsure instead (see "An unsure teacher").
    position_bias : float
        Share of wrong answers that are the first offered label instead (see "A teacher
        with a position bias").
    slow_s : float
        How long ``"slow"`` mode waits before answering.
    max_parallel : int, optional
        Chat requests served at once (the rest queue); ``None`` = unlimited.
    model : str
        Name reported by ``/api/tags`` and the only one ``/api/show`` knows (settable at run
        time: a model pulled later); chat answers echo the requested model.

    Attributes
    ----------
    requests : int
        ``/api/chat`` requests received (including failed ones).
    counts : dict
        ``chat``, ``http`` (all requests), ``right``, ``wrong``, ``unknown_text`` and
        one entry per failure mode served.
    answers : deque
        The last 10,000 answers as ``(text, true_label, answer_label, offered)``
        (``answer_label`` ``None`` for an unsure answer).
    """

    def __init__(self, truth: Mapping[str, str | None], accuracy: float = 0.9,
                 latency_s: float = 0.3, latency_scale: float = 1.0, seed: int = 0,
                 host: str = "127.0.0.1", port: int = 0, *, latency_sigma: float = 0.35,
                 latency_fn: Callable[[random.Random], float] | None = None,
                 wrong_oos_rate: float = 0.3, slow_s: float = 30.0,
                 max_parallel: int | None = None, model: str = "simulated-teacher:latest",
                 unsure_rate: float = 0.0, position_bias: float = 0.0) -> None:
        if not 0.0 <= accuracy <= 1.0:
            raise ValueError(f"accuracy must be in [0, 1], got {accuracy!r}")
        if not 0.0 <= unsure_rate <= 1.0:
            raise ValueError(f"unsure_rate must be in [0, 1], got {unsure_rate!r}")
        if not 0.0 <= position_bias <= 1.0:
            raise ValueError(f"position_bias must be in [0, 1], got {position_bias!r}")
        if not 0.0 <= wrong_oos_rate <= 1.0:
            raise ValueError(f"wrong_oos_rate must be in [0, 1], got {wrong_oos_rate!r}")
        if latency_s < 0 or latency_scale < 0 or latency_sigma < 0 or slow_s < 0:
            raise ValueError("latency_s, latency_scale, latency_sigma and slow_s must be >= 0")
        if max_parallel is not None and max_parallel < 1:
            raise ValueError("max_parallel must be >= 1 or None")
        self.accuracy = float(accuracy)
        self.latency_s = float(latency_s)
        self.latency_scale = float(latency_scale)
        self.latency_sigma = float(latency_sigma)
        self.latency_fn = latency_fn
        self.wrong_oos_rate = float(wrong_oos_rate)
        self.unsure_rate = float(unsure_rate)
        self.position_bias = float(position_bias)
        self.slow_s = float(slow_s)
        self.seed = int(seed)
        self.host = host
        self.model = model
        self._port = int(port)
        self._truth: dict[str, str | None] = {}
        self._truth_norm: dict[str, str | None] = {}
        for text, label in truth.items():
            lab = None if label in _OOS_VALUES else str(label)
            self._truth[text] = lab
            self._truth_norm.setdefault(_key(text), lab)
        self._lock = threading.Lock()
        self._latency_rng = random.Random(self.seed ^ 0x5EED)
        self._mode: str = "ok"
        self._mode_left: int | None = None
        self._stop = threading.Event()
        self._parallel = threading.BoundedSemaphore(max_parallel) if max_parallel else None
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.counts: dict[str, int] = {}
        self.answers: deque = deque(maxlen=10_000)

    # ------------------------------------------------------------------ control
    @property
    def mode(self) -> str:
        """The current failure mode (``"ok"`` when none)."""
        return self._mode

    @mode.setter
    def mode(self, value: str | None) -> None:
        self.set_mode(value)

    def set_mode(self, mode: str | None, times: int | None = None) -> None:
        """Switch the failure mode; with ``times``, only for that many requests, then ``"ok"``."""
        mode = "ok" if mode is None else str(mode)
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r} (known: {', '.join(MODES)})")
        if times is not None and times < 0:
            raise ValueError("times must be >= 0")
        with self._lock:
            self._mode = mode
            self._mode_left = None if mode == "ok" else times

    def _take_mode(self) -> str:
        with self._lock:
            mode = self._mode
            if mode != "ok" and self._mode_left is not None:
                if self._mode_left <= 0:
                    self._mode, self._mode_left = "ok", None
                    return "ok"
                self._mode_left -= 1
                if self._mode_left == 0:
                    self._mode, self._mode_left = "ok", None
            return mode

    @property
    def truth(self) -> dict[str, str | None]:
        """The served labels, text -> label (``None`` = out of scope); do not mutate."""
        return self._truth

    @property
    def requests(self) -> int:
        """``/api/chat`` requests received so far (all outcomes)."""
        return self.counts.get("chat", 0)

    def _count(self, key: str) -> None:
        with self._lock:
            self.counts[key] = self.counts.get(key, 0) + 1

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the simulated Ollama is not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """``http://host:port`` (for ``OllamaTeacher(host=...)`` or ``OLLAMA_HOST``)."""
        return f"http://{self.host}:{self.port}"

    def start(self) -> "SimulatedOllama":
        """Bind and serve in a daemon thread; returns ``self``. Idempotent."""
        if self._server is not None:
            return self
        self._stop.clear()
        server = ThreadingHTTPServer((self.host, self._port), _make_handler(self))
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="simulated-ollama", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, wake sleeping handlers, close the socket. Idempotent. A kept-alive
        connection's next request is dropped unanswered, as a stopped server's would be."""
        server, self._server = self._server, None
        if server is None:
            return
        self._stop.set()
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def __enter__(self) -> "SimulatedOllama":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.url if self._server is not None else "stopped"
        return (f"SimulatedOllama({where}, {len(self._truth)} texts, accuracy={self.accuracy}, "
                f"mode={self._mode!r})")

    # ------------------------------------------------------------------ answering
    def true_label(self, text: str) -> tuple[str | None, bool]:
        """``(label, known)``: the true label of ``text`` (``None`` = out of scope)."""
        if text in self._truth:
            return self._truth[text], True
        k = _key(text)
        if k in self._truth_norm:
            return self._truth_norm[k], True
        return None, False

    def _rng(self, text: str) -> random.Random:
        h = hashlib.blake2b(f"{self.seed}\x1f{text}".encode("utf-8", "surrogatepass"),
                            digest_size=8).digest()
        return random.Random(int.from_bytes(h, "big"))

    def choose(self, text: str, offered: list[str]) -> tuple[str, str | None, bool]:
        """Deterministic answer for ``text`` given the offered labels.

        Returns ``(answer, true_label, right)`` where ``answer`` is a label name or
        ``OUT_OF_SCOPE`` and ``right`` says whether the answer equals the truth.
        """
        truth, _ = self.true_label(text)
        rng = self._rng(text)
        right_draw = rng.random() < self.accuracy
        oos_draw = rng.random() < self.wrong_oos_rate
        pick = rng.random()
        offered_set = set(offered)
        oos_ok = OUT_OF_SCOPE in offered_set
        intents = sorted(offered_set - {OUT_OF_SCOPE})

        def any_intent(exclude: str | None = None) -> str:
            pool = [n for n in intents if n != exclude]
            if not pool:
                return OUT_OF_SCOPE if oos_ok else (exclude or OUT_OF_SCOPE)
            return pool[min(int(pick * len(pool)), len(pool) - 1)]

        if truth is None:
            answer = (OUT_OF_SCOPE if oos_ok else any_intent()) if right_draw else any_intent()
        elif truth in offered_set:
            if right_draw:
                answer = truth
            elif oos_ok and (oos_draw or len(intents) < 2):
                answer = OUT_OF_SCOPE
            else:
                answer = any_intent(exclude=truth)
        else:  # the right intent was not offered
            answer = (OUT_OF_SCOPE if oos_ok else any_intent()) if right_draw else any_intent()
        right = (answer == OUT_OF_SCOPE and truth is None) or answer == truth
        return answer, truth, right

    def _latency(self, text: str) -> float:
        if self.latency_scale <= 0:
            return 0.0
        with self._lock:
            rng = self._latency_rng
            if self.latency_fn is not None:
                base = float(self.latency_fn(rng))
            else:
                z = rng.gauss(0.0, 1.0)
                base = self.latency_s * min(math.exp(self.latency_sigma * z), 10.0)
        return max(0.0, base) * self.latency_scale

    def sleep(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; ``False`` when :meth:`stop` interrupted it."""
        if seconds <= 0:
            return not self._stop.is_set()
        return not self._stop.wait(seconds)

    def chat(self, body: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        """Answer one ``/api/chat`` body (after the failure mode was handled)."""
        text = query_from_messages(body.get("messages"))
        if text is None:
            return 400, {"error": "messages must contain a user message"}
        offered = offered_labels(body)
        answer, truth, right = self.choose(text, offered)
        if not right and offered and self.position_bias > 0 and self._draw("first", text) < self.position_bias:
            self._count("first_option")
            answer = offered[0]     # the first option, whatever it is: right only by luck
            right = (answer == OUT_OF_SCOPE and truth is None) or answer == truth
        if not self.true_label(text)[1]:
            self._count("unknown_text")
        fmt = body.get("format")
        can_be_unsure = isinstance(fmt, dict) and "candidates" in (fmt.get("properties") or {})
        if not right and can_be_unsure and self.unsure_rate > 0 and self._unsure_draw(text) < self.unsure_rate:
            self._count("unsure")
            right_name = OUT_OF_SCOPE if truth is None else truth
            self.answers.append((text, truth, None, tuple(offered)))
            if right_name in offered and right_name != answer:
                return 200, self._chat_body(body, json.dumps({"label": answer, "candidates": [right_name, answer]}))
            return 200, self._chat_body(body, json.dumps({"label": answer, "cannot_tell": True}))
        self._count("right" if right else "wrong")
        self.answers.append((text, truth, answer, tuple(offered)))
        return 200, self._chat_body(body, json.dumps({"label": answer}))

    def _unsure_draw(self, text: str) -> float:
        """A draw of its own per text, so ``unsure_rate`` changes no other answer."""
        return self._draw("unsure", text)

    def _draw(self, what: str, text: str) -> float:
        """A uniform draw of its own per ``what`` and text (one setting changes no other answer)."""
        h = hashlib.blake2b(f"{self.seed}\x1f{what}\x1f{text}".encode("utf-8", "surrogatepass"),
                            digest_size=8).digest()
        return random.Random(int.from_bytes(h, "big")).random()

    def _chat_body(self, body: Mapping[str, Any], content: str, took_s: float = 0.0) -> dict[str, Any]:
        ns = int(took_s * 1e9)
        return {"model": str(body.get("model") or self.model), "created_at": _now_iso(),
                "message": {"role": "assistant", "content": content},
                "done": True, "done_reason": "stop", "total_duration": ns,
                "load_duration": 0, "prompt_eval_count": 0, "prompt_eval_duration": 0,
                "eval_count": max(1, len(content) // 4), "eval_duration": ns}

    def show(self, raw: bytes) -> tuple[int, dict[str, Any]]:
        """``POST /api/show``: 200 for :attr:`model` (``name`` means ``name:latest``, as in
        Ollama), else Ollama's 404 ``model '...' not found``."""
        try:
            body = json.loads(raw or b"{}")
            name = str(body.get("model") or body.get("name") or "")
        except (ValueError, AttributeError):
            return 400, {"error": "invalid JSON body"}

        def tagged(n: str) -> str:
            return n if ":" in n else f"{n}:latest"

        if not name or tagged(name) != tagged(self.model):
            return 404, {"error": f"model '{name}' not found"}
        return 200, {"modelfile": "", "parameters": "", "template": "", "model_info": {},
                     "details": {"format": "gguf", "family": "simulated"}}

    def tags(self) -> dict[str, Any]:
        return {"models": [{"name": self.model, "model": self.model, "modified_at": _now_iso(),
                            "size": 0, "digest": "0" * 64,
                            "details": {"format": "gguf", "family": "simulated",
                                        "parameter_size": "0B", "quantization_level": "none"}}]}


def _make_handler(sim: SimulatedOllama) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "SimulatedOllama/" + VERSION
        timeout = 30.0  # an idle keep-alive connection is dropped after this (bounded threads)
        disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms stalls

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
            return

        def _send(self, status: int, payload: Any, content_type: str = "application/json") -> None:
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _read_body(self) -> bytes | None:
            try:
                n = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                n = -1
            if n < 0 or n > _MAX_BODY:
                self.close_connection = True
                self._send(400, {"error": "bad or too large Content-Length"})
                return None
            return self.rfile.read(n) if n else b""

        def _failure(self, mode: str) -> bool:
            """Serve the failure mode; True when the request was handled (failed)."""
            if mode == "down":
                sim._count("down")
                self.close_connection = True
                try:
                    self.wfile.flush()
                    self.connection.shutdown(2)
                except OSError:
                    pass
                return True
            if mode == "http500":
                sim._count("http500")
                self._send(500, {"error": "simulated internal server error"})
                return True
            if mode == "slow":
                sim._count("slow")
                if not sim.sleep(sim.slow_s):
                    self.close_connection = True
                    return True
                return False  # answer normally, late
            return False

        def _handle(self, method: str) -> None:
            if sim._stop.is_set():   # a kept-alive connection to a stopped server: gone
                self._failure("down")
                return
            sim._count("http")
            path = self.path.split("?", 1)[0].rstrip("/") or "/"
            body = self._read_body() if method == "POST" else b""
            if body is None:
                return
            chat = method == "POST" and path == "/api/chat"
            if chat:
                sim._count("chat")
            mode = sim._take_mode()
            if mode != "ok" and self._failure(mode):
                return
            try:
                if path == "/" and method in ("GET", "HEAD"):
                    self._send(200, b"Ollama is running", "text/plain; charset=utf-8")
                elif path == "/api/version" and method == "GET":
                    self._send(200, {"version": VERSION})
                elif path == "/api/tags" and method == "GET":
                    self._send(200, sim.tags())
                elif path == "/api/show" and method == "POST":
                    self._send(*sim.show(body))
                elif chat:
                    self._chat(body, mode)
                else:
                    self._send(404, {"error": f"{method} {path} is not simulated"})
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def _chat(self, raw: bytes, mode: str) -> None:
            try:
                body = json.loads(raw or b"{}")
            except (json.JSONDecodeError, UnicodeDecodeError):
                self._send(400, {"error": "invalid JSON body"})
                return
            if not isinstance(body, dict):
                self._send(400, {"error": "body must be a JSON object"})
                return
            gate = sim._parallel
            if gate is not None:
                while not gate.acquire(timeout=0.1):  # bounded by stop()
                    if sim._stop.is_set():
                        self.close_connection = True
                        return
            try:
                t0 = time.perf_counter()
                text = query_from_messages(body.get("messages")) or ""
                if not sim.sleep(sim._latency(text)):
                    self.close_connection = True
                    return
                if mode == "garbage":
                    sim._count("garbage")
                    self._send(200, sim._chat_body(body, "Sure! I think the label is probably "
                                                         "the first one, hope that helps.",
                                                   time.perf_counter() - t0))
                    return
                if mode == "unknown_label":
                    sim._count("unknown_label")
                    self._send(200, sim._chat_body(body, json.dumps({"label": "NOT_A_LABEL"}),
                                                   time.perf_counter() - t0))
                    return
                status, payload = sim.chat(body)
                if status == 200:
                    payload["total_duration"] = payload["eval_duration"] = \
                        int((time.perf_counter() - t0) * 1e9)
                self._send(status, payload)
            finally:
                if gate is not None:
                    gate.release()

        def do_GET(self) -> None:  # noqa: N802
            self._handle("GET")

        def do_HEAD(self) -> None:  # noqa: N802
            self._handle("HEAD")

        def do_POST(self) -> None:  # noqa: N802
            self._handle("POST")

    return Handler


# ---------------------------------------------------------------------- command line

def load_clinc_truth(path: str | Path) -> dict[str, str | None]:
    """Text -> label (``None`` = out of scope) from every list of a CLINC150 ``data_full.json``
    (``train``, ``test`` and ``val`` with their ``oos_*`` lists, in that order; the first
    occurrence of a text wins)."""
    from flywheel.training.eval.loaders import DatasetError, load_labelled

    truth: dict[str, str | None] = {}
    errors: list[str] = []
    for split in ("train", "test", "val"):
        try:
            data = load_labelled(path, fmt="clinc150", split=split)
        except DatasetError as exc:
            errors.append(str(exc))
            continue
        for t, lab in zip(data.texts, data.labels):
            truth.setdefault(t, lab)
    if not truth:
        raise ValueError("; ".join(errors) or f"{path}: no CLINC150 lists found")
    return truth


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.support.simulated_ollama",
                                 description="Serve a simulated Ollama teacher with known labels.")
    ap.add_argument("--clinc", required=True, help="CLINC150 data_full.json (all lists are served)")
    ap.add_argument("--accuracy", type=float, default=0.9)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0 picks a free port (printed)")
    ap.add_argument("--latency-s", type=float, default=0.3, help="median latency before scaling")
    ap.add_argument("--latency-scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-parallel", type=int, default=None)
    ap.add_argument("--model", default="simulated-teacher:latest")
    ap.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    args = ap.parse_args(argv)
    try:
        truth = load_clinc_truth(args.clinc)
    except Exception as exc:  # noqa: BLE001 - one line, no traceback
        print(f"simulated_ollama: error: {exc}", file=sys.stderr)
        return 2
    try:
        sim = SimulatedOllama(truth, accuracy=args.accuracy, latency_s=args.latency_s,
                              latency_scale=args.latency_scale, seed=args.seed, host=args.host,
                              port=args.port, max_parallel=args.max_parallel, model=args.model)
        sim.start()
    except (ValueError, OSError) as exc:
        print(f"simulated_ollama: error: {exc}", file=sys.stderr)
        return 2
    n_oos = sum(1 for v in truth.values() if v is None)
    print(f"simulated Ollama listening on {sim.url} ({len(truth)} texts, {n_oos} out of scope, "
          f"accuracy {args.accuracy})", flush=True)
    done = threading.Event()

    def _stop(*_: Any) -> None:
        done.set()

    signal.signal(signal.SIGTERM, _stop)
    try:
        done.wait(args.duration)
    except KeyboardInterrupt:
        pass
    finally:
        sim.stop()
    c = dict(sim.counts)
    print(f"served {c.get('chat', 0)} chat requests: {c.get('right', 0)} right, "
          f"{c.get('wrong', 0)} wrong", flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
