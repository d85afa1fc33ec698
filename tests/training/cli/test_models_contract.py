"""Issue 41, items 1 and 2: every move of the served pointer is checked against the
configured intent set, in a local models home (the fleet's: tests/fleet/test_cli_fleet.py).

A shop removed OPENING_HOURS from its intent file; a plain ``rollback`` used to go to a
version of the old set (exit 0) that the running sidecar hot-reloaded and a restart then
refused. Now the move is refused first, on one line that names the nearest version that
fits and ``--force``."""

from __future__ import annotations

from flywheel.classifier.settings.config import load_config
from flywheel.classifier.versions.registry import ModelRegistry, ModelWatcher
from flywheel.cli import main
from tests.support.intent_sets import NEW_DOC, OLD_DOC, save_fitted, write_doc


def run(capsys, *args):
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def _shop(tmp_path, monkeypatch, history):
    """A home whose promotions were ``history`` ((name, doc) pairs, in order), with the
    intents setting naming the edited file (NEW_DOC)."""
    monkeypatch.setenv("FLYWHEEL_INTENTS", str(write_doc(tmp_path / "shop.yaml", NEW_DOC)))
    monkeypatch.setenv("FLYWHEEL_TEACHER", "off")
    reg = ModelRegistry(load_config().models_dir)
    for name, doc in history:
        save_fitted(reg, doc, name)
        reg.promote(name)
    return reg


def test_a_rollback_to_another_sets_version_is_refused_naming_the_nearest_fit(tmp_path, monkeypatch, capsys):
    reg = _shop(tmp_path, monkeypatch, [("v1", NEW_DOC), ("v2", OLD_DOC), ("v3", NEW_DOC)])
    rc, out, err = run(capsys, "models", "rollback")
    assert rc == 2 and reg.current_name() == "v3", (out, err)
    line = err.strip()
    assert "\n" not in line and "Traceback" not in line, err
    assert line.startswith("flywheel: error: refusing to roll back to v2: v2 was trained on another intent set "
                           "than "), line
    assert "only in v2: OPENING_HOURS" in line, line
    assert "the nearest earlier version trained on it is v1: flywheel models promote v1" in line, line
    assert "flywheel models rollback --force" in line, line
    assert reg.history() == ["v1", "v2", "v3"]                      # nothing moved
    rc, out, err = run(capsys, "models", "promote", "v1")           # as advised
    assert rc == 0 and reg.current_name() == "v1", err
    rc, out, err = run(capsys, "models", "promote", "v2")           # promote is checked as well
    assert rc == 2 and "refusing to promote v2" in err and "--force" in err and reg.current_name() == "v1", err
    rc, out, err = run(capsys, "models", "promote", "v2", "--force")
    assert rc == 0 and reg.current_name() == "v2", err


def test_no_fitting_version_behind_says_so_and_force_rolls_back(tmp_path, monkeypatch, capsys):
    reg = _shop(tmp_path, monkeypatch, [("v1", OLD_DOC), ("v2", NEW_DOC)])
    rc, out, err = run(capsys, "models", "rollback")
    assert rc == 2 and "no earlier promoted version was trained on it: flywheel retrain trains it" in err, err
    assert reg.current_name() == "v2"
    rc, out, err = run(capsys, "models", "rollback", "--force")
    assert rc == 0 and reg.current_name() == "v1" and out.startswith("rolled back to v1 "), err


def test_a_rollback_within_the_set_is_not_held_up(tmp_path, monkeypatch, capsys):
    reg = _shop(tmp_path, monkeypatch, [("v1", NEW_DOC), ("v2", NEW_DOC)])
    rc, out, err = run(capsys, "models", "rollback")
    assert rc == 0 and reg.current_name() == "v1", err


def test_a_version_of_another_set_promoted_behind_the_commands_back_is_refused_by_the_hot_reload(
        tmp_path, monkeypatch):
    """The serving side holds to the same contract: another host (or an old flywheel)
    moves CURRENT to a version of the old set; the process keeps serving its version."""
    from flywheel.classifier.versions.default import served_model

    reg = _shop(tmp_path, monkeypatch, [("v1", NEW_DOC)])
    served = served_model(load_config(), progress=False)
    swapped: list = []
    watcher = ModelWatcher(served.home, swapped.append, current="v1")
    save_fitted(reg, OLD_DOC, "v2")
    reg.promote("v2")
    assert not watcher.poll(force=True) and swapped == []
    assert "another intent set" in watcher.refused["v2"] and "OPENING_HOURS" in watcher.refused["v2"]
    save_fitted(reg, NEW_DOC, "v3")
    reg.promote("v3")
    assert watcher.poll(force=True) and [m.version for m in swapped] == ["v3"]


def test_check_says_what_is_served_and_configured_and_whether_they_agree(tmp_path, monkeypatch, capsys):
    import json

    import yaml

    reg = _shop(tmp_path, monkeypatch, [("v1", NEW_DOC)])
    rc, out, err = run(capsys, "check")
    assert rc == 0 and out.startswith("served:     v1 (models home; intents RETRIEVAL, PLATFORM;"), (out, err)
    assert "agree:      yes" in out and "shop.yaml (set " in out
    save_fitted(reg, OLD_DOC, "v2")
    reg.promote("v2")                                    # behind the commands' back (another host, an old tool)
    rc, out, err = run(capsys, "check")
    assert rc == 1 and "agree:      NO" in out and "pointer:    CURRENT names v2" in out, out
    assert "fix:        flywheel models promote v1" in out, out
    rc, out, err = run(capsys, "check", "--json")
    doc = json.loads(out)
    assert rc == 1 and doc["agree"] is False and doc["served"]["version"] == "v1" and doc["pointer"] == "v2"
    edited = {**NEW_DOC, "intents": [*NEW_DOC["intents"], {"name": "RETURNS", "examples": [
        "send it back", "return my order", "refund a parcel"]}]}
    (tmp_path / "shop.yaml").write_text(yaml.safe_dump(edited))   # an edit no version was trained on yet
    rc, out, err = run(capsys, "check")
    assert rc == 1 and "served:     nothing can be served" in out and "flywheel retrain --intents" in out, out
    rc, out, err = run(capsys, "classify", "show my invoices")  # a start refuses it, on one line, exit 2
    assert rc == 2 and "\n" not in err.strip() and "flywheel retrain --intents" in err, err
    assert "--serve-last-good" in err and "Traceback" not in err, err
    monkeypatch.delenv("FLYWHEEL_INTENTS")
    rc, out, err = run(capsys, "check")                  # no intents setting: the served version is the set
    assert rc == 0 and "configured: no intents setting" in out and "served:     v2" in out, out


def test_push_and_train_promote_are_moves_checked_like_promote(tmp_path, monkeypatch, capsys):
    from tests.support.intent_sets import fitted

    reg = _shop(tmp_path, monkeypatch, [("v1", NEW_DOC)])
    old = fitted(OLD_DOC, "v-old").save(tmp_path / "v-old")
    rc, out, err = run(capsys, "models", "push", str(old), "--promote")
    assert rc == 2 and "refusing to promote v-old" in err and reg.current_name() == "v1", err
    assert "v-old" in {v.name for v in reg.versions()}              # pushed, not served
    old_file = write_doc(tmp_path / "old.yaml", OLD_DOC)
    rc, out, err = run(capsys, "train", "--intents", str(old_file), "--promote")
    assert rc == 2 and f"refusing to promote a version of {old_file}" in err and reg.current_name() == "v1", err


def test_list_marks_the_versions_of_another_intent_set(tmp_path, monkeypatch, capsys):
    import json

    _shop(tmp_path, monkeypatch, [("v1", NEW_DOC), ("v2", OLD_DOC), ("v3", NEW_DOC)])
    rc, out, err = run(capsys, "models", "list")
    lines = {ln.split()[1] if ln.startswith("*") else ln.split()[0]: ln for ln in out.splitlines() if " n=" in ln}
    assert rc == 0 and "(another intent set)" in lines["v2"], out
    assert "(another intent set)" not in lines["v1"] + lines["v3"], out
    rc, out, err = run(capsys, "models", "list", "--json")
    assert {v["version"]: v["fits_intents"] for v in json.loads(out)} == {"v1": True, "v2": False, "v3": True}
    monkeypatch.delenv("FLYWHEEL_INTENTS")                  # no setting: nothing to mark
    rc, out, err = run(capsys, "models", "list")
    assert rc == 0 and "(another intent set)" not in out, out
    assert "(the default model is the starter set's: flywheel models rollback --to-default --intents FILE" in out


def test_with_no_version_of_the_file_labels_are_checked_against_the_file(tmp_path, monkeypatch):
    """The label writer never falls back to "any label" because nothing fits the file."""
    from flywheel.fleet.site import open_site

    _shop(tmp_path, monkeypatch, [("v1", OLD_DOC)])             # only the old set is stored
    assert open_site(load_config()).served_labels() == ("RETRIEVAL", "PLATFORM")
