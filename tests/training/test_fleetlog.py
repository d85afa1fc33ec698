"""training.fleetlog without a store: the local log and registry, nothing on the network."""

from flywheel.classifier.config import load_config
from flywheel.classifier.registry import ModelRegistry
from flywheel.logstore import LogStore
from flywheel.training.fleetlog import label_sink, mirror_progress, open_log, open_objects, open_registry


def test_without_a_store_everything_is_local(tmp_path):
    cfg = load_config(home=tmp_path)
    assert open_objects(cfg) is None
    store = open_log(cfg)
    assert isinstance(store, LogStore) and label_sink(cfg, store) is store
    reg = open_registry(cfg)
    assert isinstance(reg, ModelRegistry) and reg.home == cfg.models_dir


def testmirror_progress_prints_at_most_every_interval_and_at_the_end(capsys):
    report = mirror_progress(every_s=3600.0)
    report(1, 3, 10)
    report(2, 3, 20)
    report(3, 3, 30)
    err = capsys.readouterr().err.splitlines()
    assert err == ["flywheel:   mirrored 3 of 3 new objects (30 rows)"]


def test_stats_refuses_bad_options_before_touching_the_store(monkeypatch, capsys):
    from flywheel.cli import main

    monkeypatch.setenv("FLYWHEEL_STORE", "s3://nowhere/prefix")   # no endpoint nor credentials: never reached
    assert main(["stats", "--top", "x"]) == 2
    err = capsys.readouterr().err
    assert "--top must be an integer" in err and "mirroring" not in err
