"""The Prometheus alerts of deploy/kubernetes/alerts.yaml, checked with the real
``promtool`` (``promtool check rules`` and the unit tests in alerts-tests.yaml), their
shape (for, severity, summary, description, a runbook naming real commands) and the
metric names they read against what a real in-process sidecar exports.

promtool is found by :func:`find_promtool`; without it the promtool tests skip and say
how to get it. ``python -m tests.test_alerts DIR`` writes the files promtool needs into
DIR, to run ``promtool test rules DIR/alerts-tests.yaml`` by hand.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT

KUBE = ROOT / "deploy" / "kubernetes"
ALERTS = KUBE / "alerts.yaml"
ALERT_TESTS = ROOT / "deploy" / "prometheus" / "alerts-tests.yaml"   # not a manifest: kept out of kubectl's way
RULES_NAME = "flywheel-alerts.rules.yaml"   # what alerts-tests.yaml's rule_files names
PROMTOOL_ENV = "FLYWHEEL_PROMTOOL"
CI_PROMTOOL = ROOT / ".ci" / "bin" / "promtool"
PROMTOOL_TIMEOUT_S = 300

INSTALL_HINT = (
    "promtool not found: set FLYWHEEL_PROMTOOL, put promtool on PATH, or extract it into .ci/bin/ "
    "(what .ci/run does, without installing the Prometheus server): "
    "d=$(mktemp -d) && (cd \"$d\" && apt-get download prometheus && dpkg -x prometheus_*.deb x) && "
    "mkdir -p .ci/bin && cp \"$d/x/usr/bin/promtool\" .ci/bin/promtool"
)


def find_promtool() -> str | None:
    """``$FLYWHEEL_PROMTOOL``, else ``promtool`` on PATH, else ``.ci/bin/promtool``; None if none."""
    env = os.environ.get(PROMTOOL_ENV)
    if env:
        return env
    return shutil.which("promtool") or (str(CI_PROMTOOL) if os.access(CI_PROMTOOL, os.X_OK) else None)


@pytest.fixture(scope="module")
def promtool() -> str:
    path = find_promtool()
    if path is None:
        pytest.skip(INSTALL_HINT)
    if not os.access(path, os.X_OK):
        pytest.fail(f"{PROMTOOL_ENV}={path} is not an executable file")
    return path


def rule_doc() -> dict:
    return yaml.safe_load(ALERTS.read_text(encoding="utf-8"))


def alert_rules() -> list[dict]:
    return [r for g in rule_doc()["spec"]["groups"] for r in g["rules"]]


def write_rules(dest: Path, *, annotations: bool = True, name: str = RULES_NAME) -> Path:
    """alerts.yaml's ``spec`` (the ``groups:`` of a Prometheus rule file) as ``dest/name``."""
    spec = rule_doc()["spec"]
    if not annotations:   # promtool's unit tests compare annotations exactly; they match labels only
        for group in spec["groups"]:
            for rule in group["rules"]:
                rule.pop("annotations", None)
    path = dest / name
    path.write_text(yaml.safe_dump(spec, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


def write_unit_test_files(dest: Path) -> Path:
    """The rules (without annotations) and a copy of alerts-tests.yaml in ``dest``; returns the copy."""
    dest.mkdir(parents=True, exist_ok=True)
    tests = yaml.safe_load(ALERT_TESTS.read_text(encoding="utf-8"))
    assert tests["rule_files"] == [RULES_NAME], "alerts-tests.yaml must read the generated rules file"
    write_rules(dest, annotations=False)
    copy = dest / ALERT_TESTS.name
    shutil.copyfile(ALERT_TESTS, copy)
    return copy


def run_promtool(promtool: str, *args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([promtool, *map(str, args)], capture_output=True, text=True, timeout=PROMTOOL_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)


# ----------------------------------------------------------------------------- shape
def test_the_manifest_is_a_prometheus_rule_the_operator_selects():
    doc = rule_doc()
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "PrometheusRule"
    assert doc["metadata"]["name"] == "flywheel-alerts"
    assert doc["metadata"]["labels"]["release"] == "prometheus"
    names = [r.get("alert") for r in alert_rules()]
    assert all(names) and len(names) == len(set(names)) >= 8, names


def _cli_commands() -> tuple[set[str], set[str]]:
    import typer

    from flywheel.cli import app

    root = typer.main.get_command(app)
    return set(root.commands), set(root.commands["models"].commands)


def test_every_alert_has_for_severity_and_a_runbook_naming_real_commands():
    commands, models_commands = _cli_commands()
    for rule in alert_rules():
        name = rule["alert"]
        assert re.fullmatch(r"Flywheel(?:[A-Z][a-z0-9]*|LLM)+", name), name
        assert re.fullmatch(r"\d+[smhd]", rule.get("for", "")), f"{name}: no `for:`"
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        notes = rule["annotations"]
        assert {"summary", "description", "runbook"} <= set(notes), name
        assert all(len(notes[k].strip()) > 20 for k in ("summary", "description")), name
        runbook = notes["runbook"]
        for part in ("What it means", "Check first", "What to do"):
            assert part in runbook, f"{name}: the runbook has no {part!r}"
        used = re.findall(r"\bflywheel (models )?([a-z][a-z-]+)", runbook)
        real = [cmd for sub, cmd in used if (cmd in models_commands if sub else cmd in commands)]
        assert real, f"{name}: the runbook names no flywheel command"
        for sub, cmd in used:
            if sub:
                assert cmd in models_commands, f"{name}: `flywheel models {cmd}` does not exist"
        assert "kubectl " in runbook, f"{name}: the runbook says nothing to run in the cluster"


def test_every_alert_has_a_unit_test_that_fires_and_one_that_does_not():
    tests = yaml.safe_load(ALERT_TESTS.read_text(encoding="utf-8"))
    fires, silent = set(), set()
    for case in tests["tests"]:
        for check in case["alert_rule_test"]:
            (fires if check["exp_alerts"] else silent).add(check["alertname"])
    names = {r["alert"] for r in alert_rules()}
    assert (fires | silent) <= names, f"tests of unknown alerts: {sorted((fires | silent) - names)}"
    assert names <= fires, f"never seen firing: {sorted(names - fires)}"
    assert names <= silent, f"never checked silent: {sorted(names - silent)}"


# ----------------------------------------------------------------------------- promtool
@pytest.mark.slow   # promtool
def test_promtool_check_rules(promtool, tmp_path):
    rules = write_rules(tmp_path)
    res = run_promtool(promtool, "check", "rules", rules)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in res.stdout, res.stdout


@pytest.mark.slow   # promtool
def test_promtool_unit_tests(promtool, tmp_path):
    tests = write_unit_test_files(tmp_path)
    res = run_promtool(promtool, "test", "rules", tests)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout, res.stdout


# ----------------------------------------------------------------------------- metric names
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_BRACES = re.compile(r"\{[^{}]*\}")   # label matchers, and {{ template }} actions
_METRIC = re.compile(r"\b(?:flywheel|grpc)_[a-z_]+\b")


def metric_names(text: str) -> set[str]:
    """Metric names in a PromQL expression or a runbook (label names and values left out)."""
    text = _LABEL_LISTS.sub(" ", text)
    while _BRACES.search(text):
        text = _BRACES.sub(" ", text)
    return set(_METRIC.findall(text))


def exposed_names(exposition: str) -> set[str]:
    """Every series name a text exposition offers: its samples' names and, for families with
    no sample yet, the names their ``# TYPE`` implies (counters ``_total``, histograms and
    summaries ``_bucket``/``_sum``/``_count``)."""
    names: set[str] = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            names.add(name)
            if kind == "counter":
                names.add(name.removesuffix("_total") + "_total")
            elif kind in ("histogram", "summary"):
                names.update(name + s for s in ("_bucket", "_sum", "_count"))
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def test_metric_names_are_found_in_expressions_and_expositions():
    expr = 'sum by (grpc_code) (rate(grpc_server_handled_total{grpc_code!="OK"}[5m])) / on(instance) flywheel_x'
    assert metric_names(expr) == {"grpc_server_handled_total", "flywheel_x"}
    assert metric_names("{{ $labels.flywheel_y }} of flywheel_model_info{version=\"v1\"}") == {"flywheel_model_info"}
    text = ("# TYPE flywheel_a_total counter\nflywheel_a_total{x=\"1\"} 1.0\n# TYPE flywheel_b counter\n"
            "# TYPE flywheel_c histogram\n# TYPE flywheel_d gauge\nflywheel_d 2.0\n")
    assert {"flywheel_a_total", "flywheel_b_total", "flywheel_c_bucket", "flywheel_c_count", "flywheel_d"} \
        <= exposed_names(text)


_AFTER_A_POLL = ('flywheel_fleet_model_info{version="v1"} 1.0', "\nflywheel_last_retrain_timestamp_seconds ")


def _fleet_sidecar_exposition(s3, tmp_path: Path, monkeypatch) -> str:
    """A fleet-mode sidecar in process (the fleet has promoted v1 and recorded a retrain run;
    it serves one Classify), then its registry in the text format Prometheus scrapes."""
    from prometheus_client.exposition import generate_latest

    from flywheel.classifier.layer2.fitter import fit_model
    from flywheel.classifier.settings.config import load_config
    from flywheel.classifier.settings.intents import parse_intents
    from flywheel.classifier.versions.registry import ModelRegistry
    from flywheel.fleet.config import StoreConfig
    from flywheel.fleet.objects import ObjectStore
    from flywheel.fleet.registry import BucketRegistry
    from flywheel.service.client import FlywheelClient
    from flywheel.service.server import ServerOptions, create_server
    from tests.support.bucket import publish
    from tests.support.docs import DOC
    from tests.support.fakes import HashEmbedder

    if not s3.running:   # the session's server: a fleet test may have stopped it
        s3.start()
    url = f"s3://{s3.bucket}/t/alerts-{uuid.uuid4().hex[:8]}"
    for var in ("AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    for var, value in {"AWS_ENDPOINT_URL": s3.endpoint, "AWS_ACCESS_KEY_ID": s3.access_key,
                       "AWS_SECRET_ACCESS_KEY": s3.secret_key, "AWS_REGION": s3.region,
                       "FLYWHEEL_STORE": url}.items():
        monkeypatch.setenv(var, value)
    fleet = BucketRegistry(ObjectStore(StoreConfig.parse(url)), ModelRegistry(tmp_path / "trainer"), by="alerts@test")
    publish(fleet, fit_model(parse_intents(DOC), embedder=HashEmbedder(), version="base"), "v1")
    fleet.promote("v1", expected=None)
    # what `flywheel retrain` records at the end of a run (training.retrain._record)
    fleet.record_retrain({"finished_at": time.time(), "outcome": "kept", "version": None, "reason": "alerts test",
                          "teacher_noise": {"estimate": 0.1, "low": 0.05, "high": 0.18, "n": 60, "wrong": 6}})

    server = create_server(load_config(teacher="off"), ServerOptions(address="127.0.0.1:0"),
                           embedder=HashEmbedder())
    try:
        server.start()
        with FlywheelClient(server.target, timeout_s=5.0) as fw:
            fw.classify("show my invoices")
        # the replica's poll copies the fleet's state; wait for it (bounded), then read once more
        deadline = time.monotonic() + 10.0
        text = generate_latest(server.metrics.registry).decode("utf-8")
        while not all(s in text for s in _AFTER_A_POLL) and time.monotonic() < deadline:
            time.sleep(0.05)
            text = generate_latest(server.metrics.registry).decode("utf-8")
        return text
    finally:
        server.stop(grace_s=1.0)


@pytest.mark.slow   # the real S3 server (weed mini)
def test_every_metric_the_alerts_read_is_exported_by_the_sidecar(s3_server, tmp_path, monkeypatch):
    # A real fleet-mode sidecar in process (create_server on a real S3 server, as tests/fleet/
    # does); its registry is what is checked. flywheel_last_retrain_timestamp_seconds is
    # absent until a retrain ran, so a retrain run is recorded in the store first, as
    # `flywheel retrain` does; the replica's poll copies it.
    text = _fleet_sidecar_exposition(s3_server, tmp_path, monkeypatch)
    assert "flywheel_decisions_total{" in text and "flywheel_log_spool_bytes " in text, text[:2000]
    exported = exposed_names(text)
    missing = {}
    for rule in alert_rules():
        used = metric_names(rule["expr"]) | metric_names(" ".join(rule["annotations"].values()))
        gone = sorted(used - exported)
        if gone:
            missing[rule["alert"]] = gone
    assert not missing, f"metrics the alerts read that the sidecar does not export: {missing}"


GRAFANA = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "flywheel-dashboard.json"


def grafana_exprs() -> dict[str, str]:
    """The Grafana dashboard's queries, by panel title."""
    doc = json.loads(GRAFANA.read_text(encoding="utf-8"))
    return {p["title"]: t["expr"] for p in doc["panels"] for t in p["targets"]}


def test_the_grafana_dashboard_is_a_dashboard_on_a_prometheus_datasource_variable():
    doc = json.loads(GRAFANA.read_text(encoding="utf-8"))
    assert doc["uid"] and doc["title"] == "flywheel" and doc["schemaVersion"] >= 36
    assert [v["name"] for v in doc["templating"]["list"]] == ["datasource"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)) >= 10
    for p in doc["panels"]:
        assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
    used = set().union(*(metric_names(e) for e in grafana_exprs().values()))
    assert {"flywheel_decisions_total", "flywheel_teacher_cache_total", "flywheel_teacher_noise_ratio"} <= used


@pytest.mark.slow   # the real S3 server (weed mini)
def test_every_metric_the_grafana_dashboard_reads_is_exported_by_the_sidecar(s3_server, tmp_path, monkeypatch):
    exported = exposed_names(_fleet_sidecar_exposition(s3_server, tmp_path, monkeypatch))
    missing = {title: sorted(metric_names(expr) - exported) for title, expr in grafana_exprs().items()
               if metric_names(expr) - exported}
    assert not missing, f"metrics the Grafana dashboard reads that the sidecar does not export: {missing}"


if __name__ == "__main__":   # python -m tests.test_alerts DIR
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.test_alerts DIR   (then: promtool test rules DIR/alerts-tests.yaml)")
    out = Path(sys.argv[1])
    tests = write_unit_test_files(out)
    full = write_rules(out, name="flywheel-alerts.full.yaml")
    print(f"promtool check rules {full}\npromtool test rules {tests}")
