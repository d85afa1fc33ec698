"""Issue 41 on the retrain's side: ``flywheel retrain`` follows the configured intent set as
every command does (item 4), an encoder switch is gated against the champion scored with
its own encoder (item 3), a gate with too few rows says "cannot tell" instead of promoting
a tie (item 6), and a dry run erases nothing (item 8)."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from typer.testing import CliRunner

from flywheel.classifier.versions.registry import ModelRegistry
from flywheel.cli import build_app
from flywheel.training.cli import retrain as cli_retrain
from tests.support.fakes import HashEmbedder
from tests.support.worlds import INTENT_DOC, World

HASH = HashEmbedder()                                   # the starter encoder of these tests ("fake:hash-256")
OTHER = HashEmbedder(128, "fake:other-128")             # what embedder.backend e5-multilingual builds here


@pytest.fixture()
def world(tmp_path, monkeypatch) -> World:
    monkeypatch.setattr(cli_retrain, "make_embedder", lambda settings, cache_root=None:
                        OTHER if settings.backend == "e5-multilingual" else HASH)
    return World(tmp_path)


def _file(tmp_path, name, doc):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def _retrain(world, *args):
    home = world.tmp / "home"
    r = CliRunner().invoke(build_app(), ["retrain", "--home", str(home), "--log-db", str(world.store.path),
                                         "--quiet", "--json", "--promote-untested", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout), ModelRegistry(home / "models")


def _edited():
    doc = copy.deepcopy(INTENT_DOC)
    doc["intents"][0]["examples"].append("where can i read about the avap grammar")
    return doc


@pytest.mark.parametrize("how", ["env", "config file"])
def test_retrain_without_intents_follows_the_intents_setting(world, tmp_path, monkeypatch, how):
    world.seed_traffic(n_teacher=200, n_human=10)
    first, reg = _retrain(world, "--intents", str(_file(tmp_path, "shop.yaml", INTENT_DOC)))
    assert first["outcome"] == "promoted"
    edited = _file(tmp_path, "shop-edited.yaml", _edited())
    if how == "env":
        monkeypatch.setenv("FLYWHEEL_INTENTS", str(edited))
    else:
        (world.tmp / "home").mkdir(exist_ok=True)
        (world.tmp / "home" / "config.toml").write_text(f'intents = "{edited}"\n')
    res, reg = _retrain(world)                           # the crontab line: no --intents
    assert res["outcome"] == "promoted", res["reason"]
    assert res["reason"].startswith("intent set changed (same intents, other examples, rules or settings)")
    bundled = reg.load(reg.current_name()).intents
    assert "where can i read about the avap grammar" in bundled.intents[0].examples
    assert any("the intent set changed since" in n for n in res["notes"])


def test_an_encoder_switch_is_gated_against_the_champion_on_its_own_encoder(world, tmp_path):
    world.seed_traffic(n_teacher=200, n_human=10)
    first, reg = _retrain(world, "--intents", str(_file(tmp_path, "shop.yaml", INTENT_DOC)))
    switched = {**copy.deepcopy(INTENT_DOC), "embedder": {"backend": "e5-multilingual"}}
    res, reg = _retrain(world, "--intents", str(_file(tmp_path, "shop-e5.yaml", switched)))
    notes = res["notes"]
    assert not any("treated as no champion" in n for n in notes), notes
    assert (f"encoder switch: champion {first['version']} uses fake:hash-256 (256-d), the challenger "
            f"fake:other-128 (128-d); the champion scores the same gate rows encoded by its own encoder "
            f"(paired)") in notes
    assert res["champion"]["version"] == first["version"]          # a champion was measured, not "first model"
    assert "first model" not in res["reason"] and res["reason"].startswith("intent set changed")
    assert res["champion"]["n"] > 0 and res["champion"]["n"] == res["challenger"]["n"]   # the same rows, paired


def test_too_few_gate_rows_keep_a_tie_out_unless_promote_untested(world, tmp_path):
    world.seed_traffic(n_teacher=30, n_human=4)
    common = ["--intents", str(_file(tmp_path, "shop.yaml", INTENT_DOC))]
    _retrain(world, *common)
    world.seed_traffic(n_teacher=20, n_human=4, seed=3)
    home = world.tmp / "home"
    r = CliRunner().invoke(build_app(), ["retrain", "--home", str(home), "--log-db", str(world.store.path),
                                         "--quiet", "--json", *common])
    res = json.loads(r.stdout)
    assert r.exit_code == 0 and res["outcome"] == "kept", res["reason"]
    assert res["reason"].startswith("cannot tell: only ")
    assert "held-out eval queries (the gate needs 20)" in res["reason"]
    assert res["reason"].endswith("keeping the champion (retrain --promote-untested promotes it anyway)")
    forced, reg = _retrain(world, *common)                          # the user asks
    assert forced["outcome"] == "promoted" and reg.current_name() == forced["version"]
    assert any(n.startswith("cannot tell: only ") and n.endswith("promoted because of --promote-untested")
               for n in forced["notes"])


def test_a_dry_run_applies_no_retention(world, tmp_path, monkeypatch):
    world.seed_traffic(n_teacher=60, n_human=4)
    monkeypatch.setenv("FLYWHEEL_LOG_RETENTION_DAYS", "0")          # every logged text is past retention

    def texts():
        return world.store.query("SELECT count(*) FROM decisions WHERE text <> ''")[0][0]

    before = texts()
    assert before > 0
    _retrain(world, "--dry-run", "--intents", str(_file(tmp_path, "shop.yaml", INTENT_DOC)))
    assert texts() == before                                        # a dry run changes nothing
    _retrain(world, "--intents", str(_file(tmp_path, "shop.yaml", INTENT_DOC)))
    assert texts() == 0                                             # a real run applies the setting
