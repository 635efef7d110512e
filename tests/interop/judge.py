"""Delta Lake's own Spark connector as the judge of the tables volume-stream writes: what it
reads (latest, by version, by timestamp, the change data feed, the history, the detail) next to
what our readers return. Every comparison is of exact rows: Python values, sorted."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

#: the change feed's own columns, as Spark names them
CDF_META = ("_change_type", "_commit_version")


def _value(v: Any) -> Any:
    if isinstance(v, datetime) and v.tzinfo is None:  # Spark's session time zone is UTC
        return v.replace(tzinfo=UTC)
    return v


def rows(table: pa.Table, columns: Sequence[str]) -> list[tuple]:
    """`columns` of `table` as sorted tuples of plain Python values."""
    d = table.select(list(columns)).to_pydict()
    return sorted((tuple(_value(v) for v in row) for row in zip(*d.values(), strict=True)),
                  key=repr)


def spark_table(spark, path: str, *, version: int | None = None,
                timestamp: datetime | None = None) -> pa.Table:
    """The table at `path` as Delta Spark reads it (latest, `versionAsOf`, `timestampAsOf`)."""
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    if timestamp is not None:
        reader = reader.option("timestampAsOf", spark_time(timestamp))
    return reader.load(path).toArrow()


def spark_versions(spark, path: str, versions: Iterable[int]) -> dict[int, pa.Table]:
    """The table at each of `versions` as Delta Spark reads it (`versionAsOf`), in one Spark
    job: a union of the versions' reads, each row tagged with its version. (One job per
    version costs Spark's scheduling round trip per version; the suite reads dozens.)"""
    from pyspark.sql import functions as F

    versions = sorted(versions)
    union = None
    for v in versions:
        df = (spark.read.format("delta").option("versionAsOf", v).load(path)
              .withColumn("_judge_version", F.lit(v)))
        union = df if union is None else union.unionByName(df)
    found = union.toArrow()
    tags = found["_judge_version"].to_numpy()
    data = found.drop(["_judge_version"])
    return {v: data.filter(pa.array(tags == v)) for v in versions}


def changes_by_version(feed: pa.Table, after: int, up_to: int) -> pa.Table:
    """The rows of a change feed `feed` (Spark's, with `_commit_version`) of versions
    (after, up_to]. Delta's feed of a range is the union of its commits' feeds, so the feed of
    any range inside one read is the part of that read committed in it."""
    import pyarrow.compute as pc

    version = feed["_commit_version"]
    return feed.filter(pc.and_(pc.greater(version, after), pc.less_equal(version, up_to)))


def spark_changes(spark, path: str, after: int, up_to: int) -> pa.Table:
    """Delta Spark's change data feed of versions (after, up_to]."""
    return (spark.read.format("delta").option("readChangeFeed", "true")
            .option("startingVersion", after + 1).option("endingVersion", up_to)
            .load(path).toArrow())


def spark_history(spark, path: str) -> list[dict]:
    """DESCRIBE HISTORY, oldest first: version, timestamp (UTC), operation, metrics."""
    found = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
    return sorted(({"version": r["version"], "timestamp": _value(r["timestamp"]),
                    "operation": r["operation"],
                    "metrics": dict(r["operationMetrics"] or {})} for r in found),
                  key=lambda h: h["version"])


def spark_detail(spark, path: str) -> dict:
    from delta.tables import DeltaTable

    return DeltaTable.forPath(spark, path).detail().collect()[0].asDict()


def spark_time(when: datetime) -> str:
    """A timestamp literal Spark parses (in its UTC session time zone), to the microsecond."""
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def cold(spark) -> None:
    """Forget every Delta log Spark has cached in this JVM: the next read starts from the
    table's files (its last checkpoint, then the commits after it)."""
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()


def pairs(versions: Iterable[int]) -> list[tuple[int, int]]:
    vs = sorted(versions)
    return [(a, b) for i, a in enumerate(vs) for b in vs[i + 1:]]


def close_in_time(ours: datetime, spark_ts: datetime) -> bool:
    """Whether Spark's commit time (the log entry's file modification time: Delta's commit
    timestamp without in-commit timestamps) is that of the commit we timed: not before it (a
    coarse file clock may lag a little) and not long after it."""
    return ours - timedelta(seconds=1) <= spark_ts <= ours + timedelta(seconds=60)
