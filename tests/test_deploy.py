"""The Kubernetes manifests of fleet mode: replicas and the retrain job share one store."""


import yaml

from flywheel.classifier.settings.config import ENV
from tests.support.paths import ROOT

KUBE = ROOT / "deploy" / "kubernetes"
STORE_KEYS = {"FLYWHEEL_STORE", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}


def _docs(name):
    return [d for d in yaml.safe_load_all((KUBE / name).read_text()) if d]


def _secret_refs(container):
    return {e["secretRef"]["name"] for e in container.get("envFrom", []) if "secretRef" in e}


def test_store_secret_holds_the_store_url_and_the_standard_aws_variables():
    (secret,) = _docs("store-secret.yaml")
    assert secret["kind"] == "Secret" and secret["metadata"]["name"] == "flywheel-store"
    assert set(secret["stringData"]) == STORE_KEYS
    assert secret["stringData"]["FLYWHEEL_STORE"].startswith("s3://")
    assert ENV["store"] == "FLYWHEEL_STORE"


def test_retrain_cronjob_never_overlaps_and_reads_the_same_store():
    docs = _docs("retrain-cronjob.yaml")
    (cron,) = [d for d in docs if d["kind"] == "CronJob"]
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (job,) = pod["containers"]
    assert job["command"][:2] == ["flywheel", "retrain"]
    assert "flywheel-store" in _secret_refs(job)
    (mount,) = job["volumeMounts"]
    (vol,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    claims = {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    assert vol["persistentVolumeClaim"]["claimName"] in claims   # the mirror survives between runs


def test_sidecar_replicas_use_the_store_and_name_themselves():
    (deploy,) = [d for d in _docs("sidecar.yaml") if d["kind"] == "Deployment"]
    pod = deploy["spec"]["template"]["spec"]
    (fw,) = [c for c in pod.get("initContainers", []) + pod["containers"] if c["name"] == "flywheel"]
    assert "flywheel-store" in _secret_refs(fw)
    env = {e["name"]: e for e in fw["env"]}
    assert env[ENV["replica"]]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert not any(e["name"].startswith("AWS_") for e in fw["env"]), "credentials only from the Secret"


def test_every_yaml_file_is_a_manifest():
    """``kubectl apply -f deploy/kubernetes/`` must work: promtool's unit tests live elsewhere."""
    kinds = {}
    for path in sorted(KUBE.glob("*.yaml")):
        for doc in _docs(path.name):
            assert doc["apiVersion"] and doc["metadata"]["name"], path.name
            kinds.setdefault(doc["kind"], []).append(doc["metadata"]["name"])
    assert kinds["PrometheusRule"] == ["flywheel-alerts"]
    assert {"Deployment", "CronJob", "PersistentVolumeClaim", "Secret"} <= set(kinds)
