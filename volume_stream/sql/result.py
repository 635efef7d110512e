"""What one SQL statement returns: rows (DDL answers) or a Spark DataFrame (queries), a message,
and the stream offsets the statement moved.

    result = cat.sql("SHOW STREAMS")
    result.rows            # [{'name': 's', 'volume': 'v', ...}]
    cat.sql("SELECT * FROM s").df.show()
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["SqlResult", "counted"]

_SINGULAR = {"volumes": "volume", "streams": "stream", "connections": "connection",
             "properties": "property", "files": "file", "rows": "row", "records": "record",
             "change records": "change record"}


def counted(n: int, noun: str) -> str:
    """`n` and `noun` (a plural), singular when `n` is 1: "1 volume", "2 volumes"."""
    return f"{n} {_SINGULAR.get(noun, noun) if n == 1 else noun}"


@dataclass
class SqlResult:
    """The outcome of one statement.

    Attributes:
        statement: What ran, e.g. "CREATE VOLUME", "SHOW STREAMS", "SELECT", "INSERT".
        text: The statement as written.
        line: Line of the script where it starts.
        message: A one-line summary ("created volume v", "stream s: offset 0 -> 3").
        columns: Column names of `rows` (DDL answers).
        offsets: For statements that consumed streams: {stream: {"start", "end", "batch_id"}}.
    """

    statement: str
    text: str = ""
    line: int = 1
    message: str = ""
    columns: list[str] = field(default_factory=list)
    offsets: dict[str, dict[str, int]] = field(default_factory=dict)
    _rows: list[dict[str, Any]] | None = field(default=None, repr=False)
    _df: DataFrame | None = field(default=None, repr=False)
    _query: bool = field(default=False, repr=False)
    _spark: Callable[[], SparkSession] | None = field(default=None, repr=False)

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The result rows as dicts (a query's DataFrame is collected on first use)."""
        if self._rows is None:
            self._rows = ([r.asDict(recursive=True) for r in self._df.collect()]
                          if self._df is not None else [])
            if self._df is not None and not self.columns:
                self.columns = list(self._df.columns)
        return self._rows

    @property
    def df(self) -> DataFrame | None:
        """The rows as a Spark DataFrame (a DDL answer is turned into one on first use)."""
        if self._df is None and self._rows and self._spark is not None:
            self._df = self._spark().createDataFrame(self.to_arrow())
        return self._df

    @property
    def is_query(self) -> bool:
        """Whether the statement was a query answered by Spark (rather than DDL rows)."""
        return self._query

    def to_arrow(self) -> pa.Table:
        """The rows as a pyarrow Table (a DDL column of mixed types, such as DESCRIBE's
        `value`, becomes text)."""
        if self._query:
            return self._df.toArrow()
        rows = self.rows
        columns = self.columns or (list(rows[0]) if rows else [])
        if not rows:
            return pa.table({c: pa.array([], pa.string()) for c in columns})
        data = {}
        for column in columns:
            values = [_plain(r.get(column)) for r in rows]
            kinds = {type(v) for v in values if v is not None}
            if len(kinds) > 1 and not kinds <= {int, float}:
                values = [None if v is None else str(v) for v in values]
            data[column] = values
        return pa.table(data)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)


def _plain(value: Any) -> Any:
    # nested dicts/lists (options, notification) become JSON text in tables
    if isinstance(value, dict | list | tuple):
        import json

        return json.dumps(value, default=str, sort_keys=True)
    return value
