"""Runs the seed's DDL (parsed by `sql.ddl`) against a `Catalog`: connections, volumes,
streams, refresh, drop, show, describe.

Storage connections live in the warehouse catalog as objects of kind "connection". Their
credentials are never stored in clear: a secret must be written `ENV('VAR')` (only the
variable's name is stored) or replaced by a `ROLE_ARN`. A volume's `create_volume` call is
worked out by `sql.volume_plan.plan_volume`; what only SQL knows about it is kept as an object of
kind "volume_sql" tied to the volume's id, and shown by DESCRIBE VOLUME.

    execute(catalog, parse(statement), statement)     # -> SqlResult
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

from connectors.secrets import is_secret
from volume_stream.errors import (
    AlreadyExistsError,
    InvalidInputError,
    NotFoundError,
)
from volume_stream.sql import ddl
from volume_stream.sql.lexer import SqlSyntaxError, Statement
from volume_stream.sql.result import SqlResult, counted
from volume_stream.sql.volume_plan import (
    CONNECTION,
    CREDENTIALS,
    STREAM,
    VOLUME,
    VOLUME_SQL,
    connection,
    literal,
    plan_volume,
    resolve,
    volume_sql,
)
from volume_stream.streams.changes import MODES

__all__ = ["execute"]

_CONNECTION_PROPS = ("TYPE", "ENDPOINT", "REGION", "ROLE_ARN", "ACCOUNT_ID", "COMMENT",
                     "COMMENTS")


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _fail(token: Any, message: str) -> SqlSyntaxError:
    """An error in a well-formed statement, still located at the offending value."""
    return SqlSyntaxError(message, token.line, token.column)


# ---------------------------------------------------------------------- connections
def _create_connection(catalog, stmt: ddl.CreateConnection) -> SqlResult:
    ctype = stmt.type
    if ctype not in CREDENTIALS:
        raise _fail(stmt.props["TYPE"].token,
                    f"connection TYPE {ctype!r} is not supported; supported: OSS, S3")
    credentials: dict[str, str] = {}
    spec: dict[str, Any] = {"name": stmt.name, "type": ctype, "created_at": _now(),
                            "external_id": secrets.token_hex(8)}
    for key, prop in stmt.props.items():
        if key == "TYPE":
            continue
        secretish = key in CREDENTIALS[ctype] or is_secret(key)
        if secretish:
            if key not in CREDENTIALS[ctype]:
                raise _fail(prop.token,
                            f"unknown credential {key} for an {ctype} connection; known: "
                            f"{', '.join(sorted(CREDENTIALS[ctype]))}")
            if not isinstance(prop.value, ddl.EnvRef):
                # the value is deliberately not echoed: it is a secret
                raise _fail(prop.token,
                            f"{key} is a credential and volume-stream never stores credentials; "
                            f"write {key} = ENV('YOUR_VARIABLE') to read it from the environment "
                            f"where the volume is used, or use ROLE_ARN = '...'")
            credentials[key] = prop.value.var
        elif key in _CONNECTION_PROPS:
            if isinstance(prop.value, ddl.EnvRef):
                raise _fail(prop.token, f"{key} takes a literal value, not ENV()")
            spec["comment" if key.startswith("COMMENT") else key.lower()] = prop.value
        else:
            raise _fail(prop.token,
                        f"unknown connection property {key}; known: "
                        f"{', '.join(_CONNECTION_PROPS[1:5] + tuple(sorted(CREDENTIALS[ctype])))}")
    spec["credentials"] = credentials

    def register(state: dict) -> bool:
        name = resolve(state, CONNECTION, stmt.name)
        if (CONNECTION, name) in state:
            if stmt.if_not_exists:
                return False
            if not stmt.replace:
                raise AlreadyExistsError(CONNECTION, name)
            del state[(CONNECTION, name)]
        state[(CONNECTION, stmt.name)] = spec
        return True

    created = catalog.warehouse.mutate(register)
    message = (f"created connection {stmt.name}" if created else
               f"connection {stmt.name} exists; left as it is")
    return SqlResult("CREATE CONNECTION", message=message)


def _connection_row(spec: dict[str, Any]) -> dict[str, Any]:
    creds = ", ".join(f"{k}=ENV('{v}')" for k, v in sorted(spec.get("credentials", {}).items()))
    return {"name": spec["name"], "type": spec["type"], "endpoint": spec.get("endpoint"),
            "region": spec.get("region"), "role_arn": spec.get("role_arn"),
            "credentials": creds or None, "external_id": spec.get("external_id"),
            "comment": spec.get("comment"), "created_at": spec.get("created_at")}


# ---------------------------------------------------------------------- volumes
def _create_volume(catalog, stmt: ddl.CreateVolume) -> SqlResult:
    plan = plan_volume(catalog, stmt)
    state = catalog.warehouse.read()
    existing = resolve(state, VOLUME, plan.name)
    if plan.if_not_exists and (VOLUME, existing) in state:
        return SqlResult("CREATE VOLUME", message=f"volume {existing} exists; left as it is")
    notification = plan.notification.build() if plan.notification else None
    try:
        spec = catalog.create_volume(plan.name, plan.location, recursive=plan.recursive,
                                     notification=notification, replace=plan.replace,
                                     **plan.options, **plan.credentials)
    except AlreadyExistsError:
        if plan.if_not_exists:  # created by someone else meanwhile
            return SqlResult("CREATE VOLUME", message=f"volume {plan.name} exists; left as it is")
        raise

    def remember(state: dict) -> None:
        state.pop((VOLUME_SQL, spec.name), None)
        if plan.metadata:
            state[(VOLUME_SQL, spec.name)] = {"name": spec.name, "volume_id": spec.id,
                                              **plan.metadata}

    catalog.warehouse.mutate(remember)
    ignored = plan.metadata.get("ignored_notification_options")
    note = f" (QUEUE_TYPE 'LOCAL' watches the folder: {', '.join(ignored)} ignored)" \
        if ignored else ""
    return SqlResult("CREATE VOLUME",
                     message=f"created volume {spec.name} at {spec.location}{note}")


# ---------------------------------------------------------------------- streams
def _timestamp(catalog, stmt: ddl.CreateStream) -> datetime | None:
    if stmt.timestamp is not None:
        try:
            when = datetime.fromisoformat(stmt.timestamp.strip())
        except ValueError:
            raise InvalidInputError(f"TIMESTAMP AS OF {stmt.timestamp!r} is not a timestamp; "
                                    f"write e.g. '2024-05-01 08:00:00'") from None
    elif stmt.timestamp_expr is not None:
        # the user's own expression, evaluated by Spark in the user's own session
        row = catalog.spark.sql(f"SELECT unix_micros(CAST(({stmt.timestamp_expr}) AS TIMESTAMP))"
                                ).collect()[0]
        if row[0] is None:
            raise InvalidInputError(f"TIMESTAMP AS OF {stmt.timestamp_expr} is NULL")
        when = datetime.fromtimestamp(row[0] / 1e6, UTC)
    else:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _create_stream(catalog, stmt: ddl.CreateStream) -> SqlResult:
    mode, initial = "STANDARD", False
    for key, prop in stmt.props.items():
        if key == "TABLE_STREAM_MODE":
            mode = str(literal(prop, key, str)).upper()
            if mode not in MODES:
                raise SqlSyntaxError(f"TABLE_STREAM_MODE must be 'STANDARD' or 'APPEND_ONLY', "
                                     f"not {prop.value!r}", prop.token.line, prop.token.column)
        elif key == "SHOW_INITIAL_ROWS":
            value = prop.value
            if isinstance(value, str) and value.upper() in ("TRUE", "FALSE"):
                value = value.upper() == "TRUE"
            if not isinstance(value, bool):
                raise SqlSyntaxError("SHOW_INITIAL_ROWS must be 'TRUE' or 'FALSE'",
                                     prop.token.line, prop.token.column)
            initial = value
        else:
            raise SqlSyntaxError(f"unknown stream property {key!r}; known: TABLE_STREAM_MODE, "
                                 f"SHOW_INITIAL_ROWS", prop.token.line, prop.token.column)
    state = catalog.warehouse.read()
    name = resolve(state, STREAM, stmt.name)
    if stmt.if_not_exists and (STREAM, name) in state:
        return SqlResult("CREATE STREAM", message=f"stream {name} exists; left as it is")
    if stmt.table is not None:
        volume = table = _table_name(catalog, stmt.table)
        target: dict[str, Any] = {"on_table": table}
    else:
        volume = resolve(state, VOLUME, stmt.volume)
        target = {"on_volume": volume}
    try:
        info = catalog.create_stream(stmt.name, **target, mode=mode, show_initial_rows=initial,
                                     at_timestamp=_timestamp(catalog, stmt),
                                     replace=stmt.replace)
    except AlreadyExistsError:
        if stmt.if_not_exists:
            return SqlResult("CREATE STREAM", message=f"stream {name} exists; left as it is")
        raise
    return SqlResult("CREATE STREAM", message=f"created stream {stmt.name} on {volume} "
                                              f"({mode}) at version {info['offset']}")


# ---------------------------------------------------------------------- tables
#: Delta table properties by their upper-cased SQL spelling
_TABLE_PROPS = {"CHANGE_TRACKING": "change_tracking", "KEY": "key",
               "VOLUME_STREAM.KEY": "volume_stream.key",
                **{k.upper(): k for k in ("delta.enableChangeDataFeed", "delta.appendOnly",
                                          "delta.logRetentionDuration",
                                          "delta.deletedFileRetentionDuration")}}


def _table_name(catalog, name: str) -> str:
    """The stored spelling of a warehouse table (case-insensitive); NotFoundError if none."""
    names = catalog.tables.names()
    found = {n.lower(): n for n in names}.get(name.lower())
    if found is None:
        raise NotFoundError("table", name, names)
    return found


def _alter_table(catalog, stmt: ddl.AlterTable) -> SqlResult:
    name = _table_name(catalog, stmt.name)
    props = {}
    for key, prop in stmt.props.items():
        if key not in _TABLE_PROPS:
            raise _fail(prop.token, f"unknown table property {key!r}; known: "
                                    f"{', '.join(sorted(_TABLE_PROPS.values()))}")
        value = prop.value
        props[_TABLE_PROPS[key]] = str(value).lower() if isinstance(value, bool) else str(value)
    version = catalog.tables.set_properties(name, props)
    return SqlResult("ALTER TABLE", message=f"table {name}: set {props} (version {version})")


def _stream_rows(streams: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """SHOW STREAMS rows, one shape for streams on volumes and on tables."""
    keys = ["name", "volume", "table"]
    for s in streams:
        keys += [k for k in s if k not in keys]
    return [{k: s.get(k) for k in keys} for s in streams]


# ---------------------------------------------------------------------- the rest
def _rows(statement: str, rows: list[dict[str, Any]], message: str = "") -> SqlResult:
    columns = list(rows[0]) if rows else []
    noun = statement.split()[-1].lower()
    return SqlResult(statement, message=message or counted(len(rows), noun), columns=columns,
                     _rows=rows)


def _properties(statement: str, info: dict[str, Any]) -> SqlResult:
    rows = [{"property": k, "value": v} for k, v in info.items()]
    return SqlResult(statement, message=counted(len(rows), "properties"),
                     columns=["property", "value"], _rows=rows)


def _drop(catalog, stmt: ddl.Drop) -> SqlResult:
    state = catalog.warehouse.read()
    name = resolve(state, stmt.kind, stmt.name)
    if stmt.kind == VOLUME:
        dropped = catalog.drop_volume(name, if_exists=stmt.if_exists, cascade=stmt.cascade)
        if (VOLUME_SQL, name) in state:
            catalog.warehouse.mutate(lambda st: st.pop((VOLUME_SQL, name), None) and None)
    elif stmt.kind == STREAM:
        dropped = catalog.drop_stream(name, if_exists=stmt.if_exists)
    else:
        def drop(state: dict) -> bool:
            if (CONNECTION, name) not in state:
                if stmt.if_exists:
                    return False
                raise NotFoundError(CONNECTION, name, [n for k, n in state if k == CONNECTION])
            users = sorted(n for k, n in state if k == VOLUME
                           and volume_sql(state, n).get("connection") == name)
            if users:
                raise InvalidInputError(f"connection {name!r} is used by volumes {users}; drop "
                                        f"them first")
            del state[(CONNECTION, name)]
            return True

        dropped = catalog.warehouse.mutate(drop)
    verb = "dropped" if dropped else "no"
    return SqlResult(f"DROP {stmt.kind.upper()}", message=f"{verb} {stmt.kind} {name}")


def execute(catalog, stmt: Any, statement: Statement) -> SqlResult:
    """Run one parsed DDL statement; returns its SqlResult (text and line filled in)."""
    result = _execute(catalog, stmt, statement)
    result.text, result.line = statement.text, statement.line
    result._spark = lambda: catalog.spark
    return result


def _execute(catalog, stmt: Any, statement: Statement) -> SqlResult:
    if isinstance(stmt, ddl.CreateConnection):
        return _create_connection(catalog, stmt)
    if isinstance(stmt, ddl.CreateVolume):
        return _create_volume(catalog, stmt)
    if isinstance(stmt, ddl.CreateStream):
        return _create_stream(catalog, stmt)
    if isinstance(stmt, ddl.AlterTable):
        return _alter_table(catalog, stmt)
    if isinstance(stmt, ddl.AlterVolume) and stmt.action == "UPGRADE":
        name = resolve(catalog.warehouse.read(), VOLUME, stmt.name)
        version = catalog.upgrade_volume(name)
        return _rows("ALTER VOLUME", [{"volume": name, "version": version}],
                     f"{name}: deletion vectors " + ("on already" if version is None
                                                     else f"on at version {version}"))
    if isinstance(stmt, ddl.AlterVolume):
        name = resolve(catalog.warehouse.read(), VOLUME, stmt.name)
        m = catalog.refresh(name)
        version = "no new version" if m.version is None else f"version {m.version}"
        return _rows("ALTER VOLUME", [{"volume": name, "listed": m.listed,
                                       "inserted": m.inserted, "updated": m.updated,
                                       "deleted": m.deleted, "version": m.version}],
                     f"refreshed {name}: listed {m.listed}, +{m.inserted} ~{m.updated} "
                     f"-{m.deleted} ({version})")
    if isinstance(stmt, ddl.Drop):
        return _drop(catalog, stmt)
    if isinstance(stmt, ddl.Show):
        if stmt.kind == "volumes":
            return _rows("SHOW VOLUMES", catalog.list_volumes())
        if stmt.kind == "streams":
            return _rows("SHOW STREAMS", _stream_rows(catalog.list_streams()))
        if stmt.kind == "connections":
            state = catalog.warehouse.read()
            return _rows("SHOW CONNECTIONS", [_connection_row(s) for (k, _), s in
                                              sorted(state.items()) if k == CONNECTION])
        from directory_table.schema import PUBLIC_COLUMNS

        name = resolve(catalog.warehouse.read(), VOLUME, stmt.name)
        table = catalog.directory_table(name).snapshot(columns=list(PUBLIC_COLUMNS))
        table = table.sort_by("relative_path")
        return SqlResult("SHOW VOLUME DIRECTORY", message=counted(table.num_rows, "files"),
                         columns=list(PUBLIC_COLUMNS), _rows=table.to_pylist())
    # Describe
    state = catalog.warehouse.read()
    name = resolve(state, stmt.kind, stmt.name)
    if stmt.kind == STREAM:
        return _properties("DESCRIBE STREAM", catalog.describe_stream(name))
    if stmt.kind == VOLUME:
        info = catalog.describe_volume(name)
        info.update(volume_sql(catalog.warehouse.read(), name))
        return _properties("DESCRIBE VOLUME", info)
    return _properties("DESCRIBE CONNECTION", _connection_row(connection(catalog, name)))
