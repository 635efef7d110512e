"""`make demo` runs examples/demo.py: it must show the records the README promises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_demo_end_to_end(tmp_path):
    """As `make demo` runs it: no --workdir (a temp folder, removed at the end), from the
    project folder, the virtual environment not activated."""
    bin_dir = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p != bin_dir)
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PATH": path, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "warehouse " + str(tmp_path) in out  # it worked in a temp folder...
    # ...and removed it. Two files stay in the temp folder by design: Spark's own log (where
    # the README says) and the Python worker launcher local sessions share (written once per
    # interpreter and release: `_spark.worker_python`)
    left = [p.name for p in tmp_path.iterdir() if p.name != "volume-stream-spark.log"]
    assert [n for n in left if not n.startswith("volume-stream-python-")] == [], left
    assert len(left) <= 1, left
    # volume-stream is not on PATH: the demo says how to get it there
    activate = os.path.relpath(Path(bin_dir) / "activate", ROOT)
    assert f"  . {activate}\n  volume-stream --help\n" in out
    standard = out.split("stream 'changes' (STANDARD)")[1].split("stream 'arrivals'")[0]
    for needle in ["UPDATE_BEFORE", "UPDATE_AFTER", "DELETE", "logs/app-1.log",
                   "images/dog.jpg"]:
        assert needle in standard, out
    append_only = out.split("stream 'arrivals' (APPEND_ONLY)")[1].split("=== consumed")[0]
    assert "images/dog.jpg" in append_only and "DELETE" not in append_only
    assert "UPDATE" not in append_only
    assert out.count("pending now: 0") == 2
