"""``flywheel classify`` on a cached model serves without the training stack: no torch,
transformers, scikit-learn or SciPy (checked with ``python -X importtime``), for the
multilingual default and for English-only MiniLM on ONNX Runtime."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.paths import ROOT

HEAVY = {"torch", "transformers", "sklearn", "scipy", "sentence_transformers", "FlagEmbedding"}

pytestmark = pytest.mark.slow


def _classify(env: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, *extra, "-m", "flywheel", "classify", "--teacher", "off", "thanks, that was helpful"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return out


@pytest.mark.parametrize("languages, encoder", [("[en, es]", "use-multilingual"), ("[en]", "minilm")])
def test_classify_on_a_cached_model_imports_no_training_stack(tmp_path, languages, encoder):
    intents = tmp_path / "intents.yaml"
    text = (ROOT / "data" / "starter_intents.yaml").read_text(encoding="utf-8")
    intents.write_text(text.replace("languages: [en, es]", f"languages: {languages}"), encoding="utf-8")
    env = {**os.environ, "FLYWHEEL_INTENTS": str(intents)}
    _classify(env)  # trains, exports and caches
    out = _classify(env, "-X", "importtime")
    decision = json.loads(out.stdout.strip().splitlines()[-1])
    assert decision["label"] == "CONVERSATIONAL" and decision["model_version"]
    assert "load" in decision["latency_ms"]  # loading reported apart from the query's own figures
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in out.stderr.splitlines()
                if line.startswith("import time:")}
    assert imported, "no -X importtime output"
    assert not imported & HEAVY, sorted(imported & HEAVY)
    assert ("onnxruntime" in imported) == (encoder == "minilm")
