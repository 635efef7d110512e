"""Every Python block of docs/spark-delta.md runs as printed, in order, in one namespace, in a
temp folder, on the session's Delta-enabled Spark; each run of full-line comments after a line
that prints (`.show(` or `print(`) must be lines of what the block printed. (They are the
"spark_delta", "spark_delta_table", "spark_delta_tools", "spark_delta_target" and
"spark_delta_register" blocks of tests/docs_blocks.py.)"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "spark-delta.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```$", PAGE.read_text(), re.M | re.S)


def _expected(block: str) -> list[str]:
    lines, wanted, printing = block.splitlines(), [], False
    for line in lines:
        if line.startswith("#") and printing:
            wanted.append(line[1:].strip())
            continue
        printing = ".show(" in line or "print(" in line
    return wanted


@pytest.mark.slow  # every block of the page, a Spark job each (about 80 s): make soak
def test_the_page_runs_as_printed(delta_spark, tmp_path, monkeypatch):
    assert len(BLOCKS) >= 5
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    try:
        for block in BLOCKS:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(block, str(PAGE), "exec"), namespace)  # noqa: S102
            printed = {line.strip() for line in out.getvalue().splitlines()}
            for line in _expected(block):
                assert line in printed, f"{line!r} not printed by:\n{block}\n{out.getvalue()}"
    finally:  # the page turns VACUUM's safety check off in the session's one SparkSession
        delta_spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
