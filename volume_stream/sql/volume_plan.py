"""What a CREATE EXTERNAL VOLUME statement means: the `create_volume` call it makes, with its
notification, connector options and credentials, worked out without creating anything.

`QUEUE_TYPE = 'ALICLOUD_MNS' | 'AWS_SQS' | 'AZURE_STORAGE_QUEUE' | 'GCP_PUBSUB' | 'LOCAL'`
maps onto `MnsNotification`, `SqsNotification`, `AzureQueueNotification`, `PubSubNotification`
(QUEUE_NAME is the subscription, 'projects/P/subscriptions/S') or `LocalNotification`. The MNS
endpoint and the SQS queue URL are derived from the connection's role ARN (its account) and
region unless given as ENDPOINT / QUEUE_URL (a Storage Queue's ENDPOINT is its queue endpoint);
other NOTIFICATION options are checked against the listener's own parameters. A connection gives its
endpoint (and region, for S3) as connector options and its credentials' variables, read when
the statement runs, for this process only; what only SQL knows (the connection, VIRTUAL_CLUSTER,
AUTO_REFRESH, COMMENT) is returned apart, as metadata.

    plan = plan_volume(catalog, parsed)
    plan.notification.build()      # MnsNotification(...)
"""

from __future__ import annotations

import inspect
import os
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from volume_stream.errors import ConfigError, InvalidInputError, NotFoundError
from volume_stream.sql import ddl
from volume_stream.sql.lexer import SqlSyntaxError
from volume_stream.volumes.notifications import notification_types

__all__ = ["CONNECTION", "CREDENTIALS", "NotificationPlan", "VolumePlan", "plan_volume",
           "literal", "connection", "resolve", "volume_sql"]

CONNECTION, VOLUME, STREAM, VOLUME_SQL = "connection", "volume", "stream", "volume_sql"

#: Credential properties, per connection type, and the backend option each one feeds.
CREDENTIALS = {
    "OSS": {"ACCESS_ID": "access_key_id", "ACCESS_KEY_ID": "access_key_id",
            "ACCESS_KEY": "access_key_secret", "ACCESS_KEY_SECRET": "access_key_secret",
            "SECURITY_TOKEN": "security_token"},
    "S3": {"ACCESS_ID": "aws_access_key_id", "ACCESS_KEY_ID": "aws_access_key_id",
           "ACCESS_KEY": "aws_secret_access_key", "SECRET_ACCESS_KEY": "aws_secret_access_key",
           "SESSION_TOKEN": "aws_session_token"},
}
_SCHEMES = {"OSS": "oss", "S3": "s3"}
_QUEUE_TYPES = {"ALICLOUD_MNS": "oss", "AWS_SQS": "s3", "GCP_PUBSUB": "gs", "LOCAL": "file",
                "AZURE_STORAGE_QUEUE": "abfss"}
#: other schemes a queue type serves besides its own
_ALSO = {"AZURE_STORAGE_QUEUE": ("az",)}
_ROLE_ACCOUNT = re.compile(r"^(?:acs:ram::|arn:aws[\w-]*:iam::)(\d+):role/")


def resolve(state: dict, kind: str, name: str) -> str:
    """The stored spelling of `name` (SQL names are case-insensitive); unknown names pass
    through so the catalog's own NotFoundError names what exists."""
    if (kind, name) in state:
        return name
    matches = [n for k, n in state if k == kind and n.lower() == name.lower()]
    if len(matches) > 1:
        raise InvalidInputError(f"{kind} name {name!r} is ambiguous: {sorted(matches)} differ "
                                f"only in case; write the exact name")
    return matches[0] if matches else name


def connection(catalog, name: str) -> dict[str, Any]:
    state = catalog.warehouse.read()
    name = resolve(state, CONNECTION, name)
    spec = state.get((CONNECTION, name))
    if spec is None:
        raise NotFoundError(CONNECTION, name, [n for k, n in state if k == CONNECTION])
    return spec


def volume_sql(state: dict, name: str) -> dict[str, Any]:
    """The SQL-only facts of a volume, if they belong to the volume now of that name."""
    meta = state.get((VOLUME_SQL, name))
    volume = state.get((VOLUME, name))
    if not meta or not volume or volume.get("id") != meta.get("volume_id"):
        return {}
    return {k: v for k, v in meta.items() if k not in ("name", "volume_id")}


@dataclass(frozen=True)
class NotificationPlan:
    """Which notification class to build, with what arguments (kept apart from building, so a
    statement can be checked where the class or its backend is not installed)."""

    type: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def build(self) -> Any:
        cls = notification_types().get(self.type)
        if cls is None:
            raise ConfigError(f"QUEUE_TYPE = '{self.type}' is not a notification type this "
                              f"installation knows ({', '.join(sorted(notification_types()))})")
        return cls(*self.args, **self.kwargs)


@dataclass(frozen=True)
class VolumePlan:
    """The `create_volume` call a CREATE EXTERNAL VOLUME statement makes."""

    name: str
    location: str
    recursive: bool
    notification: NotificationPlan | None
    options: dict[str, Any]        # create_volume options (connector options included)
    metadata: dict[str, Any]       # what only SQL knows: connection, virtual cluster, ...
    credentials: dict[str, str] = field(default_factory=dict, repr=False)  # this process only
    replace: bool = False
    if_not_exists: bool = False


def literal(prop: ddl.Prop, key: str, kind: type | tuple[type, ...]) -> Any:
    numeric = kind is not str and kind is not bool
    if not isinstance(prop.value, kind) or (numeric and isinstance(prop.value, bool)):
        names = {str: "a string literal", bool: "TRUE or FALSE"}
        want = names.get(kind, "a number") if isinstance(kind, type) else "a number"
        raise SqlSyntaxError(f"{key} takes {want}", prop.token.line, prop.token.column)
    return prop.value


def _account(conn: dict[str, Any] | None, note: dict[str, ddl.Prop]) -> str | None:
    if "ACCOUNT_ID" in note:
        return str(note["ACCOUNT_ID"].value)
    if conn is None:
        return None
    if conn.get("account_id"):
        return str(conn["account_id"])
    match = _ROLE_ACCOUNT.match(conn.get("role_arn") or "")
    return match.group(1) if match else None


def _listener_options(qtype: str) -> set[str]:
    """The options a notification may pass on to its listener (and, for SQS, to boto3)."""
    if qtype == "AZURE_STORAGE_QUEUE":
        from volume_stream.volumes.notifications import azure_queue_options

        return set(azure_queue_options()) - {"queue_endpoint"}  # that is ENDPOINT
    if qtype == "ALICLOUD_MNS":
        from connectors.alicloud.listener import MnsListener as listener
    elif qtype == "GCP_PUBSUB":
        import dataclasses

        from connectors.gcp.client import GcpOptions
        from connectors.gcp.listener import PubSubListener as listener

        names = {p.name for p in inspect.signature(listener.__init__).parameters.values()
                 if p.kind is p.KEYWORD_ONLY}
        return (names | {f.name for f in dataclasses.fields(GcpOptions)}) - {
            "bucket", "prefix", "recursive", "suffix"}
    else:
        import dataclasses

        from connectors.aws.client import ClientOptions
        from connectors.aws.listener import SqsListener as listener
    names = {p.name for p in inspect.signature(listener.__init__).parameters.values()
             if p.kind is p.KEYWORD_ONLY}
    if qtype == "AWS_SQS":
        names |= {f.name for f in dataclasses.fields(ClientOptions)}
    return names - {"bucket", "prefix", "recursive", "suffix"}


def _notification(stmt: ddl.CreateVolume, conn: dict[str, Any] | None, scheme: str,
                  metadata: dict[str, Any]) -> NotificationPlan | None:
    note = dict(stmt.notification or {})
    if not note:
        return None
    where = stmt.notification_token
    if "QUEUE_TYPE" not in note:
        raise SqlSyntaxError("NOTIFICATION needs QUEUE_TYPE ('ALICLOUD_MNS', 'AWS_SQS', "
                             "'AZURE_STORAGE_QUEUE', 'GCP_PUBSUB' or 'LOCAL')", where.line,
                             where.column)
    type_prop = note.pop("QUEUE_TYPE")
    qtype = str(literal(type_prop, "QUEUE_TYPE", str)).upper()
    if qtype not in _QUEUE_TYPES:
        raise SqlSyntaxError(f"unknown QUEUE_TYPE {qtype!r}; known: "
                             f"{', '.join(sorted(_QUEUE_TYPES))}", type_prop.token.line,
                             type_prop.token.column)
    if scheme not in (_QUEUE_TYPES[qtype], *_ALSO.get(qtype, ())):
        raise SqlSyntaxError(f"QUEUE_TYPE '{qtype}' needs a {_QUEUE_TYPES[qtype]}:// location, "
                             f"not {scheme}://", type_prop.token.line, type_prop.token.column)
    if "VIRTUAL_CLUSTER" in note:
        # which group of daemons runs the volume's listener (the seed's compute cluster)
        metadata["virtual_cluster"] = str(note.pop("VIRTUAL_CLUSTER").value)
    extra = {k.lower(): p.value for k, p in note.items()
             if k not in ("QUEUE_NAME", "QUEUE_URL", "ENDPOINT", "REGION", "ACCOUNT_ID")}
    for key, value in extra.items():
        if isinstance(value, ddl.EnvRef):
            raise SqlSyntaxError(f"NOTIFICATION {key.upper()} takes a literal value",
                                 note[key.upper()].token.line, note[key.upper()].token.column)
    region = str(note["REGION"].value) if "REGION" in note else (conn or {}).get("region")
    if qtype == "LOCAL":
        known = {"POLLING", "DEBOUNCE_S", "POLL_INTERVAL_S"}
        # the seed's queue address, kept so its DDL adapts by changing only QUEUE_TYPE and
        # LOCATION; a local folder has no queue, so it is ignored (the result says so)
        ignored = sorted(set(note) & {"QUEUE_NAME", "QUEUE_URL", "ENDPOINT", "REGION",
                                      "ACCOUNT_ID"})
        if ignored:
            metadata["ignored_notification_options"] = ignored
        unknown = sorted(set(note) - known - set(ignored))
        if unknown:
            raise SqlSyntaxError(f"a LOCAL notification takes {', '.join(sorted(known))}; not "
                                 f"{', '.join(unknown)}", where.line, where.column)
        return NotificationPlan("LOCAL", (), extra)
    allowed = _listener_options(qtype)
    for key in extra:
        if key not in allowed:
            prop = note[key.upper()]
            raise SqlSyntaxError(f"unknown NOTIFICATION option {key.upper()} for {qtype}; known: "
                                 f"QUEUE_NAME, ENDPOINT, REGION, ACCOUNT_ID, VIRTUAL_CLUSTER, "
                                 f"{', '.join(sorted(k.upper() for k in allowed))}",
                                 prop.token.line, prop.token.column)
    queue = note.get("QUEUE_NAME") or note.get("QUEUE_URL")
    if queue is None:
        raise SqlSyntaxError(f"QUEUE_TYPE '{qtype}' needs QUEUE_NAME", where.line, where.column)
    queue_name = str(queue.value)
    if qtype == "GCP_PUBSUB":  # QUEUE_NAME is the subscription's full name
        return NotificationPlan("GCP_PUBSUB", (queue_name,), extra)
    if qtype == "AZURE_STORAGE_QUEUE":
        if "ENDPOINT" in note:
            extra["queue_endpoint"] = str(note["ENDPOINT"].value)
        return NotificationPlan(qtype, (queue_name,), extra)
    account = _account(conn, note)
    if qtype == "ALICLOUD_MNS":
        endpoint = str(note["ENDPOINT"].value) if "ENDPOINT" in note else None
        if endpoint is None:
            if not (account and region):
                raise SqlSyntaxError(
                    "the MNS endpoint is unknown: give NOTIFICATION ENDPOINT = "
                    "'https://<account>.mns.<region>.aliyuncs.com', or use a connection with "
                    "ROLE_ARN (or ACCOUNT_ID) and REGION", where.line, where.column)
            endpoint = f"https://{account}.mns.{region}.aliyuncs.com"
        return NotificationPlan("ALICLOUD_MNS", (endpoint, queue_name), extra)
    # AWS_SQS
    if "QUEUE_URL" in note or queue_name.startswith(("https://", "http://")):
        queue_url = str((note.get("QUEUE_URL") or queue).value)
    elif account and region:
        queue_url = f"https://sqs.{region}.amazonaws.com/{account}/{queue_name}"
    else:
        raise SqlSyntaxError("the SQS queue URL is unknown: give QUEUE_URL, or use a connection "
                             "with ROLE_ARN (or ACCOUNT_ID) and REGION", where.line, where.column)
    if "ENDPOINT" in note:
        extra["endpoint_url"] = str(note["ENDPOINT"].value)
    if region:
        extra.setdefault("region_name", region)
    return NotificationPlan("AWS_SQS", (queue_url,), extra)


def plan_volume(catalog, stmt: ddl.CreateVolume) -> VolumePlan:
    """What `create_volume` is called with for this statement (nothing is created)."""
    where = stmt.location_token
    scheme = urlparse(stmt.location).scheme
    scheme = "file" if scheme in ("", "file") or len(scheme) == 1 else scheme
    options: dict[str, Any] = {}
    metadata: dict[str, Any] = {}
    credentials: dict[str, str] = {}
    conn = None
    if stmt.connection:
        conn = connection(catalog, stmt.connection)
        expected = _SCHEMES[conn["type"]]
        if scheme != expected:
            raise SqlSyntaxError(f"connection {conn['name']} is of type {conn['type']}; its "
                                 f"volumes are at {expected}:// locations, not {scheme}://",
                                 where.line, where.column)
        metadata["connection"] = conn["name"]
        if conn.get("role_arn"):
            metadata["role_arn"] = conn["role_arn"]
            # assumed by the AWS connectors (STS through boto3) or the OSS/MNS ones (Alibaba
            # Cloud STS, connectors.alicloud.sts)
            options["role_arn"] = conn["role_arn"]
        if conn["type"] == "OSS" and conn.get("endpoint"):
            options["endpoint"] = conn["endpoint"]
        if conn["type"] == "S3":
            if conn.get("region"):
                options["region_name"] = conn["region"]
            if conn.get("endpoint"):
                endpoint = conn["endpoint"]
                options["endpoint_url"] = endpoint if "://" in endpoint else f"https://{endpoint}"
        names = {CREDENTIALS[conn["type"]][k]: var for k, var in conn["credentials"].items()}
        if names:
            metadata["credentials_env"] = names
        # read now, used by this process's listeners and readers, never written anywhere
        credentials = {opt: os.environ[var] for opt, var in names.items() if var in os.environ}
    directory = stmt.directory or {}
    for key, prop in directory.items():
        if key not in ("ENABLE", "AUTO_REFRESH"):
            raise SqlSyntaxError(f"unknown DIRECTORY option {key}; known: ENABLE, AUTO_REFRESH",
                                 prop.token.line, prop.token.column)
        value = literal(prop, key, bool)
        if key == "ENABLE" and not value:
            raise SqlSyntaxError("every volume has a directory table: DIRECTORY = (ENABLE = "
                                 "FALSE) is not supported", prop.token.line, prop.token.column)
        if key == "AUTO_REFRESH":
            metadata["auto_refresh"] = value
    for key, prop in (stmt.options or {}).items():
        if key == "DATA_RETENTION_DAYS":
            options["data_retention_days"] = literal(prop, key, (int, float))
        elif key == "DELETION_VECTORS":
            options["deletion_vectors"] = literal(prop, key, bool)
        elif key == "COMMENT":
            metadata["comment"] = literal(prop, key, str)
        else:
            options[key.lower()] = literal(prop, key, str)
    notification = _notification(stmt, conn, scheme, metadata)
    return VolumePlan(stmt.name, stmt.location, True if stmt.recursive is None else
                      stmt.recursive, notification, options, metadata, credentials,
                      stmt.replace, stmt.if_not_exists)
