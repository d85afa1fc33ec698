"""The gRPC sidecar for tests: in process on the fake embedder, and a load generator
for any running sidecar.

- :func:`serving`: a real sidecar (``create_server``) on a model directory, on a free
  loopback port, with a :class:`~tests.support.fakes.HashEmbedder`; stopped on exit.
- :func:`client`: a :class:`~service.client.FlywheelClient` on it.
- :class:`Load`: client threads calling Classify with distinct texts, bounded in calls and
  in time, remembering every :class:`Call` (used against ``flywheel serve`` processes).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import grpc

from flywheel.classifier.settings.config import load_config
from flywheel.service.client import FlywheelClient
from flywheel.service.server import ServerOptions, SidecarServer, create_server
from tests.support.fakes import HashEmbedder

LOCAL = "127.0.0.1:0"   # a free loopback port, picked by the server


@contextmanager
def serving(model_dir: Path, options: ServerOptions | None = None, *, start: bool = True,
            log_decisions: bool = True, **classifier_kwargs: Any) -> Iterator[SidecarServer]:
    """A sidecar on ``model_dir`` (a version dir or a models home), stopped on exit."""
    classifier_kwargs.setdefault("embedder", HashEmbedder())
    cfg = load_config(teacher="off", model=str(model_dir))
    server = create_server(cfg, options or ServerOptions(address=LOCAL), log_decisions=log_decisions,
                           **classifier_kwargs)
    try:
        if start:
            server.start()
        yield server
    finally:
        server.stop(grace_s=1.0)


def client(server: SidecarServer, **kw: Any) -> FlywheelClient:
    """A client on ``server`` (5 s timeout unless given)."""
    kw.setdefault("timeout_s", 5.0)
    return FlywheelClient(server.target, **kw)


@dataclass
class Call:
    text: str
    started: float
    ended: float
    code: str                     # "OK" or a grpc.StatusCode name
    decision_id: str | None = None
    model_version: str | None = None
    details: str = ""


@dataclass
class Load:
    """``threads`` clients calling Classify with distinct texts until ``stop`` is set,
    ``max_calls`` each, or ``max_s`` have passed: bounded whatever happens."""

    target: str
    threads: int
    max_calls: int
    max_s: float
    prefix: str = "q"
    calls: list[Call] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._workers = [threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(self.threads)]

    def start(self) -> "Load":
        self._t0 = time.monotonic()
        for w in self._workers:
            w.start()
        return self

    def join(self) -> list[Call]:
        for w in self._workers:
            w.join(timeout=self.max_s + 15)
        assert not any(w.is_alive() for w in self._workers), "a load thread did not stop"
        return self.calls

    def ok(self) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.code == "OK"]

    def _run(self, n: int) -> None:
        texts = ["how do I call addVar in AVAP", "write an AVAP function that adds two numbers",
                 "how much of my quota is left", "hello there, how are you"]
        with FlywheelClient(self.target, timeout_s=10.0) as fw:
            for i in range(self.max_calls):
                if self.stop.is_set() or time.monotonic() - self._t0 > self.max_s:
                    return
                text = f"{texts[(n + i) % len(texts)]} ({self.prefix} {n}-{i})"
                t = time.monotonic()
                try:
                    d = fw.classify(text)
                    call = Call(text, t, time.monotonic(), "OK", d.id, d.model_version)
                except grpc.RpcError as exc:
                    call = Call(text, t, time.monotonic(), exc.code().name, details=exc.details() or "")
                with self._lock:
                    self.calls.append(call)
                if call.code != "OK":
                    time.sleep(0.01)  # a refused call returns at once: do not spin
