"""Our log replay (`directory_table.deltalog`) and checkpoint writer
(`directory_table.checkpoint`) with delta-spark as the judge, on tables Spark itself wrote with
deletion vectors (its DELETE and UPDATE mark rows in DVs when `delta.enableDeletionVectors` is
set): replay from Spark's classic and multi-part checkpoints equals replay from the JSON commits
alone and agrees with the rows Spark reads from each file; Spark reads every version from our
checkpoints after the commits they cover are deleted."""

from __future__ import annotations

import os
import shutil
from urllib.parse import unquote

import pytest

from directory_table import deltalog
from tests.interop.judge import cold

#: Spark's conf for the actions per part of a checkpoint (multi-part when a table has more)
PART_SIZE = "spark.databricks.delta.checkpoint.partSize"


def _spark_dv_table(spark, path: str, *, interval: int) -> int:
    """A partitioned table with deletion vectors, written by Spark: appends, DELETEs and an
    UPDATE (DVs on files, a file's DV replaced by a bigger one), checkpoints every `interval`
    commits. Returns its newest version."""
    spark.sql(f"CREATE TABLE delta.`{path}` (relative_path STRING, size BIGINT, _bucket INT) "
              f"USING delta PARTITIONED BY (_bucket) TBLPROPERTIES ("
              f"'delta.enableDeletionVectors'='true', 'delta.checkpointInterval'='{interval}')")
    for batch in range(3):
        rows = [(f"b{batch}/f{i:03d}", i, i % 2) for i in range(40)]
        (spark.createDataFrame(rows, "relative_path string, size bigint, _bucket int")
         .repartition(2).write.format("delta").mode("append").save(path))
    spark.sql(f"DELETE FROM delta.`{path}` WHERE relative_path LIKE 'b0/f00%'")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE relative_path LIKE 'b0/f01%'")
    spark.sql(f"UPDATE delta.`{path}` SET size = size + 1000 WHERE relative_path LIKE 'b1/f02%'")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE relative_path = 'b2/f039'")
    return spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").collect()[0]["version"]


def _json_only(root: str, dest: str) -> str:
    """A copy of `root`'s log without its checkpoints (replay must use the commits alone)."""
    os.makedirs(f"{dest}/_delta_log")
    for name in os.listdir(f"{root}/_delta_log"):
        if name.endswith(".json") and ".checkpoint." not in name:  # not a V2 checkpoint
            shutil.copy(f"{root}/_delta_log/{name}", f"{dest}/_delta_log/{name}")
    return dest


def _files(state: deltalog.LogState) -> list[tuple]:
    """Each active file as replay gives it (all but `dataChange`, which checkpoints clear)."""
    t = state.files.drop(["dataChange"])
    return sorted(tuple(repr(v) for v in row.values()) for row in t.to_pylist())


def _tombstones(state: deltalog.LogState) -> list[tuple]:
    t = state.tombstones
    return sorted(zip(deltalog.decoded(t["path"]).to_pylist(),
                      deltalog.dv_unique_id(t["deletionVector"]).to_pylist(), strict=True))


def _spark_rows_per_file(spark, path: str, versions: list[int]) -> dict[int, dict[str, int]]:
    """The rows Spark reads at each of `versions`, counted per data file (relative, decoded),
    in one Spark job."""
    from pyspark.sql import functions as F

    union = None
    for v in versions:
        df = (spark.read.format("delta").option("versionAsOf", v).load(path)
              .select(F.lit(v).alias("v"), F.input_file_name().alias("f")))
        union = df if union is None else union.unionByName(df)
    found: dict[int, dict[str, int]] = {v: {} for v in versions}
    for r in union.groupBy("v", "f").count().collect():
        name = unquote(r["f"]).removeprefix("file:").removeprefix("//")
        found[r["v"]][os.path.relpath(name, path)] = r["count"]
    return found


def _our_rows_per_file(state: deltalog.LogState) -> dict[str, int]:
    dv = state.files["deletionVector"].to_pylist()
    return {p: n - (d["cardinality"] if d else 0)
            for p, n, d in zip(state.files["path"].to_pylist(),
                               state.files["num_records"].to_pylist(), dv, strict=True)
            if n - (d["cardinality"] if d else 0) > 0}


@pytest.fixture(scope="module")
def spark_dv_table(delta_spark, tmp_path_factory) -> tuple[str, int]:
    """One Spark DV table for the module (checkpoints every 3 commits): each test copies it."""
    path = str(tmp_path_factory.mktemp("spark") / "t")
    return path, _spark_dv_table(delta_spark, path, interval=3)


def _copy(table: tuple[str, int], dest) -> tuple[str, int]:
    shutil.copytree(table[0], str(dest))
    return str(dest), table[1]


def _replay_agrees_with_json_only(path: str, plain: str, versions: range) -> int:
    """Replay from the table's checkpoints equals replay from its commits alone at each of
    `versions`; returns how many files had deletion vectors, summed over the versions."""
    with_dvs = 0
    for v in versions:
        ours = deltalog.replay(path, None, v)
        alone = deltalog.replay(plain, None, v)
        assert alone.checkpoint is None
        assert _files(ours) == _files(alone), v
        assert _tombstones(ours) == _tombstones(alone), v
        assert (ours.protocol, ours.metadata) == (alone.protocol, alone.metadata)
        with_dvs += len(ours.deletion_vectors())
    return with_dvs


def test_replay_of_spark_checkpoints_with_deletion_vectors(delta_spark, spark_dv_table,
                                                           tmp_path):
    path, latest = _copy(spark_dv_table, tmp_path / "t")
    checkpoints = sorted(n for n in os.listdir(f"{path}/_delta_log")
                         if ".checkpoint." in n and not n.startswith("."))
    assert checkpoints == [f"{v:020d}.checkpoint.parquet" for v in range(3, latest + 1, 3)]
    for v in range(latest + 1):
        assert deltalog.replay(path, None, v).checkpoint == (v // 3 * 3 if v >= 3 else None)
    plain = _json_only(path, str(tmp_path / "json"))
    # Spark's DELETE and UPDATE left deletion vectors
    assert _replay_agrees_with_json_only(path, plain, range(latest + 1))
    assert deltalog.replay(path).protocol["readerFeatures"] == ["deletionVectors"]
    # the rows each file holds once its DV is applied are the rows Spark reads from it
    # (at three versions: before any checkpoint, and from each of Spark's two checkpoints)
    cold(delta_spark)
    versions = [2, 4, latest]
    spark_counts = _spark_rows_per_file(delta_spark, path, versions)
    for v in versions:
        assert _our_rows_per_file(deltalog.replay(path, None, v)) == spark_counts[v], v


def test_replay_of_a_spark_multi_part_checkpoint(delta_spark, spark_dv_table, tmp_path):
    path, latest = _copy(spark_dv_table, tmp_path / "t")
    delta_spark.conf.set(PART_SIZE, "3")
    try:  # the commit setting the interval to 1 is checkpointed, in parts of 3 actions
        delta_spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
                        f"('delta.checkpointInterval'='1')")
    finally:
        delta_spark.conf.unset(PART_SIZE)
    latest += 1
    parts = sorted(n for n in os.listdir(f"{path}/_delta_log")
                   if n.startswith(f"{latest:020d}.checkpoint.") and n.endswith(".parquet"))
    assert len(parts) > 1 and all(n.count(".") == 4 for n in parts), parts
    assert deltalog.replay(path).checkpoint == latest
    plain = _json_only(path, str(tmp_path / "json"))
    assert _replay_agrees_with_json_only(path, plain, range(latest - 1, latest + 1))


def test_spark_starts_cold_from_our_checkpoints(delta_spark, spark_dv_table, tmp_path):
    """Our checkpoints of a Spark DV table at two versions, the commits before the first
    deleted: Spark reads every remaining version as before, writes on top (a DELETE making
    DVs), and replay from our checkpoint agrees with the rows Spark reads from each file."""
    from directory_table import checkpoint
    from tests.interop.judge import rows, spark_versions

    spark = delta_spark
    path, latest = _copy(spark_dv_table, tmp_path / "t")
    for name in os.listdir(f"{path}/_delta_log"):  # Spark's checkpoints gone: only ours
        if ".checkpoint." in name:
            os.remove(f"{path}/_delta_log/{name}")
    # our writer replaces Spark's _last_checkpoint (and drops its stale Hadoop checksum)
    assert os.path.exists(f"{path}/_delta_log/._last_checkpoint.crc")
    columns = ["relative_path", "size", "_bucket"]
    first = latest - 3
    before = {v: rows(t, columns) for v, t in spark_versions(spark, path, range(first,
                                                                                   latest + 1)).items()}
    replayed = {v: (_files(deltalog.replay(path, None, v)), _tombstones(deltalog.replay(
        path, None, v))) for v in range(first, latest + 1)}
    assert checkpoint.write_checkpoint(path, None, first).version == first
    assert checkpoint.write_checkpoint(path, None, latest).pointed
    for v in range(first):
        os.remove(f"{path}/_delta_log/{v:020d}.json")
    cold(spark)
    after = spark_versions(spark, path, range(first, latest + 1))
    for v in range(first, latest + 1):
        assert rows(after[v], columns) == before[v], v
        state = deltalog.replay(path, None, v)
        assert state.checkpoint == (latest if v == latest else first)
        assert (_files(state), _tombstones(state)) == replayed[v], v
    assert deltalog.replay(path, None, latest).deletion_vectors()
    # Spark writes on top of our checkpoint; the new DVs replay as Spark reads them
    spark.sql(f"DELETE FROM delta.`{path}` WHERE relative_path LIKE 'b2/f01%'")
    cold(spark)
    counts = _spark_rows_per_file(spark, path, [first, latest + 1])
    for v, found in counts.items():
        assert _our_rows_per_file(deltalog.replay(path, None, v)) == found, v


def test_replay_of_a_spark_v2_checkpoint_with_sidecars(delta_spark, spark_dv_table, tmp_path):
    """`delta.checkpointPolicy=v2`: Spark writes UUID-named JSON checkpoints whose add and
    remove actions live in `_delta_log/_sidecars/`. Replay reads them; our classic checkpoint
    (allowed on such a table) is what Spark then starts cold from."""
    from directory_table import checkpoint
    from tests.interop.judge import rows, spark_table

    path, latest = _copy(spark_dv_table, tmp_path / "t")
    delta_spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
                    f"('delta.checkpointPolicy'='v2', 'delta.checkpointInterval'='1')")
    latest += 1
    names = os.listdir(f"{path}/_delta_log")
    assert any(n.startswith(f"{latest:020d}.checkpoint.") and n.endswith(".json")
               for n in names), names
    assert os.listdir(f"{path}/_delta_log/_sidecars")
    state = deltalog.replay(path)
    assert (state.version, state.checkpoint) == (latest, latest)
    assert "v2Checkpoint" in state.protocol["readerFeatures"]
    plain = _json_only(path, str(tmp_path / "json"))
    assert _replay_agrees_with_json_only(path, plain, range(latest, latest + 1))
    columns = ["relative_path", "size", "_bucket"]
    expected = rows(spark_table(delta_spark, path), columns)
    checkpoint.write_checkpoint(path, None, latest)
    for name in os.listdir(f"{path}/_delta_log"):
        if name.endswith(".json") and int(name.split(".")[0]) < latest or (
                name.startswith(f"{latest:020d}.checkpoint.") and name.endswith(".json")):
            os.remove(f"{path}/_delta_log/{name}")
    shutil.rmtree(f"{path}/_delta_log/_sidecars")
    cold(delta_spark)
    assert rows(spark_table(delta_spark, path), columns) == expected
    assert deltalog.replay(path).checkpoint == latest
