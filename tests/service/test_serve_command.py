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
