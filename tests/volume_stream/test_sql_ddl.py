"""The seed's DDL run against a real warehouse: local volumes on real folders, streams, refresh,
show, describe, drop, and errors that name unknown objects."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import volume_stream as vs
from volume_stream.sql import SqlSyntaxError, run_script


@pytest.fixture
def cat(tmp_path):
    return vs.connect(tmp_path / "wh")  # DDL needs no Spark


@pytest.fixture
def images(tmp_path):
    folder = tmp_path / "images"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.jpg").write_bytes(b"a" * 3)
    (folder / "sub" / "b.png").write_bytes(b"b" * 5)
    return folder


def test_volume_lifecycle_through_sql(cat, images):
    script = f"""
        CREATE EXTERNAL VOLUME landing
          LOCATION '{images}'
          NOTIFICATION = (QUEUE_TYPE = 'LOCAL', VIRTUAL_CLUSTER = 'DEFAULT', POLLING = TRUE)
          DIRECTORY = (ENABLE = TRUE, AUTO_REFRESH = TRUE)
          RECURSIVE = FALSE
          DATA_RETENTION_DAYS = 3
          COMMENT = 'camera drops';
        ALTER VOLUME landing REFRESH;
    """
    created, refreshed = run_script(cat, script)
    assert created.message.startswith("created volume landing at file://")
    assert refreshed.rows[0] | {"volume": "landing"} == {
        "volume": "landing", "listed": 1, "inserted": 1, "updated": 0, "deleted": 0,
        "version": 1}  # RECURSIVE = FALSE: sub/b.png does not count
    (volume,) = cat.sql("SHOW VOLUMES").rows
    assert (volume["name"], volume["recursive"], volume["files"]) == ("landing", False, 1)
    info = {r["property"]: r["value"] for r in cat.sql("DESCRIBE VOLUME landing")}
    assert info["retention_days"] == 3 and info["virtual_cluster"] == "DEFAULT"
    assert info["auto_refresh"] is True and info["comment"] == "camera drops"
    spec = cat.warehouse.read()[("volume", "landing")]
    assert spec["notification"] == {"type": "LOCAL", "polling": True, "debounce_s": 0.2,
                                    "poll_interval_s": 1.0}
    listing = cat.sql("SHOW VOLUME DIRECTORY landing")
    assert [r["relative_path"] for r in listing] == ["a.jpg"] and listing.rows[0]["size"] == 3
    assert "left as it is" in cat.sql(
        f"CREATE EXTERNAL VOLUME IF NOT EXISTS LANDING LOCATION '{images}'").message
    with pytest.raises(vs.AlreadyExistsError):
        cat.sql(f"CREATE EXTERNAL VOLUME landing LOCATION '{images}'")
    cat.sql(f"CREATE OR REPLACE EXTERNAL VOLUME landing LOCATION '{images}'")
    assert cat.sql("SHOW VOLUMES").rows[0]["recursive"] is True
    # the replaced volume has no SQL-only facts any more
    info = {r["property"]: r["value"] for r in cat.sql("DESCRIBE VOLUME landing")}
    assert "comment" not in info
    assert cat.sql("DROP VOLUME landing").message == "dropped volume landing"
    assert cat.sql("SHOW VOLUMES").rows == []
    assert cat.sql("DROP EXTERNAL VOLUME IF EXISTS landing").message == "no volume landing"


def test_streams_through_sql(cat, images, spark):
    cat.sql(f"CREATE EXTERNAL VOLUME v LOCATION '{images}'; ALTER VOLUME v REFRESH")
    cat.sql("CREATE STREAM s ON VOLUME v")
    cat.sql("CREATE TABLE STREAM IF NOT EXISTS ao ON VOLUME V WITH PROPERTIES "
            "('TABLE_STREAM_MODE' = 'APPEND_ONLY', 'SHOW_INITIAL_ROWS' = 'TRUE')")
    streams = {r["name"]: r for r in cat.sql("SHOW STREAMS")}
    assert (streams["s"]["mode"], streams["s"]["offset"]) == ("STANDARD", 1)
    assert (streams["ao"]["mode"], streams["ao"]["show_initial_rows"]) == ("APPEND_ONLY", True)
    assert cat.read_stream_arrow("ao").num_rows == 2 and cat.read_stream_arrow("s").num_rows == 0
    assert "left as it is" in cat.sql("CREATE STREAM IF NOT EXISTS S ON VOLUME v").message
    with pytest.raises(vs.AlreadyExistsError):
        cat.sql("CREATE STREAM s ON VOLUME v")
    # an old timestamp starts before the backfill; an expression is evaluated by Spark
    past = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%d %H:%M:%S")
    with pytest.raises(vs.InvalidInputError, match="before volume 'v' existed"):
        cat.sql(f"CREATE OR REPLACE STREAM s ON VOLUME v TIMESTAMP AS OF '{past}'")
    cat.sql("CREATE OR REPLACE STREAM s ON VOLUME v TIMESTAMP AS OF "
            "current_timestamp() + INTERVAL 1 HOUR")
    assert cat.describe_stream("s")["offset"] == 1
    described = cat.sql("DESC STREAM s")
    desc = {r["property"]: r["value"] for r in described}
    assert desc["volume"] == "v" and desc["pending_changes"] == 0 and desc["stale"] is False
    # DDL answers are also DataFrames (mixed-type values become text)
    assert described.df.where("property = 'offset'").first()["value"] == "1"
    with pytest.raises(vs.InvalidInputError, match="not a timestamp"):
        cat.sql("CREATE OR REPLACE STREAM s ON VOLUME v TIMESTAMP AS OF 'yesterday'")
    with pytest.raises(SqlSyntaxError, match="TABLE_STREAM_MODE must be") as err:
        cat.sql("CREATE STREAM x ON VOLUME v\nWITH PROPERTIES ('TABLE_STREAM_MODE' = 'FAST')")
    assert (err.value.line, err.value.column) == (2, 40)
    with pytest.raises(SqlSyntaxError, match="unknown stream property 'MODE'"):
        cat.sql("CREATE STREAM x ON VOLUME v WITH PROPERTIES ('MODE' = 'STANDARD')")
    with pytest.raises(vs.InvalidInputError, match=r"has streams \['ao', 's'\]"):
        cat.sql("DROP VOLUME v")
    assert cat.sql("DROP STREAM ao").message == "dropped stream ao"
    cat.sql("DROP VOLUME v CASCADE")
    assert cat.sql("SHOW STREAMS").rows == []


def test_unknown_objects_are_named(cat, images):
    cat.sql(f"CREATE EXTERNAL VOLUME v LOCATION '{images}'")
    for text, kind, name in [("CREATE STREAM s ON VOLUME nope", "volume", "nope"),
                             ("ALTER VOLUME nope REFRESH", "volume", "nope"),
                             ("DESCRIBE STREAM nope", "stream", "nope"),
                             ("DROP STREAM nope", "stream", "nope"),
                             ("SHOW VOLUME DIRECTORY nope", "volume", "nope")]:
        with pytest.raises(vs.NotFoundError) as err:
            cat.sql(text)
        assert (err.value.kind, err.value.name) == (kind, name), text
    with pytest.raises(vs.NotFoundError, match=r"volume 'nope' does not exist \(existing "
                                               r"volumes: v\)"):
        cat.sql("DESCRIBE VOLUME nope")
    with pytest.raises(vs.InvalidInputError, match="does not exist"):
        cat.sql(f"CREATE EXTERNAL VOLUME w LOCATION '{images / 'missing'}'")


def test_a_syntax_error_runs_none_of_the_script_and_names_its_line(cat, images):
    script = (f"CREATE EXTERNAL VOLUME v LOCATION '{images}';\n"
              "CREATE STREAM s ON VOLUME v;\n"
              "CREATE STREAM t ON VOLUME v WITH PROPERTIES ('TABLE_STREAM_MODE' 'x');\n"
              "CREATE STREAM u ON VOLUME v;")
    with pytest.raises(SqlSyntaxError) as err:
        cat.sql(script)
    assert (err.value.line, err.value.column) == (3, 66)
    # the whole script is parsed first: a syntax error anywhere runs none of it
    assert cat.list_streams() == [] and cat.list_volumes() == []


def test_connection_in_use_cannot_be_dropped(cat, images):
    cat.sql("CREATE STORAGE CONNECTION c TYPE OSS ENDPOINT = 'oss-cn-hangzhou.aliyuncs.com'")
    state = cat.warehouse.read()
    # a local volume cannot use an OSS connection
    with pytest.raises(SqlSyntaxError, match="its volumes are at oss://"):
        cat.sql(f"CREATE EXTERNAL VOLUME v LOCATION '{images}' USING CONNECTION c")
    assert cat.warehouse.read() == state  # nothing was written
    cat.sql("CREATE EXTERNAL VOLUME cloud LOCATION 'oss://bucket/in/' USING CONNECTION c "
            "NOTIFICATION = (QUEUE_TYPE = 'ALICLOUD_MNS', QUEUE_NAME = 'q', "
            "ENDPOINT = 'https://1.mns.cn-hangzhou.aliyuncs.com')")
    spec = cat.warehouse.read()[("volume", "cloud")]
    assert spec["options"] == {"endpoint": "oss-cn-hangzhou.aliyuncs.com"}
    assert spec["notification"]["queue_name"] == "q"
    with pytest.raises(vs.InvalidInputError, match=r"used by volumes \['cloud'\]"):
        cat.sql("DROP CONNECTION c")
    cat.sql("DROP VOLUME cloud")
    cat.sql("DROP STORAGE CONNECTION c")
    assert cat.sql("SHOW CONNECTIONS").rows == []
