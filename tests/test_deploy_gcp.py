"""deploy/gcp/ is valid and agrees with the code.

The custom roles grant exactly the permissions behind the Google Cloud calls the code makes:
every SDK method called in connectors/gcp/ (found with `ast`, attributed to the class that
calls it) is mapped to its IAM permission by `PERMISSION` below; a new call without a
mapping, a permission the code no longer needs, or a call the roles do not grant fail here.
The README's notification config subscribes to the events the parser knows, with the payload
it needs; the Kubernetes overlay renders (with `kubectl kustomize` where it is installed),
annotates its service account for workload identity, and its daemon configuration passes
`config check`; docs/gcs.md's commands are the README's.
"""

from __future__ import annotations

import ast
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from connectors.gcp import events
from tests.docs_blocks import block

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy" / "gcp"
SOURCES = [ROOT / "connectors" / "gcp" / name for name in ("listener.py", "store.py",
                                                           "client.py")]

#: SDK method -> the IAM permission that authorises it
PERMISSION = {
    "pull": "pubsub.subscriptions.consume",
    "acknowledge": "pubsub.subscriptions.consume",
    "modify_ack_deadline": "pubsub.subscriptions.consume",
    "get_subscription": "pubsub.subscriptions.get",
    "list_blobs": "storage.objects.list",
    "get_blob": "storage.objects.get",
    "reload": "storage.objects.get",
    "download_as_bytes": "storage.objects.get",
}
#: which principal runs each class's calls: the daemon (listener, refresh) or the readers
ROLE = {"PubSubListener": "listener", "GcsLister": "listener", "_Gcs": "reader",
        "_Body": "reader"}
ROLE_FILE = {"listener": "listener-role.yaml", "reader": "reader-role.yaml"}
#: method names of the Google Cloud clients, blobs and buckets (anything called on them)
SDK_OBJECTS = ("_client", "client", "blob", "_bucket()")


def calls() -> dict[str, set[str]]:
    """The permissions each principal's code needs, from the SDK calls it makes."""
    needed: dict[str, set[str]] = {"listener": set(), "reader": set()}
    for source in SOURCES:
        tree = ast.parse(source.read_text())
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            for node in ast.walk(cls):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                receiver = ast.unparse(node.func.value)
                if not receiver.endswith(SDK_OBJECTS) or node.func.attr in ("bucket", "blob"):
                    continue  # bucket()/blob() make handles locally; no call
                assert node.func.attr in PERMISSION, \
                    f"{source.name}: {cls.name} calls {receiver}.{node.func.attr}: map it"
                assert cls.name in ROLE, f"{source.name}: which principal runs {cls.name}?"
                needed[ROLE[cls.name]].add(PERMISSION[node.func.attr])
    return needed


def test_the_custom_roles_grant_exactly_the_calls_the_code_makes():
    needed = calls()
    assert needed["listener"] >= {"pubsub.subscriptions.consume", "storage.objects.list"}
    for role, file in ROLE_FILE.items():
        doc = yaml.safe_load((DEPLOY / file).read_text())
        assert sorted(doc["includedPermissions"]) == sorted(needed[role]), file
        assert doc["stage"] == "GA" and doc["title"]


def commands(text: str) -> list[list[str]]:
    """The shell commands of the README's bash blocks (continuations joined)."""
    out = []
    for code in text.split("```bash\n")[1:]:
        body = code.split("```")[0].replace("\\\n", " ")
        out += [shlex.split(line) for line in body.splitlines() if line.strip()]
    return out


def option(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_the_notification_config_sends_what_the_parser_reads():
    cmds = commands((DEPLOY / "README.md").read_text())
    (notify,) = [c for c in cmds if c[:5] == ["gcloud", "storage", "buckets", "notifications",
                                              "create"]]
    assert option(notify, "--payload-format") == "json"  # JSON_API_V1
    assert set(option(notify, "--event-types").split(",")) == \
        events._CREATED | events._REMOVED | events._SKIPPED
    (sub,) = [c for c in cmds if c[:4] == ["gcloud", "pubsub", "subscriptions", "create"]]
    assert option(sub, "--dead-letter-topic") and int(option(sub, "--max-delivery-attempts")) \
        >= 5  # Pub/Sub's least
    assert option(sub, "--topic") == option(notify, "--topic")
    roles = {c[c.index("--role") + 1] for c in cmds if "--role" in c}
    assert {"projects/my-project/roles/volumeStreamListener",
            "projects/my-project/roles/volumeStreamReader"} <= roles
    created = [c for c in cmds if c[:4] == ["gcloud", "iam", "roles", "create"]]
    assert sorted(option(c, "--file") for c in created) == sorted(ROLE_FILE.values())


def test_the_docs_commands_are_the_readmes():
    readme = " ".join((DEPLOY / "README.md").read_text().replace("\\\n", " ").split())
    docs = block("gcs_deploy").replace("\\\n", " ")
    for line in docs.splitlines():
        line = " ".join(line.replace("landing-events", "raw-events").replace(
            "landing-bucket", "my-landing-bucket").replace("in/", "raw/").split())
        if line:
            assert line in readme, line


def test_the_k8s_overlay_uses_workload_identity_and_a_valid_configuration(tmp_path):
    overlay = DEPLOY / "k8s"
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["../../k8s"]
    docs = {p["path"]: yaml.safe_load((overlay / p["path"]).read_text())
            for p in kustomization["patches"]}
    account = docs["serviceaccount.yaml"]
    assert account["metadata"]["annotations"]["iam.gke.io/gcp-service-account"].endswith(
        ".iam.gserviceaccount.com")
    config = docs["configmap.yaml"]["data"]["volume-stream.toml"]
    assert 'location = "gs://' in config and "GCP_PUBSUB" in config
    file = tmp_path / "volume-stream.toml"
    file.write_text(config.replace("/var/lib/volume-stream/warehouse", str(tmp_path / "wh")))
    checked = subprocess.run([sys.executable, "-m", "volume_stream.cli", "config", "check",
                              str(file)], capture_output=True, text=True, cwd=ROOT)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    if shutil.which("kubectl"):  # render it as `kubectl apply -k` would
        rendered = subprocess.run(["kubectl", "kustomize", str(overlay)], capture_output=True,
                                  text=True, check=True).stdout
        kinds = {d["kind"]: d for d in yaml.safe_load_all(rendered) if d}
        assert "GCP_PUBSUB" in kinds["ConfigMap"]["data"]["volume-stream.toml"]
        assert "image_metadata.toml" in kinds["ConfigMap"]["data"]  # the CronJob's spec kept
        assert kinds["ServiceAccount"]["metadata"]["annotations"] == account["metadata"][
            "annotations"]
