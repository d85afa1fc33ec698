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

The container image (``Dockerfile``) does the same (build the wheel, install it into a
fresh venv) and runs ``flywheel serve``; CI cannot build images, so
:func:`test_installed_sidecar_serves_and_stops_cleanly` runs the installed sidecar from
the venv instead, and two cheap tests (not slow) check the Dockerfile's entrypoint and the
Kubernetes manifest's gRPC probes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT
from tests.support.servers import free_port

# the tests that build and install the wheel are slow; the deployment-file checks are not
slow = pytest.mark.slow

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
        (wheel,) = dist.glob("flywheel_intent-*.whl")
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


@slow
def test_wheel_holds_the_packages_and_package_data_but_no_test_fixtures(wheel_install):
    wheel, _ = wheel_install
    names = zipfile.ZipFile(wheel).namelist()
    assert "flywheel/classifier/data/starter_intents.yaml" in names
    assert "flywheel/cli.py" in names and "flywheel/py.typed" in names
    assert not [n for n in names if "simulated_ollama" in n or n.startswith("tests/")]
    # one namespace: no bare top-level classifier/, service/, fleet/, logstore/ or training/
    assert {n.split("/")[0] for n in names if not n.startswith("flywheel_intent-")} == {"flywheel"}
    assert {n.split("/")[1] for n in names if n.startswith("flywheel/") and n.count("/") > 1} == {
        "classifier", "logstore", "fleet", "service", "training"}
    # the checkout's flywheel/<room> links arrive as the room's files, every module of it
    infos = zipfile.ZipFile(wheel).infolist()
    assert not [i.filename for i in infos if (i.external_attr >> 16) & 0o170000 == 0o120000]
    for room in ("classifier", "logstore", "fleet", "service", "training"):
        shipped = {n for n in names if n.startswith(f"flywheel/{room}/") and n.endswith(".py")}
        tracked = {f"flywheel/{p.relative_to(ROOT).as_posix()}" for p in (ROOT / room).rglob("*.py")
                   if "__pycache__" not in p.parts}
        assert shipped == tracked, (room, sorted(tracked ^ shipped))
    assert {"flywheel/service/protos/flywheel/v1/classifier.proto",
            "flywheel/service/protos/flywheel/v1/classifier_pb2.pyi"} <= set(names)
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    assert "Name: flywheel-intent" in zipfile.ZipFile(wheel).read(meta).decode().splitlines()


@slow
def test_installed_packages_come_from_the_venv_not_the_checkout(wheel_install, tmp_path):
    _, venv = wheel_install
    code = ("import flywheel.classifier as c, flywheel.logstore as l;"
            "from flywheel.classifier.settings.config import starter_intents_path;"
            "print(c.__file__); print(l.__file__); print(starter_intents_path())")
    out = _run_from_empty_dir(tmp_path, [str(venv / "bin" / "python"), "-c", code], tmp_path / "home")
    paths = [Path(line) for line in out.stdout.split()]
    assert len(paths) == 3
    for p in paths:
        assert p.is_file() and p.is_relative_to(venv), p
        assert not p.resolve().is_relative_to(ROOT), p


@slow
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


# ------------------------------------------------------------------ the sidecar, as the image runs it
_CLIENT = """
import json, sys
from grpc_health.v1 import health_pb2, health_pb2_grpc
import flywheel.service.client
from flywheel.service.client import FlywheelClient
with FlywheelClient(sys.argv[1], timeout_s=30.0) as fw:
    h = health_pb2_grpc.HealthStub(fw.channel).Check(
        health_pb2.HealthCheckRequest(service="flywheel.v1.IntentClassifier"), timeout=10)
    d = fw.classify(sys.argv[2])
    info = fw.model_info()
print(json.dumps({"client": flywheel.service.client.__file__, "decision": d.to_dict(), "model": info["version"],
                  "health": health_pb2.HealthCheckResponse.ServingStatus.Name(h.status)}))
"""


def _wait_serving(proc: subprocess.Popen, target: str, log_path: Path, timeout_s: float) -> float:
    """Poll the standard health service until SERVING (bounded); the seconds it took."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    t0 = time.monotonic()
    with grpc.insecure_channel(target) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() - t0 < timeout_s:
            assert proc.poll() is None, f"flywheel serve exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}"
            try:
                req = health_pb2.HealthCheckRequest(service="flywheel.v1.IntentClassifier")
                if stub.Check(req, timeout=1.0).status == health_pb2.HealthCheckResponse.SERVING:
                    return time.monotonic() - t0
            except grpc.RpcError:
                pass
            time.sleep(0.25)
    raise AssertionError(f"not SERVING after {timeout_s:.0f}s:\n{log_path.read_text()[-3000:]}")


@slow
def test_installed_sidecar_serves_and_stops_cleanly(wheel_install, tmp_path):
    """What the Dockerfile's runtime stage does: the wheel's ``flywheel serve`` from a fresh
    venv, an empty working directory and an empty FLYWHEEL_HOME (the first start trains the
    default model), a Classify call through the installed client, SIGTERM, exit code 0."""
    wheel, venv = wheel_install
    assert "flywheel/service/protos/flywheel/v1/classifier.proto" in zipfile.ZipFile(wheel).namelist()
    home, cwd, log_path = tmp_path / "home", tmp_path / "serve-cwd", tmp_path / "serve.log"
    cwd.mkdir()
    target = f"127.0.0.1:{free_port()}"
    env = _clean_env(FLYWHEEL_HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    with log_path.open("wb") as out:
        proc = subprocess.Popen([str(venv / "bin" / "flywheel"), "serve", "--address", target, "--teacher", "off",
                                 "--grace", "5"], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            ready_s = _wait_serving(proc, target, log_path, timeout_s=150.0)
            client = _run_from_empty_dir(tmp_path, [str(venv / "bin" / "python"), "-c", _CLIENT, target, QUERY],
                                         tmp_path / "client-home")
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    print(f"\ninstalled sidecar SERVING after {ready_s:.1f}s (first start: trains the default model)")
    result = json.loads(client.stdout.strip().splitlines()[-1])
    assert Path(result["client"]).is_relative_to(venv)          # the installed package, not the checkout
    assert result["health"] == "SERVING"
    assert result["decision"]["label"] == "RETRIEVAL"
    assert result["model"] == result["decision"]["model_version"]
    assert rc == 0, log_path.read_text()[-3000:]
    assert "flywheel sidecar stopped" in log_path.read_text()
    assert list(cwd.iterdir()) == []                             # nothing written to the working directory
    assert (home / "log" / "flywheel.duckdb").exists()
    from flywheel.logstore import LogStore

    ids = [r[0] for r in LogStore(home / "log" / "flywheel.duckdb").query("SELECT decision_id FROM decisions")]
    assert result["decision"]["id"] in ids


def test_every_package_folder_is_found_for_the_wheel():
    """setuptools finds the packages (``packages.find`` in pyproject.toml) through the
    ``flywheel/<room>`` links: every folder with an ``__init__.py`` under a room, with no list
    to keep up to date, and nothing outside ``flywheel``."""
    setuptools = pytest.importorskip("setuptools")
    with (ROOT / "pyproject.toml").open("rb") as fh:
        find = tomllib.load(fh)["tool"]["setuptools"]["packages"]["find"]
    found = set(setuptools.find_packages(str(ROOT), include=find["include"]))
    rooms = ("classifier", "logstore", "fleet", "service", "training")
    expected = {"flywheel"} | {".".join(("flywheel", *p.parent.relative_to(ROOT).parts))
                               for room in rooms for p in (ROOT / room).rglob("__init__.py")}
    assert found == expected
    assert {"flywheel.classifier.encoders", "flywheel.service.protos.flywheel.v1"} <= found


# ------------------------------------------------------------------ deployment files (cheap)
def _dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` in order, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            word, _, args = full.partition(" ")
            out.append((word.upper(), args.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def _flag(argv: list[str], name: str) -> str | None:
    """The value of ``--name`` (the last one wins, as with click)."""
    value = None
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(name + "="):
            value = a.split("=", 1)[1]
    return value


def test_dockerfile_runs_flywheel_serve_as_a_non_root_user_beyond_loopback():
    ins = _dockerfile_instructions(ROOT / "Dockerfile")
    froms = [i for i, (w, _) in enumerate(ins) if w == "FROM"]
    assert len(froms) >= 2, "a build stage and a runtime stage"
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] for w, a in ins if w == "ARG" and "=" in a}
    base = [a.split()[0] for w, a in ins if w == "FROM"]
    assert {args.get(b.strip("${}"), b) for b in base} == {"python:3.11-slim"}
    build = " ".join(a for w, a in ins[froms[0]:froms[1]] if w == "RUN")
    assert "pip wheel" in build and "--no-deps" in build
    runtime = ins[froms[-1]:]
    run = " ".join(a for w, a in runtime if w == "RUN")
    assert "python -m venv /opt/flywheel" in run and "pip install --no-cache-dir" in run

    (entry,) = [a for w, a in runtime if w == "ENTRYPOINT"]
    argv = json.loads(entry)  # exec form: flywheel is PID 1 and gets SIGTERM itself
    assert argv[:2] == ["/opt/flywheel/bin/flywheel", "serve"], argv
    host, _, port = _flag(argv, "--address").rpartition(":")
    assert host == "0.0.0.0", "the kubelet's gRPC probes connect to the pod IP, not to loopback"
    assert [a for w, a in runtime if w == "EXPOSE"] == [port] == ["50051"]

    user = [a for w, a in runtime if w == "USER"]
    assert user and user[-1].split(":")[0] not in ("root", "0")
    env = " ".join(a for w, a in runtime if w == "ENV")
    assert "FLYWHEEL_HOME=/var/lib/flywheel" in env
    assert any("/var/lib/flywheel" in a for w, a in runtime if w == "VOLUME")

    ignored = {ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
               if ln.strip() and not ln.startswith("#")}
    assert {".venv", ".git", ".bench", "models/*", "build", "dist"} <= ignored
    assert "**/__pycache__" in ignored or "__pycache__" in ignored


def test_kubernetes_sidecar_probes_use_grpc_on_the_container_port():
    from flywheel.service.servicer import SERVICE_NAME

    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "sidecar.yaml").read_text()) if d]
    (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deploy["spec"]["template"]["spec"]
    containers = pod.get("initContainers", []) + pod["containers"]
    (fw,) = [c for c in containers if c["name"] == "flywheel"]
    if fw in pod.get("initContainers", []):
        assert fw.get("restartPolicy") == "Always", "an init container must be a native sidecar"
    (app,) = [c for c in pod["containers"] if c["name"] != "flywheel"]

    ports = {p["containerPort"] for p in fw["ports"]}
    assert 50051 in ports
    ready, live = fw["readinessProbe"]["grpc"], fw["livenessProbe"]["grpc"]
    assert ready["port"] == live["port"] == 50051
    assert ready["service"] == SERVICE_NAME
    if "startupProbe" in fw:
        assert fw["startupProbe"]["grpc"]["port"] == 50051

    # the entrypoint's --address is not overridden to loopback; SIGKILL comes after --grace
    argv = [str(a) for a in fw.get("args", [])]
    address = _flag(argv, "--address")
    assert address is None or not address.startswith("127."), address
    grace = float(_flag(argv, "--grace") or 10.0)
    assert pod["terminationGracePeriodSeconds"] > grace

    env = {e["name"]: e for e in app.get("env", [])}
    assert env["FLYWHEEL_ADDR"]["value"] == "localhost:50051"
    fw_env = {e["name"]: e for e in fw.get("env", [])}
    token = fw_env["FLYWHEEL_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert token.get("optional") is True

    (mount,) = [m for m in fw["volumeMounts"] if m["mountPath"] == "/var/lib/flywheel"]
    assert mount["name"] in {v["name"] for v in pod["volumes"]}
    for c in (fw, app):
        assert c["resources"]["requests"], c["name"]
