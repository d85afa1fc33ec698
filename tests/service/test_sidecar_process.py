"""The real ``flywheel serve`` as a separate process: SIGTERM under load, a promotion
under load, and gRPC feedback that a later ``flywheel retrain`` sees.

The model is the real default one (the starter intents with the packaged MiniLM). It is
trained once per module into a base home (``flywheel classify --no-log``, ~10 s); each
test copies that home's cache so its server starts without training. Servers listen
on 127.0.0.1 only, every load loop is bounded in calls and in time, and a server still
running when a test ends is killed (by its own process object).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from flywheel.classifier.versions.registry import ModelRegistry
from flywheel.logstore import LogStore
from flywheel.service.client import FlywheelClient
from flywheel.service.servicer import SERVICE_NAME
from tests.support.paths import ROOT
from tests.support.servers import flywheel_cmd, free_port, wait_for
from tests.support.sidecar import Call, Load

pytestmark = pytest.mark.slow

READY_TIMEOUT_S = 90.0
GRACE_S = 5.0
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    env.update(FLYWHEEL_HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               OLLAMA_HOST=f"http://127.0.0.1:{free_port()}",  # nobody listens there
               PYTHONUNBUFFERED="1")
    return env


@pytest.fixture(scope="module")
def trained_home(tmp_path_factory) -> Path:
    """A home whose cache holds the default model, trained once for the module."""
    home = tmp_path_factory.mktemp("sidecar-base-home")
    proc = subprocess.run(flywheel_cmd("classify", "--no-log", "--teacher", "off", "--home", str(home), "warm"),
                          cwd=ROOT, env=_env(home), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [p for p in (home / "cache").iterdir() if (p / "manifest.json").is_file()], "no cached model"
    return home


@pytest.fixture
def home(trained_home, tmp_path) -> Path:
    """A fresh home with the trained default model already in its cache."""
    h = tmp_path / "home"
    shutil.copytree(trained_home / "cache", h / "cache", ignore=shutil.ignore_patterns("*.lock"))
    return h


def _cached_model(home: Path) -> Path:
    (model,) = [p for p in (home / "cache").iterdir() if (p / "manifest.json").is_file()]
    return model


class Sidecar:
    """A ``flywheel serve`` process on 127.0.0.1; its output goes to a file."""

    def __init__(self, home: Path, *extra: str, grace_s: float = GRACE_S) -> None:
        self.home = home
        self.grace_s = grace_s
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.log_path = home.parent / f"serve-{self.port}.log"
        home.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            flywheel_cmd("serve", "--address", self.target, "--teacher", "off", "--home", str(home),
                      "--grace", str(grace_s), *extra),
            cwd=ROOT, env=_env(home), stdout=self._log, stderr=subprocess.STDOUT)

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def wait_serving(self, timeout_s: float = READY_TIMEOUT_S) -> float:
        """Poll the standard health service until SERVING; returns the seconds it took."""
        t0 = time.monotonic()
        with grpc.insecure_channel(self.target) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while time.monotonic() - t0 < timeout_s:
                assert self.proc.poll() is None, f"server exited with {self.proc.returncode}:\n{self.output()}"
                try:
                    resp = stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=1.0)
                    if resp.status == SERVING:
                        return time.monotonic() - t0
                except grpc.RpcError:
                    pass
                time.sleep(0.2)
        raise AssertionError(f"not SERVING after {timeout_s:.0f}s:\n{self.output()}")

    def terminate(self) -> int:
        """SIGTERM, then the exit code (the process must exit within grace + 10 s)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=self.grace_s + 10)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"no exit within grace+10s after SIGTERM:\n{self.output()}") from None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()


@pytest.fixture
def sidecars():
    started: list[Sidecar] = []

    def start(home: Path, *extra: str, grace_s: float = GRACE_S) -> Sidecar:
        s = Sidecar(home, *extra, grace_s=grace_s)
        started.append(s)
        return s

    yield start
    for s in started:
        s.close()


def _logged_ids(home: Path) -> list[str]:
    store = LogStore(home / "log" / "flywheel.duckdb")  # ingests the spooled segments on open
    return [r[0] for r in store.query("SELECT decision_id FROM decisions")]


def test_sigterm_under_load_exits_0_and_every_answered_call_is_logged(home, sidecars):
    server = sidecars(home)
    server.wait_serving()
    load = Load(server.target, threads=8, max_calls=200, max_s=30.0, prefix="sigterm").start()
    # SIGTERM once the load is really flowing (bounded wait)
    assert wait_for(lambda: len(load.ok()) >= 64, 30.0), f"no load got through:\n{server.output()}"

    health_seen: list[str] = []
    health_stop = threading.Event()

    def watch_health() -> None:
        with grpc.insecure_channel(server.target) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            t0 = time.monotonic()
            while not health_stop.is_set() and time.monotonic() - t0 < GRACE_S + 10:
                try:
                    r = stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=0.5)
                    seen = health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
                except grpc.RpcError as exc:
                    seen = f"rpc:{exc.code().name}"
                if not health_seen or health_seen[-1] != seen:
                    health_seen.append(seen)
                time.sleep(0.005)

    watcher = threading.Thread(target=watch_health, daemon=True)
    watcher.start()
    assert wait_for(lambda: health_seen[:1] == ["SERVING"], 10.0), health_seen
    t_term = time.monotonic()
    rc = server.terminate()
    exit_s = time.monotonic() - t_term
    # the clients keep calling briefly after the exit, then stop
    time.sleep(0.3)
    load.stop.set()
    calls = load.join()
    health_stop.set()
    watcher.join(timeout=5)

    assert rc == 0, server.output()
    assert exit_s < GRACE_S + 10
    ok = [c for c in calls if c.code == "OK"]
    failed = [c for c in calls if c.code != "OK"]
    codes = {c.code for c in failed}
    print(f"\n{len(calls)} calls, {len(ok)} OK, failed by code "
          f"{ {k: sum(1 for c in failed if c.code == k) for k in sorted(codes)} }, "
          f"exit {rc} after {exit_s:.2f}s, health seen {health_seen}")
    in_flight = [c for c in ok if c.started < t_term < c.ended]
    last_s = max((c.ended for c in in_flight), default=t_term) - t_term
    reasons = sorted({(c.code, c.details.split(";")[0]) for c in failed})
    print(f"{len(in_flight)} calls in flight at SIGTERM answered OK (the last {last_s:.3f}s after it); "
          f"failures: {reasons}")
    assert ok and failed, "the load did not straddle the shutdown"
    # nothing failed before the shutdown began (calls in flight then were answered: a call
    # sent a moment before SIGTERM may still arrive after it and be refused, so no check there)
    assert all(c.ended >= t_term for c in failed), [(c.code, c.details) for c in failed if c.ended < t_term]
    # after it began: refused as UNAVAILABLE; never INTERNAL, DEADLINE_EXCEEDED, ... (CANCELLED: see below)
    assert codes <= {"UNAVAILABLE", "CANCELLED"}, {c.code: c.details for c in failed}
    # health: SERVING, NOT_SERVING once shutdown began (often too brief to catch), then unreachable
    assert health_seen[0] == "SERVING", health_seen
    assert set(health_seen) <= {"SERVING", "NOT_SERVING", "rpc:UNAVAILABLE", "rpc:CANCELLED"}, health_seen
    assert health_seen[-1] == "rpc:UNAVAILABLE", health_seen
    # every answered call is in the traffic log, once
    logged = _logged_ids(home)
    assert len(logged) == len(set(logged)), "a decision was logged twice"
    missing = {c.decision_id for c in ok} - set(logged)
    assert not missing, f"{len(missing)} of {len(ok)} answered decisions are not in the log"
    # The issue wants UNAVAILABLE only, and that is what the sidecar answers while it drains
    # (health NOT_SERVING, port still open). A call that reaches grpc's core just as
    # server.stop() closes the port, before a handler took it, is failed by grpc itself with
    # CANCELLED (grpc/grpc#41785, open upstream): the sidecar cannot map it. Both are refusals
    # of calls sent after SIGTERM, safe to retry; no call in flight at SIGTERM may fail.


def _models_home(home: Path) -> Path:
    """``<home>/models`` with versions v-a (promoted) and v-b: the cached default model
    copied twice, only the manifest's version field changed (the checksum covers the head)."""
    models = home / "models"
    for name in ("v-a", "v-b"):
        d = models / name
        shutil.copytree(_cached_model(home), d)
        manifest = json.loads((d / "manifest.json").read_text())
        manifest["version"] = name
        (d / "manifest.json").write_text(json.dumps(manifest, indent=2))
    ModelRegistry(models).promote("v-a")
    return models


def test_promotion_under_load_swaps_the_model_without_failed_calls(home, sidecars):
    models = _models_home(home)
    server = sidecars(home, "--model", str(models))
    server.wait_serving()
    load = Load(server.target, threads=4, max_calls=400, max_s=40.0, prefix="promote").start()
    try:
        assert wait_for(lambda: len(load.ok()) >= 8, 20.0), f"no load got through:\n{server.output()}"
        assert {c.model_version for c in load.ok()} == {"v-a"}
        t_promote = time.monotonic()
        ModelRegistry(models).promote("v-b")

        def first_b() -> Call | None:
            return next((c for c in load.ok() if c.model_version == "v-b"), None)

        # the sidecar's watcher checks CURRENT every 2 s, then loads the version
        assert wait_for(lambda: first_b() is not None, 15.0, 0.1), \
            f"no v-b decision 15s after the promotion:\n{server.output()}"
        swap_s = first_b().ended - t_promote
        switched = first_b().ended
        # keep the load on a little after the swap
        wait_for(lambda: sum(1 for c in load.ok() if c.started > switched) >= 8, 5.0)
    finally:
        load.stop.set()
        calls = load.join()
    with FlywheelClient(server.target) as fw:
        assert fw.model_info()["version"] == "v-b"
    assert server.terminate() == 0, server.output()

    failed = [c for c in calls if c.code != "OK"]
    print(f"\n{len(calls)} calls, swap visible {swap_s:.2f}s after the promotion")
    assert not failed, {c.code: c.details for c in failed}
    assert {c.model_version for c in calls} == {"v-a", "v-b"}
    # once a v-b answer came back, every call started later is answered by v-b
    late_a = [c for c in calls if c.started > switched and c.model_version != "v-b"]
    assert not late_a, late_a[:3]


def test_feedback_over_grpc_reaches_the_next_retrain(home, sidecars):
    token = "s3cret-token"
    server = sidecars(home, "--admin-token", token)
    server.wait_serving()
    with FlywheelClient(server.target, timeout_s=10.0) as anon:
        d = anon.classify("How do I call addVar in AVAP?")
        # Feedback needs the token; Classify does not
        with pytest.raises(grpc.RpcError) as info:
            anon.feedback(d.id, "PLATFORM")
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    human = "PLATFORM" if d.label != "PLATFORM" else "RETRIEVAL"
    with FlywheelClient(server.target, admin_token=token, timeout_s=10.0) as admin:
        assert admin.feedback(d.id, human) == human
        with pytest.raises(grpc.RpcError) as info:
            admin.feedback("no-such-decision", human)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert server.terminate() == 0, server.output()

    db = home / "log" / "flywheel.duckdb"
    labels = LogStore(db).query("SELECT label, author FROM labels WHERE decision_id = ? AND source = 'human'",
                                [d.id])
    assert labels == [(human, "grpc")]
    proc = subprocess.run(flywheel_cmd("retrain", "--json", "--dry-run", "--quiet", "--home", str(home),
                                    "--log-db", str(db)),
                          cwd=ROOT, env=_env(home), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["dry_run"] is True
    assert report["dataset"]["log_rows_human"] >= 1, report["dataset"]
    assert report["dataset"]["log_rows"] >= 1
    assert not (home / "models" / "CURRENT").exists()  # a dry run promotes nothing
