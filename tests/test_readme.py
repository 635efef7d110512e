"""Every Python block of README.md runs as printed and prints what its comments say.

A block's expected output is the run of full-line comments right after a line that prints
(`print(` or `.show(`); each of those lines must be a line of what the block printed. Blocks run
in fresh Python processes whose working folder is a temp folder (their relative `./warehouse`,
`./landing`, `./out` land there); the local blocks run in order in one folder, as a reader
following the README would, each in a namespace of its own. Only what cannot be a temp folder is
substituted: the SQL example's path, and the OSS block's endpoints, bucket and queue (pointed at
the project's OSS/MNS fakes).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.alicloud_fixtures import (  # noqa: F401
    FAKE_ACCESS_KEY_ID,
    FAKE_ACCESS_KEY_SECRET,
    make_volume,
    mns_server,
    oss_server,
)
from tests.s3_warehouse_fixtures import (  # noqa: F401
    child_env,
    free_port,
    moto_process,
    s3_bucket,
    s3_env,
)

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"^```python\n(.*?)^```$", README, re.M | re.S)
MARK = "@@@ README block "

#: which block is which, by a line only it has
KINDS = {
    "quickstart": 'cat.create_volume("landing", "./landing")',
    "pipeline": "@vs.file_udf(",
    "s3": "ThreadedMotoServer",
    "oss": "vs.MnsNotification(",
    "sql": "cat.register_udf(",
    "datasource": 'readStream.format("volume_stream")',
    "shards": 'cat.change_log("landing")',
    "shard_api": 'boto3.client("dynamodbstreams"',
    "s3_warehouse": 'vs.connect("s3://my-bucket/volume-stream")',
}
LOCAL = ["quickstart", "pipeline", "shards", "sql", "datasource"]  # one folder, in this order

HARNESS = f"""
import json, sys, traceback
blocks = json.load(open(sys.argv[1]))
for name, code in blocks:
    print({MARK!r} + name, flush=True)
    try:
        exec(compile(code, "README:" + name, "exec"), {{"__name__": "__main__"}})
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


def block(kind: str) -> str:
    (found,) = [b for b in BLOCKS if KINDS[kind] in b]
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


def run_blocks(blocks: list[tuple[str, str]], cwd: Path, env: dict[str, str] | None = None,
               ) -> dict[str, str]:
    """Run the blocks in one Python process in `cwd`; return each block's output."""
    (cwd / "blocks.json").write_text(json.dumps(blocks))
    (cwd / "harness.py").write_text(HARNESS)
    proc = subprocess.run([sys.executable, "harness.py", "blocks.json"], cwd=cwd,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    parts = proc.stdout.split(MARK)[1:]
    return {p.split("\n", 1)[0]: p.split("\n", 1)[1] for p in parts}


def check_prints(kind: str, output: str) -> None:
    lines = {line.strip() for line in output.splitlines()}
    for want in expected_lines(block(kind)):
        assert want in lines, f"README block {kind!r} should print {want!r}; it printed:\n{output}"


def test_every_python_block_is_covered():
    kinds = [[k for k, marker in KINDS.items() if marker in b] for b in BLOCKS]
    assert all(len(k) == 1 for k in kinds), kinds
    assert sorted(k for (k,) in kinds) == sorted(KINDS)
    # the blocks that print data say what they print
    for kind in ("quickstart", "pipeline", "s3", "datasource"):
        assert expected_lines(block(kind)), kind


def test_local_blocks_run_as_printed(tmp_path):
    sql = block("sql").replace('"examples/image_recognition.sql"',
                               json.dumps(str(ROOT / "examples" / "image_recognition.sql")))
    blocks = [(k, sql if k == "sql" else block(k)) for k in LOCAL]
    outputs = run_blocks(blocks, tmp_path)
    for kind in LOCAL:
        check_prints(kind, outputs[kind])
    # the stream the SQL example reads is a table of change records (nothing has arrived)
    assert "|relative_path|" in outputs["sql"].replace(" ", "")


def test_s3_block_runs_as_printed(tmp_path):
    outputs = run_blocks([("s3", block("s3"))], tmp_path)
    check_prints("s3", outputs["s3"])


def test_oss_block_runs_as_printed(tmp_path, mns_server, oss_server):  # noqa: F811
    vol = make_volume(mns_server, oss_server)
    try:
        code = block("oss")
        for old, new in [("https://oss-cn-hangzhou.aliyuncs.com", oss_server.endpoint),
                         ("https://1234567890123456.mns.cn-hangzhou.aliyuncs.com",
                          mns_server.endpoint),
                         ("my-bucket", vol.bucket), ("landing-events", vol.queue_name)]:
            assert old in code, old
            code = code.replace(old, new)
        vol.oss.put_object("landing/before.csv", b"a,b\n")  # there before the volume
        outputs = run_blocks([("oss", code)], tmp_path, env={
            "ALIBABA_CLOUD_ACCESS_KEY_ID": FAKE_ACCESS_KEY_ID,
            "ALIBABA_CLOUD_ACCESS_KEY_SECRET": FAKE_ACCESS_KEY_SECRET})
        assert f"oss://{vol.bucket}/landing/before.csv" in outputs["oss"]
    finally:
        vol.close()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_blocks_use_no_absolute_paths(kind):
    """A reader can paste a block anywhere: it writes only below the current folder."""
    assert not re.search(r"""["']/(data|out|chk|tmp)\b""", block(kind)), block(kind)


def test_shard_api_block_runs_as_printed(tmp_path):
    """The boto3 block against `volume-stream shard-api` started as the README says."""
    import socket
    import time

    import volume_stream as vs

    (tmp_path / "landing").mkdir()
    (tmp_path / "landing" / "a.txt").write_text("a")
    cat = vs.connect(tmp_path / "warehouse")
    cat.create_volume("landing", str(tmp_path / "landing"))
    cat.refresh("landing")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "volume_stream.cli", "shard-api", "--warehouse",
         str(tmp_path / "warehouse"), "--listen", f"127.0.0.1:{port}", "--access-key-id", "ID",
         "--secret-access-key", "SECRET"], cwd=tmp_path, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:  # wait until it listens (or has died)
            assert server.poll() is None, server.stderr.read()
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "shard-api did not start listening"
            time.sleep(0.1)
        code = block("shard_api")
        assert "http://127.0.0.1:8000" in code
        outputs = run_blocks([("shard_api", code.replace("127.0.0.1:8000", f"127.0.0.1:{port}"))],
                             tmp_path, env={"AWS_EC2_METADATA_DISABLED": "true"})
        assert "'a.txt'" in outputs["shard_api"] and "'INSERT'" in outputs["shard_api"]
    finally:
        server.terminate()
        server.wait(30)


def test_s3_warehouse_block_runs_as_printed(tmp_path, s3_bucket, moto_process):  # noqa: F811
    """Both `connect` lines against moto's server (its own process): the bucket and the
    endpoint are the only substitutions; credentials come from the standard environment."""
    code = block("s3_warehouse")
    for old in ("my-bucket", "http://minio:9000"):
        assert old in code, old
    code = code.replace("my-bucket", s3_bucket).replace("http://minio:9000", moto_process)
    run_blocks([("s3_warehouse", code + "\nprint(cat.list_volumes())\n")], tmp_path,
               env=child_env(moto_process))
    assert not any(p.name.startswith("s3") for p in tmp_path.iterdir())  # nothing local
