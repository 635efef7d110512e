"""The change-record schema and the stream modes are defined once (streams/changes.py) and
every reader agrees with them."""

from __future__ import annotations

import typing

from pyspark.sql.types import _parse_datatype_string

from volume_stream import datasource
from volume_stream.config.daemon import StreamConfig
from volume_stream.pipelines.executor import RECORD_COLUMNS
from volume_stream.streams.changes import MODES, RECORD_DDL, RECORD_SCHEMA, StreamMode


def test_the_spark_schema_is_the_arrow_schema(spark):
    struct = _parse_datatype_string(datasource.SCHEMA)
    assert datasource.SCHEMA == RECORD_DDL
    assert struct.names == RECORD_SCHEMA.names


def test_pipeline_tasks_get_the_record_columns_but_the_commit_timestamp():
    assert RECORD_COLUMNS == [n for n in RECORD_SCHEMA.names if n != "__commit_timestamp"]


def test_modes_are_one_list():
    assert typing.get_args(StreamMode) == MODES
    assert StreamConfig().mode == MODES[0]
