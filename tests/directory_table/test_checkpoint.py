"""`checkpoint.write_checkpoint` read back by delta-rs (a cold start from our checkpoint after
the commits it covers are deleted: the same rows at every version) and by our own replay
(equal to the JSON-only replay; tombstones expire by `delta.deletedFileRetentionDuration`).
delta-spark on tables with deletion vectors: tests/interop/test_log_checkpoints.py."""

from __future__ import annotations

import json
import os
import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from directory_table import checkpoint, deltalog
from tests.directory_table.test_deltalog import _PROTOCOL as PROTOCOL
from tests.directory_table.test_deltalog import DV1, DV2, _add, _batch, _remove, _write_log
from tests.s3_warehouse_fixtures import s3_client


def _state(state: deltalog.LogState) -> tuple:
    files = state.files.drop(["dataChange"]).to_pylist()
    tombs = state.tombstones.drop(["dataChange"]).to_pylist()
    return (state.version, state.protocol, state.metadata, state.txns, state.domains,
            sorted(map(repr, files)), sorted(map(repr, tombs)))


def _rows(table: pa.Table) -> list[tuple]:
    return sorted(zip(*table.select(["relative_path", "size", "_bucket"]).to_pydict().values(),
                      strict=True))


def _history(root: str) -> None:
    for i in range(4):
        write_deltalake(root, _batch(i), mode="append", partition_by=["_bucket"])
    DeltaTable(root).delete("relative_path = 'd001/f1'")
    write_deltalake(root, _batch(9), mode="overwrite", predicate="_bucket = 0")
    write_deltalake(root, _batch(10), mode="append", partition_by=["_bucket"])
    DeltaTable(root).delete("relative_path = 'd010/f0'")


def test_delta_rs_starts_cold_from_our_checkpoint(tmp_path):
    root = str(tmp_path / "t")
    _history(root)
    latest = DeltaTable(root).version()
    expected = {v: _rows(DeltaTable(root, version=v).to_pyarrow_table())
                for v in range(3, latest + 1)}
    replayed = {v: _state(deltalog.replay(root, None, v)) for v in range(3, latest + 1)}
    written = checkpoint.write_checkpoint(root, None, 3)
    assert (written.version, written.adds, written.pointed) == (3, 4, True)
    assert json.loads(open(f"{root}/_delta_log/_last_checkpoint").read()) == {
        "version": 3, "size": written.size, "sizeInBytes": written.size_in_bytes,
        "numOfAddFiles": 4}
    for v in range(3):
        os.remove(f"{root}/_delta_log/{v:020d}.json")
    for v in range(3, latest + 1):
        assert _rows(DeltaTable(root, version=v).to_pyarrow_table()) == expected[v], v
        state = deltalog.replay(root, None, v)
        assert state.checkpoint == 3
        assert _state(state) == replayed[v], v
    assert _rows(DeltaTable(root).to_pyarrow_table()) == expected[latest]
    # a second checkpoint at the newest version moves _last_checkpoint on
    assert checkpoint.write_checkpoint(root, None).version == latest
    assert _rows(DeltaTable(root).to_pyarrow_table()) == expected[latest]
    assert deltalog.replay(root).checkpoint == latest
    assert not [n for n in os.listdir(f"{root}/_delta_log") if n.endswith(".tmp")]


def test_an_older_checkpoint_leaves_last_checkpoint_alone(tmp_path):
    root = str(tmp_path / "t")
    _history(root)
    checkpoint.write_checkpoint(root, None, 6)
    older = checkpoint.write_checkpoint(root, None, 4)
    assert not older.pointed
    assert json.loads(open(f"{root}/_delta_log/_last_checkpoint").read())["version"] == 6
    assert os.path.exists(f"{root}/_delta_log/{4:020d}.checkpoint.parquet")
    assert deltalog.replay(root, None, 5).checkpoint == 4


def test_checkpoint_keeps_deletion_vectors_and_unexpired_tombstones(tmp_path):
    """A hand-written DV log (delta-rs cannot read DV tables): the checkpoint holds each file's
    DV; tombstones older than the retention are dropped, newer ones kept."""
    root = str(tmp_path / "t")
    now = int(time.time() * 1000)
    metadata = {"metaData": {
        "id": "t1", "format": {"provider": "parquet", "options": {}},
        "schemaString": json.dumps({"type": "struct", "fields": []}),
        "partitionColumns": ["_bucket"], "createdTime": 1,
        "configuration": {"delta.enableDeletionVectors": "true",
                          "delta.deletedFileRetentionDuration": "interval 2 days"}}}
    recent = _remove("_bucket=2/a.parquet", DV1)
    recent["remove"]["deletionTimestamp"] = now - 86_400_000  # a day old: kept
    _write_log(root, [
        [PROTOCOL, metadata, _add("_bucket=2/a.parquet"), _add("_bucket=2/b.parquet"),
         {"txn": {"appId": "app", "version": 4, "lastUpdated": 9}}],
        [_remove("_bucket=2/a.parquet"), _add("_bucket=2/a.parquet", DV1)],  # removed at 7
        [recent, _add("_bucket=2/a.parquet", DV2)],
    ])
    written = checkpoint.write_checkpoint(root, None, now_ms=now)
    assert (written.adds, written.tombstones) == (2, 1)
    full = deltalog.replay(root)
    for v in range(3):
        os.remove(f"{root}/_delta_log/{v:020d}.json")
    cold = deltalog.replay(root)
    assert cold.checkpoint == 2
    assert sorted(map(repr, cold.files.drop(["dataChange"]).to_pylist())) == sorted(
        map(repr, full.files.drop(["dataChange"]).to_pylist()))
    assert cold.deletion_vectors()["_bucket=2/a.parquet"] == {**DV2, "maxRowIndex": None}
    assert deltalog.dv_unique_id(cold.tombstones["deletionVector"]).to_pylist() == [
        "i" + DV1["pathOrInlineDv"]]
    assert (cold.protocol, cold.metadata, cold.txns) == (full.protocol, full.metadata,
                                                         full.txns)
    assert cold.files["dataChange"].to_pylist() == [False, False]


@pytest.mark.parametrize(("text", "ms"), [
    ("interval 1 week", 604_800_000), ("interval 7 days", 604_800_000),
    ("INTERVAL 2 hours 30 minutes", 9_000_000), ("interval 1 day 1 second", 86_401_000),
    ("interval 250 milliseconds", 250)])
def test_retention_reads_spark_intervals(text, ms):
    assert checkpoint.retention_ms({"delta.deletedFileRetentionDuration": text}) == ms
    assert checkpoint.retention_ms({}) == 604_800_000


def test_retention_that_is_no_interval_is_refused():
    with pytest.raises(ValueError, match="deletedFileRetentionDuration"):
        checkpoint.retention_ms({"delta.deletedFileRetentionDuration": "interval 3 fortnights"})
    with pytest.raises(ValueError, match="not an interval"):
        checkpoint.retention_ms({"delta.deletedFileRetentionDuration": "soon"})


def test_checkpoint_on_s3(tmp_path, s3_bucket, s3_env):
    root = str(tmp_path / "t")
    _history(root)
    client = s3_client(s3_env)
    for name in os.listdir(f"{root}/_delta_log"):
        client.upload_file(f"{root}/_delta_log/{name}", s3_bucket, f"t/_delta_log/{name}")
    uri = f"s3://{s3_bucket}/t"
    expected = _state(deltalog.replay(uri))
    written = checkpoint.write_checkpoint(uri)
    for v in range(written.version):
        client.delete_object(Bucket=s3_bucket, Key=f"t/_delta_log/{v:020d}.json")
    state = deltalog.replay(uri)
    assert state.checkpoint == written.version
    assert _state(state) == expected
    body = client.get_object(Bucket=s3_bucket, Key="t/_delta_log/_last_checkpoint")["Body"]
    assert json.loads(body.read())["version"] == written.version


def test_a_torn_last_checkpoint_is_only_a_lost_hint(tmp_path):
    """`_last_checkpoint` is written without a sync: after a crash it may be cut short, and
    readers then list the log (delta-rs and our replay alike)."""
    root = str(tmp_path / "t")
    _history(root)
    expected = _rows(DeltaTable(root).to_pyarrow_table())
    written = checkpoint.write_checkpoint(root, None, 4)
    for v in range(4):
        os.remove(f"{root}/_delta_log/{v:020d}.json")
    with open(f"{root}/_delta_log/_last_checkpoint", "r+b") as f:
        f.truncate(7)
    assert _rows(DeltaTable(root).to_pyarrow_table()) == expected
    assert deltalog.replay(root).checkpoint == written.version
