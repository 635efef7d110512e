"""deploy/k8s-s3: the Kubernetes example whose daemon and CronJob share an S3 warehouse."""

from __future__ import annotations

from pathlib import Path

import yaml

from volume_stream.config.daemon import DaemonConfig

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s-s3"


def docs() -> dict[str, dict]:
    out = {}
    for file in sorted(K8S.glob("*.yaml")):
        if file.name != "kustomization.yaml":
            for doc in yaml.safe_load_all(file.read_text()):
                out[doc["kind"]] = doc
    return out


def test_kustomization_lists_every_file_and_nothing_claims_a_volume():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(kustomization["resources"]) == files
    text = "".join(p.read_text() for p in K8S.glob("*.yaml"))
    assert "persistentVolumeClaim" not in text and "PersistentVolumeClaim" not in text


def test_daemon_and_cronjob_use_the_same_s3_warehouse(tmp_path):
    found = docs()
    config_file = tmp_path / "volume-stream.toml"
    config_file.write_text(found["ConfigMap"]["data"]["volume-stream.toml"])
    config = DaemonConfig.load(config_file)
    assert isinstance(config.warehouse, str) and config.warehouse.startswith("s3://")
    assert config.storage_options == {"AWS_REGION": "eu-west-1"}
    pod = found["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (job,) = pod["containers"]
    assert job["args"][job["args"].index("--warehouse") + 1] == config.warehouse
    daemon = found["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert daemon["args"][:1] == ["daemon"]
    assert all("warehouse" not in m["mountPath"] for m in daemon["volumeMounts"])
