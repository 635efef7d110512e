"""The code blocks of README.md and docs/*.md, and how the doc tests run them.

Every fenced block is one *kind*, found by a line only it has (`KINDS`), except ```text blocks,
which are pictures (diagrams, folder trees), not code. A kind is run by `tests/test_docs.py`
(Python blocks, and the SQL one inside the Python process) or `tests/test_docs_cli.py` (bash
blocks, the pipeline spec), checked by another test file (`ELSEWHERE`), or not run, with the
reason (`NOT_RUN`). Pages have no indented code blocks: a block is fenced, so it has a kind.

Blocks run in a *sandbox*: a temp folder holding a copy of `examples/` and a `.venv` link to the
running interpreter's environment, with that environment's `bin` first on PATH, so a block runs
as a reader pasting it into a shell in the project folder would (`make install` done). Only what
cannot be a temp folder is substituted: fixed ports, `/tmp/vs-demo`, the cloud endpoints, buckets
and queues (pointed at moto's server and the project's OSS/MNS fakes).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PICTURES = {"text"}  # fenced blocks that are drawings, not code
MARK = "@@@ docs block "


@dataclass(frozen=True)
class Block:
    page: str   # relative to the project folder
    lang: str
    code: str


def _blocks() -> list[Block]:
    found = []
    for page in PAGES:
        for lang, code in re.findall(r"^```(\w*)\n(.*?)^```$", page.read_text(), re.M | re.S):
            found.append(Block(str(page.relative_to(ROOT)), lang, code))
    return found


BLOCKS = _blocks()

#: which block is which, by a line only it has
KINDS = {
    # README.md
    "setup": "make test    # same install, then the whole test suite",
    "venv": ".venv/bin/volume-stream --help",
    "quickstart": 'cat.create_volume("landing", "./landing",',
    "glance": "volume-stream volume create photos ./photos",
    # docs/pipelines.md
    "pipeline": "@vs.file_udf(",
    "recipes": "python examples/log_ingestion.py       # JSON lines",
    "demo_recipes": "examples/demo.py --workdir /tmp/vs-demo",
    "spec": 'udf = "../image_metadata.py:image_metadata"',
    "run_spec": "volume-stream run examples/pipelines/image_metadata.toml",
    "spark_submit": "spark-submit --master local[2]",
    # docs/s3.md, docs/oss.md
    "s3": "ThreadedMotoServer",
    "oss_env": "export ALIBABA_CLOUD_ACCESS_KEY_ID=",
    "oss": "vs.MnsNotification(",
    # docs/gcs.md
    "gcs": 'bucket.notification(topic_name="landing"',
    "gcs_deploy": "gcloud storage buckets notifications create gs://landing-bucket",
    # docs/azure.md
    "azure": 'notification=vs.AzureQueueNotification("landing-events"))',
    "azurite": "azurite --silent --inMemoryPersistence --skipApiVersionCheck",
    "azure_setup": "az eventgrid event-subscription create",
    # docs/daemon.md
    "daemon_start": "volume-stream daemon --config examples/volume-stream.toml",
    "daemon_other_shell": "echo hello > demo-data/landing/hello.txt",
    "daemon_toml": "[volumes.raw]",
    # docs/sql.md, docs/structured-streaming.md
    "sql": "cat.register_udf(",
    "sql_cli": "--udf fc_image_to_text=my_udfs:recognise",
    "tables": "CREATE TABLE STREAM people_changes",
    "remote": "sql --remote sc://127.0.0.1:15002",
    "datasource": 'readStream.format("volume_stream")',
    # docs/shards.md
    "shards": 'cat.change_log("landing")',
    "shard_api_server": "volume-stream shard-api --warehouse ./warehouse",
    "shard_api": 'boto3.client("dynamodbstreams"',
    "export": "volume-stream export landing --start-ms",
    # docs/object-storage.md, docs/clusters.md
    "s3_warehouse": 'vs.connect("s3://my-bucket/volume-stream")',
    "s3_warehouse_cli": "volume-stream volume list --warehouse s3://my-bucket/volume-stream",
    "cluster": "spark-submit --master yarn",
    # docs/status.md
    "status_serve": "volume-stream ui --warehouse ./warehouse",
    "status_cli": "volume-stream status --json",
    # docs/spark-delta.md
    "spark_delta": 'files = spark.read.format("delta").load(cat.table_path(volume="landing"))',
    "spark_delta_table": "cat.sql(\"CREATE TABLE orders (id INT, item VARCHAR)\")",
    "spark_delta_tools": 'spark.sql(f"VACUUM delta.`{path}` RETAIN 0 HOURS").collect()',
    "spark_delta_target": 'cat.pipeline("for_spark", first_line, "first_lines", format="delta")',
    "spark_delta_register": 'cat.register_table("people", lake, key="id")',
}

#: blocks another test file runs as printed
ELSEWHERE = {
    "daemon_toml": "tests/test_shipped_configs.py",  # `volume-stream config check` on it
    # `ui` and the daemon's page in a real browser and over HTTP; status through the CLI
    "status_serve": "tests/volume_stream/test_status_browser.py",
    "status_cli": "tests/volume_stream/test_status.py",
    # the page's blocks run in order, their printed lines checked, with Delta's connector
    "spark_delta": "tests/interop/test_docs.py",
    "spark_delta_table": "tests/interop/test_docs.py",
    "spark_delta_tools": "tests/interop/test_docs.py",
    "spark_delta_target": "tests/interop/test_docs.py",
    "spark_delta_register": "tests/interop/test_docs.py",
}

#: blocks that cannot run here, and why
NOT_RUN = {
    "azurite": "serves until stopped on fixed ports; the tests start the same command on free "
               "ports (tests/azure_fixtures.py) and run the page's Python block against it",
    "azure_setup": "needs an Azure subscription (az CLI against Azure Resource Manager); "
                   "tests/test_deploy_azure.py checks the names it uses against deploy/",
    "setup": "`make test` is the whole suite, this test included; `make demo` is "
             "examples/demo.py, which tests/test_demo.py runs as make does",
    "remote": "needs a daemon serving Spark Connect (a second Spark application); "
              "tests/volume_stream/test_spark_connect.py runs these commands against one",
    "gcs_deploy": "needs a Google Cloud project; tests/test_deploy_gcp.py checks that these are "
                  "deploy/gcp/README.md's commands and that they agree with the code",
    "cluster": "needs a YARN cluster and an S3 bucket; tests/warehouse/test_cluster.py runs "
               "the same job with --master local-cluster[2,1,1024] against moto",
}

#: the blocks of the README reader's folder, run in one Python process in this order
LOCAL = ["quickstart", "pipeline", "shards", "sql", "datasource", "tables"]


def block(kind: str) -> str:
    (found,) = [b.code for b in BLOCKS if KINDS[kind] in b.code and b.lang not in PICTURES]
    return found


def kinds_of(b: Block) -> list[str]:
    return [k for k, marker in KINDS.items() if marker in b.code]


def indented_code_blocks(text: str) -> list[str]:
    """Lines that start an indented (unfenced) code block: 4+ spaces after a blank line, not
    inside a fence and not continuing a list item."""
    found, fenced, previous = [], False, ["", ""]  # the last line, the last non-blank line
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif (not fenced and line.startswith("    ") and line.strip() and previous[0] == ""
              and not re.match(r"\s+\S|[-*] |\d+\. ", previous[1])):
            found.append(line)
        previous = [line, line if line.strip() else previous[1]]
    return found


def expected_lines(code: str) -> list[str]:
    """The comment lines that follow a printing line: what the block says it prints."""
    expected, after_print = [], False
    for line in code.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") and after_print:
            expected.append(stripped[1:].strip())
            continue
        after_print = "print(" in line or ".show(" in line
    return expected


def sandbox(folder: Path) -> Path:
    """`folder` made to look like the project folder after `make install`."""
    shutil.copytree(ROOT / "examples", folder / "examples",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (folder / ".venv").symlink_to(sys.prefix, target_is_directory=True)
    return folder


def shell_env(**extra: str) -> dict[str, str]:
    """The environment of a reader's shell: the virtual environment's commands on PATH and no
    VOLUME_STREAM_* settings left over from other tests."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOLUME_STREAM_")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return {**env, **extra}


def shell(code: str, cwd: Path, env: dict[str, str] | None = None, *, timeout: float = 600,
          ) -> str:
    """Run a bash block as a script that stops at the first failing command; its stdout."""
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=cwd, env=env or shell_env(),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{code}\nexit {proc.returncode}\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-5000:]}"
    return proc.stdout


def start_shell(code: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    """Start a bash block that serves until stopped (`stop_shell`), in a session of its own;
    its output goes to `block.log` in `cwd` (a pipe nobody reads could fill and block it)."""
    with open(cwd / "block.log", "w") as log:
        proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", code], cwd=cwd, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    proc.log = cwd / "block.log"  # type: ignore[attr-defined]
    return proc


def stop_shell(proc: subprocess.Popen) -> str:
    """SIGTERM the block's process group (the shell and what it started, as Ctrl-C in its
    terminal would stop them); returns its output."""
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    return proc.log.read_text()  # type: ignore[attr-defined]


HARNESS = f"""
import json, sys, traceback
blocks = json.load(open(sys.argv[1]))
for name, code in blocks:
    print({MARK!r} + name, flush=True)
    try:
        exec(compile(code, "docs:" + name, "exec"), {{"__name__": "__main__"}})
    except BaseException:
        traceback.print_exc()
        print({MARK!r} + name + " FAILED", flush=True)
        sys.exit(1)
    sys.stdout.flush()
# end as `volume-stream` does (DESIGN §8): skip delta-rs's native teardown, which can abort a
# process whose work is done (delta-io/delta-rs#2184); the blocks' output is what is checked
from volume_stream._exit import exit_process
exit_process(0)
"""


def run_python(blocks: list[tuple[str, str]], cwd: Path, env: dict[str, str] | None = None,
               stderr: list[str] | None = None) -> dict[str, str]:
    """Run the blocks in one Python process in `cwd`, each in a namespace of its own; return
    each block's output (and append the process's stderr to `stderr`, if given)."""
    (cwd / "blocks.json").write_text(json.dumps(blocks))
    (cwd / "harness.py").write_text(HARNESS)
    proc = subprocess.run([sys.executable, "harness.py", "blocks.json"], cwd=cwd,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    if stderr is not None:
        stderr.append(proc.stderr)
    parts = proc.stdout.split(MARK)[1:]
    return {p.split("\n", 1)[0]: p.split("\n", 1)[1] for p in parts}


def check_prints(kind: str, output: str) -> None:
    lines = {line.strip() for line in output.splitlines()}
    for want in expected_lines(block(kind)):
        assert want in lines, f"block {kind!r} should print {want!r}; it printed:\n{output}"
