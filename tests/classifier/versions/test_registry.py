import threading

import pytest

from flywheel.classifier import Classifier
from flywheel.classifier.errors import InvalidInputError, ModelError
from flywheel.classifier.layer2.fitter import fit_model
from flywheel.classifier.settings.intents import parse_intents
from flywheel.classifier.versions.registry import ModelRegistry
from tests.support.docs import DOC
from tests.support.fakes import HashEmbedder


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


def test_background_reload_runs_on_the_watcher_thread(tmp_path, monkeypatch):
    reg = ModelRegistry(tmp_path)
    save(reg, "v1")
    reg.promote("v1")
    swaps = []
    original = Classifier.swap_model

    def spy(self, model):
        swaps.append((model.version, threading.current_thread().name))
        original(self, model)

    monkeypatch.setattr(Classifier, "swap_model", spy)
    clf = Classifier.from_registry(tmp_path, embedder=HashEmbedder(), interval_s=0.02, background=True)
    try:
        assert clf.watcher.running
        save(reg, "v2")
        reg.promote("v2")
        for _ in range(500):  # bounded wait; no request is made meanwhile
            if clf.model_version == "v2":
                break
            threading.Event().wait(0.01)
        assert clf.model_version == "v2"
        assert swaps == [("v2", "flywheel-model-watcher")]
        assert clf.classify("show my invoices").model_version == "v2"
        assert len(swaps) == 1  # the request did not poll or reload
    finally:
        clf.close()
    assert not clf.watcher.running


# ------------------------------------------------------------------------ prune
def _names(path):
    return sorted(p.name for p in path.iterdir())


@pytest.fixture(scope="module")
def fitted():
    """v00..v08 fitted once; each test saves them into its own home."""
    return {f"v{i:02d}": fit_model(parse_intents(DOC), embedder=HashEmbedder(), version=f"v{i:02d}")
            for i in range(9)}


@pytest.fixture
def pruneable(tmp_path, fitted):
    """v01..v08: v01, v03, v05 promoted in turn (v05 served), the rest kept challengers;
    plus things that are not versions."""
    home = tmp_path / "models"
    reg = ModelRegistry(home)
    for i in range(1, 9):
        fitted[f"v{i:02d}"].save(reg.version_dir(f"v{i:02d}"))
    for name in ("v01", "v03", "v05"):
        reg.promote(name)
    (home / "notes").mkdir()                                   # a stray folder, no manifest
    (home / "notes" / "todo.txt").write_text("keep me")
    (home / "README.txt").write_text("stray file")
    (home / ".retrain.lock").write_text("")
    (home / ".v09.tmp1234").mkdir()                            # a save in progress (hidden)
    (home / ".v09.tmp1234" / "manifest.json").write_text("{}")
    return reg


def test_prune_keeps_current_last_promoted_and_recent(pruneable):
    reg, home = pruneable, pruneable.home
    before = _names(home)
    assert reg.prune(keep_promoted=2, keep_recent=2, dry_run=True) == ["v01", "v02", "v04", "v06"]
    assert _names(home) == before and reg.history() == ["v01", "v03", "v05"]  # the dry run changed nothing
    assert reg.prune(keep_promoted=2, keep_recent=2) == ["v01", "v02", "v04", "v06"]
    assert [v.name for v in reg.versions()] == ["v03", "v05", "v07", "v08"]
    assert _names(home) == sorted([".current.lock", ".retrain.lock", ".v09.tmp1234", "CURRENT", "HISTORY",
                                   "README.txt", "notes", "v03", "v05", "v07", "v08"])
    assert (home / "notes" / "todo.txt").read_text() == "keep me"
    assert (home / ".v09.tmp1234" / "manifest.json").is_file()
    assert reg.current_name() == "v05" and reg.history() == ["v03", "v05"]
    assert reg.prune(keep_promoted=2, keep_recent=2) == []     # idempotent
    assert reg.rollback() == "v03"                             # rollback still works ...
    with pytest.raises(ModelError, match="nothing to roll back"):
        reg.rollback()                                         # ... as far back as was kept


def test_prune_always_keeps_current(pruneable):
    reg = pruneable
    reg.promote("v01")                                         # HISTORY v01 v03 v05 v01
    assert reg.prune(keep_promoted=0, keep_recent=0) == ["v02", "v03", "v04", "v05", "v06", "v07", "v08"]
    assert [v.name for v in reg.versions()] == ["v01"]
    assert reg.current_name() == "v01" and reg.history() == ["v01"]
    assert reg.load_current().version == "v01"


def test_prune_recent_counts_kept_challengers_and_large_keeps_remove_nothing(pruneable):
    reg = pruneable
    # keep_recent larger than the number of versions, keep_promoted larger than HISTORY
    assert reg.prune(keep_promoted=10, keep_recent=10, dry_run=True) == []
    # the newest versions are kept challengers: they survive, older challengers go
    assert reg.prune(keep_promoted=3, keep_recent=3) == ["v02", "v04"]
    assert [v.name for v in reg.versions()] == ["v01", "v03", "v05", "v06", "v07", "v08"]
    assert reg.history() == ["v01", "v03", "v05"]


def test_prune_negative_keeps_are_refused(pruneable):
    before = _names(pruneable.home)
    with pytest.raises(InvalidInputError, match="keep_promoted must be >= 0, got -1"):
        pruneable.prune(keep_promoted=-1)
    with pytest.raises(InvalidInputError, match="keep_recent must be >= 0, got -3"):
        pruneable.prune(keep_recent=-3, dry_run=True)
    with pytest.raises(InvalidInputError, match="keep_recent must be an integer"):
        pruneable.prune(keep_recent=1.5)
    assert _names(pruneable.home) == before


def test_prune_finishes_interrupted_deletions_and_unlinks_linked_versions(tmp_path, fitted, pruneable):
    reg, home = pruneable, pruneable.home
    half = home / "..pruning-v00-deadbeef"                      # left by a prune that crashed
    (half / "sub").mkdir(parents=True)
    (half / "sub" / "head.joblib").write_bytes(b"x")
    outside = tmp_path / "elsewhere" / "v00"
    fitted["v00"].save(outside)
    (home / "v00").symlink_to(outside, target_is_directory=True)
    assert "v00" in [v.name for v in reg.versions()]
    assert reg.prune(keep_promoted=1, keep_recent=1) == ["v00", "v01", "v02", "v03", "v04", "v06", "v07"]
    assert not half.exists() and not any(p.name.startswith("..pruning-") for p in home.iterdir())
    assert (outside / "manifest.json").is_file()               # only the link went
    assert [v.name for v in reg.versions()] == ["v05", "v08"] and reg.history() == ["v05"]


def test_cli_models_prune(pruneable, capsys):
    from filelock import FileLock
    from typer.testing import CliRunner

    from flywheel.classifier.errors import FlywheelError
    from flywheel.cli import build_app, main

    app = build_app()
    home = pruneable.home
    args = ["models", "prune", "--models", str(home), "--keep-promoted", "2", "--keep-recent", "2"]
    before = _names(home)
    r = CliRunner().invoke(app, [*args, "--dry-run"])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == ["would remove v01", "would remove v02", "would remove v04",
                                     "would remove v06",
                                     f"dry run: would remove 4 of 8 versions, 4 kept, in {home}"]
    assert _names(home) == before
    with FileLock(str(home / ".retrain.lock")):                # a retrain is running: refuse
        r = CliRunner().invoke(app, args)
    assert isinstance(r.exception, FlywheelError) and "a retrain is running" in str(r.exception)
    assert _names(home) == before
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == ["removed v01", "removed v02", "removed v04", "removed v06",
                                     f"removed 4 of 8 versions, 4 kept, in {home}"]
    assert [v.name for v in ModelRegistry(home).versions()] == ["v03", "v05", "v07", "v08"]
    # through the real entry point: a negative keep is one error line and exit code 2
    capsys.readouterr()
    assert main(["models", "prune", "--models", str(home), "--keep-recent", "-1"]) == 2
    assert capsys.readouterr().err == "flywheel: error: keep_recent must be >= 0, got -1\n"
    assert [v.name for v in ModelRegistry(home).versions()] == ["v03", "v05", "v07", "v08"]


# ------------------------------------------------------------- the Registry contract
def test_model_registry_is_a_registry(tmp_path):
    from flywheel.classifier.protocols import Registry

    reg = ModelRegistry(tmp_path / "models")
    assert isinstance(reg, Registry)
    assert reg.current() == (None, None)
    save(reg, "v1")
    assert reg.promote("v1", expected=None) == "v1"
    assert reg.current() == ("v1", "v1")
    assert reg.load("v1").version == "v1" and reg.staging_dir("v2") == reg.home / "v2"
    with pytest.raises(ModelError, match="invalid version name"):
        reg.load("../v1")


def test_promote_compares_and_swaps(tmp_path):
    from flywheel.classifier.versions.registry import PromotionConflict

    reg = ModelRegistry(tmp_path / "models")
    for name in ("v1", "v2", "v3"):
        save(reg, name)
    reg.promote("v1", expected=None)
    _, token = reg.current()
    assert reg.promote("v2", expected=token) == "v2"
    # a stale token (v1), or "nothing promoted": refused, nothing changes
    for stale in (token, None):
        with pytest.raises(PromotionConflict, match="expected (v1|none), found v2") as info:
            reg.promote("v3", expected=stale)
        assert isinstance(info.value, ModelError)
        assert (info.value.expected, info.value.found) == (stale, "v2") and str(reg.home) in str(info.value)
    assert reg.current_name() == "v2" and reg.history() == ["v1", "v2"]
    with pytest.raises(PromotionConflict, match="expected v1, found v2"):
        reg.rollback(expected="v1")
    assert reg.current_name() == "v2" and reg.history() == ["v1", "v2"]
    assert reg.rollback(expected="v2") == "v1"
    reg.promote("v3")                                      # no expected: unconditional, as before
    assert reg.current_name() == "v3"


def test_promotion_conflict_survives_pickling():
    import pickle

    from flywheel.classifier.versions.registry import PromotionConflict

    exc = pickle.loads(pickle.dumps(PromotionConflict("v1", None, "home")))
    assert (exc.expected, exc.found) == ("v1", None)
    assert str(exc) == "home: the served version moved: expected v1, found none"


def test_racing_promotions_one_wins(tmp_path, fitted):
    """Eight threads promote eight versions against the same token: exactly one wins."""
    from flywheel.classifier.versions.registry import PromotionConflict

    reg = ModelRegistry(tmp_path / "models")
    for name in ("v00", *(f"v0{i}" for i in range(1, 9))):
        fitted.get(name, fitted["v00"]).save(reg.version_dir(name))
    reg.promote("v00")
    won, lost = [], []
    start = threading.Barrier(8)

    def worker(name):
        start.wait(timeout=30)
        try:
            won.append(ModelRegistry(reg.home).promote(name, expected="v00"))
        except PromotionConflict as exc:
            lost.append(exc.found)

    threads = [threading.Thread(target=worker, args=(f"v0{i}",)) for i in range(1, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(won) == 1 and len(lost) == 7 and set(lost) == set(won)
    assert reg.current_name() == won[0] and reg.history() == ["v00", won[0]]


HOLDER = """
import sys
from flywheel.classifier.versions.registry import ModelRegistry
with ModelRegistry(sys.argv[1]).lock() as taken:
    print("held" if taken else "busy", flush=True)
    sys.stdin.readline()
"""


def _holder(home):
    """A process that tries the retrain lock, says whether it got it, and keeps it until told."""
    import select
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(home)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    if not ready:
        proc.kill()
        pytest.fail("the lock holder did not answer in 60 s")
    return proc, proc.stdout.readline().strip()


def _release(proc):
    proc.stdin.write("\n")
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0


@pytest.mark.slow
def test_retrain_lock_is_exclusive_across_processes(tmp_path):
    reg = ModelRegistry(tmp_path / "models")
    proc, said = _holder(reg.home)
    try:
        assert said == "held"
        with reg.lock() as taken:
            assert taken is False
    finally:
        _release(proc)
    with reg.lock() as taken:
        assert taken is True
        proc, said = _holder(reg.home)
        _release(proc)
        assert said == "busy"
    with reg.lock() as taken:                               # released on exit
        assert taken is True


def test_a_run_that_writes_nothing_creates_no_home_for_the_lock(tmp_path):
    reg = ModelRegistry(tmp_path / "models")
    with reg.lock(create=False) as taken:
        assert taken is True
    assert not reg.home.exists()
    with reg.lock() as taken:
        assert taken is True
    assert (reg.home / ".retrain.lock").exists()


# -------------------------------------------------------------- publish and install
def test_publish_copies_create_only(tmp_path, fitted):
    reg = ModelRegistry(tmp_path / "models")
    elsewhere = fitted["v01"].save(tmp_path / "trained" / "v01")
    assert reg.publish(elsewhere) == "v01"
    assert reg.load("v01").version == "v01" and (elsewhere / "manifest.json").is_file()
    with pytest.raises(ModelError, match="'v01' already exists"):
        reg.publish(elsewhere)
    assert reg.publish(reg.version_dir("v01")) == "v01"      # already here: nothing to do
    fitted["v02"].save(reg.version_dir("v02"))
    assert reg.publish(reg.version_dir("v02")) == "v02"
    with pytest.raises(ModelError, match="not a model version"):
        reg.publish(tmp_path / "trained")
    assert reg.current_name() is None                        # publishing serves nothing
    assert not [p for p in reg.home.iterdir() if "publish" in p.name]


def test_install_refuses_and_removes_a_tampered_download(tmp_path, fitted):
    reg = ModelRegistry(tmp_path / "models")
    fitted["v01"].save(reg.version_dir("v01"))
    reg.promote("v01")
    download = fitted["v02"].save(reg.home / ".download-v02")
    intents = download / "intents.yaml"
    intents.write_text(intents.read_text().replace("RETRIEVAL", "RETRIEVAL ", 1))
    with pytest.raises(ModelError, match="intents.yaml: checksum does not match"):
        reg.install("v02", download)
    assert not download.exists() and not reg.version_dir("v02").exists()
    assert reg.current_name() == "v01" and reg.history() == ["v01"]
    # an intact download is moved in and can be promoted
    download = fitted["v02"].save(reg.home / ".download-v02")
    assert reg.install("v02", download) == reg.version_dir("v02") and not download.exists()
    reg.promote("v02", expected="v01")
    # the same version again: kept; another version under that name: refused; both downloads go
    again = fitted["v02"].save(reg.home / ".again")
    (again / "manifest.json").write_bytes((reg.version_dir("v02") / "manifest.json").read_bytes())
    assert reg.install("v02", again) == reg.version_dir("v02") and not again.exists()
    other = fitted["v03"].save(reg.home / ".other")
    with pytest.raises(ModelError, match="another version named 'v02'"):
        reg.install("v02", other)
    assert not other.exists() and reg.load("v02").version == "v02" and reg.current_name() == "v02"


def test_install_repairs_a_corrupt_copy_and_takes_downloads_from_elsewhere(tmp_path, fitted):
    reg = ModelRegistry(tmp_path / "models")
    fitted["v01"].save(reg.version_dir("v01"))
    (reg.version_dir("v01") / "head.npz").write_bytes(b"rotten")
    download = fitted["v01"].save(tmp_path / "downloads" / "v01")
    (download / "manifest.json").write_bytes((reg.version_dir("v01") / "manifest.json").read_bytes())
    assert reg.install("v01", download) == reg.version_dir("v01")
    assert reg.load("v01").version == "v01" and not download.exists()
    assert not [p for p in reg.home.iterdir() if p.name.startswith(".")]


def test_the_local_registrys_log_lines_say_they_are_local(tmp_path, fitted, caplog):
    """On a replica these lines sit beside the fleet's ``promoted v2 in s3://...``: each names
    the local models home, so none reads like a fleet promotion (issue 26)."""
    import logging

    reg = ModelRegistry(tmp_path / "models")
    elsewhere = fitted["v01"].save(tmp_path / "trained" / "v01")
    download = fitted["v02"].save(reg.home.parent / ".download-v02")
    with caplog.at_level(logging.INFO, logger="flywheel.registry"):
        reg.publish(elsewhere)
        reg.promote("v01")
        reg.install("v02", download)
        reg.set_shadow("v02")
    lines = [r.getMessage() for r in caplog.records if r.name == "flywheel.registry"]
    assert [ln.split()[0] for ln in lines] == ["published", "promoted", "installed", "shadow"], lines
    assert all(f"in the local models home {reg.home}" in ln or f"into the local models home {reg.home}" in ln
               for ln in lines), lines
