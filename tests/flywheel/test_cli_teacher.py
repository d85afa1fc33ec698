"""``--teacher on|ollama|openai|off`` and ``--teacher-host`` (alias ``--ollama-host``) on the
command line, in process, against local servers speaking OpenAI's and Ollama's APIs; a
fake embedder (tests.support.fakes.HashEmbedder) stands in for the real model."""

from __future__ import annotations

import json

import pytest

from flywheel.cli import main
from tests.support.servers import free_port
from tests.support.simulated_ollama import SimulatedOllama
from tests.support.teacher_models import always_unsure_model

TEXTS = ["explain addparam", "what is addvar"]


def completion(label: str) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "tiny-llm",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": json.dumps({"label": label})}}]}


@pytest.fixture()
def model_dir(tmp_path, monkeypatch):
    """A model whose layer 2 always asks the teacher (intent file: the default ollama
    backend), served as FLYWHEEL_MODEL; no teacher host in the environment."""
    return always_unsure_model(tmp_path, monkeypatch)


@pytest.fixture()
def openai_server(httpserver):
    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_json(completion("RETRIEVAL"))
    return httpserver


def run(capsys, *args):
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def chat_calls(server) -> int:
    return sum(1 for req, _ in server.log if req.path == "/v1/chat/completions")


def test_classify_teacher_openai_reaches_an_openai_compatible_server(model_dir, openai_server, monkeypatch, capsys):
    monkeypatch.setenv("FLYWHEEL_TEACHER", "off")                                  # the flag wins over the env
    monkeypatch.setenv("FLYWHEEL_TEACHER_HOST", f"http://127.0.0.1:{free_port()}/v1")   # and over this one
    rc, out, err = run(capsys, "classify", "--no-log", "--teacher", "openai",
                       "--teacher-host", openai_server.url_for("/v1"), TEXTS[0])
    assert rc == 0, err
    d = json.loads(out)
    assert (d["layer"], d["label"]) == ("llm", "RETRIEVAL")
    assert chat_calls(openai_server) == 1
    body = json.loads(openai_server.log[0][0].get_data())
    assert body["model"] == "tiny-llm"


def test_teacher_on_uses_the_intent_files_backend_and_ollama_host_still_works(model_dir, capsys):
    with SimulatedOllama({TEXTS[0]: "RETRIEVAL"}, accuracy=1.0, latency_scale=0.0) as sim:
        for flags in (["--teacher", "on", "--ollama-host", sim.url], ["--teacher-host", sim.url]):
            rc, out, err = run(capsys, "classify", "--no-log", *flags, TEXTS[0])
            assert rc == 0, err
            assert (json.loads(out)["layer"], json.loads(out)["label"]) == ("llm", "RETRIEVAL")
        assert sim.counts["chat"] == 2


def test_bad_teacher_value_names_the_choices(model_dir, capsys):
    rc, _, err = run(capsys, "classify", "--no-log", "--teacher", "gpt", "x")
    assert rc == 2 and "teacher must be one of on, ollama, openai, off, got 'gpt'" in err


def test_label_teacher_host_reaches_an_openai_compatible_server(model_dir, openai_server, capsys):
    dead = f"http://127.0.0.1:{free_port()}/v1"
    rc, out, err = run(capsys, "classify", "--teacher", "openai", "--teacher-host", dead, *TEXTS)
    assert rc == 0, err
    assert all(json.loads(line)["layer"] == "embedding" for line in out.splitlines())   # pending now
    rc, out, err = run(capsys, "label", "--teacher", "openai", "--teacher-host", openai_server.url_for("/v1"),
                       "--json", "--quiet")
    assert rc == 0, err
    assert json.loads(out) == {"pending": 2, "labelled": 2, "invalid": 0, "remaining": 0}
    assert chat_calls(openai_server) == 2


def test_label_ollama_host_is_an_alias_of_teacher_host(model_dir, capsys):
    dead = f"http://127.0.0.1:{free_port()}"
    rc, _, err = run(capsys, "classify", "--teacher-host", dead, *TEXTS)
    assert rc == 0, err
    with SimulatedOllama({t: "RETRIEVAL" for t in TEXTS}, accuracy=1.0, latency_scale=0.0) as sim:
        rc, out, err = run(capsys, "label", "--ollama-host", sim.url, "--json", "--quiet")
        assert rc == 0, err
        assert json.loads(out)["labelled"] == 2 and sim.counts["chat"] == 2
