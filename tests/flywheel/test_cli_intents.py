"""An explicit intents setting (``--intents``, ``FLYWHEEL_INTENTS``) on ``classify`` and
``serve`` (issue 26): the file is always validated, and a promoted model trained on another
intent set refuses it; one ``flywheel: error:`` line, exit 2, no model loaded or served."""

from __future__ import annotations

import copy
import logging

import pytest
import yaml

from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.settings.intents import parse_intents
from flywheel.classifier.versions.registry import ModelRegistry
from flywheel.cli import main
from tests.support.docs import DOC
from tests.support.fakes import HashEmbedder


def _promote(home, doc=DOC, name="v1"):
    """A version of ``doc`` promoted in ``home``'s models home (the tests' hash encoder: a
    refused setting never loads the encoder)."""
    reg = ModelRegistry(home / "models")
    fit_model(parse_intents(doc), embedder=HashEmbedder(), version=name).save(reg.version_dir(name))
    reg.promote(name)
    return reg


def _bad_files(tmp_path):
    syntax = tmp_path / "syntax.yaml"
    syntax.write_text("intents: [\n  - name: A\n")
    schema = tmp_path / "schema.yaml"
    schema.write_text("intents:\n  - {name: A, examples: [x]}\n  - {name: A, examples: [y]}\n")
    return {"missing": (tmp_path / "missing.yaml", "missing.yaml: file not found"),
            "syntax": (syntax, "syntax.yaml: not valid yaml"),
            "schema": (schema, "schema.yaml: intent 'A': duplicate intent")}


def _run(capsys, caplog, *args):
    with caplog.at_level(logging.INFO):
        rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def _args_setting(monkeypatch, how, path):
    """The command line that gives ``path`` as the intents setting ``how``."""
    if how == "classify-env":
        monkeypatch.setenv("FLYWHEEL_INTENTS", str(path))
        return ["classify", "--no-log", "--teacher", "off", "show my invoices"]
    if how == "classify-flag":
        return ["classify", "--no-log", "--teacher", "off", "--intents", str(path), "show my invoices"]
    return ["serve", "--teacher", "off", "--address", "127.0.0.1:0", "--intents", str(path)]


def _one_error_line(err, words):
    assert err.startswith("flywheel: error: ") and err.count("\n") == 1, err
    assert words in err and "Traceback" not in err


@pytest.mark.parametrize("promoted", [False, True], ids=["empty-home", "promoted-home"])
@pytest.mark.parametrize("kind", ["missing", "syntax", "schema"])
@pytest.mark.parametrize("how", ["classify-flag", "classify-env", "serve-flag"])
def test_a_bad_intents_setting_is_one_line_and_exit_2(capsys, caplog, monkeypatch, tmp_path, _isolated_home,
                                                      promoted, kind, how):
    if promoted:
        _promote(_isolated_home)
    path, words = _bad_files(tmp_path)[kind]
    rc, out, err = _run(capsys, caplog, *_args_setting(monkeypatch, how, path))
    assert (rc, out) == (2, "")
    _one_error_line(err, words)
    assert "serving model" not in caplog.text
    # no model was trained (cached as <stem>-<digest>) for the refused file
    assert not (_isolated_home / "cache").exists() or not any((_isolated_home / "cache").glob(f"{path.stem}-*"))


@pytest.mark.parametrize("how", ["classify-flag", "classify-env", "serve-flag"])
def test_an_intents_setting_the_promoted_model_was_not_trained_on_is_refused(capsys, caplog, monkeypatch,
                                                                            tmp_path, _isolated_home, how):
    _promote(_isolated_home)
    other = copy.deepcopy(DOC)
    other["intents"][1]["name"] = "BILLING"
    other["rules"][0]["intent"] = "BILLING"
    path = tmp_path / "other.yaml"
    path.write_text(yaml.safe_dump(other))
    rc, out, err = _run(capsys, caplog, *_args_setting(monkeypatch, how, path))
    assert (rc, out) == (2, "")
    _one_error_line(err, f"{path}: not served: the models home ({_isolated_home / 'models'}) serves v1, "
                         "trained on another intent set (intents only in the file: BILLING; only in v1: PLATFORM)")
    assert "drop the intents setting to serve v1" in err
    assert "serving model" not in caplog.text
    assert not (_isolated_home / "cache").exists()    # nothing was trained from the refused file
