"""The interop suite reads with Delta Lake's own Spark connector: the session's one SparkSession
(tests/conftest.py) must have been started with its jars, which `make install` fetches
(`volume_stream._jars`): `volume_stream._spark.get_spark` turns Delta on whenever they are
there, so every test of the run shares the one Delta-enabled JVM."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def delta_spark(spark):
    from volume_stream import _jars

    if not _jars.has_delta():
        pytest.fail(f"Delta Lake's Spark jars are not in {_jars.jars_dir()}: run `make install` "
                    f"(or `python -m volume_stream._jars fetch`)")
    extensions = spark.conf.get("spark.sql.extensions", "")
    if "DeltaSparkSessionExtension" not in extensions:
        pytest.fail("the session's SparkSession was started without Delta Lake (another "
                    "session was active first?)")
    # Delta's VACUUM lists a table's folders in a Spark job of this many tasks (10,000 by
    # default: minutes on a busy 2-core machine for a table of 16 buckets, seconds with 4)
    spark.conf.set("spark.sql.sources.parallelPartitionDiscovery.parallelism", "4")
    return spark
