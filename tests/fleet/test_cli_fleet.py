"""The offline commands in fleet mode, in process: ``flywheel feedback`` and ``flywheel
prune-log`` against a real S3 server, on decisions a replica's spool shipped there, and
``flywheel models rollback`` on versions another host published."""

from __future__ import annotations

import json

import pytest

from flywheel.classifier.decision import Decision, Layer, Tier, new_decision_id
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.protocols import DecisionRecord
from flywheel.classifier.settings.intents import parse_intents
from flywheel.classifier.versions.registry import ModelRegistry
from flywheel.cli import main
from flywheel.fleet.registry import BucketRegistry
from flywheel.fleet.shipper import ObjectShipper
from flywheel.logstore import LogStore, SpoolSink
from tests.support.bucket import publish, tamper
from tests.support.docs import DOC
from tests.support.fakes import HashEmbedder

pytestmark = pytest.mark.slow   # talks to the real server


def _ship(objects, tmp_path, texts):
    """Decisions made on "another replica": spooled and shipped to the bucket."""
    sink = SpoolSink(tmp_path / "replica.spool", drain=ObjectShipper(objects), fsync=False)
    ids = []
    for t in texts:
        d = Decision(label="RETRIEVAL", confidence=0.9, tier=Tier.CONFIDENT, layer=Layer.EMBEDDING, reason="t")
        sink.write(DecisionRecord(decision=d, text=t, created_at=1.0e9))   # 2001: old enough to prune
        ids.append(d.id)
    assert sink.drain_now(timeout_s=30) == len(texts)
    sink.close()
    return ids


def run(capsys, *args):
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_feedback_and_prune_log_see_the_fleets_log(objects, store_env, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLYWHEEL_TEACHER", "off")
    ids = _ship(objects, tmp_path, ["what is addVar", "secret-ish text 9f3a1c"])
    rc, out, err = run(capsys, "feedback", ids[0], "PLATFORM")
    assert rc == 0 and f"recorded PLATFORM for decision {ids[0]}" in out, err
    unknown = new_decision_id()   # not shipped (yet): kept, with a note, checked at retrain
    rc, out, err = run(capsys, "feedback", unknown, "RETRIEVAL")
    assert rc == 0 and "not in the fleet's log yet" in err
    rc, out, err = run(capsys, "feedback", "not-an-id", "RETRIEVAL")
    assert rc == 2 and "not a decision id" in err and "Traceback" not in err
    store = LogStore(tmp_path / "home-check.duckdb")   # a fresh host mirrors the same labels
    from flywheel.fleet.mirror import mirror

    mirror(objects, store)
    rows = {r.decision_id: r for r in store.labelled_rows()}
    assert rows[ids[0]].human_label == "PLATFORM" and ids[1] not in rows
    rc, out, err = run(capsys, "prune-log", "--days", "30", "--json")
    assert rc == 0, err
    out = json.loads(out.strip().splitlines()[-1])
    assert out["objects_redacted"] == 1 and out["objects_deleted"] == 1 and out["local_rows"] == 2
    fresh = LogStore(tmp_path / "fresh.duckdb")
    mirror(objects, fresh)
    texts = {r[0] for r in fresh.query("SELECT text FROM decisions")}
    assert texts == {""}   # the text is gone from the bucket, the decisions and label stay
    assert {r.decision_id: r.human_label for r in fresh.labelled_rows()} == {ids[0]: "PLATFORM"}


def test_models_rollback_names_the_version_and_refuses_a_corrupt_one(objects, tmp_path, capsys):
    trainer = BucketRegistry(objects, ModelRegistry(tmp_path / "trainer"))   # another host published them
    publish(trainer, fit_model(parse_intents(DOC), embedder=HashEmbedder(), version="base"), "v1", "v2", "v3")
    token = None
    for name in ("v1", "v2", "v3"):
        token = trainer.promote(name, expected=token)
    tamper(objects, "models/v2/head.npz")
    rc, out, err = run(capsys, "models", "rollback")
    assert rc == 3 and "cannot roll back to 'v2'" in err and "checksum does not match" in err, err
    assert trainer.current() == ("v3", token)                                # CURRENT unchanged
    token = trainer.promote("v1", expected=token)                            # history: v1 v2 v3 v1
    rc, out, err = run(capsys, "models", "rollback")
    assert rc == 0, err
    name, etag = trainer.current()
    assert name == "v3" and out.startswith("rolled back to v3 ") and etag.strip('"') not in out


def test_models_rollback_to_default_serves_the_default_fleet_wide(objects, store_env, tmp_path, monkeypatch,
                                                                  capsys):
    """Issue 32, item 8: after the fleet's first promotion, ``rollback --to-default`` publishes the
    default model (the intent file trained as on first use) to the bucket and promotes it:
    replicas follow it, and a plain rollback goes back."""
    import yaml

    from flywheel.classifier.settings.config import load_config
    from flywheel.classifier.versions.default import cached_model_dir
    from flywheel.fleet.sync import RegistrySync
    from flywheel.training.cli.models import default_version_name

    intents = tmp_path / "intents.yaml"
    intents.write_text(yaml.safe_dump(DOC))
    monkeypatch.setenv("FLYWHEEL_INTENTS", str(intents))
    cfg = load_config()
    cached = cached_model_dir(cfg, intents)            # what the first classify trains (here a tiny model)
    fit_model(parse_intents(DOC), embedder=HashEmbedder(), version=cached.name).save(cached)
    trainer = BucketRegistry(objects, ModelRegistry(tmp_path / "trainer"))   # another host promoted v1
    publish(trainer, fit_model(parse_intents(DOC), embedder=HashEmbedder(), version="base"), "v1")
    trainer.promote("v1", expected=None)
    replica = ModelRegistry(tmp_path / "replica")
    sync = RegistrySync(objects, replica, interval_s=60)
    assert sync.poll() == "new" and replica.current_name() == "v1"
    rc, out, err = run(capsys, "models", "rollback")
    assert rc == 3 and "rollback --to-default" in err, err

    rc, out, err = run(capsys, "models", "rollback", "--to-default")
    name = default_version_name(cfg)
    assert rc == 0 and out.startswith(f"rolled back to the default model {name} in BucketRegistry("), err
    assert trainer.current()[0] == name and trainer.history() == ["v1", name]
    assert {v.name for v in trainer.versions()} == {"v1", name}
    assert sync.poll() == "new" and replica.current_name() == name          # replicas follow it
    assert (replica.home / name / "head.npz").read_bytes() == (cached / "head.npz").read_bytes()
    rc, out, err = run(capsys, "models", "list")
    assert rc == 0 and f"* {name}" in out and "(the default model)" in out, out
    rc, out, err = run(capsys, "models", "rollback")
    assert rc == 0 and out.startswith("rolled back to v1 ") and trainer.current()[0] == "v1"
    assert sync.poll() == "new" and replica.current_name() == "v1"


def test_models_prune_cleans_the_bucket_then_the_local_home(objects, tmp_path, capsys):
    # issue 22: versions carry their encoder and weigh megabytes; prune works on the bucket too
    trainer = BucketRegistry(objects, ModelRegistry(tmp_path / "trainer"))
    publish(trainer, fit_model(parse_intents(DOC), embedder=HashEmbedder(), version="base"), "v1", "v2", "v3", "v4")
    trainer.promote("v2", expected=None)
    rc, out, err = run(capsys, "models", "prune", "--keep-promoted", "1", "--keep-recent", "1", "--dry-run")
    assert rc == 0, err
    assert "would remove v1\nwould remove v3\ndry run: would remove 2 of 4 versions, 2 kept, in" in out
    assert [v.name for v in trainer.versions()] == ["v1", "v2", "v3", "v4"]
    rc, out, err = run(capsys, "models", "prune", "--keep-promoted", "1", "--keep-recent", "1")
    assert rc == 0, err
    assert "removed v1\nremoved v3\nremoved 2 of 4 versions, 2 kept, in BucketRegistry(" in out
    assert [v.name for v in trainer.versions()] == ["v2", "v4"] and trainer.current()[0] == "v2"
    rc, out, err = run(capsys, "models", "prune", "--keep-recent", "0")
    assert rc == 2 and "--keep-recent must be at least 1 with a store" in err and "Traceback" not in err
    rc, out, err = run(capsys, "models", "prune", "--keep-recent", "0", "--local-only")
    assert rc == 0 and "BucketRegistry" not in out, err
    assert [v.name for v in trainer.versions()] == ["v2", "v4"]


def test_review_reads_the_fleets_log_and_its_labels_ship(objects, store_env, tmp_path, monkeypatch, capsys):
    """Issue 25: the review queue works the same in fleet mode: it reads the mirrored log, and
    a label made from it (here through a Label Studio import) ships like Feedback's."""
    from flywheel.classifier.decision import Layer2Answer, TeacherCall

    monkeypatch.setenv("FLYWHEEL_TEACHER", "off")
    sink = SpoolSink(tmp_path / "replica.spool", drain=ObjectShipper(objects), fsync=False)
    d = Decision(label="PLATFORM", confidence=0.9, tier=Tier.CONFIDENT, layer=Layer.LLM, reason="t",
                 teacher=TeacherCall("llm", "PLATFORM", True, 10.0))
    sink.write(DecisionRecord(decision=d, text="show my quota", created_at=1.79e9,
                              layer2=Layer2Answer("RETRIEVAL", 0.5, Tier.WEAK)))
    assert sink.drain_now(timeout_s=30) == 1
    sink.close()
    rc, out, err = run(capsys, "review", "--json")
    assert rc == 0, err
    items = json.loads(out.strip().splitlines()[-1])["items"]
    assert [(it["decision_id"], it["reasons"]) for it in items] == [(d.id, ["teacher_vs_l2"])]
    done = [{"data": {"decision_id": d.id}, "annotations": [{"completed_by": 3, "result": [
        {"from_name": "intent", "to_name": "text", "type": "choices", "value": {"choices": ["RETRIEVAL"]}}]}]}]
    (tmp_path / "ls.json").write_text(json.dumps(done))
    rc, out, err = run(capsys, "review", "--import-label-studio", str(tmp_path / "ls.json"))
    assert rc == 0 and "recorded 1 human label(s)" in out, err
    from flywheel.fleet.mirror import mirror

    fresh = LogStore(tmp_path / "another-host.duckdb")     # another host mirrors the label from the bucket
    mirror(objects, fresh)
    assert {r.decision_id: r.human_label for r in fresh.labelled_rows() if r.has_human_label} == {d.id: "RETRIEVAL"}


def test_the_same_label_studio_export_imported_twice_ships_its_labels_once(objects, store_env, tmp_path,
                                                                         monkeypatch, capsys):
    """Issue 32, item 11, fleet-wide: the same export imported again, on this host or on another
    one, writes no second label object, and every host's mirror counts each label once."""
    from flywheel.fleet.bucket_labels import BucketLabels
    from flywheel.fleet.mirror import mirror
    from flywheel.logstore.label_records import stable_label_uid
    from tests.support.bucket import log_keys

    monkeypatch.setenv("FLYWHEEL_TEACHER", "off")
    ids = _ship(objects, tmp_path, ["what is addVar", "show my quota"])
    done = [{"data": {"decision_id": did}, "annotations": [{"id": i, "completed_by": 3, "updated_at": "2026-11-27",
                                                           "result": [{"from_name": "intent", "value": {
                                                               "choices": [choice]}}]}]}
            for i, (did, choice) in enumerate(zip(ids, ["RETRIEVAL", "PLATFORM"]))]
    (tmp_path / "ls.json").write_text(json.dumps(done))
    rc, out, err = run(capsys, "review", "--import-label-studio", str(tmp_path / "ls.json"))
    assert rc == 0 and "recorded 2 human label(s)" in out, err
    labels_before = log_keys(objects, "labels")
    rc, out, err = run(capsys, "review", "--import-label-studio", str(tmp_path / "ls.json"))
    assert rc == 0 and "recorded 0 human label(s)" in out and "2 already recorded" in out, out
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "another-host"))     # a host that has mirrored nothing yet
    rc, out, err = run(capsys, "review", "--import-label-studio", str(tmp_path / "ls.json"))
    assert rc == 0 and "2 already recorded" in out, out
    assert log_keys(objects, "labels") == labels_before and len(labels_before) == 2
    # two hosts writing the same import at once (neither has seen the other's): one object
    uid = stable_label_uid("label-studio", ids[0], "PLATFORM", "label-studio:9", "7@t")
    for _ in range(2):
        assert BucketLabels(objects).add_human_label(ids[0], "PLATFORM", author="label-studio:9", label_uid=uid)
    assert len(log_keys(objects, "labels")) == 3
    fresh = LogStore(tmp_path / "fresh.duckdb")
    mirror(objects, fresh)
    assert fresh.query("SELECT count(*) FROM labels WHERE source = 'human'")[0][0] == 3
    assert fresh.count_new_labels(None) == 3


def test_a_host_that_has_not_synced_labels_with_the_fleets_intents(objects, store_env, tmp_path, monkeypatch,
                                                                    capsys):
    """Issue 33, items 3 and 4: which model is served is the site's to say. Host A promoted a
    version whose intents are not the starter set's; host B (a fresh home, no intents set,
    nothing synced) takes ``feedback ID BILLING``, refuses a starter-only label, offers the
    fleet's intents in ``review --json`` (reading the bucket's manifest, downloading nothing)
    and asks the teacher with the fleet's options in ``flywheel label``."""
    import copy

    import flywheel.classifier.encoders
    from flywheel.classifier.decision import Candidate, Layer2Answer, TeacherCall
    from flywheel.classifier.settings.config import load_config
    from tests.support.docs import ALWAYS_UNSURE
    from tests.support.simulated_ollama import SimulatedOllama

    emb = HashEmbedder()
    monkeypatch.setattr(flywheel.classifier.encoders, "make_embedder", lambda *a, **k: emb)
    for name in ("FLYWHEEL_TEACHER", "FLYWHEEL_TEACHER_HOST", "FLYWHEEL_INTENTS", "FLYWHEEL_MODEL"):
        monkeypatch.delenv(name, raising=False)
    doc = copy.deepcopy(DOC)
    doc["thresholds"] = ALWAYS_UNSURE
    doc["teacher"] = {"model": "tiny-llm", "timeout_s": 5.0}
    doc["intents"] = [{"name": n, "description": n.lower(), "examples": [f"{n.lower()} {w}" for w in
                                                                         ("one", "two", "three", "four", "five")]}
                      for n in ("BILLING", "REFUND")]
    doc["rules"] = []
    host_a = BucketRegistry(objects, ModelRegistry(tmp_path / "host-a"))
    publish(host_a, fit_model(parse_intents(doc), embedder=emb, version="base"), "v1")
    host_a.promote("v1", expected=None)

    sink = SpoolSink(tmp_path / "replica.spool", drain=ObjectShipper(objects), fsync=False)
    served = Decision(label="BILLING", confidence=0.9, tier=Tier.CONFIDENT, layer=Layer.LLM, reason="t",
                      alternatives=[Candidate("CODE_GENERATION", 0.2)],
                      teacher=TeacherCall("llm", "BILLING", True, 9.0))
    pending = Decision(label="REFUND", confidence=0.4, tier=Tier.WEAK, layer=Layer.EMBEDDING, reason="t")
    sink.write(DecisionRecord(decision=served, text="my invoice twice", created_at=1.79e9,
                              layer2=Layer2Answer("REFUND", 0.5, Tier.WEAK)))
    sink.write(DecisionRecord(decision=pending, text="refund one please", created_at=1.79e9, pending=True,
                              layer2=Layer2Answer("REFUND", 0.4, Tier.WEAK)))
    assert sink.drain_now(timeout_s=30) == 2
    sink.close()
    home = load_config().models_dir                                   # host B: nothing synced, no intents

    rc, out, err = run(capsys, "review", "--json", "--reason", "teacher_vs_l2")
    assert rc == 0, err
    items = json.loads(out.strip().splitlines()[-1])["items"]
    assert [(it["decision_id"], it["choices"]) for it in items] == [(served.id, ["BILLING", "REFUND"])]
    rc, out, err = run(capsys, "feedback", served.id, "BILLING")
    assert rc == 0 and f"recorded BILLING for decision {served.id}" in out, err
    rc, out, err = run(capsys, "feedback", served.id, "CODE_GENERATION")     # the starter set's, not the fleet's
    assert rc == 2 and "unknown label 'CODE_GENERATION'" in err and "BILLING, REFUND" in err, err
    assert not (home / "CURRENT").exists() and not (home / "v1").exists()   # the manifest read, nothing downloaded

    with SimulatedOllama({"refund one please": "REFUND"}, accuracy=1.0, latency_scale=0.0) as sim:
        rc, out, err = run(capsys, "label", "--teacher-host", sim.url, "--quiet")
        assert rc == 0 and out.startswith("labelled 1 of 1 pending decision"), err
        assert [(a[0], a[2], set(a[3]) - {"OUT_OF_SCOPE"}) for a in sim.answers] == [
            ("refund one please", "REFUND", {"BILLING", "REFUND"})]
    from flywheel.fleet.mirror import mirror

    fresh = LogStore(tmp_path / "another-host.duckdb")
    mirror(objects, fresh)
    rows = {r.decision_id: r for r in fresh.labelled_rows()}
    assert rows[served.id].human_label == "BILLING" and rows[pending.id].teacher_label == "REFUND"


def test_fleet_moves_are_checked_against_the_configured_intent_set(objects, store_env, tmp_path, monkeypatch,
                                                                   capsys):
    """Issue 41, items 1 and 2 against the bucket: a rollback to a version of the old set is
    refused naming the nearest fit, promote is checked, and a replica configured with the
    file refuses another set's version that reaches the fleet's CURRENT anyway."""
    from flywheel.classifier.settings.config import load_config
    from flywheel.service.runtime import open_runtime
    from tests.support.intent_sets import NEW_DOC, OLD_DOC, fitted, write_doc

    monkeypatch.setenv("FLYWHEEL_INTENTS", str(write_doc(tmp_path / "shop.yaml", NEW_DOC)))
    monkeypatch.setenv("FLYWHEEL_TEACHER", "off")
    trainer = BucketRegistry(objects, ModelRegistry(tmp_path / "trainer"))   # another host published them
    publish(trainer, fitted(NEW_DOC, "new"), "v1", "v3")
    publish(trainer, fitted(OLD_DOC, "old"), "v2")
    token = None
    for name in ("v1", "v2", "v3"):
        token = trainer.promote(name, expected=token)
    rc, out, err = run(capsys, "models", "rollback")
    assert rc == 2 and trainer.current()[0] == "v3", (out, err)
    assert "refusing to roll back to v2" in err and "only in v2: OPENING_HOURS" in err, err
    assert "the nearest earlier version trained on it is v1: flywheel models promote v1" in err, err
    rc, out, err = run(capsys, "models", "promote", "v2")
    assert rc == 2 and "refusing to promote v2" in err and trainer.current()[0] == "v3", err
    rc, out, err = run(capsys, "check")
    assert rc == 0 and out.startswith("served:     v3 (fleet;"), out

    rt = open_runtime(load_config(home=tmp_path / "replica"), progress=False, embedder=HashEmbedder())
    try:
        assert rt.classifier.model_version == "v3"
        trainer.promote("v2", expected=trainer.current()[1])      # a forced move, or an old tool
        assert rt.sync is not None and rt.sync.poll() == "new"    # installed in the replica's home ...
        assert rt.classifier.model_version == "v3"                # ... and refused: still serving v3
        assert "another intent set" in rt.classifier.watcher.refused["v2"]
        rc, out, err = run(capsys, "check")
        assert rc == 1 and "agree:      NO" in out and "flywheel retrain" in out, out
    finally:
        rt.close()
    rc, out, err = run(capsys, "models", "rollback")               # back to v3, of the file: allowed
    assert rc == 0 and trainer.current()[0] == "v3", err
