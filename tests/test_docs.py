"""Every code block of README.md and docs/*.md is accounted for, and the Python ones (and the
SQL one) run as printed and print what their comments say.

A block's expected output is the run of full-line comments right after a line that prints
(`print(` or `.show(`); each of those lines must be a line of what the block printed. The README
reader's blocks (`LOCAL`) run in order in one sandbox folder, as a reader following the README
and then the pages would, each in a namespace of its own. The shell blocks:
`tests/test_docs_cli.py`; the harness: `tests/docs_blocks.py`.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.alicloud_fixtures import (  # noqa: F401
    FAKE_ACCESS_KEY_ID,
    FAKE_ACCESS_KEY_SECRET,
    make_volume,
    mns_server,
    oss_server,
)
from tests.azure_fixtures import azurite  # noqa: F401
from tests.docs_blocks import (
    BLOCKS,
    ELSEWHERE,
    KINDS,
    LOCAL,
    NOT_RUN,
    PAGES,
    PICTURES,
    ROOT,
    block,
    check_prints,
    expected_lines,
    indented_code_blocks,
    kinds_of,
    run_python,
    sandbox,
    shell,
    shell_env,
    start_shell,
    stop_shell,
)
from tests.s3_warehouse_fixtures import (  # noqa: F401
    child_env,
    free_port,
    moto_process,
    s3_bucket,
    s3_env,
)

#: the SQL page's Tables block, run through `cat.sql` in the reader's Python process
TABLES = """
import json
import volume_stream as vs
result = vs.connect("./warehouse").sql({sql})
print(json.dumps(sorted(list(row) for row in result.df.collect())))
"""


def test_every_block_is_run_or_says_why_not():
    code_blocks = [b for b in BLOCKS if b.lang not in PICTURES]
    kinds = [kinds_of(b) for b in code_blocks]
    assert all(len(k) == 1 for k in kinds), [(b.page, k) for b, k in zip(code_blocks, kinds,
                                                                       strict=True)]
    assert sorted(k for (k,) in kinds) == sorted(KINDS)  # no stale kind either
    assert {b.lang for b in code_blocks} <= {"python", "bash", "sql", "toml"}
    assert set(NOT_RUN) | set(ELSEWHERE) <= set(KINDS)
    for kind, test in ELSEWHERE.items():
        assert kind in (ROOT / test).read_text(), f"{test} does not run the {kind!r} block"
    # the blocks that print data say what they print
    for kind in ("quickstart", "pipeline", "s3", "datasource"):
        assert expected_lines(block(kind)), kind


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_pages_have_no_indented_code_blocks(page):
    """An indented block would escape the harness: every block is fenced, with a language."""
    text = page.read_text()
    assert indented_code_blocks(text) == []
    page_name = str(page.relative_to(ROOT))
    assert all(b.lang for b in BLOCKS if b.page == page_name), "a fence without a language"


def test_readme_stays_a_front_page():
    readme = (ROOT / "README.md").read_text()
    assert readme.count("\n") <= 250
    # its links go to files that exist (mkdocs --strict checks the pages' own links)
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", readme):
        assert (ROOT / target).exists(), target


def test_mkdocs_nav_lists_every_page():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in (ROOT / "docs").glob("*.md"):
        assert f": {page.name}" in nav, f"mkdocs.yml's nav does not list docs/{page.name}"


def test_local_blocks_run_as_printed(tmp_path):
    """The README's quickstart, then the pages' blocks on its warehouse, in one folder; then
    the shell blocks that use that warehouse (SQL with a --udf module, the export)."""
    folder = sandbox(tmp_path)
    blocks = [(k, TABLES.format(sql=json.dumps(block(k))) if k == "tables" else block(k))
              for k in LOCAL]
    # the README's quickstart runs again as printed (issue 34: if_not_exists=True)
    outputs = run_python([*blocks, ("quickstart_again", block("quickstart"))], folder)
    assert outputs["quickstart_again"].strip().splitlines()[-1] == "0"
    for kind in LOCAL:
        if kind != "tables":
            check_prints(kind, outputs[kind])
    # the stream the SQL example reads is a table of change records (nothing has arrived)
    assert "|relative_path|" in outputs["sql"].replace(" ", "")
    # Bob came and went; Alice's insert and update fold into one INSERT of her latest value
    assert json.loads(outputs["tables"].strip().splitlines()[-1]) == [[1, "Alice", 30]]
    out = shell(block("sql_cli"), folder)
    assert "str_dish_images" in out and "landing" in out, out
    out = shell(block("export"), folder)
    first, again = (json.loads(line) for line in out.splitlines()[:2])
    assert first["records"] > 0 and again["records"] == again["files"] == 0, out  # same range
    assert list((folder / "exports" / "landing").rglob("*.csv")), "the export wrote no CSV"


def test_s3_block_runs_as_printed(tmp_path):
    stderr: list[str] = []
    outputs = run_python([("s3", block("s3"))], tmp_path, stderr=stderr)
    check_prints("s3", outputs["s3"])
    assert "HTTP/1.1" not in stderr[0], stderr[0][-2000:]  # moto's server logs no request


def test_gcs_block_runs_as_printed(tmp_path):
    """docs/gcs.md on the emulators `make install` built (its fixed ports made free ones)."""
    from tests.gcp_fixtures import free_port

    code = block("gcs")
    for port in ("8085", "4443"):
        code = code.replace(port, str(free_port()))
    outputs = run_python([("gcs", code)], sandbox(tmp_path), {
        "PUBSUB_EMULATOR_HOST": "", "STORAGE_EMULATOR_HOST": ""})
    check_prints("gcs", outputs["gcs"])


def test_oss_blocks_run_as_printed(tmp_path, mns_server, oss_server):  # noqa: F811
    shell(block("oss_env"), tmp_path)  # sets the variables the Python block reads
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
        outputs = run_python([("oss", code)], tmp_path, env={
            "ALIBABA_CLOUD_ACCESS_KEY_ID": FAKE_ACCESS_KEY_ID,
            "ALIBABA_CLOUD_ACCESS_KEY_SECRET": FAKE_ACCESS_KEY_SECRET})
        assert f"oss://{vol.bucket}/landing/before.csv" in outputs["oss"]
    finally:
        vol.close()


def test_azure_block_runs_as_printed(tmp_path, azurite):  # noqa: F811
    """docs/azure.md on Azurite (the session's, on free ports): an overwrite is one UPDATE pair."""
    code = block("azure")
    for old, new in [("http://127.0.0.1:10000/devstoreaccount1", azurite.blob),
                     ("http://127.0.0.1:10001/devstoreaccount1", azurite.queue)]:
        assert old in code, old
        code = code.replace(old, new)
    outputs = run_python([("azure", code)], tmp_path)
    check_prints("azure", outputs["azure"])


@pytest.mark.parametrize("kind", sorted(k for k in KINDS if k not in NOT_RUN and k not in ELSEWHERE))
def test_blocks_use_no_absolute_paths(kind):
    """A reader can paste a block anywhere: it writes only below the current folder (the
    pipeline page's demo folder, /tmp/vs-demo, is the one exception, and a temp folder). The
    daemon page's configuration is a deployment's, with a deployment's absolute paths."""
    code = block(kind).replace("/tmp/vs-demo", "vs-demo")
    assert not re.search(r"""["' ]/(data|out|chk|tmp|exports)\b""", code), code


def test_shard_api_blocks_run_as_printed(tmp_path):
    """The server started by its block, then the boto3 block against it."""
    import socket
    import time

    import volume_stream as vs

    (tmp_path / "landing").mkdir()
    (tmp_path / "landing" / "a.txt").write_text("a")
    cat = vs.connect(tmp_path / "warehouse")
    cat.create_volume("landing", str(tmp_path / "landing"))
    cat.refresh("landing")
    port = free_port()
    server_block = block("shard_api_server")
    assert "127.0.0.1:8000" in server_block
    server = start_shell(server_block.replace("127.0.0.1:8000", f"127.0.0.1:{port}"),
                         tmp_path, shell_env())
    try:
        deadline = time.monotonic() + 120
        while True:  # wait until it listens (or has died)
            assert server.poll() is None, stop_shell(server)
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "shard-api did not start listening"
            time.sleep(0.1)
        code = block("shard_api")
        assert "http://127.0.0.1:8000" in code
        outputs = run_python([("shard_api", code.replace("127.0.0.1:8000", f"127.0.0.1:{port}"))],
                             tmp_path, env={"AWS_EC2_METADATA_DISABLED": "true"})
        assert "'a.txt'" in outputs["shard_api"] and "'INSERT'" in outputs["shard_api"]
    finally:
        stop_shell(server)


def test_s3_warehouse_blocks_run_as_printed(tmp_path, s3_bucket, moto_process):  # noqa: F811
    """Both `connect` lines against moto's server (its own process), then the command lines
    on the warehouses they made: the bucket and the endpoint are the only substitutions;
    credentials come from the standard environment."""
    code = block("s3_warehouse")
    for old in ("my-bucket", "http://minio:9000"):
        assert old in code, old
    code = code.replace("my-bucket", s3_bucket).replace("http://minio:9000", moto_process)
    run_python([("s3_warehouse", code + "\nprint(cat.list_volumes())\n")], tmp_path,
               env=child_env(moto_process))
    cli = block("s3_warehouse_cli")
    assert "my-bucket" in cli
    env = {**child_env(moto_process), "PATH": shell_env()["PATH"]}
    shell(cli.replace("my-bucket", s3_bucket), tmp_path, {k: v for k, v in env.items()
                                                         if not k.startswith("VOLUME_STREAM_")})
    assert not any(p.name.startswith("s3") for p in tmp_path.iterdir())  # nothing local

