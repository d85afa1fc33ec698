"""The flywheel end to end: classifier + DuckDB log + simulated Ollama + labels + CLI."""

from __future__ import annotations

import copy
import threading

import pytest

from flywheel.classifier import Classifier, Layer
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.settings.config import load_config
from flywheel.classifier.settings.intents import parse_intents
from flywheel.classifier.teachers import CircuitBreaker, OllamaTeacher
from flywheel.cli import main
from flywheel.logstore import LogStore
from flywheel.training.labeling import backfill_pending
from flywheel.training.stats.traffic import convergence
from tests.support.docs import ALWAYS_SURE, ALWAYS_UNSURE, DOC
from tests.support.fakes import HashEmbedder
from tests.support.simulated_ollama import SimulatedOllama


def classifier(thresholds, **kw):
    d = copy.deepcopy(DOC)
    d["thresholds"] = thresholds
    emb = HashEmbedder()
    return Classifier(fit_model(parse_intents(d), embedder=emb), embedder=emb, **kw)


def test_concurrent_classify_logs_every_decision_exactly_once(tmp_path):
    store = LogStore(tmp_path / "log.duckdb")
    clf = classifier(ALWAYS_SURE, log_sink=store.open_sink(flush_interval_s=0.05))
    ids: list[str] = []
    lock = threading.Lock()

    def worker(n):
        for i in range(60):
            d = clf.classify(f"show my invoices {n}-{i}", session_id=f"s{n}")
            with lock:
                ids.append(d.id)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    clf.close()
    rows = store.query("SELECT decision_id, count(*) FROM decisions GROUP BY decision_id")
    assert len(ids) == 480 and sorted(r[0] for r in rows) == sorted(ids)
    assert all(n == 1 for _, n in rows)
    assert store.query("SELECT count(*) FROM embeddings")[0][0] == 480


def test_teacher_down_marks_pending_then_label_backfills(tmp_path):
    truth = {"explain addparam": "RETRIEVAL", "my billing history please": "PLATFORM"}
    store = LogStore(tmp_path / "log.duckdb")
    with SimulatedOllama(truth, accuracy=1.0, latency_scale=0.0) as sim:
        teacher = OllamaTeacher("sim", host=sim.url, timeout_s=2.0, breaker=CircuitBreaker(2, 60.0))
        clf = classifier(ALWAYS_UNSURE, teacher=teacher, log_sink=store.open_sink())
        sim.mode = "down"
        down = [clf.classify(t) for t in truth]
        assert all(d.layer is Layer.EMBEDDING and "llm unavailable" in d.reason for d in down)
        clf.log_sink.flush()
        assert {p[1] for p in store.pending()} == set(truth)
        # still down: `label` stops early and everything stays pending
        counts = backfill_pending(store, classifier(ALWAYS_UNSURE, teacher=OllamaTeacher("sim", host=sim.url,
                                                                                   timeout_s=2.0)), progress=False)
        assert counts["labelled"] == 0 and counts["remaining"] == 2 and "stopped_because" in counts
        sim.mode = None
        counts = backfill_pending(store, classifier(ALWAYS_UNSURE, teacher=OllamaTeacher("sim", host=sim.url,
                                                                                   timeout_s=2.0)), progress=False)
        assert counts == {"pending": 2, "labelled": 2, "invalid": 0, "remaining": 0}
        assert store.pending() == []
        rows = {r.text: r.teacher_label for r in store.labelled_rows()}
        assert rows == truth
        clf.close()


def test_garbage_from_the_teacher_is_never_a_training_label(tmp_path):
    store = LogStore(tmp_path / "log.duckdb")
    with SimulatedOllama({"explain addparam": "RETRIEVAL"}, latency_scale=0.0) as sim:
        clf = classifier(ALWAYS_UNSURE, teacher=OllamaTeacher("sim", host=sim.url, timeout_s=2.0),
                         log_sink=store.open_sink())
        sim.mode = "garbage"
        d = clf.classify("explain addparam")
        clf.close()
    assert d.teacher is not None and not d.teacher.valid and "malformed" in d.reason
    assert store.labelled_rows() == []
    assert store.query("SELECT teacher_valid FROM decisions")[0][0] is False


def test_audit_answers_are_stored_and_show_in_stats(tmp_path):
    from flywheel.service.runtime import open_runtime

    truth = {"show my invoices": "PLATFORM", "what is addvar": "PLATFORM"}  # the teacher disagrees once
    with SimulatedOllama(truth, accuracy=1.0, latency_scale=0.0) as sim:
        cfg = load_config(home=tmp_path, ollama_host=sim.url, audit_rate=1.0)
        emb = HashEmbedder()
        d = copy.deepcopy(DOC)
        d["thresholds"] = ALWAYS_SURE
        model = fit_model(parse_intents(d), embedder=emb)
        model.save(tmp_path / "m")
        cfg.model = str(tmp_path / "m")
        served = open_runtime(cfg, progress=False, embedder=emb)
        for text in truth:
            assert served.classifier.classify(text).layer is Layer.EMBEDDING
        served.close()
    stats = convergence(served.store, window=10)
    assert stats["windows"][0]["audited"] == 2 and stats["windows"][0]["audit_labelled"] == 2
    assert stats["windows"][0]["audit_agree"] == 1


def test_unwritable_log_path_is_a_clear_error_at_start(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rc = main(["classify", "--log-db", str(blocker / "log.duckdb"), "hello"])
    err = capsys.readouterr().err
    assert rc == 2 and "not writable" in err and "Traceback" not in err


def test_models_cli_list_promote_rollback(tmp_path, capsys):
    from flywheel.classifier.versions.registry import ModelRegistry

    reg = ModelRegistry(tmp_path / "models")
    for name in ("v1", "v2"):
        fit_model(parse_intents(DOC), embedder=HashEmbedder(), version=name).save(reg.version_dir(name))
    home = ["--models", str(reg.home)]
    assert main(["models", "promote", "v1", *home]) == 0
    assert main(["models", "promote", "v2", *home]) == 0
    assert main(["models", "list", *home]) == 0
    out = capsys.readouterr().out
    assert "* v2" in out and "  v1" in out
    assert main(["models", "rollback", *home]) == 0
    assert "rolled back to v1" in capsys.readouterr().out and reg.current_name() == "v1"
    (reg.home / "v2" / "head.joblib").write_bytes(b"corrupt")
    assert main(["models", "promote", "v2", *home]) == 3
    assert "checksum" in capsys.readouterr().err and reg.current_name() == "v1"


def test_train_refuses_a_models_home_as_out(tmp_path, capsys, monkeypatch):
    import yaml

    import flywheel.classifier.layer2.fitter

    def no_training(*a, **kw):
        raise AssertionError("trained although --out is refused")

    monkeypatch.setattr(flywheel.classifier.layer2.fitter, "fit_model", no_training)
    intents = tmp_path / "intents.yaml"
    intents.write_text(yaml.safe_dump(DOC))
    models = load_config().models_dir                        # <home>/models, not there yet
    pointed = tmp_path / "pointed"                           # another home: a CURRENT pointer
    pointed.mkdir()
    (pointed / "CURRENT").write_text("v1\n")
    holding = tmp_path / "holding"                           # another home: a version in it
    (holding / "v1").mkdir(parents=True)
    (holding / "v1" / "manifest.json").write_text("{}")
    for args in (["--out", str(models)], ["--out", str(pointed)], ["--out", str(holding)],
                 ["--models", str(tmp_path / "m"), "--out", str(tmp_path / "m")],
                 ["--out", str(models), "--promote"]):
        rc = main(["train", "--intents", str(intents), *args])
        err = capsys.readouterr().err
        assert rc == 2 and "is a models home, not a version directory" in err and "Traceback" not in err, args
        assert len(err.strip().splitlines()) == 1
    assert main(["train", "--intents", str(intents)]) == 2
    assert "give --out DIR" in capsys.readouterr().err
    assert not models.exists() and not (tmp_path / "m").exists()


@pytest.mark.parametrize("window", ["0", "fortnight", "-3"])
def test_stats_rejects_bad_windows(window, capsys, tmp_path):
    rc = main(["stats", "--home", str(tmp_path), "--window", window])
    assert rc == 2 and "window" in capsys.readouterr().err


def test_feedback_checks_labels_without_training_a_model(tmp_path, capsys):
    store = LogStore(tmp_path / "log" / "flywheel.duckdb")
    clf = classifier(ALWAYS_SURE, log_sink=store.open_sink())
    d = clf.classify("show my invoices")
    clf.close()
    rc = main(["feedback", "--home", str(tmp_path), d.id, "NOT_A_LABEL"])
    assert rc == 2 and "unknown label 'NOT_A_LABEL'" in capsys.readouterr().err  # starter intent labels
    assert main(["feedback", "--home", str(tmp_path), d.id, "PLATFORM"]) == 0
    assert not (tmp_path / "cache").exists()  # no default model was trained to learn the labels
