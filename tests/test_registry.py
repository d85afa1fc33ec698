import threading

import pytest

from classifier import Classifier
from classifier.errors import ModelError
from classifier.intents import parse_intents
from classifier.registry import ModelRegistry
from classifier.trainer import fit_model
from tests.fakes import HashEmbedder
from tests.test_model import DOC


def save(reg, name):
    m = fit_model(parse_intents(DOC), embedder=HashEmbedder(), version=name)
    m.save(reg.version_dir(name))
    return m


def test_promote_list_rollback(tmp_path):
    reg = ModelRegistry(tmp_path / "models")
    save(reg, "v1")
    save(reg, "v2")
    with pytest.raises(ModelError, match="no version is promoted"):
        reg.current_path()
    reg.promote("v1")
    reg.promote("v2")
    assert reg.current_name() == "v2"
    assert [(v.name, v.current) for v in reg.versions()] == [("v1", False), ("v2", True)]
    assert reg.rollback() == "v1" and reg.current_name() == "v1"
    with pytest.raises(ModelError, match="nothing to roll back"):
        reg.rollback()
    with pytest.raises(ModelError, match="no version 'v9'"):
        reg.promote("v9")


def test_corrupt_version_cannot_be_promoted(tmp_path):
    reg = ModelRegistry(tmp_path)
    save(reg, "v1")
    (tmp_path / "v1" / "head.joblib").write_bytes(b"not a head")
    with pytest.raises(ModelError, match="checksum"):
        reg.promote("v1")
    assert reg.current_name() is None


def test_hot_reload_without_failing_requests(tmp_path):
    reg = ModelRegistry(tmp_path)
    save(reg, "v1")
    reg.promote("v1")
    clf = Classifier.from_registry(tmp_path, embedder=HashEmbedder(), interval_s=0.0)
    assert clf.model_version == "v1"
    errors, seen = [], set()
    done = threading.Event()

    def worker():
        try:
            while not done.is_set():  # bounded: the main thread sets it after the swap
                seen.add(clf.classify("show my invoices").model_version)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    save(reg, "v2")
    reg.promote("v2")
    for _ in range(500):  # wait (bounded) until a worker has served the new version
        if "v2" in seen:
            break
        threading.Event().wait(0.01)
    done.set()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    assert clf.classify("x y z").model_version == "v2"
    assert "v2" in seen


def test_corrupt_new_version_is_refused_old_keeps_serving(tmp_path, caplog):
    reg = ModelRegistry(tmp_path)
    save(reg, "v1")
    reg.promote("v1")
    clf = Classifier.from_registry(tmp_path, embedder=HashEmbedder(), interval_s=0.0)
    save(reg, "v2")
    (tmp_path / "v2" / "head.joblib").write_bytes(b"corrupt")
    (tmp_path / "CURRENT").write_text("v2\n")  # promoted behind the registry's back
    with caplog.at_level("ERROR"):
        d = clf.classify("show my invoices")
    assert d.model_version == "v1"
    assert "v2" in clf.watcher.refused and "refusing model version v2" in caplog.text
    # a version trained for another encoder is refused too
    other = fit_model(parse_intents(DOC), embedder=HashEmbedder(dim=64, id="fake:64"), version="v3")
    other.save(tmp_path / "v3")
    (tmp_path / "CURRENT").write_text("v3\n")
    assert clf.classify("show my invoices").model_version == "v1"
    assert "v3" in clf.watcher.refused
