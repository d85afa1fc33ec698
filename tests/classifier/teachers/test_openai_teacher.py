"""Tests of the OpenAI-compatible teacher against a local HTTP server speaking that API."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest
from werkzeug import Request, Response

from flywheel.classifier.errors import ConfigError, TeacherError
from flywheel.classifier.protocols import LabelOption, ManagedTeacher, Teacher, TeacherRequest, TeacherStatus
from flywheel.classifier.settings.label_names import OUT_OF_SCOPE
from flywheel.classifier.teachers import API_KEY_ENV, CircuitBreaker, OpenAITeacher, build_messages, option_order
from tests.support.servers import free_port

MODEL = "gemma-3-270m-it"
KEY = "sk-test-0123456789abcdef-SECRET"
OPTIONS = (
    LabelOption("RETRIEVAL", "Look up facts in the knowledge base.", ("what is our refund policy",)),
    LabelOption("CODE", "Write or change code.", ("write a function that sorts",)),
)
REQUEST = TeacherRequest(text="explain this function", options=OPTIONS)


def completion(content) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}]}


def answer(httpserver, content='{"label": "RETRIEVAL"}', status: int = 200) -> None:
    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_json(
        completion(content), status=status)


def base(httpserver) -> str:
    return httpserver.url_for("/v1")


def make_teacher(httpserver, **kw) -> OpenAITeacher:
    kw.setdefault("timeout_s", 2.0)
    return OpenAITeacher(MODEL, host=base(httpserver), **kw)


def body_of(httpserver, i: int = 0) -> dict:
    return json.loads(httpserver.log[i][0].get_data())


@pytest.fixture(autouse=True)
def _no_key(monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    monkeypatch.delenv("FLYWHEEL_TEACHER_HOST", raising=False)


# --- happy path and request shape -------------------------------------------------------

def test_right_answer(httpserver):
    answer(httpserver)
    t = make_teacher(httpserver)
    assert isinstance(t, Teacher) and isinstance(t, ManagedTeacher)
    a = t.label(REQUEST)
    assert (a.label, a.model, a.raw) == ("RETRIEVAL", MODEL, '{"label": "RETRIEVAL"}')
    assert a.latency_ms > 0
    assert t.breaker.state == "closed"


def test_out_of_scope_is_none(httpserver):
    answer(httpserver, json.dumps({"label": OUT_OF_SCOPE}))
    assert make_teacher(httpserver).label(REQUEST).label is None


def test_request_shape_without_a_key(httpserver):
    answer(httpserver)
    make_teacher(httpserver, temperature=0.0).label(REQUEST)
    req = httpserver.log[0][0]
    assert req.path == "/v1/chat/completions"
    assert "Authorization" not in req.headers
    body = body_of(httpserver)
    assert body["model"] == MODEL and body["temperature"] == 0.0 and body["stream"] is False
    assert body["messages"] == build_messages(REQUEST)
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    order = [o.name for o in option_order(REQUEST)]
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "intent", "strict": True,
        "schema": {"type": "object", "properties": {
            "label": {"type": "string", "enum": [*order, OUT_OF_SCOPE]},
            "candidates": {"type": "array", "items": {"type": "string", "enum": [*order, OUT_OF_SCOPE]}},
            "cannot_tell": {"type": "boolean"}},
            "required": ["label", "candidates", "cannot_tell"], "additionalProperties": False}}}


def test_api_key_from_the_environment_is_sent_as_bearer(httpserver, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, KEY)
    answer(httpserver)
    make_teacher(httpserver).label(REQUEST)
    assert httpserver.log[0][0].headers["Authorization"] == f"Bearer {KEY}"


def test_system_prompt_user_folds_the_system_turn(httpserver):
    answer(httpserver)
    make_teacher(httpserver, system_prompt="user").label(REQUEST)
    messages = body_of(httpserver)["messages"]
    assert [m["role"] for m in messages] == ["user"]
    system, user = build_messages(REQUEST)
    assert messages[0]["content"] == f"{system['content']}\n\n{user['content']}"


def test_max_tokens_is_sent_only_when_set(httpserver):
    answer(httpserver)
    make_teacher(httpserver).label(REQUEST)
    make_teacher(httpserver, max_tokens=48).label(REQUEST)
    assert "max_tokens" not in body_of(httpserver, 0)
    assert body_of(httpserver, 1)["max_tokens"] == 48


@pytest.mark.parametrize("fmt, expected", [("json_object", {"type": "json_object"}), ("none", None)])
def test_other_response_formats(httpserver, fmt, expected):
    answer(httpserver)
    make_teacher(httpserver, response_format=fmt).label(REQUEST)
    assert body_of(httpserver).get("response_format") == expected


def test_json_object_schema_sends_the_label_enum_inside_json_object(httpserver):
    answer(httpserver)
    make_teacher(httpserver, response_format="json_object_schema").label(REQUEST)
    rf = body_of(httpserver)["response_format"]
    assert rf["type"] == "json_object" and "CODE" in rf["schema"]["properties"]["label"]["enum"]


def test_json_schema_refused_falls_back_to_the_schema_in_json_object_and_remembers(httpserver, caplog):
    httpserver.expect_oneshot_request("/v1/chat/completions").respond_with_json(
        {"error": {"message": "response_format type json_schema is not supported", "type": "invalid_request_error"}},
        status=400)
    answer(httpserver, '{"label": "CODE"}')
    t = make_teacher(httpserver)
    with caplog.at_level(logging.WARNING, logger="flywheel.teacher"):
        assert t.label(REQUEST).label == "CODE"
    sent = [body_of(httpserver, i)["response_format"] for i in range(2)]
    assert [f["type"] for f in sent] == ["json_schema", "json_object"]
    assert sent[1]["schema"]["properties"]["label"]["enum"] == sent[0]["json_schema"]["schema"]["properties"][
        "label"]["enum"]                                   # the label enum still constrains the answer
    assert t.sent_format == "json_object_schema"
    assert "json_object_schema" in caplog.text
    assert t.label(REQUEST).label == "CODE"
    assert body_of(httpserver, 2)["response_format"] == sent[1]
    assert len(httpserver.log) == 3


def test_auto_walks_down_to_plain_json_object_on_a_server_that_refuses_both_schemas(httpserver):
    # llama-cpp-python's server answers 500 naming response_format for json_schema; some
    # servers validate the schema key too (422)
    httpserver.expect_oneshot_request("/v1/chat/completions").respond_with_json(
        {"error": {"message": "body.response_format.type: Input should be 'text' or 'json_object'"}}, status=500)
    httpserver.expect_oneshot_request("/v1/chat/completions").respond_with_json(
        {"detail": "response_format: extra fields not permitted (schema)"}, status=422)
    answer(httpserver, '{"label": "CODE"}')
    t = make_teacher(httpserver)
    assert t.label(REQUEST).label == "CODE"
    assert [body_of(httpserver, i)["response_format"]["type"] for i in range(3)] == [
        "json_schema", "json_object", "json_object"]
    assert "schema" in body_of(httpserver, 1)["response_format"]
    assert body_of(httpserver, 2)["response_format"] == {"type": "json_object"}
    assert t.sent_format == "json_object"


def test_a_500_that_names_nothing_is_unavailable_without_fallback(httpserver):
    httpserver.expect_request("/v1/chat/completions").respond_with_json({"error": "out of memory"}, status=500)
    t = make_teacher(httpserver)
    with pytest.raises(TeacherError) as ei:
        t.label(REQUEST)
    assert ei.value.kind == "unavailable" and len(httpserver.log) == 1 and t.sent_format == "json_schema"


def test_a_400_about_something_else_is_an_error_without_fallback(httpserver):
    httpserver.expect_request("/v1/chat/completions").respond_with_json(
        {"error": {"message": "temperature must be <= 2"}}, status=400)
    t = make_teacher(httpserver)
    with pytest.raises(TeacherError) as ei:
        t.label(REQUEST)
    assert str(ei.value) == "error: HTTP 400 temperature must be <= 2"
    assert len(httpserver.log) == 1 and t.sent_format == "json_schema"


def test_explicit_json_schema_does_not_fall_back(httpserver):
    httpserver.expect_request("/v1/chat/completions").respond_with_json(
        {"error": "response_format not supported"}, status=400)
    with pytest.raises(TeacherError) as ei:
        make_teacher(httpserver, response_format="json_schema").label(REQUEST)
    assert ei.value.kind == "error" and len(httpserver.log) == 1


# --- failures ---------------------------------------------------------------------------

def test_slow_server_times_out(httpserver):
    release = threading.Event()

    def slow(_req: Request) -> Response:
        release.wait(3.0)
        return Response(json.dumps(completion('{"label": "CODE"}')), content_type="application/json")

    httpserver.expect_request("/v1/chat/completions").respond_with_handler(slow)
    t = make_teacher(httpserver, timeout_s=0.3)
    start = time.monotonic()
    try:
        with pytest.raises(TeacherError) as ei:
            t.label(REQUEST)
        elapsed = time.monotonic() - start
    finally:
        release.set()
        deadline = time.monotonic() + 3.0
        while not httpserver.log and time.monotonic() < deadline:
            time.sleep(0.01)
    assert ei.value.kind == "timeout" and "0.3 s" in str(ei.value)
    assert elapsed < 1.5
    assert ei.value.__cause__ is None and ei.value.__suppress_context__


def test_down_server_is_unavailable_and_opens_the_breaker():
    t = OpenAITeacher(MODEL, host=f"http://127.0.0.1:{free_port()}/v1", timeout_s=1.0,
                      breaker=CircuitBreaker(failures=2, reset_s=60.0))
    for _ in range(2):
        with pytest.raises(TeacherError) as ei:
            t.label(REQUEST)
        assert ei.value.kind == "unavailable"
        assert str(ei.value).startswith("unavailable: connection refused by http://127.0.0.1:")
    assert t.breaker.state == "open"
    with pytest.raises(TeacherError) as ei:
        t.label(REQUEST)
    assert ei.value.kind == "circuit_open"


@pytest.mark.parametrize("status", [500, 502, 503])
def test_5xx_is_unavailable(httpserver, status):
    httpserver.expect_request("/v1/chat/completions").respond_with_json(
        {"error": {"message": "the model crashed"}}, status=status)
    t = make_teacher(httpserver, breaker=CircuitBreaker(failures=1))
    with pytest.raises(TeacherError) as ei:
        t.label(REQUEST)
    assert str(ei.value) == f"unavailable: HTTP {status} the model crashed"
    assert t.breaker.state == "open"


def test_404_model_not_found_is_unavailable(httpserver):
    httpserver.expect_request("/v1/chat/completions").respond_with_json(
        {"error": {"message": f"The model `{MODEL}` does not exist.", "code": "model_not_found"}}, status=404)
    t = make_teacher(httpserver, breaker=CircuitBreaker(failures=1))
    with pytest.raises(TeacherError) as ei:
        t.label(REQUEST)
    assert ei.value.kind == "unavailable"
    assert "does not exist" in str(ei.value) and "teacher.model" in str(ei.value)
    assert t.breaker.state == "open"


def test_429_is_unavailable(httpserver):
    httpserver.expect_request("/v1/chat/completions").respond_with_json({"error": "slow down"}, status=429)
    with pytest.raises(TeacherError) as ei:
        make_teacher(httpserver).label(REQUEST)
    assert ei.value.kind == "unavailable" and "rate limited" in str(ei.value)


@pytest.mark.parametrize("status", [401, 403])
def test_auth_failure_is_error_and_never_shows_the_key(httpserver, monkeypatch, caplog, status):
    monkeypatch.setenv(API_KEY_ENV, KEY)
    for path in ("/v1/chat/completions", "/v1/models"):
        httpserver.expect_request(path).respond_with_json(
            {"error": {"message": f"Incorrect API key provided: {KEY}"}}, status=status)
    t = make_teacher(httpserver, breaker=CircuitBreaker(failures=1))
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(TeacherError) as ei:
            t.label(REQUEST)
        status_check = t.check()
    assert ei.value.kind == "error"
    assert "authentication failed" in str(ei.value) and API_KEY_ENV in str(ei.value)
    assert t.breaker.state == "closed"
    assert status_check.ok is False and "authentication failed" in status_check.detail
    for text in (str(ei.value), repr(ei.value), repr(t), str(vars(t)), status_check.detail, caplog.text):
        assert KEY not in text


def test_an_echoed_key_is_scrubbed_from_other_errors(httpserver, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, KEY)
    httpserver.expect_request("/v1/chat/completions").respond_with_json(
        {"error": f"bad request from key {KEY}"}, status=422)
    with pytest.raises(TeacherError) as ei:
        make_teacher(httpserver).label(REQUEST)
    assert ei.value.kind == "error" and KEY not in str(ei.value) and "<redacted>" in str(ei.value)


def test_repr_shows_no_key_and_no_url_credentials(monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, KEY)
    t = OpenAITeacher(MODEL, host="https://user:pw@api.example.com/v1?api-key=abc")
    assert repr(t) == ("OpenAITeacher(model='gemma-3-270m-it', host='https://api.example.com/v1', timeout_s=5.0, "
                       "response_format='auto', api_key=set)")
    assert KEY not in str(vars(t))


@pytest.mark.parametrize("body", ["<html>proxy error</html>", json.dumps({"choices": []}),
                                  json.dumps({"choices": [{"message": {}}]}),
                                  json.dumps({"choices": [{"message": {"content": None}}]}),
                                  json.dumps({"object": "chat.completion"})])
def test_malformed_body(httpserver, body):
    httpserver.expect_request("/v1/chat/completions").respond_with_data(body, content_type="application/json")
    t = make_teacher(httpserver)
    with pytest.raises(TeacherError) as ei:
        t.label(REQUEST)
    assert ei.value.kind == "malformed"
    assert t.breaker.state == "closed"


@pytest.mark.parametrize("content", ["CODE", '{"intent": "CODE"}', '{"label": 3}', ""])
def test_non_json_content_is_malformed(httpserver, content):
    answer(httpserver, content)
    with pytest.raises(TeacherError) as ei:
        make_teacher(httpserver).label(REQUEST)
    assert ei.value.kind == "malformed"


def test_unknown_label(httpserver):
    answer(httpserver, '{"label": "BILLING"}')
    t = make_teacher(httpserver)
    with pytest.raises(TeacherError) as ei:
        t.label(REQUEST)
    assert ei.value.kind == "unknown_label"
    assert "'BILLING' is not one of RETRIEVAL, CODE, OUT_OF_SCOPE" in str(ei.value)
    assert t.breaker.state == "closed"


# --- check() ----------------------------------------------------------------------------

def models(httpserver, ids, status: int = 200) -> None:
    httpserver.expect_request("/v1/models", method="GET").respond_with_json(
        {"object": "list", "data": [{"id": i, "object": "model"} for i in ids]}, status=status)


def test_check_ok_when_the_model_is_listed(httpserver):
    models(httpserver, ["other", MODEL])
    assert make_teacher(httpserver).check() == TeacherStatus(True, f"teacher {MODEL!r} at {base(httpserver)}: served")


def test_check_missing_model(httpserver):
    models(httpserver, ["llama-3.1-8b-instruct"])
    status = make_teacher(httpserver).check()
    assert status.ok is False
    assert "does not serve this model" in status.detail and "'llama-3.1-8b-instruct'" in status.detail


def test_check_not_verifiable_is_ok(httpserver):
    models(httpserver, [])
    status = make_teacher(httpserver).check()
    assert status.ok is True and "not verifiable" in status.detail


def test_check_without_a_models_endpoint_is_ok(httpserver):
    httpserver.expect_request("/v1/models").respond_with_data("not found", status=404)
    status = make_teacher(httpserver).check()
    assert status.ok is True and "not verifiable" in status.detail


def test_check_server_down():
    t = OpenAITeacher(MODEL, host=f"http://127.0.0.1:{free_port()}/v1", timeout_s=1.0,
                      breaker=CircuitBreaker(failures=1))
    status = t.check()
    assert status.ok is False and "connection refused" in status.detail
    assert t.breaker.state == "closed"


def test_check_500(httpserver):
    httpserver.expect_request("/v1/models").respond_with_json({"error": "boom"}, status=500)
    status = make_teacher(httpserver).check()
    assert status.ok is False and "HTTP 500 boom" in status.detail


# --- construction and settings ----------------------------------------------------------

def test_construction_makes_no_connection(httpserver):
    t = make_teacher(httpserver)
    assert t._client is None and not httpserver.log
    answer(httpserver)
    t.label(REQUEST)
    assert t._client is not None
    t.close()
    assert t._client is None


@pytest.mark.parametrize("host", ["", "   ", "127.0.0.1:8000/v1"])
def test_bad_host_is_a_config_error(host):
    with pytest.raises(ConfigError, match="teacher.host"):
        OpenAITeacher(MODEL, host=host)


def test_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match="response_format"):
        OpenAITeacher(MODEL, host="http://x/v1", response_format="xml")
    with pytest.raises(ConfigError, match="system_prompt"):
        OpenAITeacher(MODEL, host="http://x/v1", system_prompt="assistant")


INTENTS = {"intents": [{"name": n, "examples": [f"{n} one", f"{n} two"]} for n in ("A", "B")]}


def test_build_teacher_builds_an_openai_teacher_from_the_intent_file(monkeypatch):
    from flywheel.classifier.settings.config import load_config
    from flywheel.classifier.settings.intents import parse_intents
    from flywheel.classifier.teachers import build_teacher

    doc = {**INTENTS, "teacher": {"backend": "openai", "model": MODEL, "host": "http://127.0.0.1:8000/v1/",
                                  "timeout_s": 30, "breaker_failures": 4, "response_format": "json_object",
                                  "system_prompt": "user"}}
    monkeypatch.setenv("OLLAMA_HOST", "http://127.0.0.1:11434")   # never used by the openai backend
    t = build_teacher(load_config(ollama_host="http://127.0.0.1:9"), parse_intents(doc))
    assert isinstance(t, OpenAITeacher)
    assert (t.model, t.host, t.timeout_s, t.breaker.failures) == (MODEL, "http://127.0.0.1:8000/v1", 30.0, 4)
    assert (t.response_format, t.system_prompt) == ("json_object", "user")
    assert t._client is None

    monkeypatch.setenv("FLYWHEEL_TEACHER_HOST", "http://10.0.0.5:8000/v1")
    assert build_teacher(load_config(), parse_intents(doc)).host == "http://10.0.0.5:8000/v1"
    assert build_teacher(load_config(teacher="off"), parse_intents(doc)) is None


def test_build_teacher_without_a_host_names_teacher_host():
    from flywheel.classifier.settings.config import load_config
    from flywheel.classifier.settings.intents import parse_intents
    from flywheel.classifier.teachers import build_teacher

    with pytest.raises(ConfigError, match="teacher.host"):
        build_teacher(load_config(), parse_intents({**INTENTS, "teacher": {"backend": "openai"}}))


def test_a_missing_host_names_the_configured_intent_file_not_a_cached_copy(tmp_path):
    """A model serves the copy of the intent file it was trained on (the default model's is
    under ``<home>/cache``): the error names the file the person configured and edits."""
    import yaml

    from flywheel.classifier.settings.config import load_config
    from flywheel.classifier.settings.intents import load_intents
    from flywheel.classifier.teachers import build_teacher

    doc = {**INTENTS, "teacher": {"backend": "openai"}}
    mine = tmp_path / "intents_hi.yaml"
    copy = tmp_path / "home" / "cache" / "intents_hi-0123abcd" / "intents.yaml"
    copy.parent.mkdir(parents=True)
    for path in (mine, copy):
        path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    with pytest.raises(ConfigError) as ei:
        build_teacher(load_config(intents=str(mine)), load_intents(copy))
    assert str(ei.value).startswith(f"{mine}: the openai teacher needs") and "cache" not in str(ei.value)
    with pytest.raises(ConfigError, match=f"^{copy}: "):      # no intent file configured: the set's own
        build_teacher(load_config(), load_intents(copy))


def test_the_intent_file_refuses_an_api_key():
    from flywheel.classifier.errors import IntentFileError
    from flywheel.classifier.settings.intents import parse_intents

    with pytest.raises(IntentFileError, match=API_KEY_ENV) as ei:
        parse_intents({**INTENTS, "teacher": {"backend": "openai", "api_key": KEY}})
    assert KEY not in str(ei.value)
    with pytest.raises(IntentFileError, match="teacher.response_format must be one of auto, json_schema"):
        parse_intents({**INTENTS, "teacher": {"response_format": "xml"}})


def test_the_teacher_setting_picks_the_backend_over_the_intent_file(monkeypatch):
    from flywheel.classifier.settings.config import load_config
    from flywheel.classifier.settings.intents import parse_intents
    from flywheel.classifier.teachers import OllamaTeacher, build_teacher

    monkeypatch.setenv("OLLAMA_HOST", "http://127.0.0.1:11434")
    ollama_file = parse_intents({**INTENTS, "teacher": {"model": MODEL, "host": "http://10.0.0.9:11434"}})
    openai_file = parse_intents({**INTENTS, "teacher": {"backend": "openai", "model": MODEL,
                                                        "host": "http://10.0.0.5:8000/v1"}})
    assert isinstance(build_teacher(load_config(teacher="on"), openai_file), OpenAITeacher)
    assert isinstance(build_teacher(load_config(), ollama_file), OllamaTeacher)         # default: on
    t = build_teacher(load_config(teacher="openai", teacher_host="http://127.0.0.1:8000/v1"), ollama_file)
    assert isinstance(t, OpenAITeacher) and t.host == "http://127.0.0.1:8000/v1" and t.model == MODEL
    with pytest.raises(ConfigError, match="--teacher-host"):   # the ollama file's host is not an openai URL
        build_teacher(load_config(teacher="openai"), ollama_file)
    t = build_teacher(load_config(teacher="ollama"), openai_file)
    assert isinstance(t, OllamaTeacher) and t.host == "http://127.0.0.1:11434"   # not the openai file's host


def test_teacher_setting_precedence_flag_env_file_default(monkeypatch):
    import os
    from pathlib import Path

    from flywheel.classifier.settings.config import load_config

    monkeypatch.delenv("FLYWHEEL_TEACHER", raising=False)
    assert (load_config().teacher, load_config().sources.get("teacher")) == ("on", None)
    (Path(os.environ["FLYWHEEL_HOME"]) / "config.toml").write_text('teacher = "Ollama"\n', encoding="utf-8")
    assert (load_config().teacher, load_config().sources["teacher"]) == ("ollama", "file")
    monkeypatch.setenv("FLYWHEEL_TEACHER", "openai")
    assert (load_config().teacher, load_config().sources["teacher"]) == ("openai", "env")
    assert (load_config(teacher="off").teacher, load_config(teacher="off").sources["teacher"]) == ("off", "flag")
    monkeypatch.setenv("FLYWHEEL_TEACHER", "gpt")
    with pytest.raises(ConfigError, match=r"teacher must be one of on, ollama, openai, off, got 'gpt' \(from env\)"):
        load_config()
