"""deploy/k8s-azure agrees with the code and the docs: the manifests parse and the
kustomization lists them, the pod runs under AKS workload identity (the label, the service
account's client-id, no key anywhere), the daemon's command line parses with the real CLI, the
ConfigMap's TOML validates and passes `config check`, its queue and roles are the ones
docs/azure.md tells you to create and grant, and the same configuration runs on Azurite."""

# ruff: noqa: F811 - the fixtures are imported explicitly and injected by name

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

import volume_stream as vs
from connectors.secrets import is_secret
from tests.azure_fixtures import ACCOUNT, azure_env, azure_rig, azurite  # noqa: F401
from tests.test_deploy import parse_cli
from tests.volume_stream.test_daemon import wait_for
from volume_stream.config.daemon import DaemonConfig
from volume_stream.daemon import Daemon

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s-azure"
CLI = str(Path(sys.executable).parent / "volume-stream")


def docs() -> dict[str, dict]:
    found = {}
    for file in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(file.read_text()):
            if doc and "kind" in doc and doc["kind"] != "Kustomization":
                found[doc["kind"]] = doc
    return found


def daemon_toml() -> str:
    return docs()["ConfigMap"]["data"]["volume-stream.toml"]


def test_the_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(kustomization["resources"]) == files


def test_the_pod_runs_under_workload_identity_with_no_key():
    found = docs()
    pod = found["Deployment"]["spec"]["template"]
    account = found["ServiceAccount"]
    assert pod["metadata"]["labels"]["azure.workload.identity/use"] == "true"
    assert pod["spec"]["serviceAccountName"] == account["metadata"]["name"]
    assert re.fullmatch(r"[0-9a-f-]{36}",
                        account["metadata"]["annotations"]["azure.workload.identity/client-id"])
    (container,) = pod["spec"]["containers"]
    assert parse_cli(container["args"]) == ["daemon"]
    for env in container.get("env", []):
        assert not is_secret(env["name"]) or "valueFrom" in env, env


def test_the_configuration_validates_names_what_the_docs_grant_and_holds_no_secret(tmp_path):
    text = daemon_toml()
    data = tomllib.loads(text)
    cfg = DaemonConfig.from_mapping({**data, "warehouse": str(tmp_path / "wh")})
    raw = cfg.volumes["raw"]
    assert raw.location.startswith("abfss://") and raw.notification["type"] == \
        "AZURE_STORAGE_QUEUE"
    assert not [k for k in re.findall(r"(\w+)\s*=", text) if is_secret(k)]
    page = (ROOT / "docs" / "azure.md").read_text()
    kustomization = (K8S / "kustomization.yaml").read_text()
    for role in ("Storage Blob Data Reader", "Storage Queue Data Message Processor"):
        assert role in page and role in kustomization, role
    assert "--endpoint-type storagequeue" in page and "--endpoint-type storagequeue" in \
        kustomization
    path = tmp_path / "vs.toml"
    path.write_text(text.replace("/var/lib/volume-stream/warehouse", str(tmp_path / "wh")))
    proc = subprocess.run([CLI, "config", "check", str(path)], capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr


def test_the_configuration_runs_on_azurite(tmp_path, azure_rig):
    """The ConfigMap's daemon with the example account, container and queue replaced by
    Azurite's (the connection string in the environment stands for the workload identity)."""
    text = (daemon_toml().replace("/var/lib/volume-stream/warehouse", str(tmp_path / "wh"))
            .replace("raw@mystorage", f"{azure_rig.container}@{ACCOUNT}")
            .replace('"raw-events"', f'"{azure_rig.queue_name}", wait_seconds = 1')
            .replace('host = "0.0.0.0"\nport = 9108', "port = 0"))
    data = tomllib.loads(text)
    cfg = DaemonConfig.from_mapping(data)
    with Daemon(cfg) as daemon:
        wait_for(lambda: daemon.readiness()[0], timeout=60)
        azure_rig.put("in/a.csv", b"abc")
        cat = vs.connect(tmp_path / "wh")
        wait_for(lambda: cat.directory_table("raw").file_count() == 1, timeout=60)
    assert [r["__change_type"] for r in cat.read_stream_arrow("raw_changes").to_pylist()] == [
        "INSERT"]
