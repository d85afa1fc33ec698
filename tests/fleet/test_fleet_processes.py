"""The whole fleet as separate processes against the real S3 server (``weed mini``):
``flywheel serve`` replicas, and ``flywheel stats``/``retrain``/``models`` as CLI processes,
sharing one store prefix.

One set of replicas serves the whole module (``fleet``): the module trains a tiny English
intent set once (the real MiniLM on ONNX Runtime, whose export is shared through the
session's ``FLYWHEEL_ONNX_CACHE``), publishes and promotes it with ``flywheel models push
--promote``, and starts replicas A and B with empty homes, so they start on the fleet's
version. Every replica ships every 0.2 s and polls ``models/CURRENT`` every 0.2 s.

- two replicas answer; ``flywheel stats`` elsewhere sees each decision once; a ``flywheel
  retrain`` process promotes, every running replica follows, a fresh one starts on it;
- ``Feedback`` at B for A's decision is accepted, what B can rule out is ``NOT_FOUND``, and
  the label is mirrored once (even when it reaches the store before its decision);
- ``kill -9`` of a replica with segments in its spool: the restart ships them, nothing is
  duplicated, only the last flush interval's answers may be lost;
- the store stopped under load: no request fails or waits, the spool grows, every decision
  arrives after the restart;
- two ``flywheel models promote`` processes against the same ``CURRENT``: one wins, the
  other says which version moved in, in one line;
- no credential in any output, log line or ``/metrics``.

Each test tags its query texts with its own marker, so it counts only its own decisions in
the shared log. Every wait is bounded in time; every process is ended by its own process
object (SIGTERM, then SIGKILL) when the module ends, whatever happened.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import grpc
import pyarrow as pa
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from flywheel.logstore import LogStore
from flywheel.service.client import FlywheelClient
from flywheel.service.servicer import SERVICE_NAME
from tests.support.paths import ROOT
from tests.support.servers import flywheel_cmd, free_port, wait_for
from tests.support.sidecar import Load

pytestmark = pytest.mark.slow

READY_TIMEOUT_S = 120.0
SHIP_S = 0.2                 # FLYWHEEL_SHIP_INTERVAL of every replica
POLL_S = 0.2                 # FLYWHEEL_STORE_POLL of every replica
FLUSH_S = 0.5                # the spool writer's flush interval (SpoolSink's default): kill -9 may lose this much
CLI_TIMEOUT_S = 240.0

TINY_INTENTS = """\
version: 1
name: fleet-tiny
languages: [en]
embedder:
  backend: minilm
  num_threads: 1
intents:
  - name: RETRIEVAL
    description: Questions about the AVAP language and its documentation.
    examples:
      - What is addVar in AVAP?
      - How does addParam work?
      - Explain the syntax of AVAP loops
      - What does the getQueryParamList command return?
      - Where is the documentation for AVAP variables?
      - How do conditionals work in AVAP?
      - What is the difference between addVar and addResult?
      - Which data types does AVAP support?
  - name: CODE_GENERATION
    description: Requests to write AVAP code.
    examples:
      - Write an AVAP function that adds two numbers
      - Generate AVAP code to read a query parameter
      - Write a loop in AVAP that sums a list
      - Create an AVAP API endpoint that returns hello
      - Fix this AVAP code so it compiles
      - Convert this Python snippet to AVAP
      - Write AVAP code to call an external REST API
      - Implement a function in AVAP that reverses a string
  - name: CONVERSATIONAL
    description: Small talk and turns about the conversation itself.
    examples:
      - hello there, how are you
      - thanks, that was helpful
      - make it shorter please
      - can you rephrase that
      - good morning
      - continue
      - summarise your last answer
      - great, thank you very much
"""


# ----------------------------------------------------------------------------- processes
class Replica:
    """One ``flywheel serve`` process of the fleet on 127.0.0.1 (gRPC and /metrics); its
    output goes to a file next to its home."""

    def __init__(self, name: str, home: Path, env: dict[str, str]) -> None:
        self.name, self.home = name, home
        self.port, self.metrics_port = free_port(), free_port()
        self.target = f"127.0.0.1:{self.port}"
        home.mkdir(parents=True, exist_ok=True)
        self.log_path = home.parent / f"{home.name}-serve-{self.port}.log"
        self._log = self.log_path.open("wb")
        self._terminated = False
        self.proc = subprocess.Popen(
            flywheel_cmd("serve", "--address", self.target, "--teacher", "off", "--home", str(home),
                      "--metrics-port", str(self.metrics_port), "--grace", "5"),
            cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def output(self, tail: int = 4000) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-tail:]

    def wait_serving(self, timeout_s: float = READY_TIMEOUT_S) -> float:
        t0 = time.monotonic()
        with grpc.insecure_channel(self.target) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while time.monotonic() - t0 < timeout_s:
                assert self.proc.poll() is None, f"{self.name} exited with {self.proc.returncode}:\n{self.output()}"
                try:
                    r = stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=1.0)
                    if r.status == health_pb2.HealthCheckResponse.SERVING:
                        return time.monotonic() - t0
                except grpc.RpcError:
                    pass
                time.sleep(0.1)
        raise AssertionError(f"{self.name} not SERVING after {timeout_s:.0f}s:\n{self.output()}")

    def client(self, **kw) -> FlywheelClient:
        return FlywheelClient(self.target, timeout_s=10.0, **kw)

    def version(self) -> str:
        with self.client() as fw:
            return fw.model_info()["version"]

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
            return resp.read().decode("utf-8")

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics, ``name{labels}`` -> value."""
        out = {}
        for line in self.metrics_text().splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def metric(self, name: str) -> float:
        """One unlabelled sample (counters by their ``_total`` name)."""
        m = self.metrics()
        assert name in m, f"no metric {name!r} on {self.name}: {sorted(k for k in m if 'log' in k)}"
        return m[name]

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def terminate(self) -> None:
        if self.proc.poll() is None and not self._terminated:
            self._terminated = True
            self.proc.terminate()

    def close(self) -> None:
        """SIGTERM (the replica ships what it can within its grace), SIGKILL after 15 s."""
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()


class Fleet:
    """The module's store prefix, environment, processes and what they printed."""

    def __init__(self, server, url: str, base: Path, onnx_cache: Path) -> None:
        self.server, self.url, self.base = server, url, base
        self.env_base = {k: v for k, v in os.environ.items() if not k.startswith(("FLYWHEEL_", "AWS_"))}
        self.env_base.update(
            FLYWHEEL_STORE=url, FLYWHEEL_SHIP_INTERVAL=str(SHIP_S), FLYWHEEL_STORE_POLL=str(POLL_S),
            FLYWHEEL_TEACHER="off", FLYWHEEL_ONNX_CACHE=str(onnx_cache),
            AWS_ENDPOINT_URL=server.endpoint, AWS_ACCESS_KEY_ID=server.access_key,
            AWS_SECRET_ACCESS_KEY=server.secret_key, AWS_REGION=server.region,
            HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1",
            OLLAMA_HOST=f"http://127.0.0.1:{free_port()}")  # nobody listens there
        self.replicas: dict[str, Replica] = {}
        self.retired: list[Replica] = []       # killed or replaced (their logs are scanned too)
        self.outputs: list[tuple[str, str]] = []   # (what, text) of every CLI process
        self.base_version: str | None = None
        self.base_dir: Path | None = None

    def env(self, home: Path, **extra: str) -> dict[str, str]:
        return {**self.env_base, "FLYWHEEL_HOME": str(home), **extra}

    def home(self, name: str) -> Path:
        return self.base / f"{name}-{uuid.uuid4().hex[:6]}"

    @property
    def objects(self):
        from flywheel.fleet.config import StoreConfig
        from flywheel.fleet.objects import ObjectStore

        env = {k: v for k, v in self.env_base.items() if k.startswith("AWS_")}
        return ObjectStore(StoreConfig.parse(self.url, env))

    def bucket_registry(self):
        from flywheel.classifier.versions.registry import ModelRegistry
        from flywheel.fleet.registry import BucketRegistry

        return BucketRegistry(self.objects, ModelRegistry(self.home("reader") / "models"))

    def run(self, *args: str, home: Path | None = None, check: bool = True, env: dict[str, str] | None = None,
            timeout_s: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess:
        """``flywheel ARGS`` as a process (``FLYWHEEL_HOME``: its own home unless given); output recorded."""
        home = home or self.home("cli")
        proc = subprocess.run(flywheel_cmd(*args), cwd=ROOT, env=env or self.env(home),
                              capture_output=True, text=True, timeout=timeout_s)
        self.outputs.append((f"flywheel {' '.join(args)} (rc {proc.returncode})", proc.stdout + proc.stderr))
        if check:
            assert proc.returncode == 0, f"flywheel {' '.join(args)}: rc {proc.returncode}\n" \
                                         f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc

    def close(self) -> None:
        for r in self.replicas.values():   # SIGTERM them all first, then wait for each
            r.terminate()
        for r in [*self.replicas.values(), *self.retired]:
            r.close()

    def mirror(self, db: Path, tag: str) -> list[tuple[str, str]]:
        """Mirror the bucket's log into the DuckDB file ``db`` (in this process) and return
        ``(decision_id, text)`` of every decision whose text holds ``tag``."""
        from flywheel.fleet.mirror import mirror

        store = LogStore(db)
        mirror(self.objects, store)
        return store.query("SELECT decision_id, text FROM decisions WHERE contains(text, ?)", [tag])

    def in_bucket(self, tag: str) -> list[str]:
        """The decision ids, one per row, of every decision object in the bucket whose
        text holds ``tag`` (what the mirror's own de-duplication would hide)."""
        import pyarrow.parquet as pq

        objects, ids = self.objects, []
        for info in objects.list("log/decisions"):
            data, _ = objects.get(info.key)
            t = pq.read_table(pa.BufferReader(data), columns=["decision_id", "text"])
            ids += [i for i, x in zip(t["decision_id"].to_pylist(), t["text"].to_pylist()) if tag in x]
        return ids


def _start_replica(fleet: Fleet, name: str, home: Path | None = None) -> Replica:
    home = home or fleet.home(f"replica-{name}")
    old = fleet.replicas.pop(name, None)
    if old is not None:
        old.close()
        fleet.retired.append(old)
    r = fleet.replicas[name] = Replica(name, home, fleet.env(home))
    return r


@pytest.fixture(scope="module")
def fleet(s3_server, onnx_cache, tmp_path_factory):
    """The module's fleet: a tiny model trained and promoted in a fresh store prefix, and
    replicas A and B (empty homes) serving it."""
    if not s3_server.running:
        s3_server.start()
    base = tmp_path_factory.mktemp("fleet-procs")
    url = f"s3://{s3_server.bucket}/t/fleet-procs-{uuid.uuid4().hex[:8]}"
    f = Fleet(s3_server, url, base, onnx_cache)
    try:
        intents = base / "tiny_intents.yaml"
        intents.write_text(TINY_INTENTS, encoding="utf-8")
        f.env_base["FLYWHEEL_INTENTS"] = str(intents)   # never used: the fleet has a version first
        f.base_version = f"base-{uuid.uuid4().hex[:8]}"
        f.base_dir = base / "trained" / f.base_version
        trainer = f.home("trainer")
        t0 = time.monotonic()
        f.run("train", "--intents", str(intents), "--out", str(f.base_dir), "--no-tune-encoder", home=trainer)
        out = f.run("models", "push", str(f.base_dir), "--promote", home=trainer).stdout
        assert f"promoted {f.base_version}" in out, out
        t1 = time.monotonic()
        a, b = _start_replica(f, "A"), _start_replica(f, "B")
        a.wait_serving()
        b.wait_serving()
        print(f"\nfleet: trained and pushed in {t1 - t0:.1f}s, replicas A and B serving {time.monotonic() - t1:.1f}s "
              f"later")
        yield f
    finally:
        f.close()


def _wait_shipped(replica: Replica, before: float, n: int, timeout_s: float = 30.0) -> None:
    """Until ``replica`` has shipped ``n`` more rows than ``before`` and its spool is empty."""
    def done() -> bool:
        m = replica.metrics()
        return (m["flywheel_log_shipped_rows_total"] >= before + n and m["flywheel_log_spool_segments"] == 0)
    assert wait_for(done, timeout_s, 0.1), \
        f"{replica.name} did not ship {n} rows in {timeout_s:g}s: {_log_metrics(replica)}\n{replica.output()}"


def _log_metrics(replica: Replica) -> dict[str, float]:
    return {k: v for k, v in replica.metrics().items() if k.startswith(("flywheel_log", "flywheel_registry"))}


def _tag(test: str) -> str:
    return f"{test}-{uuid.uuid4().hex[:8]}"


# ----------------------------------------------------------------------------- tests
def test_two_replicas_one_log_and_a_retrain_promotion_reaches_every_replica(fleet):
    a, b = fleet.replicas["A"], fleet.replicas["B"]
    assert a.version() == b.version() == fleet.base_version
    tag = _tag("t1")
    shipped = {r.name: r.metric("flywheel_log_shipped_rows_total") for r in (a, b)}
    loads = [Load(r.target, threads=2, max_calls=12, max_s=60.0, prefix=f"{tag} {r.name}").start() for r in (a, b)]
    calls = {r.name: ld.join() for r, ld in zip((a, b), loads)}
    for name, cs in calls.items():
        assert [c.code for c in cs] == ["OK"] * 24, (name, {c.code: c.details for c in cs})
        assert {c.model_version for c in cs} == {fleet.base_version}
    for r in (a, b):
        _wait_shipped(r, shipped[r.name], 24)

    # a third process, with its own empty home, sees every decision of both replicas once
    cli = fleet.home("stats")
    stats = json.loads(fleet.run("stats", "--json", home=cli).stdout.strip().splitlines()[-1])
    db = cli / "log" / "flywheel.duckdb"
    rows = LogStore(db).query("SELECT decision_id FROM decisions WHERE contains(text, ?)", [tag])
    ids = [r[0] for r in rows]
    assert len(ids) == len(set(ids)), "a decision was mirrored twice"
    assert set(ids) == {c.decision_id for cs in calls.values() for c in cs}
    assert sorted(fleet.in_bucket(tag)) == sorted(ids)   # and once in the bucket
    assert stats["total"] == LogStore(db).count() >= 48, stats

    # a retrain process (same store, same CLI home) trains and promotes fleet-wide;
    # --tolerance 1: this test is about the promotion's path, not the gate
    proc = fleet.run("retrain", "--json", "--tolerance", "1", "--promote-untested", home=cli)
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["outcome"] == "promoted", report.get("reason")
    new = report["version"]
    assert new and new != fleet.base_version
    assert fleet.bucket_registry().current()[0] == new
    t0 = time.monotonic()
    seen: dict[str, float] = {}

    def everywhere() -> bool:
        for r in (a, b):
            if r.name not in seen and r.version() == new:
                seen[r.name] = time.monotonic() - t0
        return len(seen) == 2
    assert wait_for(everywhere, 30.0, 0.1), f"promotion reached only {seen}:\n{a.output()}\n{b.output()}"
    print(f"\npromotion of {new} visible on the replicas after {seen} s")
    for r in (a, b):   # /metrics says which version serves, and only that one
        served = [k for k, v in r.metrics().items() if k.startswith("flywheel_model_info{") and v == 1]
        assert len(served) == 1 and f'version="{new}"' in served[0], served
    with a.client() as fw:
        assert fw.classify(f"what is addVar ({tag} after)").model_version == new

    # a fresh replica with an empty home starts on the fleet's current version
    c = _start_replica(fleet, "C")
    c.wait_serving()
    assert c.version() == new
    with c.client() as fw:
        assert fw.classify(f"write an AVAP loop ({tag} C)").model_version == new


def test_feedback_at_another_replica_is_accepted_and_counted_once(fleet):
    a, b = fleet.replicas["A"], fleet.replicas["B"]
    tag = _tag("t2")
    cli = fleet.home("stats")
    db = cli / "log" / "flywheel.duckdb"
    shipped = {r.name: r.metric("flywheel_log_shipped_rows_total") for r in (a, b)}
    text = f"How do I call addVar in AVAP? ({tag})"
    with a.client() as fa, b.client() as fb:
        d = fa.classify(text)
        # A is frozen at once, so that (most likely) its decision reaches the store after the label
        a.proc.send_signal(signal.SIGSTOP)
        try:
            own = fb.classify(f"hello there ({tag} B)")      # a decision of B: B's process tag
            human = "CODE_GENERATION" if d.label != "CODE_GENERATION" else "RETRIEVAL"
            # B cannot check A's decision: accepted, checked at retrain
            assert fb.feedback(d.id, human) == human
            # what B can rule out itself: NOT_FOUND
            for bad in ("no-such-decision", own.id[:8] + "0" * 24, d.id.upper()):
                with pytest.raises(grpc.RpcError) as info:
                    fb.feedback(bad, human)
                assert info.value.code() == grpc.StatusCode.NOT_FOUND, (bad, info.value.details())
            _wait_shipped(b, shipped["B"], 2)    # B's decision and the label
            label_first = d.id not in {i for i, _ in fleet.mirror(db, tag)}
        finally:
            a.proc.send_signal(signal.SIGCONT)
    _wait_shipped(a, shipped["A"], 1)
    print(f"\nthe label was mirrored before its decision: {label_first}")

    fleet.run("stats", "--json", home=cli)    # the retrain's view of the log: this home's, mirrored
    store = LogStore(db)
    labelled = [r for r in store.labelled_rows() if r.decision_id == d.id]
    assert len(labelled) == 1, labelled
    assert (labelled[0].human_label, labelled[0].human_author, labelled[0].text) == (human, "grpc", text)
    # mirrored again (nothing new): still one decision and one human label
    assert fleet.mirror(db, tag) and store.query(
        "SELECT count(*) FROM labels WHERE decision_id = ? AND source = 'human'", [d.id]) == [(1,)]
    assert store.query("SELECT count(*) FROM decisions WHERE decision_id = ?", [d.id]) == [(1,)]


def test_kill_9_mid_ship_loses_only_the_unflushed_tail_and_duplicates_nothing(fleet):
    c = fleet.replicas.get("C") or _start_replica(fleet, "C")
    c.wait_serving()
    tag = _tag("t3")
    # phase 1: answered, then a pause of more than the flush interval: on disk before the kill
    before = Load(c.target, threads=2, max_calls=15, max_s=60.0, prefix=f"{tag} before").start().join()
    assert [x.code for x in before] == ["OK"] * 30
    time.sleep(FLUSH_S * 2 + 0.5)
    # phase 2: load on, the drain thread shipping every 0.2 s; kill -9 in the middle of it,
    # at a moment when the spool holds finished segments (frozen by SIGSTOP to look)
    spool = c.home / "log" / "flywheel.duckdb.spool"

    def segments() -> list[Path]:
        return sorted(p for p in spool.iterdir() if p.suffix == ".arrow")

    shipped0 = c.metric("flywheel_log_shipped_rows_total")
    load = Load(c.target, threads=2, max_calls=1000, max_s=60.0, prefix=f"{tag} during").start()
    left: list[Path] = []
    try:
        assert wait_for(lambda: len(load.ok()) >= 60, 30.0), c.output()
        assert wait_for(lambda: c.metric("flywheel_log_shipped_rows_total") > shipped0, 10.0), \
            "nothing shipped under load"
        t_end = time.monotonic() + 20.0
        while not left and time.monotonic() < t_end:
            if segments():
                c.proc.send_signal(signal.SIGSTOP)
                t_kill = time.monotonic()
                left = segments()
                if left:
                    c.kill9()
                else:
                    c.proc.send_signal(signal.SIGCONT)
            time.sleep(0.002)
        assert left, "the spool never held a finished segment under load"
    finally:
        load.stop.set()
        during = load.join()
    from flywheel.logstore.segments import read_segment

    rows_left = sum(read_segment(p).num_rows for p in left)
    print(f"\nkill -9 after {len(load.ok())} answered calls; {len(left)} segments ({rows_left} rows) left "
          f"in the spool")

    # the same home again: what the spool holds ships at the start
    c = _start_replica(fleet, "C", home=c.home)
    c.wait_serving()
    assert wait_for(lambda: not segments(), 30.0, 0.1), \
        f"the spool was not shipped after the restart: {segments()}\n{c.output()}"
    assert wait_for(lambda: c.metric("flywheel_log_shipped_rows_total") >= rows_left, 10.0)
    assert c.metric("flywheel_log_shipped_rows_total") == rows_left   # (no traffic since the restart)

    rows = fleet.mirror(fleet.home("mirror") / "log.duckdb", tag)
    ids = [r[0] for r in rows]
    assert len(ids) == len(set(ids)), "a decision arrived twice"
    assert sorted(fleet.in_bucket(tag)) == sorted(ids), "a decision was shipped twice"
    by_text = dict((t, i) for i, t in rows)
    answered = [x for x in before + during if x.code == "OK"]
    # no decision arrived with another id than the one its client got
    assert all(by_text[x.text] == x.decision_id for x in answered if x.text in by_text)
    # what was answered before the pause arrived, all of it
    assert not [x.text for x in before if x.text not in by_text]
    # of the rest, only what was answered within the flush window before the kill may be lost
    lost = [x for x in answered if x.text not in by_text]
    late = [round(t_kill - x.ended, 3) for x in lost if t_kill - x.ended > FLUSH_S + 1.0]
    print(f"{len(answered)} answered, {len(rows)} arrived, {len(lost)} lost (answered in the last "
          f"{max((t_kill - x.ended for x in lost), default=0):.2f}s before the kill)")
    assert not late, f"{len(late)} decisions answered long before the kill were lost: {late[:5]}"
    # anything that arrived was a call made by this test (nothing made up, nothing mixed)
    texts = {x.text for x in before + during}
    assert set(by_text) <= texts


def test_store_down_under_load_fails_no_request_and_everything_arrives_after(fleet):
    a = fleet.replicas["A"]
    server = fleet.server
    tag = _tag("t4")
    m0 = a.metrics()
    try:
        server.stop()
        load = Load(a.target, threads=2, max_calls=100, max_s=60.0, prefix=tag).start()
        calls = load.join()
        assert len(calls) == 200 and {c.code for c in calls} == {"OK"}, \
            {c.code: c.details for c in calls if c.code != "OK"}
        # the request path never waits for the store (whose requests time out after 10 s)
        slowest = max(c.ended - c.started for c in calls)
        assert slowest < 5.0, slowest
        # the spool grows; the failed attempts are counted once they fail (a request to a
        # store that is going down can also hang until the store's timeout)
        assert wait_for(lambda: a.metric("flywheel_log_spool_segments") > 0
                         and a.metric("flywheel_log_spool_bytes") > 0, 10.0, 0.1), _log_metrics(a)
        assert wait_for(lambda: a.metric("flywheel_log_ship_errors_total") > m0["flywheel_log_ship_errors_total"],
                         15.0, 0.1), _log_metrics(a)
        m_down = _log_metrics(a)
    finally:
        t0 = time.monotonic()
        if not server.running:
            server.start()
    _wait_shipped(a, m0["flywheel_log_shipped_rows_total"], 200, timeout_s=90.0)
    print(f"\nstore down: slowest call {slowest:.3f}s, {m_down}; all shipped {time.monotonic() - t0:.1f}s after "
          f"the restart began")
    rows = fleet.mirror(fleet.home("mirror") / "log.duckdb", tag)
    assert len(rows) == 200 and {r[0] for r in rows} == {c.decision_id for c in calls}
    assert sorted(fleet.in_bucket(tag)) == sorted(r[0] for r in rows)


def test_a_shadow_set_in_the_bucket_is_scored_by_the_replicas_reported_and_promoted(fleet):
    a = fleet.replicas["A"]
    name, tag = f"shadow-{uuid.uuid4().hex[:8]}", _tag("shadow")
    cli = fleet.home("shadow-cli")
    fleet.run("models", "push", str(_copy_version(fleet, name)), home=cli)
    assert f"shadow set to {name}" in fleet.run("models", "shadow", name, home=cli).stdout
    info = f'flywheel_shadow_info{{version="{name}"}}'
    assert wait_for(lambda: a.metrics().get(info) == 1, 30.0, 0.1), a.output()
    served = a.version()
    scored = 'flywheel_shadow_decisions_total{outcome="scored"}'
    before_scored, shipped = a.metrics()[scored], a.metric("flywheel_log_shipped_rows_total")
    calls = Load(a.target, threads=2, max_calls=10, max_s=60.0, prefix=tag).start().join()
    assert [c.code for c in calls] == ["OK"] * 20
    assert {c.model_version for c in calls} == {served}                      # the shadow enforces nothing
    assert wait_for(lambda: a.metrics()[scored] - before_scored >= 1, 30.0, 0.1)
    n_scored = a.metrics()[scored] - before_scored
    _wait_shipped(a, shipped, 20 + int(n_scored))                           # decisions and shadow answers

    stats = json.loads(fleet.run("stats", "--json", home=cli).stdout.strip().splitlines()[-1])
    assert stats["shadow"]["version"] == name and stats["shadow"]["n"] >= n_scored, stats["shadow"]
    refused = fleet.run("models", "promote", "--from-shadow", "--min-shadow", "100000", home=cli, check=False)
    assert refused.returncode == 2 and "fewer than --min-shadow" in refused.stderr
    out = fleet.run("models", "promote", "--from-shadow", "--min-shadow", str(int(n_scored)), home=cli).stdout
    assert f"promoted {name}" in out and "shadow cleared" in out
    assert fleet.bucket_registry().current()[0] == name and fleet.bucket_registry().shadow() is None
    assert wait_for(lambda: a.version() == name and info not in a.metrics(), 30.0, 0.1), a.output()


def _copy_version(fleet: Fleet, name: str) -> Path:
    """The module's trained version under another name (only the manifest's name changes)."""
    d = fleet.base / "race" / name
    shutil.copytree(fleet.base_dir, d)
    manifest = json.loads((d / "manifest.json").read_text())
    manifest["version"] = name
    (d / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return d


def _race(fleet: Fleet, names: list[str]) -> tuple[list[subprocess.Popen], list[str], bool]:
    """Start ``flywheel models promote NAME`` for each name at once (empty homes). Each is
    stopped (SIGSTOP) as soon as it starts to download its version, which it does after it
    read CURRENT's etag and before its compare-and-swap; once every one is there, all go on
    together. Returns the processes, their outputs, and whether every one was caught."""
    homes = [fleet.home("promoter") for _ in names]
    procs = [subprocess.Popen(flywheel_cmd("models", "promote", n), cwd=ROOT, env=fleet.env(h),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n, h in zip(names, homes)]
    caught = [False] * len(procs)
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 120.0:
            for i, (p, h) in enumerate(zip(procs, homes)):
                if not caught[i] and p.poll() is None and (h / "models").exists():
                    p.send_signal(signal.SIGSTOP)
                    caught[i] = True
            if all(c or p.poll() is not None for c, p in zip(caught, procs)):
                break
            time.sleep(0.001)
    finally:
        for p, c in zip(procs, caught):
            if c:
                p.send_signal(signal.SIGCONT)
    outs = []
    for p, n in zip(procs, names):
        try:
            out, err = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        outs.append(out + err)
        fleet.outputs.append((f"flywheel models promote {n} (rc {p.returncode})", out + err))
    return procs, outs, all(caught)


def test_racing_promoters_exactly_one_wins_the_other_says_which_version_moved_in(fleet):
    reg = fleet.bucket_registry()
    for attempt in range(3):
        uid = uuid.uuid4().hex[:6]
        names = [f"race-a-{uid}", f"race-b-{uid}"]
        for n in names:
            reg.publish(_copy_version(fleet, n))
        before = reg.pointer()
        procs, outs, all_caught = _race(fleet, names)
        winners = [i for i, p in enumerate(procs) if p.returncode == 0]
        if len(winners) == 2 and not all_caught:
            continue   # one finished before the other had read CURRENT: no race happened; again
        print(f"\nattempt {attempt + 1}: both promoters caught before their swap: {all_caught}")
        break
    else:
        pytest.fail("three attempts and the promoters never raced")
    assert len(winners) == 1, outs
    win, lose = winners[0], 1 - winners[0]
    after = reg.pointer()
    assert after.version == names[win] and after.generation == before.generation + 1
    assert names[lose] not in after.history
    lines = outs[lose].strip().splitlines()   # the loser's output: one line, no traceback
    assert procs[lose].returncode not in (0, None)
    assert len(lines) == 1 and lines[0].startswith("flywheel: error: "), outs[lose]
    assert "Traceback" not in outs[lose]
    assert names[win] in lines[0] and "moved" in lines[0], lines[0]
    print(f"\nloser (rc {procs[lose].returncode}): {lines[0]}")


def test_no_credential_in_any_output_log_or_metrics(fleet):
    texts = list(fleet.outputs)
    # error paths: a store nobody answers at, and a wrong secret
    dead = fleet.home("dead")
    p = fleet.run("stats", "--json", home=dead, check=False,
                  env=fleet.env(dead, AWS_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}"))
    assert p.returncode != 0 and p.stderr.strip().startswith("flywheel: error: "), p.stderr
    assert "store unavailable" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    texts.append(("stats against a dead endpoint", p.stdout + p.stderr))
    wrong = fleet.home("wrong")
    secret, access_key = fleet.server.secret_key, fleet.server.access_key
    wrong_secret = secret + "-wrong"
    p = fleet.run("models", "list", home=wrong, check=False,
                  env=fleet.env(wrong, AWS_SECRET_ACCESS_KEY=wrong_secret))
    assert p.returncode != 0 and p.stderr.strip().startswith("flywheel: error: "), p.stderr
    assert "access denied" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    texts.append(("models list with a wrong secret", p.stdout + p.stderr))
    print("\n" + "\n".join(t[-400:] for _, t in texts[-2:]))
    for r in [*fleet.replicas.values(), *fleet.retired]:
        texts.append((f"replica {r.name} log {r.log_path.name}", r.output(tail=10**9)))
        if r.proc.poll() is None:
            texts.append((f"replica {r.name} /metrics", r.metrics_text()))
    assert len(texts) >= 6
    for what, text in texts:
        for credential in (secret, access_key, wrong_secret):
            assert credential not in text, f"{credential!r} in {what}:\n{text[-2000:]}"
