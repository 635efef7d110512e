"""`deltalog.replay` against delta-rs's own reading of the same logs (JSON commits, delta-rs
checkpoints, time travel before a checkpoint, S3 on moto), and on hand-written logs for what
delta-rs cannot show: deletion vectors, percent-encoded paths, a file's DV replaced. Spark's
logs and checkpoints with deletion vectors: tests/interop/test_log_checkpoints.py."""

from __future__ import annotations

import json
import os
import shutil

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from directory_table import deltalog
from tests.s3_warehouse_fixtures import s3_client

#: the version of the checkpoint `_history` makes
CP = 5


def _batch(i: int, n: int = 3) -> pa.Table:
    return pa.table({"relative_path": [f"d{i:03d}/f{j}" for j in range(n)],
                     "size": pa.array(range(n), pa.int64()), "_bucket": [i % 3] * n})


def _ours(state: deltalog.LogState) -> list[tuple]:
    t = state.files
    return sorted(zip(t["log_path"].to_pylist(), t["size"].to_pylist(),
                      t["bucket"].to_pylist(), t["num_records"].to_pylist(),
                      t["min_path"].to_pylist(), t["max_path"].to_pylist(), strict=True))


def _theirs(dt: DeltaTable) -> list[tuple]:
    t = pa.table(dt.get_add_actions(flatten=True))
    return sorted(zip(t["path"].to_pylist(), t["size_bytes"].to_pylist(),
                      t["partition._bucket"].to_pylist(), t["num_records"].to_pylist(),
                      t["min.relative_path"].to_pylist(), t["max.relative_path"].to_pylist(),
                      strict=True))


def _history(root: str) -> None:
    """Appends (0-3), a delete (4), an overwrite of one bucket (5), a checkpoint at 5, more
    commits (6-9)."""
    for i in range(4):
        write_deltalake(root, _batch(i), mode="append", partition_by=["_bucket"])
    dt = DeltaTable(root)
    dt.delete("relative_path = 'd001/f1'")
    write_deltalake(root, _batch(9), mode="overwrite", predicate="_bucket = 0")
    DeltaTable(root).create_checkpoint()
    for i in range(10, 13):
        write_deltalake(root, _batch(i), mode="append", partition_by=["_bucket"])
    DeltaTable(root).delete("relative_path = 'd010/f0'")


def test_replay_matches_delta_rs_at_every_version(tmp_path):
    root = str(tmp_path / "t")
    _history(root)
    latest = DeltaTable(root).version()
    assert os.path.exists(f"{root}/_delta_log/{CP:020d}.checkpoint.parquet")
    for v in range(latest + 1):
        state = deltalog.replay(root, None, v)
        assert state.version == v
        assert state.checkpoint == (CP if v >= CP else None)
        assert _ours(state) == _theirs(DeltaTable(root, version=v)), v
    state = deltalog.replay(root)
    assert state.version == latest
    assert state.metadata["partitionColumns"] == ["_bucket"]
    assert state.protocol["minReaderVersion"] == 1
    assert json.loads(state.metadata["schemaString"])["type"] == "struct"
    assert state.files["deletionVector"].null_count == state.files.num_rows
    # the files removed since the checkpoint and before it are tombstones
    assert len(state.tombstones) >= 2


def test_replay_reads_a_delta_rs_checkpoint_alone(tmp_path):
    """Cold start: the commits the checkpoint covers are gone."""
    root = str(tmp_path / "t")
    _history(root)
    expected = {v: _ours(deltalog.replay(root, None, v)) for v in range(CP, 10)}
    for v in range(CP):
        os.remove(f"{root}/_delta_log/{v:020d}.json")
    for v, files in expected.items():
        assert _ours(deltalog.replay(root, None, v)) == files
    with pytest.raises(deltalog.LogGap, match="commit 0 is missing"):
        deltalog.replay(root, None, CP - 1)


def test_replay_from_a_delta_rs_checkpoint_equals_json_only_replay(tmp_path):
    root = str(tmp_path / "t")
    _history(root)
    plain = str(tmp_path / "plain")
    os.makedirs(f"{plain}/_delta_log")
    for name in os.listdir(f"{root}/_delta_log"):
        if name.endswith(".json"):
            shutil.copy(f"{root}/_delta_log/{name}", f"{plain}/_delta_log/{name}")
    for v in range(CP, DeltaTable(root).version() + 1):
        ours, alone = deltalog.replay(root, None, v), deltalog.replay(plain, None, v)
        assert (ours.checkpoint, alone.checkpoint) == (CP, None)
        for state in (ours, alone):  # checkpoints clear dataChange; Spark's JSON lacks nulls
            state.files = state.files.drop(["dataChange"])
            state.tombstones = state.tombstones.select(["path", "deletionTimestamp"])
        assert sorted(map(repr, ours.files.to_pylist())) == sorted(
            map(repr, alone.files.to_pylist()))
        assert sorted(map(repr, ours.tombstones.to_pylist())) == sorted(
            map(repr, alone.tombstones.to_pylist()))
        assert (ours.protocol, ours.metadata, ours.txns) == (alone.protocol, alone.metadata,
                                                             alone.txns)


def test_replay_without_last_checkpoint_lists_the_log(tmp_path):
    root = str(tmp_path / "t")
    _history(root)
    expected = _ours(deltalog.replay(root))
    os.remove(f"{root}/_delta_log/_last_checkpoint")
    state = deltalog.replay(root)
    assert (state.checkpoint, _ours(state)) == (CP, expected)


def test_replay_when_last_checkpoint_names_a_missing_checkpoint(tmp_path):
    root = str(tmp_path / "t")
    _history(root)
    expected = _ours(deltalog.replay(root))
    os.remove(f"{root}/_delta_log/{CP:020d}.checkpoint.parquet")
    state = deltalog.replay(root)
    assert (state.checkpoint, _ours(state)) == (None, expected)


def test_replay_errors_name_the_table(tmp_path):
    with pytest.raises(deltalog.LogGap, match="no Delta table at"):
        deltalog.replay(str(tmp_path / "none"))
    root = str(tmp_path / "t")
    write_deltalake(root, _batch(0))
    with pytest.raises(deltalog.LogGap, match="has no version 3"):
        deltalog.replay(root, None, 3)


def _write_log(root: str, commits: list[list[dict]]) -> None:
    os.makedirs(f"{root}/_delta_log", exist_ok=True)
    for v, actions in enumerate(commits):
        with open(f"{root}/_delta_log/{v:020d}.json", "w") as f:
            f.write("".join(json.dumps(a) + "\n" for a in actions))


_PROTOCOL = {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                          "readerFeatures": ["deletionVectors"],
                          "writerFeatures": ["deletionVectors"]}}
_SCHEMA = json.dumps({"type": "struct", "fields": [
    {"name": "relative_path", "type": "string", "nullable": True, "metadata": {}},
    {"name": "_bucket", "type": "integer", "nullable": True, "metadata": {}}]})
_METADATA = {"metaData": {"id": "t1", "format": {"provider": "parquet", "options": {}},
                          "schemaString": _SCHEMA, "partitionColumns": ["_bucket"],
                          "configuration": {"delta.enableDeletionVectors": "true"},
                          "createdTime": 1}}


def _add(path: str, dv: dict | None = None, rows: int = 10) -> dict:
    stats = {"numRecords": rows, "minValues": {"relative_path": "a"},
             "maxValues": {"relative_path": "z"}}
    return {"add": {"path": path, "partitionValues": {"_bucket": "2"}, "size": 100,
                    "modificationTime": 5, "dataChange": True, "stats": json.dumps(stats),
                    **({"deletionVector": dv} if dv else {})}}


def _remove(path: str, dv: dict | None = None) -> dict:
    return {"remove": {"path": path, "deletionTimestamp": 7, "dataChange": True,
                       **({"deletionVector": dv} if dv else {})}}


DV1 = {"storageType": "i", "pathOrInlineDv": "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L",
       "sizeInBytes": 40, "cardinality": 2}
DV2 = {"storageType": "u", "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^", "offset": 4,
       "sizeInBytes": 40, "cardinality": 3}


def _dv_log(root: str) -> None:
    """A file gains a DV, then has it replaced (remove + add of the same path in one commit
    each time); a second file with an escaped path is removed under another spelling."""
    _write_log(root, [
        [_PROTOCOL, _METADATA, _add("_bucket=2/a.parquet"), _add("_bucket=2/b%20c.parquet"),
         {"txn": {"appId": "app", "version": 1}}],
        [_remove("_bucket=2/a.parquet"), _add("_bucket=2/a.parquet", DV1)],
        [_remove("_bucket=2/a.parquet", DV1), _add("_bucket=2/a.parquet", DV2),
         {"txn": {"appId": "app", "version": 2}}],
        [_remove("_bucket%3D2/b c.parquet")],
    ])


def test_replay_follows_deletion_vectors_and_decodes_paths(tmp_path):
    root = str(tmp_path / "t")
    _dv_log(root)
    states = [deltalog.replay(root, None, v) for v in range(4)]
    assert [s.files["path"].to_pylist() for s in states] == [
        ["_bucket=2/a.parquet", "_bucket=2/b c.parquet"],
        ["_bucket=2/b c.parquet", "_bucket=2/a.parquet"],
        ["_bucket=2/b c.parquet", "_bucket=2/a.parquet"], ["_bucket=2/a.parquet"]]
    assert states[1].deletion_vectors() == {"_bucket=2/a.parquet": {**DV1, "offset": None,
                                                                     "maxRowIndex": None}}
    last = states[3]
    assert last.deletion_vectors()["_bucket=2/a.parquet"]["pathOrInlineDv"] == DV2[
        "pathOrInlineDv"]
    assert last.files["bucket"].to_pylist() == [2]
    assert last.txns == {"app": {"appId": "app", "version": 2}}
    assert last.protocol["readerFeatures"] == ["deletionVectors"]
    assert last.metadata["configuration"] == {"delta.enableDeletionVectors": "true"}
    assert last.adds()[0]["partitionValues"] == {"_bucket": "2"}
    # tombstones: a.parquet with no DV and with DV1, and b c.parquet
    tomb = last.tombstones
    assert sorted(zip(deltalog.decoded(tomb["path"]).to_pylist(),
                      deltalog.dv_unique_id(tomb["deletionVector"]).to_pylist(),
                      strict=True)) == [("_bucket=2/a.parquet", ""),
                                        ("_bucket=2/a.parquet", "i" + DV1["pathOrInlineDv"]),
                                        ("_bucket=2/b c.parquet", "")]


def test_stats_that_do_not_parse_give_nulls_for_their_file_only(tmp_path):
    root = str(tmp_path / "t")
    odd = _add("_bucket=2/c.parquet")
    odd["add"]["stats"] = '{"numRecords": "many"}'
    broken = _add("_bucket=2/d.parquet")
    broken["add"]["stats"] = '{"numRecords": 4, "minVal'
    _write_log(root, [[_PROTOCOL, _METADATA, _add("_bucket=2/a.parquet", rows=7), odd, broken]])
    files = deltalog.replay(root).files
    assert sorted(zip(files["path"].to_pylist(), files["num_records"].to_pylist(),
                      files["min_path"].to_pylist(), strict=True)) == [
        ("_bucket=2/a.parquet", 7, "a"), ("_bucket=2/c.parquet", None, None),
        ("_bucket=2/d.parquet", None, None)]


def test_dv_unique_id_follows_the_protocol():
    dvs = pa.array([DV1, DV2, None], deltalog.DV)
    assert deltalog.dv_unique_id(dvs).to_pylist() == [
        "i" + DV1["pathOrInlineDv"], "u" + DV2["pathOrInlineDv"] + "@4", ""]


def test_replay_on_s3_matches_local(tmp_path, s3_bucket, s3_env):
    root = str(tmp_path / "t")
    _history(root)
    client = s3_client(s3_env)
    for dirpath, _, names in os.walk(root):
        for name in names:
            local = os.path.join(dirpath, name)
            client.upload_file(local, s3_bucket, f"t/{os.path.relpath(local, root)}")
    uri = f"s3://{s3_bucket}/t"
    for v in (3, CP, 8, DeltaTable(root).version()):
        assert _ours(deltalog.replay(uri, None, v)) == _ours(deltalog.replay(root, None, v))
    latest = deltalog.replay(uri)
    assert (latest.version, latest.checkpoint) == (DeltaTable(root).version(), CP)


def test_multi_part_checkpoint_with_a_missing_part_is_ignored(tmp_path):
    root = str(tmp_path / "t")
    _history(root)
    log = f"{root}/_delta_log"
    # a second, incomplete checkpoint at 8 (part 2 of 2 never written)
    shutil.copy(f"{log}/{CP:020d}.checkpoint.parquet",
                f"{log}/{8:020d}.checkpoint.{1:010d}.{2:010d}.parquet")
    state = deltalog.replay(root)
    assert state.checkpoint == CP
