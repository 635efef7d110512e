"""A full disk is an error in our words, naming the table, with nothing written: delta-rs said
"Failed to parse parquet: ... No space left on device (os error 28)" as an `InvalidInputError`.

The warehouse lives on a 2 MiB tmpfs mounted in a private mount namespace (`unshare -Urm`, so
no root and no mount outside the test's own process)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import json, os, sys, pyarrow as pa
    import volume_stream as vs
    from volume_stream.tables import Column
    cat = vs.connect(sys.argv[1] + "/wh")
    cat.tables.create("t", [Column("id", "INT"), Column("s", "STRING")])
    cat.tables.insert("t", pa.table({"id": pa.array([1], pa.int32()), "s": ["kept"]}))
    big = pa.table({"id": pa.array(range(5000), pa.int32()),
                    "s": [os.urandom(400).hex() for _ in range(5000)]})  # ~4 MB, incompressible
    out = {}
    try:
        cat.tables.insert("t", big)
    except Exception as exc:
        out = {"type": type(exc).__name__, "message": str(exc),
               "bases": [c.__name__ for c in type(exc).__mro__]}
    out["rows"] = cat.tables.snapshot("t").num_rows
    print(json.dumps(out))
""")


@pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux unshare is missing")
def test_a_full_disk_is_a_warehouse_error_and_writes_nothing(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    script = tmp_path / "fill.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        ["unshare", "-Urm", "sh", "-c",
         f'mount -t tmpfs -o size=2m tmpfs "{mount}" && exec "{sys.executable}" "{script}" '
         f'"{mount}"'], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["type"] == "WarehouseError", out
    assert out["message"].startswith("table 't': the storage is full"), out
    assert "nothing was written" in out["message"] and "Failed to parse" not in out["message"]
    assert out["rows"] == 1  # the table still reads, with only what was committed before
