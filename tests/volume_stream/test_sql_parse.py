"""The SQL front door without Spark: splitting, the DDL grammar, errors with line and column,
identifier validation, and what CREATE EXTERNAL VOLUME maps to (LOCAL, ALICLOUD_MNS, AWS_SQS)."""

from __future__ import annotations

import json

import pytest

import volume_stream as vs
from volume_stream.sql import SqlSyntaxError, ddl, statements
from volume_stream.sql.volume_plan import plan_volume


def parse(text):
    (statement,) = statements(text)
    return ddl.parse(statement)


def syntax_error(text):
    with pytest.raises(SqlSyntaxError) as err:
        for statement in statements(text):
            ddl.parse(statement)
    return err.value


@pytest.fixture
def cat(tmp_path):
    return vs.connect(tmp_path / "wh")  # no Spark: DDL never needs it


# ---------------------------------------------------------------------- splitting
def test_split_respects_strings_comments_and_reports_positions():
    text = ("-- a comment; not a split\n"
            "SHOW VOLUMES;\n"
            "  SELECT ';', \"x;y\", `weird;name` /* ; /* nested ; */ */ FROM t;;\n"
            "/* only a comment */;\n"
            "CREATE STREAM s ON VOLUME v")
    found = statements(text)
    assert [(s.keyword, s.line, s.column) for s in found] == [
        ("SHOW", 2, 1), ("SELECT", 3, 3), ("CREATE", 5, 1)]
    assert found[1].text.endswith("FROM t")
    assert [t.value for t in found[1].tokens][:4] == ["SELECT", ";", ",", "x;y"]


def test_unterminated_string_and_comment_name_where_they_open():
    err = syntax_error("SHOW VOLUMES;\nSELECT 'abc;\nSHOW STREAMS")
    assert (err.line, err.column) == (2, 8) and "unterminated string" in str(err)
    err = syntax_error("SELECT 1 /* never closed")
    assert (err.line, err.column) == (1, 10) and "*/" in str(err)


def test_only_comments_is_no_statement(cat):
    assert statements("-- nothing\n/* here */ ;") == []
    with pytest.raises(vs.InvalidInputError, match="no SQL statement"):
        cat.sql("  -- nothing  ")


def test_string_escapes_and_windows_paths():
    stmt = parse(r"CREATE EXTERNAL VOLUME v LOCATION 'C:\data\it''s \'here\''")
    assert stmt.location == r"C:\data\it's 'here'"


# ---------------------------------------------------------------------- grammar
def test_seed_volume_statement_parses_case_insensitively():
    stmt = parse("""create or replace external volume vol_dish_images
      location 'oss://sh-oss-derek/dish-images/'
      using connection conn_sh_oss
      notification = (queue_type = 'ALICLOUD_MNS', QUEUE_NAME = 'q', virtual_cluster = 'DEFAULT')
      directory = (enable = true, AUTO_REFRESH = false)
      recursive = false""")
    assert isinstance(stmt, ddl.CreateVolume)
    assert (stmt.name, stmt.location, stmt.connection, stmt.recursive, stmt.replace) == (
        "vol_dish_images", "oss://sh-oss-derek/dish-images/", "conn_sh_oss", False, True)
    assert {k: p.value for k, p in stmt.notification.items()} == {
        "QUEUE_TYPE": "ALICLOUD_MNS", "QUEUE_NAME": "q", "VIRTUAL_CLUSTER": "DEFAULT"}
    assert {k: p.value for k, p in stmt.directory.items()} == {"ENABLE": True,
                                                               "AUTO_REFRESH": False}


def test_stream_statements():
    stmt = parse("CREATE TABLE STREAM IF NOT EXISTS s ON VOLUME v TIMESTAMP AS OF "
                 "'2026-01-01 00:00:00' COMMENT = 'c' WITH PROPERTIES "
                 "('TABLE_STREAM_MODE' = 'APPEND_ONLY', 'SHOW_INITIAL_ROWS' = 'TRUE')")
    assert isinstance(stmt, ddl.CreateStream) and stmt.if_not_exists and stmt.comment == "c"
    assert stmt.timestamp == "2026-01-01 00:00:00" and stmt.timestamp_expr is None
    assert {k: p.value for k, p in stmt.props.items()} == {
        "TABLE_STREAM_MODE": "APPEND_ONLY", "SHOW_INITIAL_ROWS": "TRUE"}
    expr = parse("CREATE STREAM s ON VOLUME v TIMESTAMP AS OF current_timestamp() - "
                 "INTERVAL '12' HOURS")
    assert expr.timestamp_expr == "current_timestamp() - INTERVAL '12' HOURS"


def test_other_statements():
    assert parse("ALTER VOLUME v REFRESH") == ddl.AlterVolume("v")
    assert parse("DROP VOLUME IF EXISTS v CASCADE") == ddl.Drop("volume", "v", True, True)
    assert parse("drop table stream s") == ddl.Drop("stream", "s")
    assert parse("DROP STORAGE CONNECTION c") == ddl.Drop("connection", "c")
    assert parse("SHOW VOLUMES") == ddl.Show("volumes")
    assert parse("SHOW TABLE STREAMS") == ddl.Show("streams")
    assert parse("show volume directory v") == ddl.Show("directory", "v")
    assert parse("DESC STREAM s") == ddl.Describe("stream", "s")
    assert parse("DESCRIBE CONNECTION c") == ddl.Describe("connection", "c")
    assert parse("DESCRIBE EXTERNAL VOLUME `v`") == ddl.Describe("volume", "v")


def test_spark_statements_are_not_ours():
    for text in ("SELECT * FROM s", "CREATE TABLE stream (a INT)", "CREATE TABLE t AS SELECT 1",
                 "DROP TABLE t", "SHOW TABLES", "DESCRIBE t", "INSERT INTO t SELECT 1"):
        assert parse(text) is None, text


def test_syntax_errors_name_line_column_expected_and_found():
    err = syntax_error("SHOW VOLUMES;\n\nCREATE EXTERNAL VOLUME v\n  LOCATION '/x'\n"
                       "  NOTIFICATION (QUEUE_TYPE = 'LOCAL')")
    assert (err.line, err.column) == (5, 16)
    assert err.expected == ("'='",) and err.found == "'('"
    assert "line 5, column 16" in str(err) and "NOTIFICATION (QUEUE_TYPE" in str(err)
    err = syntax_error("CREATE STREAM s ON VOLUME v WITH PROPERTIES ('TABLE_STREAM_MODE' 'x')")
    assert err.found == "a string literal" and "expected '='" in str(err)
    err = syntax_error("CREATE STREAM s ON VIEW t")
    assert "expected VOLUME" in str(err) and (err.line, err.column) == (1, 20)
    err = syntax_error("CREATE EXTERNAL VOLUME v RECURSIVE = TRUE")
    assert "needs a LOCATION" in str(err)
    err = syntax_error("CREATE EXTERNAL VOLUME v LOCATION '/x' FROBNICATE = 1")
    assert "unknown clause" in str(err) and "LOCATION" in str(err)
    err = syntax_error("ALTER VOLUME v")
    assert "expected REFRESH, found the end of the statement" in str(err)
    err = syntax_error("SHOW VOLUME DIRECTORY")
    assert "expected a volume name, found the end of the statement" in str(err)
    err = syntax_error("CREATE OR REPLACE STREAM IF NOT EXISTS s ON VOLUME v")
    assert "cannot be combined" in str(err)
    err = syntax_error("CREATE EXTERNAL VOLUME v LOCATION '/x' LOCATION '/y'")
    assert "given twice" in str(err)


@pytest.mark.parametrize("name", [
    "`x; DROP TABLE t`", "`a b`", "`1abc`", "`über`", "`" + "a" * 129 + "`", "db.v",
])
def test_names_are_validated_so_nothing_can_be_injected(name):
    err = syntax_error(f"CREATE STREAM {name} ON VOLUME v")
    assert "name" in str(err)


# ---------------------------------------------------------------------- connections
def test_connection_never_stores_a_secret(cat, tmp_path):
    with pytest.raises(SqlSyntaxError) as err:
        cat.sql("CREATE STORAGE CONNECTION c TYPE OSS ENDPOINT = 'oss-cn-hangzhou.aliyuncs.com'\n"
                "  ACCESS_ID = 'LTAIsecretid' ACCESS_KEY = 'verysecretkey'")
    assert "never stores credentials" in str(err.value) and "ENV(" in str(err.value)
    assert "verysecret" not in str(err.value) and "LTAIsecretid" not in str(err.value)
    assert (err.value.line, err.value.column) == (2, 15)
    # a syntax error in a connection statement does not echo the line either
    with pytest.raises(SqlSyntaxError) as err:
        cat.sql("CREATE STORAGE CONNECTION c TYPE OSS ACCESS_KEY 'verysecretkey'")
    assert "verysecret" not in str(err.value)
    cat.sql("CREATE STORAGE CONNECTION c TYPE OSS ENDPOINT = 'oss-cn-hangzhou.aliyuncs.com' "
            "ACCESS_ID = ENV('MY_OSS_ID') ACCESS_KEY = ENV('MY_OSS_SECRET') COMMENTS = 'dev'")
    row = cat.sql("SHOW CONNECTIONS").rows[0]
    assert row["credentials"] == "ACCESS_ID=ENV('MY_OSS_ID'), ACCESS_KEY=ENV('MY_OSS_SECRET')"
    assert row["comment"] == "dev"
    stored = json.dumps(list(cat.warehouse.read().values()))
    assert "MY_OSS_SECRET" in stored and "verysecret" not in stored  # names, never values


def test_connection_errors(cat):
    with pytest.raises(SqlSyntaxError, match="TYPE 'COS' is not supported"):
        cat.sql("CREATE STORAGE CONNECTION c TYPE COS")
    with pytest.raises(SqlSyntaxError, match="unknown connection property BUCKET"):
        cat.sql("CREATE STORAGE CONNECTION c TYPE S3 BUCKET = 'b'")
    cat.sql("CREATE STORAGE CONNECTION c TYPE S3 REGION = 'us-east-1'")
    with pytest.raises(vs.AlreadyExistsError):
        cat.sql("CREATE STORAGE CONNECTION c TYPE S3")
    assert "left as it is" in cat.sql("CREATE STORAGE CONNECTION IF NOT EXISTS C TYPE S3").message
    cat.sql("CREATE OR REPLACE STORAGE CONNECTION c TYPE S3 REGION = 'eu-west-1'")
    assert cat.sql("DESCRIBE CONNECTION C").rows[3] == {"property": "region",
                                                         "value": "eu-west-1"}
    with pytest.raises(vs.NotFoundError, match="connection 'nope' does not exist .*: c\\)"):
        cat.sql("DESCRIBE CONNECTION nope")
    assert cat.sql("DROP CONNECTION c").message == "dropped connection c"
    assert cat.sql("DROP CONNECTION IF EXISTS c").message == "no connection c"


# ---------------------------------------------------------------------- volume mapping
def _plan(cat, text):
    return plan_volume(cat, parse(text))


def test_seed_mns_volume_maps_to_mns_notification(cat):
    cat.sql("CREATE STORAGE CONNECTION conn_sh_oss TYPE OSS REGION = 'cn-shanghai' "
            "ROLE_ARN = 'acs:ram::1450476637304722:role/czvolumestreamrole' "
            "ENDPOINT = 'oss-cn-shanghai.aliyuncs.com'")
    plan = _plan(cat, """CREATE EXTERNAL VOLUME vol_dish_images
      LOCATION 'oss://sh-oss-derek/dish-images/' USING CONNECTION conn_sh_oss
      NOTIFICATION = (QUEUE_TYPE = 'ALICLOUD_MNS', QUEUE_NAME = 'cz-queue-mns-ossevent',
                      VIRTUAL_CLUSTER = 'DEFAULT')
      DIRECTORY = (ENABLE = TRUE) RECURSIVE = TRUE""")
    assert (plan.name, plan.location, plan.recursive) == (
        "vol_dish_images", "oss://sh-oss-derek/dish-images/", True)
    assert plan.notification.type == "ALICLOUD_MNS"
    assert plan.notification.args == ("https://1450476637304722.mns.cn-shanghai.aliyuncs.com",
                                      "cz-queue-mns-ossevent")
    # only what the OSS connector takes goes to create_volume; the rest is SQL's own record
    assert plan.options == {"endpoint": "oss-cn-shanghai.aliyuncs.com",  # the role is assumed
                            "role_arn": "acs:ram::1450476637304722:role/czvolumestreamrole"}
    assert plan.metadata == {"connection": "conn_sh_oss", "virtual_cluster": "DEFAULT",
                             "role_arn": "acs:ram::1450476637304722:role/czvolumestreamrole"}
    assert plan.credentials == {}
    explicit = _plan(cat, "CREATE EXTERNAL VOLUME v LOCATION 'oss://b/p/' NOTIFICATION = ("
                          "QUEUE_TYPE = 'ALICLOUD_MNS', QUEUE_NAME = 'q', "
                          "ENDPOINT = 'http://127.0.0.1:9000')")
    assert explicit.notification.args == ("http://127.0.0.1:9000", "q")


def test_sqs_volume_maps_to_sqs_notification(cat, monkeypatch):
    monkeypatch.setenv("AWS_KEY_VAR", "AKIAFAKE")
    monkeypatch.delenv("AWS_SECRET_VAR", raising=False)
    cat.sql("CREATE STORAGE CONNECTION aws TYPE S3 REGION = 'eu-west-1' "
            "ROLE_ARN = 'arn:aws:iam::123456789012:role/reader' "
            "ACCESS_ID = ENV('AWS_KEY_VAR') ACCESS_KEY = ENV('AWS_SECRET_VAR')")
    plan = _plan(cat, "CREATE EXTERNAL VOLUME logs LOCATION 's3://bkt/logs/' USING CONNECTION aws "
                      "NOTIFICATION = (QUEUE_TYPE = 'AWS_SQS', QUEUE_NAME = 'log-events')")
    assert plan.notification.type == "AWS_SQS"
    assert plan.notification.args == ("https://sqs.eu-west-1.amazonaws.com/123456789012/"
                                      "log-events",)
    assert plan.notification.kwargs == {"region_name": "eu-west-1"}
    # the connection's role is assumed by the AWS connectors (STS AssumeRole)
    assert plan.options == {"region_name": "eu-west-1",
                            "role_arn": "arn:aws:iam::123456789012:role/reader"}
    assert plan.metadata["credentials_env"] == {"aws_access_key_id": "AWS_KEY_VAR",
                                                "aws_secret_access_key": "AWS_SECRET_VAR"}
    # variables are read when the statement runs (an unset one is simply not passed)
    assert plan.credentials == {"aws_access_key_id": "AKIAFAKE"}
    with pytest.raises(SqlSyntaxError, match="unknown NOTIFICATION option BATCH_SIZE for AWS_SQS"):
        _plan(cat, "CREATE EXTERNAL VOLUME l LOCATION 's3://b/' USING CONNECTION aws NOTIFICATION"
                   " = (QUEUE_TYPE = 'AWS_SQS', QUEUE_NAME = 'q', BATCH_SIZE = 5)")
    tuned = _plan(cat, "CREATE EXTERNAL VOLUME l LOCATION 's3://b/' USING CONNECTION aws "
                       "NOTIFICATION = (QUEUE_TYPE = 'AWS_SQS', QUEUE_NAME = 'q', "
                       "WAIT_TIME_SECONDS = 5, MAX_WORKERS = 2)")
    assert tuned.notification.kwargs == {"wait_time_seconds": 5, "max_workers": 2,
                                         "region_name": "eu-west-1"}
    url = _plan(cat, "CREATE EXTERNAL VOLUME l LOCATION 's3://b/' NOTIFICATION = (QUEUE_TYPE = "
                     "'AWS_SQS', QUEUE_URL = 'http://localhost:5000/123/q', "
                     "ENDPOINT = 'http://localhost:5000')")
    assert url.notification.args == ("http://localhost:5000/123/q",)
    assert url.notification.kwargs == {"endpoint_url": "http://localhost:5000"}


def test_volume_mapping_errors(cat, tmp_path):
    with pytest.raises(SqlSyntaxError, match="MNS endpoint is unknown") as err:
        _plan(cat, "CREATE EXTERNAL VOLUME v LOCATION 'oss://b/' NOTIFICATION = ("
                   "QUEUE_TYPE = 'ALICLOUD_MNS', QUEUE_NAME = 'q')")
    assert err.value.column == 46
    with pytest.raises(SqlSyntaxError, match="needs a s3:// location, not oss://"):
        _plan(cat, "CREATE EXTERNAL VOLUME v LOCATION 'oss://b/' NOTIFICATION = ("
                   "QUEUE_TYPE = 'AWS_SQS', QUEUE_URL = 'https://x')")
    with pytest.raises(SqlSyntaxError, match="unknown QUEUE_TYPE 'KAFKA'"):
        _plan(cat, f"CREATE EXTERNAL VOLUME v LOCATION '{tmp_path}' NOTIFICATION = ("
                   f"QUEUE_TYPE = 'KAFKA')")
    with pytest.raises(SqlSyntaxError, match="not QUEUE_GROUP"):  # QUEUE_NAME is ignored
        _plan(cat, f"CREATE EXTERNAL VOLUME v LOCATION '{tmp_path}' NOTIFICATION = ("
                   f"QUEUE_TYPE = 'LOCAL', QUEUE_NAME = 'q', QUEUE_GROUP = 'g')")
    with pytest.raises(SqlSyntaxError, match="ENABLE = FALSE"):
        _plan(cat, f"CREATE EXTERNAL VOLUME v LOCATION '{tmp_path}' DIRECTORY = (ENABLE = FALSE)")
    with pytest.raises(vs.NotFoundError, match="connection 'nope' does not exist"):
        _plan(cat, "CREATE EXTERNAL VOLUME v LOCATION 'oss://b/' USING CONNECTION nope")
    cat.sql("CREATE STORAGE CONNECTION o TYPE OSS")
    with pytest.raises(SqlSyntaxError, match="type OSS; its volumes are at oss://"):
        _plan(cat, f"CREATE EXTERNAL VOLUME v LOCATION '{tmp_path}' USING CONNECTION o")


def test_plans_build_the_notification_classes_of_volumes():
    """The plans instantiate volume_stream.volumes' MnsNotification / SqsNotification."""
    from volume_stream.sql.volume_plan import NotificationPlan

    mns = NotificationPlan("ALICLOUD_MNS", ("https://1.mns.cn-shanghai.aliyuncs.com", "q")).build()
    assert type(mns).__name__ == "MnsNotification"
    assert (mns.endpoint, mns.queue_name) == ("https://1.mns.cn-shanghai.aliyuncs.com", "q")
    assert mns.to_dict()["type"] == "ALICLOUD_MNS"
    sqs = NotificationPlan("AWS_SQS", ("https://sqs.eu-west-1.amazonaws.com/1/q",),
                           {"region_name": "eu-west-1"}).build()
    assert type(sqs).__name__ == "SqsNotification"
    assert sqs.queue_url == "https://sqs.eu-west-1.amazonaws.com/1/q"
    local = NotificationPlan("LOCAL", (), {"polling": True}).build()
    assert local == vs.LocalNotification(polling=True)


# ---------------------------------------------------------------------- stream DML analysis
def analysis(text, streams=("s", "Other"), udfs=("fc_image_to_text",)):
    from volume_stream.sql.dml import analyze

    (statement,) = statements(text)
    found = analyze(statement, {s.lower(): s for s in streams}, set(udfs))
    return found, found.text(statement.text)


def test_stream_references_become_pinned_views_aliased_to_their_names():
    found, sent = analysis("INSERT INTO t SELECT s.url, o.size FROM s JOIN OTHER o ON "
                           "s.relative_path = o.relative_path")
    assert (found.kind, found.label, sorted(found.streams)) == ("write", "INSERT",
                                                                ["Other", "s"])
    view_s, view_o = found.streams["s"], found.streams["Other"]
    assert view_s.startswith("__vs_") and view_s.endswith("_s")
    assert sent == (f"INSERT INTO t SELECT s.url, o.size FROM `{view_s}` AS `s` JOIN "
                    f"`{view_o}` o ON s.relative_path = o.relative_path")
    # every statement gets fresh views
    assert analysis("SELECT * FROM s")[0].streams["s"] != view_s


def test_what_is_not_a_stream_reference():
    for text in ("WITH s AS (SELECT 1) SELECT * FROM s", "SELECT * FROM db.s",
                 "SELECT s FROM t", "SELECT 's' FROM t", "USE s", "SET s = 1"):
        found, sent = analysis(text)
        assert found.streams == {} and sent == text, text
    found, _ = analysis("SELECT * FROM t")
    assert found.kind == "read"
    found, sent = analysis("DESCRIBE s")
    assert sent == f"DESCRIBE `{found.streams['s']}`"  # no alias where Spark allows none


def test_statement_kinds():
    assert analysis("INSERT OVERWRITE TABLE t SELECT * FROM s")[0].label == "INSERT OVERWRITE"
    assert analysis("CREATE TABLE t AS SELECT * FROM s")[0].kind == "write"
    assert analysis("CREATE TABLE t (a INT)")[0].kind == "other"
    assert analysis("MERGE INTO t USING s src ON t.id = src.id WHEN MATCHED THEN DELETE"
                    )[0].kind == "write"
    assert analysis("SELECT * FROM s UNION ALL SELECT * FROM t")[0].label == "SELECT"
    with pytest.raises(vs.InvalidInputError, match="CACHE statement cannot read streams"):
        analysis("CACHE TABLE s")
    with pytest.raises(vs.InvalidInputError, match="EXPLAIN statement cannot read streams"):
        analysis("EXPLAIN SELECT * FROM s")
    with pytest.raises(vs.InvalidInputError, match="'s' is a stream and streams are read-only"):
        analysis("INSERT INTO s SELECT * FROM t")


def test_seed_adaptations_keep_the_rest_of_the_text_and_positions():
    text = ("CREATE TABLE r (a VARCHAR COMMENT 'x', b VARCHAR(10), c CHAR(2));\n"
            "SELECT public.fc_image_to_text('t', url), other.fn(x), CAST(y AS VARCHAR) FROM s")
    first, second = statements(text)
    from volume_stream.sql.dml import analyze

    a = analyze(first, {}, {"fc_image_to_text"})
    assert a.text(first.text) == "CREATE TABLE r (a STRING COMMENT 'x', b VARCHAR(10), c CHAR(2))"
    b = analyze(second, {"s": "s"}, {"fc_image_to_text"})
    sent = b.text(second.text)
    assert sent.startswith("SELECT fc_image_to_text('t', url), other.fn(x), CAST(y AS STRING) ")
    # positions in the text sent to Spark map back to the text as written
    assert b.original_offset(sent.index("url")) == second.text.index("url")
    assert b.original_offset(sent.index("FROM")) == second.text.index("FROM")
    assert b.original_offset(sent.index("__vs_")) == second.text.index(" s") + 1
