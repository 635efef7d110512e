"""Build the class-data archive (CDS) a local Spark driver starts from (`volume_stream._jars`
says what it is and where it lives; `make install` runs this after fetching the jars):

    python -m volume_stream._cds

A fresh JVM, started with `-XX:ArchiveClassesAtExit`, runs a small Spark + Delta workload and
writes the archive of every class it loaded when it exits. The new archive must map in a JVM of
its own before it replaces the old one: a JVM that maps a damaged archive crashes instead of
ignoring it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from volume_stream import _jars
from volume_stream._spark import get_spark, spark_log_path

__all__ = ["build_archive"]


def _archive_workload(spark, folder: Path) -> None:
    """What a session does in its first minute: SQL, a Python UDF, Arrow both ways, a Delta
    table written, merged, read at a version and through its change feed."""
    path = str(folder / "t")
    spark.sql("SELECT 1 AS x").collect()
    df = spark.range(100).selectExpr("id", "CAST(id % 7 AS STRING) AS k")
    spark.createDataFrame(df.toArrow()).groupBy("k").count().collect()
    spark.udf.register("twice", lambda v: v * 2, "long")
    spark.sql("SELECT twice(id) FROM range(10)").collect()
    if not _jars.has_delta():
        return
    df.write.format("delta").option("delta.enableChangeDataFeed", "true").save(path)
    spark.sql(f"MERGE INTO delta.`{path}` t USING (SELECT 1 AS id, 'x' AS k) s ON t.id = s.id "
              "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")
    spark.read.format("delta").option("versionAsOf", 0).load(path).collect()
    spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0) \
        .load(path).collect()


def java() -> str:
    """The `java` Spark launches: `$JAVA_HOME/bin/java`, else the first on PATH."""
    home = os.environ.get("JAVA_HOME")
    return str(Path(home) / "bin" / "java") if home else (shutil.which("java") or "java")


def _check_archive(path: Path) -> None:
    """A JVM that maps a damaged archive crashes (SIGBUS) instead of ignoring it, so a new
    archive must map in a JVM of its own before it takes the old one's place (any crash report
    is written beside it, in the temporary folder)."""
    done = subprocess.run([java(), f"-XX:SharedArchiveFile={path}", *_jars.QUIET_CDS.split(),
                           "-version"], capture_output=True, text=True, check=False, cwd=path.parent)
    if done.returncode != 0:
        raise RuntimeError(f"the class-data archive {path} does not map (java exited with "
                           f"{done.returncode}): {done.stdout[-500:]}{done.stderr[-500:]}")


def build_archive(*, out=sys.stderr) -> None:
    """Build `spark-classes.jsa` from a fresh JVM (call in a process with no Spark yet): the
    workload runs, the JVM exits, and the archive it wrote at exit replaces the old one."""
    from pyspark import SparkContext

    target = _jars.jars_dir() / _jars.ARCHIVE
    print(f"==> jars: building {target} (a Spark session's classes, about a minute)",
          file=out, flush=True)
    _jars.jars_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cds-", dir=_jars.jars_dir()) as tmp:
        written = Path(tmp) / _jars.ARCHIVE
        spark = get_spark(master="local[2]", extra_conf={"spark.driver.extraJavaOptions":
                          f"-XX:ArchiveClassesAtExit={written} {_jars.QUIET_CDS}"})
        _archive_workload(spark, Path(tmp))
        gateway = SparkContext._gateway
        spark.stop()
        code = _jars.stop_gateway(gateway, timeout=600)  # the JVM writes the archive at exit
        if code != 0 or not written.is_file():
            raise RuntimeError(f"the JVM exited with {code} and wrote no archive {written} "
                               f"(its output is in {spark_log_path()})")
        _check_archive(written)
        written.replace(target)
    print(f"==> jars: {target}: {target.stat().st_size / 1e6:.0f} MB", file=out, flush=True)


if __name__ == "__main__":
    build_archive()
