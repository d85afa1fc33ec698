"""Shared fixtures: every test runs with a temporary flywheel home and no reachable Ollama."""

from __future__ import annotations

import os
import socket

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def onnx_cache(tmp_path_factory):
    """One ONNX export cache for the whole session: the default runtime exports the real
    MiniLM once (~10 s) instead of once per temporary home."""
    return tmp_path_factory.mktemp("onnx-cache")


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch, onnx_cache):
    home = tmp_path_factory.mktemp("flywheel-home")
    monkeypatch.setenv("FLYWHEEL_HOME", str(home))
    monkeypatch.setenv("FLYWHEEL_ONNX_CACHE", str(onnx_cache))
    monkeypatch.delenv("FLYWHEEL_CONFIG", raising=False)
    monkeypatch.delenv("FLYWHEEL_MODEL", raising=False)
    monkeypatch.delenv("FLYWHEEL_INTENTS", raising=False)
    monkeypatch.setenv("OLLAMA_HOST", f"http://127.0.0.1:{free_port()}")  # nobody listens there
    from classifier.default import reset_default

    reset_default()
    yield home
    reset_default()
