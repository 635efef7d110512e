"""DataX-style export of a change-tracked SQL table's change log (issue 15: change logs of
tables): the key column (row id, or the log's key column) in place of `relative_path`, a `U`
row per visible column, `DR` before an update's and a delete's rows, every column type as text,
status-table resume, the CLI, and clear errors for tables without a change log."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import volume_stream as vs
from volume_stream.cli.app import app
from volume_stream.errors import InvalidInputError, NotFoundError
from volume_stream.tables import Column


@pytest.fixture
def cat(tmp_path):
    return vs.connect(tmp_path / "wh")


def ended(end_ms):
    """end_ms, once the clock has passed it (these tests export with `safety_lag_ms=0`: every
    commit is written before the export starts, none can be in flight)."""
    while time.time() * 1000 <= end_ms:
        time.sleep(0.001)
    return end_ms


def commit_ms(cat, name, version):
    (h,) = [h for h in cat.tables.open(name).history() if h["version"] == version]
    return int(h["timestamp"])


def rows_of(out):
    return [r for f in sorted(Path(out).glob("part-*.parquet"))
            for r in pq.read_table(f).to_pylist()]


def things(cat):
    """v0 create, v1 tracking on, v2 insert 2 rows, v3 update one, v4 delete the other."""
    store = cat.tables
    store.create("things", [Column("id", "BIGINT"), Column("name", "STRING"),
                            Column("blob", "BINARY"), Column("at", "TIMESTAMP_NTZ")])
    store.set_properties("things", {"change_tracking": "true"})
    store.insert("things", pa.table({
        "id": pa.array([1, 2], pa.int64()), "name": ["a", None],
        "blob": pa.array([b"\x00\xff", b"z"], pa.binary()),
        "at": pa.array([datetime(2026, 11, 23, 8, 0, 1), None], pa.timestamp("us"))}))
    store.update("things", {"name": "'A'"}, where="id = 1")
    store.delete("things", where="id = 2")
    return store


def test_a_tables_changes_export_keyed_by_row_id(cat, tmp_path):
    store = things(cat)
    v = store.version("things")
    assert v == 4
    end = ended(commit_ms(cat, "things", v) + 1)
    res = cat.export_changes("things", safety_lag_ms=0,
                             start_ms=0, end_ms=end, out=tmp_path / "out")
    rows = rows_of(tmp_path / "out")
    assert list(rows[0]) == ["_vs_row_id", "column_name", "version", "column_value", "op_type"]
    ids = {r["column_value"]: r["_vs_row_id"] for r in rows if r["column_name"] == "id"}
    one, two = ids["1"], ids["2"]
    t2, t3, t4 = (commit_ms(cat, "things", n) for n in (2, 3, 4))
    got = [(r["_vs_row_id"], r["version"], r["op_type"], r["column_name"], r["column_value"])
           for r in rows]
    insert_one = [(one, t2, "U", "id", "1"), (one, t2, "U", "name", "a"),
                  (one, t2, "U", "blob", base64.b64encode(b"\x00\xff").decode()),
                  (one, t2, "U", "at", "2026-11-23T08:00:01.000000")]
    insert_two = [(two, t2, "U", "id", "2"), (two, t2, "U", "blob", "eg==")]  # nulls: no row
    update_one = [(one, t3, "DR", None, None), (one, t3, "U", "id", "1"),
                  (one, t3, "U", "name", "A"), *[r[:1] + (t3,) + r[2:] for r in insert_one[2:]]]
    delete_two = [(two, t4, "DR", None, None)]
    assert sorted(got, key=repr) == sorted(insert_one + insert_two + update_one + delete_two,
                                           key=repr)
    assert res.records == 4 and res.rows == len(got)
    # only the update's commit: [t3, t4)
    res = cat.export_changes("things", safety_lag_ms=0,
                             start_ms=t3, end_ms=t4, out=tmp_path / "mid")
    assert {r["op_type"] for r in rows_of(tmp_path / "mid")} == {"DR", "U"}
    assert res.records == 1


def test_a_key_column_replaces_the_row_id_and_a_rerun_resumes(cat, tmp_path):
    store = cat.tables
    store.create("kv", [Column("k", "STRING"), Column("n", "BIGINT")])
    store.set_properties("kv", {"change_tracking": "true"})
    cat.enable_change_log("kv", key="k", shards=2)
    store.insert("kv", pa.table({"k": [f"k{i}" for i in range(30)], "n": list(range(30))}))
    store.update("kv", {"n": "n + 100"}, where="n < 10")
    end = ended(commit_ms(cat, "kv", store.version("kv")) + 1)
    res = cat.export_changes("kv", safety_lag_ms=0, start_ms=0, end_ms=end, out=tmp_path / "out",
                             status_table="kv_status")
    rows = rows_of(tmp_path / "out")
    assert list(rows[0])[0] == "k" and {r["column_name"] for r in rows} == {"n", None}
    assert res.records == 40 and res.rows == 30 + 10 * 2 and res.shards == 2
    again = cat.export_changes("kv", safety_lag_ms=0, start_ms=0, end_ms=end, out=tmp_path / "out",
                               status_table="kv_status")
    assert again.rows == 0 and len(rows_of(tmp_path / "out")) == len(rows)


def test_cli_exports_a_table_and_names_what_cannot_be(cat, tmp_path):
    things(cat)
    cat.tables.create("plain", [Column("x", "BIGINT")])
    end = ended(commit_ms(cat, "things", 4) + 1)
    wh = ["--warehouse", str(cat.warehouse.root)]
    runner = CliRunner()
    res = runner.invoke(app, ["export", "things", "--start-ms", "0", "--end-ms", str(end),
                              "--safety-lag-ms", "0",
                              "--out", str(tmp_path / "cli"), *wh])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout.strip().splitlines()[-1])["records"] == 4
    with pytest.raises(InvalidInputError, match="'plain' does not have change tracking"):
        cat.export_changes("plain", safety_lag_ms=0, start_ms=0, end_ms=end, out=tmp_path / "p")
    with pytest.raises(NotFoundError, match="nothing_here"):
        cat.export_changes("nothing_here", safety_lag_ms=0,
                           start_ms=0, end_ms=end, out=tmp_path / "n")
    proc = subprocess.run([str(Path(sys.executable).parent / "volume-stream"), "export", "plain",
                           "--start-ms", "0", "--end-ms", str(end),
                           "--safety-lag-ms", "0", "--out", str(tmp_path / "p"),
                           *wh], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "'plain' does not have change tracking" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "p").exists()


def test_spark_engine_exports_a_table_as_threads_do(tmp_path, spark):
    cat = vs.connect(tmp_path / "wh", spark=spark)
    store = cat.tables
    store.create("kv", [Column("k", "STRING"), Column("n", "BIGINT")])
    store.set_properties("kv", {"change_tracking": "true"})
    cat.enable_change_log("kv", key="k", shards=3)
    store.insert("kv", pa.table({"k": [f"k{i}" for i in range(20)], "n": list(range(20))}))
    store.delete("kv", where="n >= 15")
    end = ended(commit_ms(cat, "kv", store.version("kv")) + 1)
    res = cat.export_changes("kv", safety_lag_ms=0, start_ms=0, end_ms=end, out=tmp_path / "spark",
                             engine="spark")
    threads = cat.export_changes("kv", safety_lag_ms=0,
                                 start_ms=0, end_ms=end, out=tmp_path / "threads")
    assert res.shards == 3 and res.rows == threads.rows == 20 + 5
    assert sorted(map(str, rows_of(tmp_path / "spark"))) == sorted(
        map(str, rows_of(tmp_path / "threads")))
