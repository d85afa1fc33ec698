"""Ports, waits and processes for tests that start servers.

- :func:`free_port` / :func:`free_ports`: free loopback ports (``free_ports`` holds them
  together while choosing, so the ``n`` ports are distinct).
- :func:`wait_for`: poll a predicate until it holds or a timeout passes (bounded).
- :func:`flywheel_cmd`: the command line that runs ``flywheel`` from this checkout in a
  separate process (``python -m flywheel ...``).
"""

from __future__ import annotations

import socket
import sys
import time
from typing import Callable


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (held together while chosen, so no repeats)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    """A loopback port nobody listens on (at the moment it is returned)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred: Callable[[], object], timeout_s: float, step_s: float = 0.05) -> bool:
    """Poll ``pred`` every ``step_s`` until it is true (then True) or ``timeout_s`` passed
    (then its value once more)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if pred():
            return True
        time.sleep(step_s)
    return pred()


def flywheel_cmd(*args: str) -> list[str]:
    """``[python, -m, flywheel, *args]``: the CLI of this checkout, as a subprocess argv."""
    return [sys.executable, "-m", "flywheel", *args]
