"""`make demo` runs examples/demo.py: it must show the records the README promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_demo_end_to_end(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py"),
                           "--workdir", str(tmp_path)], capture_output=True, text=True,
                          timeout=180, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    standard = out.split("stream 'changes' (STANDARD)")[1].split("stream 'arrivals'")[0]
    for needle in ["UPDATE_BEFORE", "UPDATE_AFTER", "DELETE", "logs/app-1.log",
                   "images/dog.jpg"]:
        assert needle in standard, out
    append_only = out.split("stream 'arrivals' (APPEND_ONLY)")[1].split("=== consumed")[0]
    assert "images/dog.jpg" in append_only and "DELETE" not in append_only
    assert "UPDATE" not in append_only
    assert out.count("pending now: 0") == 2
