"""``flywheel label`` (training/cli/offline.py ``label_command``) against a teacher that is down:
a closed local port, and a simulated Ollama that refuses; a fake embedder stands in for
the real model."""

from __future__ import annotations

import json

import pytest

from flywheel.cli import main
from tests.support.servers import free_port
from tests.support.simulated_ollama import SimulatedOllama
from tests.support.teacher_models import always_unsure_model

TEXTS = ["explain addparam", "what is addvar"]


@pytest.fixture()
def model_dir(tmp_path, monkeypatch):
    """A model whose layer 2 always asks the teacher, served as FLYWHEEL_MODEL."""
    return always_unsure_model(tmp_path, monkeypatch)


def run(capsys, *args):
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_label_exits_1_with_one_line_when_the_teacher_is_down_and_nothing_was_labelled(model_dir, capsys):
    dead = f"http://127.0.0.1:{free_port()}"
    rc, _, err = run(capsys, "classify", "--teacher-host", dead, *TEXTS)
    assert rc == 0, err                                        # both decisions are pending now
    rc, out, err = run(capsys, "label", "--teacher-host", dead, "--quiet")
    assert rc == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flywheel: error: the teacher is down (")
    assert "none of 2 pending decisions could be labelled" in lines[0] and "Traceback" not in err
    # --json still prints the counts (stdout) and fails the same way
    rc, out, err = run(capsys, "label", "--teacher-host", dead, "--json", "--quiet")
    counts = json.loads(out)
    assert rc == 1 and counts["labelled"] == 0 and counts["remaining"] == 2 and "stopped_because" in counts
    assert err.strip().startswith("flywheel: error: the teacher is down")
    # once the teacher answers: exit 0, nothing pending; nothing to label is not an error
    with SimulatedOllama({t: "RETRIEVAL" for t in TEXTS}, accuracy=1.0, latency_scale=0.0) as sim:
        rc, out, err = run(capsys, "label", "--teacher-host", sim.url)
        assert rc == 0, err
        assert out.startswith("labelled 2 of 2 pending decisions")
        sim.mode = "down"
        rc, out, err = run(capsys, "label", "--teacher-host", sim.url, "--json", "--quiet")
        assert rc == 0 and json.loads(out)["pending"] == 0, err
