"""The wheel works on its own: built from the repository, installed (not editable) into a
fresh virtual environment, ``flywheel classify`` runs from an empty directory.

Approach: the faithful one. The fresh venv gets ``pip install <wheel>`` with its
dependencies (torch CPU & co.) from the configured package registries, exactly what a
container image does. Measured on the 2-core dev machine: 76 s the first time, 73 s the
second (the registries are local file indexes, so pip's cache does not help), about
2 GB on disk; well under the ~4 minutes that would have justified installing with
``--no-deps`` and borrowing the dev venv's site-packages through a ``.pth`` file.
The venv lives in a temporary directory that is removed afterwards.

The wheel is built (``python -m build --wheel``) from a copy of the checkout's files
(``git ls-files``: tracked plus untracked, not ignored), so a stale ``build/`` in the
checkout cannot leak old modules into the wheel and the checkout is not written to.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
QUERY = "What is addVar in AVAP?"
_IGNORE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                                 ".pytest_cache", "models", ".bench", ".whl")


def _copy_checkout(dest: Path) -> None:
    """The files a clean clone would have (plus work not yet committed), links kept as links."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        shutil.copytree(ROOT, dest, symlinks=True, ignore=_IGNORE)
        return
    for rel in sorted({r for r in listed.decode().split("\0") if r}):
        src = ROOT / rel
        if not src.exists() and not src.is_symlink():  # deleted in the working tree
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel, follow_symlinks=False)


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
           and not k.startswith("FLYWHEEL_")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    return env


@pytest.fixture(scope="module")
def wheel_install():
    """``(wheel, venv)``: the built wheel and a fresh venv with it installed."""
    with tempfile.TemporaryDirectory(prefix="flywheel-wheel-") as tmp:
        tmp_dir = Path(tmp)
        src, dist, venv = tmp_dir / "src", tmp_dir / "dist", tmp_dir / "venv"
        _copy_checkout(src)
        built = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(src)],
                               env=_clean_env(), capture_output=True, text=True, timeout=600)
        assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
        (wheel,) = dist.glob("flywheel-*.whl")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        inst = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
                              env=_clean_env(), capture_output=True, text=True, timeout=1200)
        assert inst.returncode == 0, inst.stdout[-3000:] + inst.stderr[-3000:]
        shutil.rmtree(src)
        yield wheel, venv


def _run_from_empty_dir(tmp_path: Path, cmd: list[str], home: Path) -> subprocess.CompletedProcess:
    cwd = tmp_path / "empty"
    cwd.mkdir()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600,
                          env=_clean_env(FLYWHEEL_HOME=str(home), FLYWHEEL_TEACHER="off",
                                         HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert list(cwd.iterdir()) == []  # nothing is written to the working directory
    return proc


def test_wheel_holds_the_packages_and_package_data_but_no_test_fixtures(wheel_install):
    wheel, _ = wheel_install
    names = zipfile.ZipFile(wheel).namelist()
    assert "classifier/data/starter_intents.yaml" in names
    assert "flywheel/cli.py" in names
    assert not [n for n in names if "simulated_ollama" in n or n.startswith("tests/")]
    assert {n.split("/")[0] for n in names if not n.startswith("flywheel-")} == {
        "classifier", "logstore", "service", "training", "flywheel"}


def test_installed_packages_come_from_the_venv_not_the_checkout(wheel_install, tmp_path):
    _, venv = wheel_install
    code = ("import classifier, logstore; from classifier.config import starter_intents_path;"
            "print(classifier.__file__); print(logstore.__file__); print(starter_intents_path())")
    out = _run_from_empty_dir(tmp_path, [str(venv / "bin" / "python"), "-c", code], tmp_path / "home")
    paths = [Path(line) for line in out.stdout.split()]
    assert len(paths) == 3
    for p in paths:
        assert p.is_file() and p.is_relative_to(venv), p
        assert not p.resolve().is_relative_to(ROOT), p


@pytest.mark.parametrize("log", [False, True], ids=["no-log", "logged"])
def test_installed_flywheel_classifies_from_an_empty_dir(wheel_install, tmp_path, log):
    _, venv = wheel_install
    home = tmp_path / "home"
    cmd = [str(venv / "bin" / "flywheel"), "classify", QUERY] + ([] if log else ["--no-log"])
    proc = _run_from_empty_dir(tmp_path, cmd, home)
    decision = json.loads(proc.stdout.strip().splitlines()[-1])
    assert decision["label"] == "RETRIEVAL"
    assert decision["layer"] in {"embedding", "rules"}
    assert (home / "log" / "flywheel.duckdb").exists() == log
