"""Issue 32, item 8: after the first promotion, ``flywheel models rollback --to-default``
serves the default model again (the intent file trained as on first use): a running
process swaps it in, a restart serves it, and a plain rollback goes back again. The
fleet's side is in tests/fleet/test_cli_fleet.py."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.settings.config import load_config, starter_intents_path
from flywheel.classifier.settings.intents import load_intents, parse_intents
from flywheel.classifier.versions.default import cached_model_dir, served_model
from flywheel.classifier.versions.registry import ModelRegistry, ModelWatcher
from flywheel.cli import main
from flywheel.training.cli.models import default_version_name
from tests.support.docs import DOC
from tests.support.fakes import HashEmbedder


@pytest.fixture
def served_default(tmp_path, monkeypatch):
    """A home configured with an intent file whose default model is in the cache (what the
    first classify trains there; here a tiny model, so nothing loads a real encoder)."""
    intents = tmp_path / "my intents.yaml"
    intents.write_text(yaml.safe_dump(DOC))
    monkeypatch.setenv("FLYWHEEL_INTENTS", str(intents))
    cfg = load_config()
    cached = cached_model_dir(cfg, intents)
    fit_model(parse_intents(DOC), embedder=HashEmbedder(), version=cached.name).save(cached)
    return cfg, cached


def run(capsys, *args):
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_rollback_to_default_after_the_first_promotion(served_default, capsys):
    cfg, cached = served_default
    home = ModelRegistry(cfg.models_dir)
    fit_model(parse_intents(DOC), embedder=HashEmbedder(), version="v1").save(home.version_dir("v1"))
    home.promote("v1")
    assert served_model(cfg).home.home == cfg.models_dir                       # the promoted version wins now
    rc, out, err = run(capsys, "models", "rollback")
    assert rc == 3 and "nothing to roll back to" in err and "rollback --to-default" in err, err

    watcher = ModelWatcher(home, lambda model: swapped.append(model), current="v1")   # a running process
    swapped: list = []
    rc, out, err = run(capsys, "models", "rollback", "--to-default")
    name = default_version_name(cfg)
    assert rc == 0, err
    assert name.startswith("default-my_intents-") and name.endswith(cached.name.rsplit("-", 1)[1])
    assert out.startswith(f"rolled back to the default model {name} in ") and "(was v1;" in out
    assert home.current_name() == name and home.history() == ["v1", name]
    for f in ("head.npz", "head.joblib", "intents.yaml"):                  # the cached default, as it is
        assert (home.home / name / f).read_bytes() == (cached / f).read_bytes()
    assert watcher.poll(force=True) and [m.version for m in swapped] == [name]

    # a restart serves it: the models home, whose CURRENT names the default
    restarted = load_config()
    assert served_model(restarted).home.home == cfg.models_dir
    assert ModelRegistry(restarted.models_dir).load_current().version == name

    rc, out, err = run(capsys, "models", "list")
    assert rc == 0 and f"* {name}" in out and "(the default model)" in out, out
    listed = json.loads(run(capsys, "models", "list", "--json")[1])
    assert [(v["version"], v["current"], v["default"]) for v in listed] == [(name, True, True), ("v1", False, False)]
    rc, out, err = run(capsys, "models", "rollback", "--to-default")
    assert rc == 0 and out.startswith(f"already serving the default model {name}")
    rc, out, err = run(capsys, "models", "rollback")                       # and back to the promoted one
    assert rc == 0 and out.startswith("rolled back to v1 ") and home.current_name() == "v1"
    rc, out, err = run(capsys, "models", "rollback", "--to-default")       # the version is there: reused
    assert rc == 0 and home.current_name() == name and home.history() == ["v1", name]


def test_rollback_to_default_refuses_a_corrupt_cached_default(served_default, capsys):
    cfg, cached = served_default
    home = ModelRegistry(cfg.models_dir)
    fit_model(parse_intents(DOC), embedder=HashEmbedder(), version="v1").save(home.version_dir("v1"))
    home.promote("v1")
    (cached / "head.npz").write_bytes(b"broken on disk")
    rc, out, err = run(capsys, "models", "rollback", "--to-default")
    assert rc == 3 and err.startswith("flywheel: error: ") and "head.npz" in err and "Traceback" not in err, err
    assert home.current_name() == "v1" and [v.name for v in home.versions()] == ["v1"]


def test_rollback_to_default_takes_the_intent_file_given_on_the_command_line(tmp_path, monkeypatch, capsys):
    """A user who passes ``--intents FILE`` to every command (no intents setting) gets their
    own file's default model back with ``rollback --to-default --intents FILE``; without it
    the switch to the starter set is refused before anything changes (issue 41, item 2), and
    ``--force`` makes it."""
    monkeypatch.delenv("FLYWHEEL_INTENTS", raising=False)
    intents = tmp_path / "home intents.yaml"
    intents.write_text(yaml.safe_dump(DOC))
    cfg = load_config()
    for source in (intents, starter_intents_path()):   # both defaults already in the cache (as first use leaves them)
        cached = cached_model_dir(cfg, source)
        fit_model(load_intents(source), embedder=HashEmbedder(), version=cached.name).save(cached)
    home = ModelRegistry(cfg.models_dir)
    fit_model(parse_intents(DOC), embedder=HashEmbedder(), version="v1").save(home.version_dir("v1"))
    home.promote("v1")

    rc, out, err = run(capsys, "models", "rollback", "--to-default", "--intents", str(intents))
    mine = default_version_name(load_config(intents=str(intents)))
    assert rc == 0 and mine.startswith("default-home_intents-"), err
    assert out.startswith(f"rolled back to the default model {mine} ") and "note" not in err, (out, err)
    assert home.current_name() == mine
    rc, out, err = run(capsys, "models", "list", "--intents", str(intents))
    assert rc == 0 and f"* {mine}" in out and "(the default model)" in out, out
    dates = {re.search(r" \d{4}-\d\d-\d\dT", line).start() for line in out.splitlines()}   # one column
    assert len(dates) == 1 and len(mine) > 32, out

    rc, out, err = run(capsys, "models", "rollback", "--intents", str(intents))   # --intents needs --to-default
    assert rc == 2 and "--intents goes with --to-default" in err and home.current_name() == mine, err
    assert run(capsys, "models", "rollback")[0] == 0 and home.current_name() == "v1"

    rc, out, err = run(capsys, "models", "rollback", "--to-default")   # no intents setting: the starter set
    assert rc == 2 and home.current_name() == "v1", (out, err)          # refused before the switch
    assert err.startswith("flywheel: error: refusing to switch to the starter set: with no intents setting"), err
    assert "v1 serves another intent set" in err and "--to-default --intents FILE" in err, err
    assert "--force" in err and len(err.strip().splitlines()) == 1, err
    starter = default_version_name(cfg)
    assert not (home.home / starter).exists()                            # nothing published either
    rc, out, err = run(capsys, "models", "rollback", "--to-default", "--force")
    assert rc == 0 and starter.startswith("default-starter_intents-") and home.current_name() == starter, err
