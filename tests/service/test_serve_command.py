"""``flywheel serve`` on an address it cannot listen on: one ``flywheel: error:`` line that
names the reason, exit 2, nothing from grpc's core above it, and no model loaded first.
Real sockets on 127.0.0.1 hold the ports (issue 32, item 14)."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from flywheel.classifier.errors import ConfigError
from tests.support.paths import ROOT
from tests.support.servers import flywheel_cmd


@contextmanager
def listening(host: str = "127.0.0.1", family: int = socket.AF_INET) -> Iterator[int]:
    """A socket listening on a free port of ``host``: the port another process holds."""
    with socket.socket(family, socket.SOCK_STREAM) as held:
        held.bind((host, 0))
        held.listen()
        yield held.getsockname()[1]


@pytest.mark.slow   # starts flywheel as a process
def test_serve_on_a_port_in_use_says_so_in_one_line_and_exits_2(tmp_path):
    env = {**os.environ, "FLYWHEEL_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    with listening() as port:
        proc = subprocess.run(flywheel_cmd("serve", "--address", f"127.0.0.1:{port}", "--teacher", "off"),
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [                 # no grpc core line (E... add_port.cc) above it
        f"flywheel: error: cannot listen on 127.0.0.1:{port}: address already in use "
        f"(port {port}: another process listens there)"], proc.stderr[-2000:]
    assert proc.stdout == "" and not (tmp_path / "home" / "cache").exists()   # refused before any model


@pytest.mark.parametrize("address", ["127.0.0.1:{port}", "0.0.0.0:{port}", "localhost:{port}"])
def test_a_taken_port_is_refused_for_every_form_of_the_address(address):
    from flywheel.service.server import check_address

    with listening("0.0.0.0") as port:
        with pytest.raises(ConfigError, match=rf"address already in use \(port {port}"):
            check_address(address.format(port=port))


def test_a_free_port_any_port_and_a_foreign_address():
    from flywheel.service.server import check_address

    with listening() as port:
        pass
    check_address(f"127.0.0.1:{port}")   # free again
    check_address("127.0.0.1:0")          # any free port: grpc picks one
    with pytest.raises(ConfigError, match="cannot listen on 192.0.2.1:"):   # TEST-NET-1: not this machine's
        check_address(f"192.0.2.1:{port}")
    with pytest.raises(ConfigError, match="expected host:port"):
        check_address("127.0.0.1")


# -- issue 41, item 7: /metrics' port, and a port out of range, the same one line


def _serve(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FLYWHEEL_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    return subprocess.run(flywheel_cmd("serve", "--teacher", "off", *args), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def _one_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and proc.stdout == "", proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("flywheel: error: "), proc.stderr[-2000:]
    return lines[0]


@pytest.mark.slow
def test_serve_with_its_metrics_port_in_use_says_so_in_one_line_and_exits_2(tmp_path):
    with listening() as port:
        proc = _serve(tmp_path, "--address", "127.0.0.1:0", "--metrics-port", str(port))
    assert _one_line(proc) == (
        f"flywheel: error: cannot listen on 127.0.0.1:{port} (--metrics-address/--metrics-port): address already "
        f"in use (port {port}: another process listens there)")
    assert not (tmp_path / "home" / "cache").exists()   # refused before any model


@pytest.mark.slow
@pytest.mark.parametrize("args, words", [
    (["--metrics-port", "99999"], "Invalid value for '--metrics-port'"),
    (["--address", "127.0.0.1:99999"], "--address 127.0.0.1:99999: port 99999 is out of range (0 to 65535)"),
    (["--address", "127.0.0.1:0", "--metrics-port", "0", "--metrics-address", "192.0.2.1"],
     "cannot listen on 192.0.2.1:0 (--metrics-address/--metrics-port): 192.0.2.1 is not an address of this machine"),
])
def test_serve_refuses_a_port_out_of_range_or_a_foreign_metrics_address(tmp_path, args, words):
    """``:99999`` listened on port 34463 (99999 modulo 65536) without a word; now refused."""
    line = _one_line(_serve(tmp_path, *args))
    assert words in line, line
    assert not (tmp_path / "home" / "cache").exists()


def test_a_port_out_of_range_is_refused_wherever_the_sidecar_reads_one():
    from flywheel.service.metrics import ServerMetrics, start_metrics_http
    from flywheel.service.options import ServerOptions
    from flywheel.service.server import check_address, check_metrics_address

    with pytest.raises(ConfigError, match=r"port 99999 is out of range \(0 to 65535\)"):
        check_address("127.0.0.1:99999")
    with pytest.raises(ConfigError, match=r"--address \[::1\]:70000: port 70000 is out of range"):
        ServerOptions(address="[::1]:70000")
    with pytest.raises(ConfigError, match="--metrics-port: port 65536 is out of range"):
        ServerOptions(metrics_port=65536)
    with pytest.raises(ConfigError, match="--metrics-port: port -1 is out of range"):
        start_metrics_http(ServerMetrics(), -1)
    assert ServerOptions(uds="/tmp/flywheel.sock", address="ignored").uds   # a socket file: no port read
    with listening() as port:
        options = ServerOptions(metrics_port=port)
        with pytest.raises(ConfigError, match=rf"address already in use \(port {port}"):
            check_metrics_address(options)
        with pytest.raises(ConfigError, match=rf"127.0.0.1:{port} .*address already in use"):
            start_metrics_http(ServerMetrics(), port)     # taken after the early check: the same line
