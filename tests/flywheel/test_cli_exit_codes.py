"""Every error of the command line is one ``flywheel: error:`` line on stderr, with exit
code 2 for bad input (usage errors included) and 3 for model or object-store problems
(issue 26, item 9). In process, on the tests' hash encoder: nothing loads a real model."""

from __future__ import annotations

import socket

import pytest

from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.settings.intents import parse_intents
from flywheel.classifier.versions.registry import ModelRegistry
from flywheel.cli import main
from flywheel.training.options import RetrainError, RetrainOptionError, RetrainOptions
from tests.support.docs import DOC
from tests.support.fakes import HashEmbedder


def run(capsys, *args):
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def one_error_line(err: str) -> str:
    assert err.startswith("flywheel: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and "Usage:" not in err
    return err.strip()


@pytest.mark.parametrize("args, words", [
    (["retrain", "--llm-budget", "1.5"], "Invalid value for '--llm-budget'"),
    (["retrain", "--tolerance", "2"], "Invalid value for '--tolerance'"),
    (["retrain", "--bogus"], "No such option: --bogus"),
    (["retrain", "--llm-budget"], "Option '--llm-budget' requires an argument"),
    (["feedback"], "Missing argument"),
    (["models", "promote", "--bogus"], "No such option: --bogus"),
    (["no-such-command"], "No such command 'no-such-command'"),
])
def test_usage_errors_are_one_line_with_the_help_hint_and_exit_2(capsys, args, words):
    rc, out, err = run(capsys, *args)
    line = one_error_line(err)
    assert (rc, out) == (2, "")
    assert words in line
    sub = [a for a in args if not a.startswith("-") and a not in ("1.5", "2", "no-such-command")]
    assert line.endswith(f"(see {' '.join(['flywheel', *sub])} --help)"), line


def test_an_intent_file_syntax_error_is_one_line_exit_2(capsys, tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("intents:\n  - name: A\n    examples: [a, b\n  - name: B\n")
    rc, _, err = run(capsys, "train", "--intents", str(p), "--out", str(tmp_path / "m"))
    line = one_error_line(err)
    assert rc == 2 and f"{p}: not valid" in line and "line 4, column 9" in line, line


def test_no_arguments_still_print_the_help(capsys):
    main([])
    out, err = capsys.readouterr()
    assert "Usage:" in out + err and "retrain" in out + err


def test_a_retrain_option_out_of_range_is_bad_input(capsys):
    with pytest.raises(RetrainOptionError) as ei:
        RetrainOptions(target_precision=0.0)
    assert isinstance(ei.value, RetrainError) and ei.value.exit_code == 2
    rc, _, err = run(capsys, "retrain", "--target-precision", "0")   # no typer range: checked by RetrainOptions
    assert rc == 2 and "target_precision must be in (0, 1]" in one_error_line(err)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_object_store_outage_exits_3(capsys, monkeypatch):
    for var in ("AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_closed_port()}")   # nobody listens there
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test-access-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test-secret-key-1234")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("FLYWHEEL_STORE", "s3://flywheel-down/t")
    rc, out, err = run(capsys, "models", "list")
    assert (rc, out) == (3, "")
    assert "store unavailable" in one_error_line(err)


def _home_with_a_shadow(home) -> ModelRegistry:
    reg = ModelRegistry(home / "models")
    model = fit_model(parse_intents(DOC), embedder=HashEmbedder(), version="v1")
    for name in ("v1", "v2"):
        model.save(reg.version_dir(name))
    reg.promote("v1")
    return reg


def test_promote_from_shadow_refusals_are_one_line_exit_2_or_3(capsys, _isolated_home):
    reg = _home_with_a_shadow(_isolated_home)
    rc, _, err = run(capsys, "models", "promote", "--from-shadow")
    assert rc == 3 and "no shadow version" in one_error_line(err)   # nothing to promote: like "no version"
    reg.set_shadow("v2")
    rc, _, err = run(capsys, "models", "promote", "--from-shadow", "--min-shadow", "5")
    assert rc == 2 and "fewer than --min-shadow 5" in one_error_line(err)
    assert reg.current_name() == "v1"
