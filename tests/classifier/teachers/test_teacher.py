"""Tests of the Ollama teacher against a local HTTP server speaking Ollama's API."""

from __future__ import annotations

import json
import threading
import time

import pytest
from werkzeug import Request, Response

from flywheel.classifier.errors import ConfigError, TeacherError
from flywheel.classifier.protocols import (
    HistoryEntry,
    LabelOption,
    ManagedTeacher,
    Teacher,
    TeacherRequest,
    TeacherStatus,
)
from flywheel.classifier.settings.label_names import OUT_OF_SCOPE
from flywheel.classifier.teachers import (
    DEFAULT_HOST,
    HISTORY_RULE,
    CircuitBreaker,
    OllamaTeacher,
    build_messages,
    option_order,
    resolve_host,
    response_schema,
)
from tests.support.servers import free_port

MODEL = "test-model:1b"
OPTIONS = (
    LabelOption("RETRIEVAL", "Look up facts in the knowledge base.",
                ("what is our refund policy", "find the design doc")),
    LabelOption("CODE", "Write or change code.", ("write a function that sorts",)),
)
REQUEST = TeacherRequest(text="explain this function", options=OPTIONS)


def chat_body(content: str) -> dict:
    return {"model": MODEL, "created_at": "2024-01-01T00:00:00Z",
            "message": {"role": "assistant", "content": content},
            "done": True, "done_reason": "stop", "total_duration": 1000,
            "eval_count": 5}


def answer(httpserver, content: str, status: int = 200) -> None:
    httpserver.expect_request("/api/chat", method="POST").respond_with_json(
        chat_body(content), status=status)


def make_teacher(httpserver, **kw) -> OllamaTeacher:
    kw.setdefault("timeout_s", 2.0)
    return OllamaTeacher(MODEL, host=httpserver.url_for("/").rstrip("/"), **kw)


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(autouse=True)
def _no_env_host(monkeypatch):
    monkeypatch.delenv("OLLAMA_HOST", raising=False)
    monkeypatch.delenv("OLLAMA_API_KEY", raising=False)


# --- happy path -------------------------------------------------------------------------

def test_valid_answer(httpserver):
    answer(httpserver, '{"label": "RETRIEVAL"}')
    t = make_teacher(httpserver)
    assert isinstance(t, Teacher) and isinstance(t, ManagedTeacher)
    a = t.label(REQUEST)
    assert a.label == "RETRIEVAL"
    assert a.model == MODEL
    assert a.latency_ms > 0
    assert a.raw == '{"label": "RETRIEVAL"}'
    assert t.breaker.state == "closed"


def test_out_of_scope_is_none(httpserver):
    answer(httpserver, json.dumps({"label": OUT_OF_SCOPE}))
    assert make_teacher(httpserver).label(REQUEST).label is None


def test_out_of_scope_not_allowed_is_unknown_label(httpserver):
    answer(httpserver, json.dumps({"label": OUT_OF_SCOPE}))
    req = TeacherRequest(text="hi", options=OPTIONS, allow_out_of_scope=False)
    with pytest.raises(TeacherError) as ei:
        make_teacher(httpserver).label(req)
    assert ei.value.kind == "unknown_label"


def test_request_body(httpserver):
    answer(httpserver, '{"label": "CODE"}')
    history = (HistoryEntry.of("CODE", "def parse_rows(path): ..."),
               HistoryEntry.of(None, "thanks, that helped"))
    req = TeacherRequest(text="why does this function fail?", options=OPTIONS, history=history)
    assert make_teacher(httpserver, temperature=0.0).label(req).label == "CODE"

    assert len(httpserver.log) == 1
    body = json.loads(httpserver.log[0][0].get_data())
    assert body["model"] == MODEL
    assert body["stream"] is False
    order = [o.name for o in option_order(req)]
    assert sorted(order) == ["CODE", "RETRIEVAL"]
    assert body["format"] == response_schema(order, True)
    assert body["format"]["properties"]["label"]["enum"] == [*order, OUT_OF_SCOPE]
    assert body["options"]["temperature"] == 0.0
    assert body["keep_alive"] == "30m"
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["system", "user"]
    text = "\n".join(m["content"] for m in body["messages"])
    assert HISTORY_RULE in text
    assert "def parse_rows(path): ..." in text and "thanks, that helped" in text
    assert "why does this function fail?" in text
    for opt in OPTIONS:
        assert opt.name in text and opt.description in text
        for ex in opt.examples:
            assert ex in text
    assert OUT_OF_SCOPE in text and '"label"' in text


def test_keep_alive_is_sent(httpserver):
    answer(httpserver, '{"label": "CODE"}')
    make_teacher(httpserver, keep_alive="-1s").label(REQUEST)
    assert json.loads(httpserver.log[0][0].get_data())["keep_alive"] == "-1s"


def test_system_prompt_user_folds_the_instructions_into_the_user_turn(httpserver):
    answer(httpserver, '{"label": "CODE"}')
    make_teacher(httpserver, system_prompt="user").label(REQUEST)
    messages = json.loads(httpserver.log[0][0].get_data())["messages"]
    assert [m["role"] for m in messages] == ["user"]
    assert messages[0]["content"].startswith("You are an intent classifier.")
    assert messages[0]["content"].endswith('Query: "explain this function"')
    with pytest.raises(ConfigError, match="system_prompt"):
        build_messages(REQUEST, "assistant")


# --- option order -----------------------------------------------------------------------

MANY = tuple(LabelOption(f"L{i}", f"label number {i}") for i in range(6))


def _order(text: str, options=MANY) -> list[str]:
    return [o.name for o in option_order(TeacherRequest(text=text, options=options))]


def test_option_order_is_reproducible_per_text_and_differs_across_texts():
    assert _order("where is the design doc") == _order("where is the design doc")
    assert sorted(_order("where is the design doc")) == [o.name for o in MANY]
    orders = {tuple(_order(f"query number {i}")) for i in range(50)}
    assert len(orders) > 20


def test_option_order_spreads_the_first_position_over_the_labels():
    firsts = [_order(f"how do I do thing {i}?")[0] for i in range(200)]
    counts = {name: firsts.count(name) for name in (o.name for o in MANY)}
    assert all(n >= 15 for n in counts.values()), counts   # expected 33 each


def test_prompt_and_schema_follow_the_option_order_with_out_of_scope_last():
    req = TeacherRequest(text="the text decides the order", options=MANY)
    order = [o.name for o in option_order(req)]
    assert order != [o.name for o in MANY]   # this text does reorder them
    system = build_messages(req)[0]["content"]
    positions = [system.index(f"- {n}: ") for n in order]
    assert positions == sorted(positions)
    assert system.index(f"- {OUT_OF_SCOPE}: ") > positions[-1]
    assert "exactly one of: " + ", ".join([*order, OUT_OF_SCOPE]) + "." in system
    _, schema = OllamaTeacher(MODEL).prompt(req)
    assert schema["properties"]["label"]["enum"] == [*order, OUT_OF_SCOPE]


def test_build_messages_without_history_or_oos():
    req = TeacherRequest(text="hello", options=OPTIONS, allow_out_of_scope=False)
    msgs = build_messages(req)
    text = "\n".join(m["content"] for m in msgs)
    assert OUT_OF_SCOPE not in text
    assert HISTORY_RULE not in text
    assert response_schema(["A"], False)["properties"]["label"]["enum"] == ["A"]


# --- failures ---------------------------------------------------------------------------

def test_slow_server_times_out_quickly(httpserver):
    release = threading.Event()

    def slow(_req: Request) -> Response:
        release.wait(3.0)
        return Response(json.dumps(chat_body('{"label": "CODE"}')), content_type="application/json")

    httpserver.expect_request("/api/chat", method="POST").respond_with_handler(slow)
    t = make_teacher(httpserver, timeout_s=0.3)
    start = time.monotonic()
    try:
        with pytest.raises(TeacherError) as ei:
            t.label(REQUEST)
        elapsed = time.monotonic() - start
    finally:
        release.set()
        deadline = time.monotonic() + 3.0  # let the (single-threaded) server finish
        while not httpserver.log and time.monotonic() < deadline:
            time.sleep(0.01)
    assert ei.value.kind == "timeout"
    assert "0.3 s" in str(ei.value)
    assert elapsed < 1.5
    assert ei.value.__cause__ is None and ei.value.__suppress_context__


def test_server_down_is_unavailable():
    t = OllamaTeacher(MODEL, host=f"http://127.0.0.1:{free_port()}", timeout_s=1.0)
    with pytest.raises(TeacherError) as ei:
        t.label(REQUEST)
    assert ei.value.kind == "unavailable"
    assert str(ei.value).startswith("unavailable: connection refused")


@pytest.mark.parametrize("content", ["this is not json", '{"intent": "CODE"}', '["CODE"]',
                                     '{"label": 3}', '{"label": null}', ""])
def test_malformed_content(httpserver, content):
    answer(httpserver, content)
    t = make_teacher(httpserver)
    with pytest.raises(TeacherError) as ei:
        t.label(REQUEST)
    assert ei.value.kind == "malformed"
    assert t.breaker.state == "closed"


def test_reply_not_an_ollama_response(httpserver):
    httpserver.expect_request("/api/chat").respond_with_data("<html>proxy</html>")
    with pytest.raises(TeacherError) as ei:
        make_teacher(httpserver).label(REQUEST)
    assert ei.value.kind == "malformed"


def test_unknown_label(httpserver):
    answer(httpserver, '{"label": "retrieval"}')  # case-sensitive
    t = make_teacher(httpserver)
    with pytest.raises(TeacherError) as ei:
        t.label(REQUEST)
    assert ei.value.kind == "unknown_label"
    assert "'retrieval' is not one of RETRIEVAL, CODE, OUT_OF_SCOPE" in str(ei.value)
    assert t.breaker.state == "closed"


def test_model_not_found_is_unavailable_and_counts(httpserver):
    httpserver.expect_request("/api/chat").respond_with_json(
        {"error": f'model "{MODEL}" not found, try pulling it first'}, status=404)
    t = make_teacher(httpserver, breaker=CircuitBreaker(failures=2))
    with pytest.raises(TeacherError) as ei:
        t.label(REQUEST)
    assert ei.value.kind == "unavailable"
    assert f"model '{MODEL}' not found" in str(ei.value)
    assert f"ollama pull {MODEL}" in str(ei.value)
    assert t.breaker.state == "closed"
    with pytest.raises(TeacherError):
        t.label(REQUEST)
    assert t.breaker.state == "open"


def test_http_400_is_error_and_keeps_breaker_closed(httpserver):
    httpserver.expect_request("/api/chat").respond_with_json({"error": "invalid format"}, status=400)
    t = make_teacher(httpserver, breaker=CircuitBreaker(failures=1))
    with pytest.raises(TeacherError) as ei:
        t.label(REQUEST)
    assert str(ei.value) == "error: HTTP 400 invalid format"
    assert t.breaker.state == "closed"


# --- check() ----------------------------------------------------------------------------

def test_check_ok(httpserver):
    httpserver.expect_request("/api/show", method="POST", json={"model": MODEL}).respond_with_json(
        {"modelfile": "", "parameters": "", "template": "", "details": {}, "model_info": {}})
    status = make_teacher(httpserver).check()
    assert status == TeacherStatus(True, status.detail) and MODEL in status.detail


def test_check_model_not_pulled(httpserver):
    httpserver.expect_request("/api/show", method="POST").respond_with_json(
        {"error": f"model '{MODEL}' not found"}, status=404)
    t = make_teacher(httpserver, breaker=CircuitBreaker(failures=1))
    status = t.check()
    assert status.ok is False
    assert f"ollama pull {MODEL}" in status.detail
    assert t.breaker.state == "closed"   # a check is no labelling call


def test_check_server_down_never_raises():
    status = OllamaTeacher(MODEL, host=f"http://127.0.0.1:{free_port()}", timeout_s=1.0).check()
    assert status.ok is False
    assert "connection refused" in status.detail


def test_check_is_bounded_by_the_timeout(httpserver):
    release = threading.Event()
    httpserver.expect_request("/api/show").respond_with_handler(lambda _r: (release.wait(3.0), Response("{}"))[1])
    start = time.monotonic()
    try:
        status = make_teacher(httpserver, timeout_s=0.3).check()
        elapsed = time.monotonic() - start
    finally:
        release.set()
    assert status.ok is False and "0.3 s" in status.detail
    assert elapsed < 1.5


def test_http_500_is_unavailable_and_counts(httpserver):
    httpserver.expect_request("/api/chat").respond_with_json(
        {"error": "llama runner process has terminated"}, status=500)
    t = make_teacher(httpserver, breaker=CircuitBreaker(failures=2))
    with pytest.raises(TeacherError) as ei:
        t.label(REQUEST)
    assert ei.value.kind == "unavailable"
    assert "HTTP 500 llama runner process has terminated" in str(ei.value)
    assert t.breaker.state == "closed"
    with pytest.raises(TeacherError):
        t.label(REQUEST)
    assert t.breaker.state == "open"


def test_no_options_and_no_oos_is_error(httpserver):
    with pytest.raises(TeacherError) as ei:
        make_teacher(httpserver).label(TeacherRequest("x", (), allow_out_of_scope=False))
    assert ei.value.kind == "error"
    assert not httpserver.log


# --- circuit breaker --------------------------------------------------------------------

def test_breaker_opens_and_skips_server_then_probe_closes(httpserver):
    clock = FakeClock()
    breaker = CircuitBreaker(failures=3, reset_s=30.0, clock=clock)
    httpserver.expect_oneshot_request("/api/chat").respond_with_json({"error": "boom"}, status=500)
    httpserver.expect_oneshot_request("/api/chat").respond_with_json({"error": "boom"}, status=503)
    httpserver.expect_oneshot_request("/api/chat").respond_with_json({"error": "boom"}, status=500)
    t = make_teacher(httpserver, breaker=breaker)
    for _ in range(3):
        with pytest.raises(TeacherError) as ei:
            t.label(REQUEST)
        assert ei.value.kind == "unavailable"
    assert breaker.state == "open"
    assert len(httpserver.log) == 3

    start = time.monotonic()
    with pytest.raises(TeacherError) as ei:
        t.label(REQUEST)
    assert time.monotonic() - start < 0.05
    assert ei.value.kind == "circuit_open"
    assert "retry in 30 s" in str(ei.value)
    assert len(httpserver.log) == 3  # the server was not contacted

    clock.t += 10
    with pytest.raises(TeacherError) as ei:
        t.label(REQUEST)
    assert "retry in 20 s" in str(ei.value)
    assert len(httpserver.log) == 3

    clock.t += 20
    assert breaker.state == "half_open"
    answer(httpserver, '{"label": "CODE"}')
    assert t.label(REQUEST).label == "CODE"
    assert len(httpserver.log) == 4
    assert breaker.state == "closed"


def test_breaker_failed_probe_reopens_and_counts_timeouts_and_refusals():
    clock = FakeClock()
    breaker = CircuitBreaker(failures=2, reset_s=5.0, clock=clock)
    t = OllamaTeacher(MODEL, host=f"http://127.0.0.1:{free_port()}", timeout_s=1.0, breaker=breaker)
    for _ in range(2):
        with pytest.raises(TeacherError) as ei:
            t.label(REQUEST)
        assert ei.value.kind == "unavailable"
    assert breaker.state == "open"
    clock.t += 5
    with pytest.raises(TeacherError) as ei:  # the probe goes out and fails
        t.label(REQUEST)
    assert ei.value.kind == "unavailable"
    assert breaker.state == "open"
    with pytest.raises(TeacherError) as ei:
        t.label(REQUEST)
    assert ei.value.kind == "circuit_open"


def test_breaker_half_open_lets_one_probe_only():
    clock = FakeClock()
    b = CircuitBreaker(failures=1, reset_s=1.0, clock=clock)
    assert b.state == "closed" and b.allow()
    b.record_failure()
    assert b.state == "open" and not b.allow()
    assert b.retry_in() == pytest.approx(1.0)
    clock.t += 1.0
    assert b.state == "half_open"
    assert b.allow()
    assert not b.allow()  # probe in flight
    b.record_success()
    assert b.state == "closed" and b.allow()


def test_breaker_success_resets_consecutive_count():
    b = CircuitBreaker(failures=2, clock=FakeClock())
    b.record_failure()
    b.record_success()
    b.record_failure()
    assert b.state == "closed"
    b.record_failure()
    assert b.state == "open"


def test_breaker_is_thread_safe_in_half_open():
    clock = FakeClock()
    b = CircuitBreaker(failures=1, reset_s=1.0, clock=clock)
    b.record_failure()
    clock.t += 2
    results: list[bool] = []
    barrier = threading.Barrier(16)

    def worker() -> None:
        barrier.wait()
        results.append(b.allow())

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert results.count(True) == 1


# --- host, construction, settings -------------------------------------------------------

def test_resolve_host_precedence(monkeypatch):
    assert resolve_host(None) == DEFAULT_HOST == "http://127.0.0.1:11434"
    monkeypatch.setenv("OLLAMA_HOST", "http://127.0.0.1:5555")
    assert resolve_host(None) == "http://127.0.0.1:5555"
    assert resolve_host("") == "http://127.0.0.1:5555"
    assert resolve_host("http://127.0.0.1:7777") == "http://127.0.0.1:7777"
    monkeypatch.setenv("OLLAMA_HOST", "")
    assert resolve_host(None) == DEFAULT_HOST
    assert OllamaTeacher(MODEL).host == DEFAULT_HOST


def test_env_host_is_used_for_calls(httpserver, monkeypatch):
    monkeypatch.setenv("OLLAMA_HOST", httpserver.url_for("/").rstrip("/"))
    answer(httpserver, '{"label": "RETRIEVAL"}')
    assert OllamaTeacher(MODEL, timeout_s=2.0).label(REQUEST).label == "RETRIEVAL"
    assert len(httpserver.log) == 1


def test_construction_makes_no_connection(httpserver, monkeypatch):
    import ollama

    def boom(*a, **k):
        raise AssertionError("ollama.Client created in __init__")

    monkeypatch.setattr(ollama, "Client", boom)
    t = make_teacher(httpserver)
    assert t._client is None
    assert len(httpserver.log) == 0
    monkeypatch.undo()
    answer(httpserver, '{"label": "CODE"}')
    assert t.label(REQUEST).label == "CODE"
    assert t._client is not None
    t.close()
    assert t._client is None


def test_build_teacher_reads_the_intent_file_and_the_config_wins():
    from flywheel.classifier.errors import IntentFileError
    from flywheel.classifier.settings.config import load_config
    from flywheel.classifier.settings.intents import parse_intents
    from flywheel.classifier.teachers import build_teacher

    doc = {"intents": [{"name": n, "examples": [f"{n} one", f"{n} two"]} for n in ("A", "B")],
           "teacher": {"model": "m:1", "host": "http://127.0.0.1:9", "timeout_s": 1.5,
                       "breaker_failures": 4, "breaker_reset_s": 12.0}}
    t = build_teacher(load_config(ollama_host="http://127.0.0.1:8"), parse_intents(doc))
    assert (t.model, t.host, t.timeout_s) == ("m:1", "http://127.0.0.1:8", 1.5)
    assert (t.breaker.failures, t.breaker.reset_s) == (4, 12.0)
    assert t._client is None
    assert build_teacher(load_config(teacher="off"), parse_intents(doc)) is None
    assert t.keep_alive == "30m" and t.system_prompt == "system"
    t = build_teacher(load_config(), parse_intents({**doc, "teacher": {"keep_alive": "1h", "system_prompt": "user"}}))
    assert (t.keep_alive, t.system_prompt) == ("1h", "user")
    with pytest.raises(IntentFileError, match="teacher.backend must be one of ollama, openai, got 'vllm'"):
        parse_intents({**doc, "teacher": {"backend": "vllm"}})


@pytest.mark.parametrize("value, parsed", [("30m", "30m"), ("1h30m", "1h30m"), (-1, "-1s"), (300, "300s"),
                                           (2.5, "2500ms"), ("0", "0")])
def test_keep_alive_setting(value, parsed):
    from flywheel.classifier.settings.intents import parse_intents

    doc = {"intents": [{"name": n, "examples": [f"{n} one", f"{n} two"]} for n in ("A", "B")],
           "teacher": {"keep_alive": value}}
    assert parse_intents(doc).teacher.keep_alive == parsed


@pytest.mark.parametrize("value", ["forever", "30", "", True, None])
def test_bad_keep_alive_names_the_key(value):
    from flywheel.classifier.errors import IntentFileError
    from flywheel.classifier.settings.intents import parse_intents

    doc = {"intents": [{"name": n, "examples": [f"{n} one", f"{n} two"]} for n in ("A", "B")],
           "teacher": {"keep_alive": value}}
    with pytest.raises(IntentFileError, match="teacher.keep_alive must be a duration"):
        parse_intents(doc)
