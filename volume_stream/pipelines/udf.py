"""What a pipeline's function sees and is: `FileRecord`, `FileUdf`, `@file_udf` (DESIGN §7).

Used on the driver and on the executors; it imports no Spark at module level, so an executor
unpickling a `FileRecord` loads only this module.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any

from volume_stream.errors import InvalidInputError

if TYPE_CHECKING:  # annotations only: no Spark import on executors
    import pyarrow as pa
    from pyspark.sql.types import StructType

__all__ = ["FileRecord", "FileUdf", "file_udf"]


class _BytesReader:
    """An `ObjectReader` over bytes held in memory (for `FileRecord.from_bytes`)."""

    def __init__(self, data: bytes) -> None:
        self.data = bytes(data)

    def open(self, relative_path: str) -> IO[bytes]:
        return io.BytesIO(self.data)

    def read_range(self, relative_path: str, start: int, length: int) -> bytes:
        return self.data[start:start + length]


@dataclass(frozen=True)
class FileRecord:
    """One file as a file UDF sees it: the change record's metadata and a lazy way to read it.

    Nothing is read until `open()`, `read_bytes()` or `read_text()` is called; `open()` streams
    from the volume's object reader (local disk, S3, OSS), so large files need not fit in memory.

    Example:
        >>> rec = FileRecord.from_bytes(b"hello\\nworld\\n", relative_path="a/b.txt")
        >>> rec.read_text().splitlines()
        ['hello', 'world']
        >>> with rec.open() as f:
        ...     f.read(5)
        b'hello'
    """

    relative_path: str
    url: str | None
    size: int | None
    last_modified_time: datetime | None
    etag: str | None
    change_type: str
    commit_version: int
    reader: Any = field(repr=False, compare=False)

    @property
    def name(self) -> str:
        """The last segment of the path: `'cat.jpg'` for `'2024/cat.jpg'`."""
        return self.relative_path.rsplit("/", 1)[-1]

    def open(self) -> IO[bytes]:
        """A binary, streamed file-like object (use it as a context manager)."""
        return self.reader.open(self.relative_path)

    def read_bytes(self) -> bytes:
        """The whole file as bytes."""
        with self.open() as f:
            return f.read()

    def read_text(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        """The whole file decoded as text."""
        return self.read_bytes().decode(encoding, errors)

    @classmethod
    def from_bytes(cls, data: bytes, relative_path: str = "file", *, change_type: str = "INSERT",
                   commit_version: int = 0, **meta: Any) -> FileRecord:
        """A record over in-memory bytes: to unit-test a file UDF, or to call it on data you
        already hold (Spark's `binaryFile` content, say).

        Example:
            >>> FileRecord.from_bytes(b"abc").size
            3
        """
        return cls(relative_path=relative_path, url=meta.get("url"),
                   size=meta.get("size", len(data)),
                   last_modified_time=meta.get("last_modified_time"), etag=meta.get("etag"),
                   change_type=change_type, commit_version=commit_version,
                   reader=_BytesReader(data))

    @classmethod
    def from_path(cls, path: str | os.PathLike, *, change_type: str = "INSERT",
                  commit_version: int = 0) -> FileRecord:
        """A record over a local file, read through the same `LocalReader` a local volume uses.

        Example:
            >>> FileRecord.from_path("/data/in/cat.jpg").name  # doctest: +SKIP
            'cat.jpg'
        """
        # imported here, not at module level: executors unpickling records need no watchdog
        from connectors.local import LocalReader, file_url

        path = os.path.abspath(os.fspath(path))
        root, name = os.path.split(path)
        st = os.stat(path)
        return cls(relative_path=name, url=file_url(root, name), size=st.st_size,
                   last_modified_time=datetime.fromtimestamp(st.st_mtime, UTC),
                   etag=f"{st.st_mtime_ns:x}-{st.st_size:x}", change_type=change_type,
                   commit_version=commit_version, reader=LocalReader(root))


class FileUdf:
    """A function of one file with a declared output schema; made by `@file_udf(schema)`.

    Calling it calls the function. `struct_type()` / `arrow_schema()` give the schema (a DDL
    string needs a SparkSession to parse; one is made if none is active).
    """

    def __init__(self, fn: Callable[[FileRecord], Any], schema: str | StructType):
        if not callable(fn):
            raise InvalidInputError(f"file_udf needs a function, not {type(fn).__name__}")
        if not isinstance(schema, str) and type(schema).__name__ != "StructType":
            raise InvalidInputError(
                f"file_udf schema must be a Spark DDL string (e.g. 'width int, height int') or "
                f"a StructType, not {type(schema).__name__}")
        self.fn = fn
        self.schema = schema
        self.__name__ = getattr(fn, "__name__", "file_udf")
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__wrapped__ = fn
        self._struct: StructType | None = None

    def __repr__(self) -> str:
        return f"FileUdf({self.__name__}, {self.schema!r})"

    def __call__(self, file: FileRecord) -> Any:
        return self.fn(file)

    def struct_type(self) -> StructType:
        """The output schema as a Spark StructType (parsed once)."""
        if self._struct is None:
            from pyspark.sql.types import StructType

            if isinstance(self.schema, StructType):
                self._struct = self.schema
            else:
                parsed = parse_simple_ddl(self.schema)
                if parsed is not None:  # no JVM needed: a run with nothing to do stays fast
                    self._struct = parsed
                    return parsed
                from volume_stream._spark import get_spark

                get_spark()  # other DDL (NOT NULL, COMMENT, char(n), intervals) needs the JVM
                try:
                    parsed = StructType.fromDDL(self.schema)
                except Exception as exc:
                    raise InvalidInputError(
                        f"file_udf {self.__name__}: cannot parse schema {self.schema!r}: "
                        f"{str(exc).splitlines()[0]}") from exc
                if not isinstance(parsed, StructType):
                    raise InvalidInputError(
                        f"file_udf {self.__name__}: schema {self.schema!r} is not a list of "
                        f"columns ('name type, ...')")
                self._struct = parsed
        return self._struct

    def arrow_schema(self) -> pa.Schema:
        """The output schema as Arrow (timestamps in UTC)."""
        from pyspark.sql.pandas.types import to_arrow_schema

        try:
            return to_arrow_schema(self.struct_type(), timezone="UTC")
        except Exception as exc:
            raise InvalidInputError(f"file_udf {self.__name__}: schema {self.schema!r} has a "
                                    f"type Arrow cannot hold: {exc}") from exc


_SIMPLE_TYPES = {
    "boolean": "boolean", "byte": "byte", "tinyint": "byte", "short": "short",
    "smallint": "short", "int": "integer", "integer": "integer", "long": "long",
    "bigint": "long", "float": "float", "real": "float", "double": "double", "date": "date",
    "timestamp": "timestamp", "timestamp_ltz": "timestamp", "timestamp_ntz": "timestamp_ntz",
    "string": "string", "binary": "binary",
}
_DDL_TOKEN = re.compile(r"\s*(`(?:[^`]|``)+`|[A-Za-z_][A-Za-z0-9_]*|\d+|[<>(),:])")


def parse_simple_ddl(ddl: str) -> StructType | None:
    """Parse `name type, ...` DDL without Spark's JVM: the simple types, decimal(p,s),
    array<T>, map<K,V> and struct<name:T,...>. Returns None for anything else (the caller
    then asks Spark), so the result is always what `StructType.fromDDL` would give.

    Example:
        >>> parse_simple_ddl("format string, width int").fieldNames()
        ['format', 'width']
    """
    from pyspark.sql.types import StructType

    tokens, pos = [], 0
    while pos < len(ddl):
        if ddl[pos:].strip() == "":
            break
        match = _DDL_TOKEN.match(ddl, pos)
        if match is None:
            return None
        tokens.append(match.group(1))
        pos = match.end()
    at = [0]

    def peek() -> str | None:
        return tokens[at[0]] if at[0] < len(tokens) else None

    def take(expected: str | None = None) -> str:
        token = peek()
        if token is None or (expected is not None and token.lower() != expected):
            raise ValueError(token)
        at[0] += 1
        return token

    def name() -> str:
        token = take()
        if token.startswith("`"):
            return token[1:-1].replace("``", "`")
        if not (token[0].isalpha() or token[0] == "_"):
            raise ValueError(token)
        return token

    def dtype() -> object:
        word = take().lower()
        if word in _SIMPLE_TYPES:
            return _SIMPLE_TYPES[word]
        if word in ("decimal", "dec", "numeric"):
            precision, scale = 10, 0
            if peek() == "(":
                take("(")
                precision = int(take())
                if peek() == ",":
                    take(",")
                    scale = int(take())
                take(")")
            return f"decimal({precision},{scale})"
        if word == "array":
            take("<")
            element = dtype()
            take(">")
            return {"type": "array", "elementType": element, "containsNull": True}
        if word == "map":
            take("<")
            key = dtype()
            take(",")
            value = dtype()
            take(">")
            return {"type": "map", "keyType": key, "valueType": value,
                    "valueContainsNull": True}
        if word == "struct":
            take("<")
            fields = []
            while True:
                field_name = name()
                if peek() == ":":
                    take(":")
                fields.append(field(field_name))
                if peek() != ",":
                    break
                take(",")
            take(">")
            return {"type": "struct", "fields": fields}
        raise ValueError(word)

    def field(field_name: str) -> dict:
        return {"name": field_name, "type": dtype(), "nullable": True, "metadata": {}}

    try:
        if not tokens:
            return None
        fields = [field(name())]
        while peek() == ",":
            take(",")
            fields.append(field(name()))
        if peek() is not None:
            return None
        return StructType.fromJson({"type": "struct", "fields": fields})
    except (ValueError, KeyError, IndexError):
        return None


def file_udf(schema: str | StructType) -> Callable[[Callable[[FileRecord], Any]], FileUdf]:
    """Declare a function of one file as a pipeline UDF with the given output schema.

    The function gets a `FileRecord` and returns a dict (one row), an iterable of dicts (zero
    or more rows) or None (no row). Keys must be columns of `schema`; missing ones are null.

    Example:
        >>> @file_udf("n_lines long")
        ... def count_lines(file):
        ...     return {"n_lines": file.read_bytes().count(b"\\n")}
        >>> count_lines(FileRecord.from_bytes(b"a\\nb\\n"))
        {'n_lines': 2}
    """

    def wrap(fn: Callable[[FileRecord], Any]) -> FileUdf:
        return FileUdf(fn, schema)

    return wrap


