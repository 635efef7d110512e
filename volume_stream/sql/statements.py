"""The parsed forms of the DDL statements `sql.ddl.parse` returns (small frozen dataclasses)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from volume_stream.sql.lexer import Token as _Token

__all__ = ["AlterTable", "AlterVolume", "CreateConnection", "CreateStream", "CreateVolume", "Describe", "Drop",
           "EnvRef", "Prop", "Show"]


@dataclass(frozen=True)
class EnvRef:
    """`ENV('NAME')`: a value taken from an environment variable when it is used."""

    var: str


@dataclass(frozen=True)
class Prop:
    """A `KEY = value` property; `token` locates the value for error messages."""

    value: Any
    token: _Token


@dataclass(frozen=True)
class CreateConnection:
    name: str
    type: str
    props: dict[str, Prop]
    replace: bool = False
    if_not_exists: bool = False


@dataclass(frozen=True)
class CreateVolume:
    name: str
    location: str
    connection: str | None = None
    notification: dict[str, Prop] | None = None
    directory: dict[str, Prop] | None = None
    recursive: bool | None = None
    options: dict[str, Prop] | None = None
    replace: bool = False
    if_not_exists: bool = False
    location_token: _Token | None = None
    notification_token: _Token | None = None


@dataclass(frozen=True)
class CreateStream:
    name: str
    volume: str                            # "" for a stream on a table
    props: dict[str, Prop]
    timestamp: str | None = None           # a literal timestamp
    timestamp_expr: str | None = None      # a Spark SQL expression to evaluate
    comment: str | None = None
    replace: bool = False
    if_not_exists: bool = False
    table: str | None = None               # CREATE TABLE STREAM ... ON TABLE t


@dataclass(frozen=True)
class AlterTable:  # ALTER TABLE t SET PROPERTIES ('change_tracking' = 'true', ...)
    name: str
    props: dict[str, Prop]


@dataclass(frozen=True)
class AlterVolume:
    name: str
    action: str = "REFRESH"


@dataclass(frozen=True)
class Drop:
    kind: str  # "connection" | "stream" | "volume"
    name: str
    if_exists: bool = False
    cascade: bool = False


@dataclass(frozen=True)
class Show:
    kind: str  # "volumes" | "streams" | "connections" | "directory"
    name: str | None = None


@dataclass(frozen=True)
class Describe:
    kind: str  # "connection" | "stream" | "volume"
    name: str
