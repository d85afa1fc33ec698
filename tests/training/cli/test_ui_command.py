"""``flywheel ui`` on an address it cannot listen on (issue 41, item 7): one
``flywheel: error:`` line that names the address and why, exit 2, no traceback, and the
traffic log not opened first. A real socket on 127.0.0.1 holds the port."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from flywheel.classifier.errors import ConfigError
from flywheel.cli import main
from tests.support.paths import ROOT
from tests.support.servers import flywheel_cmd


@contextmanager
def listening(host: str = "127.0.0.1") -> Iterator[int]:
    """A socket listening on a free port of ``host``: the port another process holds."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind((host, 0))
        held.listen()
        yield held.getsockname()[1]


def _one_line(rc: int, out: str, err: str) -> str:
    assert rc == 2 and out == "", (rc, out, err)
    assert "Traceback" not in err and err.startswith("flywheel: error: ") and err.count("\n") == 1, err
    return err.strip()


def test_ui_on_a_port_in_use_is_one_line_and_exit_2(capsys, tmp_path):
    with listening() as port:
        rc = main(["ui", "--port", str(port), "--log-db", str(tmp_path / "log.duckdb")])
    line = _one_line(rc, *capsys.readouterr())
    assert line == (f"flywheel: error: cannot listen on 127.0.0.1:{port} (--host/--port): address already in use "
                    f"(port {port}: another process listens there)")
    assert not (tmp_path / "log.duckdb").exists()          # refused before the log is opened


@pytest.mark.parametrize("host, words", [
    ("192.0.2.1", "cannot listen on 192.0.2.1:0 (--host/--port): 192.0.2.1 is not an address of this machine"),
    ("no-such-host.invalid", "cannot listen on no-such-host.invalid:0 (--host/--port): unknown host"),
])
def test_ui_on_an_address_not_of_this_machine_is_one_line_and_exit_2(capsys, tmp_path, host, words):
    rc = main(["ui", "--host", host, "--port", "0", "--log-db", str(tmp_path / "log.duckdb")])
    assert words in _one_line(rc, *capsys.readouterr())


def test_ui_refuses_a_port_out_of_range(capsys):
    rc = main(["ui", "--port", "99999"])
    assert "Invalid value for '--port'" in _one_line(rc, *capsys.readouterr())


def test_make_server_names_the_address_it_cannot_listen_on(tmp_path):
    from flywheel.fleet.human_labels import HumanLabels
    from flywheel.logstore import LogStore
    from flywheel.training.review.app import ReviewApp, make_server

    store = LogStore(tmp_path / "log.duckdb")
    app = ReviewApp(store, HumanLabels(store, lambda: None))
    with listening() as port:
        with pytest.raises(ConfigError, match=rf"127.0.0.1:{port} \(--host/--port\): address already in use"):
            make_server(app, "127.0.0.1", port)
    with pytest.raises(ConfigError, match="--port: port 65536 is out of range"):
        make_server(app, "127.0.0.1", 65536)


@pytest.mark.slow
def test_the_real_ui_process_says_it_in_one_line(tmp_path):
    env = {**os.environ, "FLYWHEEL_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    with listening() as port:
        proc = subprocess.run(flywheel_cmd("ui", "--port", str(port)), cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=60)
    assert _one_line(proc.returncode, proc.stdout, proc.stderr) == (
        f"flywheel: error: cannot listen on 127.0.0.1:{port} (--host/--port): address already in use "
        f"(port {port}: another process listens there)")
    assert not (tmp_path / "home" / "log").exists()
