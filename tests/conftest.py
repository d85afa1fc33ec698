"""Shared fixtures: every test runs with a temporary flywheel home and no reachable Ollama.

The real S3 server's fixtures (``s3_server``, ``store_env``, ``objects``) come from
tests/support/s3.py, registered here; what tests share besides fixtures (documents, fakes,
worlds, servers) is imported from ``tests.support``.
"""

from __future__ import annotations

import os
import sys

import pytest

from tests.support.servers import free_port

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

pytest_plugins = ["tests.support.s3"]


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
    # `flywheel train`, `eval` and `retrain` tune a real encoder by default (minutes): a test opts in with
    # --tune-encoder, and the tests of that default remove this
    monkeypatch.setenv("FLYWHEEL_TUNE_ENCODER", "off")
    monkeypatch.setenv("OLLAMA_HOST", f"http://127.0.0.1:{free_port()}")  # nobody listens there
    from flywheel.classifier.assembly import reset_default

    reset_default()
    _close_flywheel()
    yield home
    reset_default()
    _close_flywheel()


def _close_flywheel() -> None:
    """Close ``flywheel.classify``'s process-wide classifier, if a test opened one (its log
    is in that test's home)."""
    api = sys.modules.get("flywheel.api")
    if api is not None:
        api.close()
