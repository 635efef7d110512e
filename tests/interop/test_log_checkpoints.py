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
        if name.endswith(".json"):
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


@pytest.mark.parametrize("part_size", [None, "3"], ids=["classic", "multi-part"])
def test_replay_of_spark_checkpoints_with_deletion_vectors(delta_spark, tmp_path, part_size):
    spark = delta_spark
    path = str(tmp_path / "spark")
    if part_size:
        spark.conf.set(PART_SIZE, part_size)
    try:
        latest = _spark_dv_table(spark, path, interval=3)
    finally:
        spark.conf.unset(PART_SIZE)
    names = os.listdir(f"{path}/_delta_log")
    checkpoints = sorted(n for n in names if ".checkpoint." in n)
    assert checkpoints, names
    if part_size:
        assert any(n.count(".") == 4 for n in checkpoints), checkpoints  # v.checkpoint.i.n.parquet
    plain = _json_only(path, str(tmp_path / "json"))
    with_dvs = 0
    for v in range(latest + 1):
        ours = deltalog.replay(path, None, v)
        alone = deltalog.replay(plain, None, v)
        assert alone.checkpoint is None
        assert ours.checkpoint == (v // 3 * 3 if v >= 3 else None), v
        assert _files(ours) == _files(alone), v
        assert _tombstones(ours) == _tombstones(alone), v
        assert (ours.protocol, ours.metadata) == (alone.protocol, alone.metadata)
        with_dvs += len(ours.deletion_vectors())
    assert with_dvs  # Spark's DELETE and UPDATE left deletion vectors
    assert deltalog.replay(path).protocol["readerFeatures"] == ["deletionVectors"]
    if part_size:
        return
    # the rows each file holds once its DV is applied are the rows Spark reads from it
    cold(spark)
    versions = list(range(latest + 1))
    spark_counts = _spark_rows_per_file(spark, path, versions)
    for v in versions:
        assert _our_rows_per_file(deltalog.replay(path, None, v)) == spark_counts[v], v
