"""The SQL front door (DESIGN §8): `run_sql`, `run_script`, `register_udf` (see `runner`).

    lexer       tokens and statements with line/column
    ddl         the DDL parser (statements → dataclasses)
    statements  the parsed DDL dataclasses
    ddl_exec    runs parsed DDL against the catalog's public methods
    volume_plan CREATE EXTERNAL VOLUME → create_volume arguments
    dml         Spark SQL over streams (pinning, offset moves)
    tables      warehouse tables: CREATE/DROP/SHOW/DESCRIBE TABLE, INSERT/UPDATE/DELETE/MERGE
    result      SqlResult
    udfs        Python UDFs registered per SparkSession
"""

from volume_stream.errors import SqlError, SqlSyntaxError
from volume_stream.sql.result import SqlResult
from volume_stream.sql.runner import (
    check_script,
    check_statement,
    register_udf,
    register_udf_lazily,
    run_script,
    run_sql,
    run_statement,
    statements,
)
from volume_stream.sql.udfs import registered_udfs

__all__ = [
    "SqlError",
    "SqlResult",
    "SqlSyntaxError",
    "check_script",
    "check_statement",
    "register_udf",
    "register_udf_lazily",
    "registered_udfs",
    "run_script",
    "run_sql",
    "run_statement",
    "statements",
]
