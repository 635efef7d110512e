"""Spark SQL over streams: SELECT never moves an offset; INSERT INTO / INSERT OVERWRITE /
CREATE TABLE AS SELECT move the offsets of the streams they read, to the version pinned when the
statement started, only when they succeed. Tables are parquet tables in a per-test database
under tmp_path (Spark's default in-memory catalog; no Hive, no Delta jars)."""

from __future__ import annotations

import pytest

import volume_stream as vs
from tests.volume_stream.conftest import rows
from volume_stream.sql import SqlError, SqlSyntaxError


def apply(catalog, *events):
    return catalog.directory_table("vol").apply(events)


@pytest.fixture
def files(catalog, volume, ev, db):
    """A volume with a stream `s` and two new files pending on it."""
    catalog.create_stream("s", volume)
    apply(catalog, ev.put("a.jpg", size=1), ev.put("b.txt", size=2))
    return catalog


def offset(catalog, name="s"):
    return catalog.describe_stream(name)["offset"]


def test_select_reads_pending_changes_and_never_moves_the_offset(files):
    cat = files
    result = cat.sql("SELECT relative_path, s.size, __change_type FROM s ORDER BY 1")
    assert result.statement == "SELECT" and "offsets unchanged" in result.message
    assert result.rows == [{"relative_path": "a.jpg", "size": 1, "__change_type": "INSERT"},
                           {"relative_path": "b.txt", "size": 2, "__change_type": "INSERT"}]
    joined = cat.sql("SELECT count(*) AS n FROM s x JOIN S y ON x.relative_path = "
                     "y.relative_path")
    assert joined.rows == [{"n": 2}]
    assert offset(cat) == 0 and cat.describe_stream("s")["batch_id"] == 0
    # the DataFrame stays usable after the statement (its pinned view is gone)
    assert result.df.count() == 2
    assert not [t for t in cat.spark.catalog.listTables() if t.name.startswith("__vs_")]


def test_insert_moves_offset_only_when_it_succeeds(files):
    cat = files
    cat.sql("CREATE TABLE out (path STRING, label STRING, version BIGINT)")

    def broken(path):
        if path.endswith(".txt"):
            raise ValueError("cannot label " + path)
        return "ok"

    cat.register_udf("label", broken, "string")
    insert = "INSERT INTO out SELECT relative_path, label(relative_path), __commit_version FROM s"
    with pytest.raises(SqlError, match="cannot label b.txt") as err:
        cat.sql(insert)
    assert err.value.line == 1
    assert offset(cat) == 0 and cat.sql("SELECT * FROM out").rows == []
    cat.register_udf("label", lambda path: path.upper(), "string")
    result = cat.sql(insert)
    assert result.statement == "INSERT"
    assert result.offsets == {"s": {"start": 0, "end": 1, "batch_id": 0, "records": 2}}
    assert "offset 0 -> 1" in result.message
    assert sorted(r["label"] for r in cat.sql("SELECT label FROM out")) == ["A.JPG", "B.TXT"]
    assert offset(cat) == 1 and cat.describe_stream("s")["batch_id"] == 1
    # nothing pending: the same statement adds nothing and moves nothing
    assert cat.sql(insert).message == "INSERT: ok; stream s: nothing pending"
    assert cat.sql("SELECT count(*) AS n FROM out").rows == [{"n": 2}]


def test_insert_overwrite_and_create_table_as_select(files, ev):
    cat = files
    cat.create_stream("s2", "vol", show_initial_rows=True)
    cat.sql("CREATE TABLE snap (path STRING)")
    cat.sql("INSERT INTO snap VALUES ('stale')")
    result = cat.sql("INSERT OVERWRITE TABLE snap SELECT relative_path FROM s")
    assert result.statement == "INSERT OVERWRITE" and result.offsets["s"]["end"] == 1
    assert sorted(r["path"] for r in cat.sql("SELECT * FROM snap")) == ["a.jpg", "b.txt"]
    assert offset(cat, "s2") == 1  # s2 was not read
    ctas = cat.sql("CREATE TABLE copy AS SELECT relative_path, __change_type FROM s2")
    assert ctas.statement == "CREATE TABLE" and ctas.offsets["s2"]["records"] == 2
    assert cat.describe_stream("s2")["batch_id"] == 1
    apply(cat, ev.put("c.jpg"))
    with pytest.raises(SqlError, match="already exists"):
        cat.sql("CREATE TABLE copy AS SELECT relative_path, __change_type FROM s2")
    assert offset(cat, "s2") == 1  # the failed CTAS moved nothing
    assert cat.sql("SELECT relative_path FROM s2").rows == [{"relative_path": "c.jpg"}]


def test_one_statement_reading_two_streams_moves_both(files, ev):
    cat = files
    cat.create_stream("t", "vol", show_initial_rows=True)
    cat.sql("CREATE TABLE u (path STRING, src STRING)")
    result = cat.sql("INSERT INTO u SELECT relative_path, 's' FROM s "
                     "UNION ALL SELECT relative_path, 't' FROM t")
    assert sorted(result.offsets) == ["s", "t"]
    assert cat.sql("SELECT count(*) AS n FROM u").rows == [{"n": 4}]
    assert offset(cat, "s") == 1 and offset(cat, "t") == 1


def test_the_range_is_pinned_when_the_statement_starts(files, ev):
    """A file committed while the INSERT runs is not in its range and stays pending."""
    cat = files
    table = cat.directory_table("vol")
    root, base_url = table.root, table.base_url
    late = ev.put("late.jpg")

    def label_and_commit_a_new_file(path):
        # runs on an executor, in the middle of the statement
        from directory_table import DirectoryTable

        DirectoryTable(root, base_url).apply([late])
        return "seen"

    cat.register_udf("label_and_commit", label_and_commit_a_new_file, "string")
    cat.sql("CREATE TABLE seen (path STRING, label STRING)")
    result = cat.sql("INSERT INTO seen SELECT relative_path, label_and_commit(relative_path) "
                     "FROM s")
    assert table.version() == 2  # the new file was committed during the statement
    assert result.offsets["s"]["end"] == 1
    assert sorted(r["path"] for r in cat.sql("SELECT path FROM seen")) == ["a.jpg", "b.txt"]
    assert rows(cat.read_stream_arrow("s")) == [("INSERT", "late.jpg", 1, 2)]


def test_a_racing_consumer_wins_and_the_offset_moves_once(files):
    cat = files
    root = str(cat.warehouse.root)
    volume_id = cat.warehouse.read()[("stream", "s")]["volume_id"]

    def consume_elsewhere(path):
        import volume_stream as vs

        try:  # another consumer commits the same range while this statement runs
            vs.connect(root).commit_offset("s", volume_id, 0, 1, 0)
        except vs.ConsumeConflictError:
            pass  # a second row of the same task: already moved
        return path

    cat.register_udf("consume_elsewhere", consume_elsewhere, "string")
    cat.sql("CREATE TABLE raced (path STRING)")
    with pytest.raises(vs.ConsumeConflictError, match="another consumer committed first"):
        cat.sql("INSERT INTO raced SELECT consume_elsewhere(relative_path) FROM s")
    info = cat.describe_stream("s")
    assert (info["offset"], info["batch_id"]) == (1, 1)  # moved once, by the winner


def test_ctes_qualified_names_and_tables_are_not_streams(files, db):
    cat = files
    assert cat.sql("WITH s AS (SELECT 42 AS x) SELECT x FROM s").rows == [{"x": 42}]
    with pytest.raises(vs.InvalidInputError, match="'s' is a stream"):
        cat.sql("CREATE TABLE s (x INT)")
    cat.sql(f"CREATE TABLE {db}.s (x INT)")
    cat.sql(f"INSERT INTO {db}.s VALUES (7)")
    assert cat.sql(f"SELECT x FROM {db}.s").rows == [{"x": 7}]
    assert cat.sql("SELECT count(*) AS n FROM s").rows == [{"n": 2}]  # the stream
    assert offset(cat) == 0


def test_streams_are_read_only_and_cannot_outlive_a_statement(files):
    cat = files
    with pytest.raises(vs.InvalidInputError, match="'s' is a stream and streams are read-only"):
        cat.sql("INSERT INTO s SELECT * FROM s")
    with pytest.raises(vs.InvalidInputError, match="CREATE VIEW statement cannot read streams"):
        cat.sql("CREATE TEMPORARY VIEW v AS SELECT * FROM s")
    assert offset(cat) == 0


def test_spark_errors_name_line_column_and_unknown_objects(files):
    cat = files
    script = "SELECT 1;\n\nSELECT relative_path\n  FROM s WHERE size >"
    with pytest.raises(SqlSyntaxError) as err:
        cat.sql(script)
    assert (err.value.line, err.value.column) == (4, 22)
    assert "FROM s WHERE size >" in str(err.value) and "__vs_" not in str(err.value)
    with pytest.raises(SqlSyntaxError) as err:
        cat.sql("SELECT 1;\nSELEC * FROM t")
    assert (err.value.line, err.value.column) == (2, 1) and "SELEC" in str(err.value)
    with pytest.raises(vs.NotFoundError, match=r"table 'nope' does not exist \(existing tables: "
                                               r"s \(stream\)\)"):
        cat.sql("SELECT * FROM nope")
    with pytest.raises(vs.NotFoundError, match="function 'public.no_such_fn' does not exist.*"
                                               "register_udf"):
        cat.sql("SELECT public.no_such_fn(url) FROM s")
    with pytest.raises(SqlError) as err:
        cat.sql("SELECT 1;\nSELECT relative_path,\n       no_such_column FROM s")
    assert (err.value.line, err.value.column) == (3, 8)
    assert "no_such_column" in str(err.value) and "__vs_" not in str(err.value)
    assert offset(cat) == 0


def test_names_cannot_inject_sql(files):
    cat = files
    cat.sql("CREATE TABLE keep (x INT)")
    with pytest.raises(vs.NotFoundError):
        cat.sql("SELECT * FROM `s; DROP TABLE keep`")
    assert cat.tables.names() == ["keep"]  # a warehouse table (issue 14)
    with pytest.raises(vs.InvalidInputError):
        cat.create_stream("s; DROP TABLE keep", "vol")
    with pytest.raises(vs.InvalidInputError, match="invalid function name"):
        cat.register_udf("f(); DROP TABLE keep", len, "int")


def test_seed_dialect_adaptations_varchar_and_qualified_udfs(files):
    cat = files
    cat.register_udf("fc_image_to_text", lambda task, url: f"{task}:{url.rsplit('/', 1)[-1]}")
    cat.sql("CREATE TABLE r (path VARCHAR COMMENT 'p', label VARCHAR)")
    assert {r["col_name"]: r["data_type"] for r in cat.sql("DESCRIBE r")} == {
        "path": "string", "label": "string"}
    result = cat.sql("SELECT CAST(size AS VARCHAR) AS s, public.fc_image_to_text('dish', url) AS l "
                     "FROM s WHERE relative_path = 'a.jpg'")
    assert result.rows == [{"s": "1", "l": "dish:a.jpg"}]


def test_register_udf_checks_its_arguments(catalog, spark):
    from pyspark.sql.functions import udf

    with pytest.raises(vs.InvalidInputError, match="needs a function"):
        catalog.register_udf("f", "not callable")
    with pytest.raises(vs.InvalidInputError, match="cannot register 'f'"):
        catalog.register_udf("f", len, "no_such_type<")
    catalog.register_udf("twice", udf(lambda x: x * 2, "int"))
    assert catalog.sql("SELECT twice(21) AS v").rows == [{"v": 42}]
