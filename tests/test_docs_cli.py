"""The shell blocks of README.md and docs/*.md run as printed, in a sandbox that looks like the
project folder after `make install` (`tests/docs_blocks.py`): the README's set-up and command
line at a glance, the pipeline page's recipes, demo, spec, `volume-stream run` and
`spark-submit`, and the daemon page's two shells. Blocks that need another block's warehouse
run in `tests/test_docs.py` beside it; the few that cannot run are listed in `NOT_RUN`."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from tests.docs_blocks import block, sandbox, shell, shell_env, start_shell, stop_shell
from tests.s3_warehouse_fixtures import free_port


def test_readme_shell_blocks_run_as_printed(tmp_path):
    folder = sandbox(tmp_path)
    assert "Commands:" in shell(block("venv"), folder)
    out = shell(block("glance"), folder)
    for said in ("created volume photos", "created stream new_photos", "a.txt",
                 "examples/volume-stream.toml: ok", "dropped volume photos"):
        assert said in out, out


@pytest.mark.slow  # the pipelines page runs Spark jobs one after another (~2 min): make soak
def test_pipeline_page_shell_blocks_run_as_printed(tmp_path):
    """The recipes on their own, then the demo kept in /tmp/vs-demo (here: the sandbox's
    vs-demo) with the recipes on its volume, then the page's spec run by `volume-stream run`
    and by `spark-submit`."""
    folder = sandbox(tmp_path)
    demo = str(folder / "vs-demo")
    out = shell(block("recipes"), folder)
    assert "holiday" in out or "image_meta" in out or "rows" in out, out
    shell(block("demo_recipes").replace("/tmp/vs-demo", demo), folder)
    # the spec shown is the spec that runs
    (folder / "examples" / "pipelines" / "image_metadata.toml").write_text(block("spec"))
    out = shell(block("run_spec").replace("/tmp/vs-demo", demo), folder)
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert lines and all("files_seen" in line for line in lines), out
    out = shell(block("spark_submit").replace("/tmp/vs-demo", demo), folder)
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert lines and lines[-1]["files_seen"] == 0, out  # `run` left nothing pending


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def test_daemon_page_shell_blocks_run_as_printed(tmp_path):
    """The first shell starts the daemon; once it is ready, the second shell drops a file and
    reads the stream, until the file's record is there. The metrics port is the only
    substitution (a free one, through the documented VOLUME_STREAM_METRICS__PORT)."""
    folder = sandbox(tmp_path)
    port = free_port()
    env = shell_env(VOLUME_STREAM_METRICS__PORT=str(port))
    daemon = start_shell(block("daemon_start"), folder, env)
    try:
        deadline = time.monotonic() + 120
        while _get(f"http://127.0.0.1:{port}/readyz") != 200:
            assert daemon.poll() is None, stop_shell(daemon)
            assert time.monotonic() < deadline, "the daemon did not become ready"
            time.sleep(0.2)
        other = block("daemon_other_shell")
        assert "localhost:9108" in other
        out = shell(other.replace("localhost:9108", f"localhost:{port}"), folder)
        read = other.strip().splitlines()[-1]
        assert read.startswith("volume-stream stream read arrivals")
        while "hello.txt" not in out:  # the daemon commits within max_wait_s of the event
            assert time.monotonic() < deadline, out
            time.sleep(0.2)
            out = shell(read, folder)
    finally:
        log = stop_shell(daemon)
    assert daemon.returncode == 0, log[-3000:]
