"""Write inventory reports exactly as S3 Inventory and OSS inventory deliver them.

`write_report(put, ...)` writes, through `put(key, bytes)` (boto3 to moto, oss2 to the OSS
fake), the data files under `<prefix>/<source>/<config>/data/`, then
`<prefix>/<source>/<config>/YYYY-MM-DDTHH-MMZ/manifest.json` and `manifest.checksum` (the MD5
of manifest.json), and returns the manifest's key. Objects are dicts with Key, Size,
LastModifiedDate (datetime), ETag (unquoted), and for versioned reports VersionId, IsLatest and
IsDeleteMarker.

AWS's formats: CSV data files are gzipped, unheaded, every field quoted, keys URL-encoded
(form style: a space is '+'), times 'YYYY-MM-DDTHH:MM:SS.fffZ', `creationTimestamp` in epoch
milliseconds, fileSchema the field names. Parquet files have lower-case snake_case columns
(bucket, key, version_id, is_latest, is_delete_marker, size, last_modified_date as
TIMESTAMP_MILLIS, e_tag) and keys as they are. OSS: CSV only, `creationTimestamp` in epoch
seconds, MD5checksum in upper-case hex, its own fileSchema order.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from urllib.parse import quote_plus

import boto3
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["from_s3_listing", "from_s3_versions", "md5", "write_data_file", "write_manifest",
           "write_raw_csv", "write_report"]

S3_CSV = ["Bucket", "Key", "Size", "LastModifiedDate", "ETag", "StorageClass"]
S3_CSV_VERSIONED = ["Bucket", "Key", "VersionId", "IsLatest", "IsDeleteMarker", "Size",
                    "LastModifiedDate", "ETag", "StorageClass"]
OSS_CSV = ["Bucket", "Key", "Size", "StorageClass", "LastModifiedDate", "ETag",
           "IsMultipartUploaded", "EncryptionStatus"]
_PARQUET_SCHEMA = ("message s3.inventory { required binary bucket (UTF8); required binary key "
                   "(UTF8); optional binary version_id (UTF8); optional boolean is_latest; "
                   "optional boolean is_delete_marker; optional int64 size; optional int64 "
                   "last_modified_date (TIMESTAMP_MILLIS); optional binary e_tag (UTF8); "
                   "optional binary storage_class (UTF8);}")


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def _stamp(when: datetime) -> str:
    when = when.astimezone(UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def _csv_value(obj: dict, field: str, bucket: str) -> str:
    if field == "Bucket":
        return bucket
    if field == "Key":
        return quote_plus(obj["Key"], safe="/")
    if field == "LastModifiedDate":
        return _stamp(obj["LastModifiedDate"])
    if field in ("IsLatest", "IsDeleteMarker", "IsMultipartUploaded"):
        return str(bool(obj.get(field, field == "IsLatest"))).lower()
    if field == "Size":
        return "" if obj.get("IsDeleteMarker") else str(obj["Size"])
    if field == "ETag":
        return "" if obj.get("IsDeleteMarker") else obj["ETag"]
    if field == "StorageClass":
        return "STANDARD"
    if field == "EncryptionStatus":
        return "NOT-SSE"
    return str(obj.get(field, ""))


def _csv_file(objects: list[dict], fields: list[str], bucket: str) -> bytes:
    text = io.StringIO()
    writer = csv.writer(text, quoting=csv.QUOTE_ALL, lineterminator="\n")
    for obj in objects:
        writer.writerow([_csv_value(obj, f, bucket) for f in fields])
    return gzip.compress(text.getvalue().encode())


def _parquet_file(objects: list[dict], bucket: str, versioned: bool) -> bytes:
    columns = {
        "bucket": pa.array([bucket] * len(objects), pa.string()),
        "key": pa.array([o["Key"] for o in objects], pa.string()),
    }
    if versioned:
        columns["version_id"] = pa.array([o.get("VersionId") for o in objects], pa.string())
        columns["is_latest"] = pa.array([bool(o.get("IsLatest", True)) for o in objects])
        columns["is_delete_marker"] = pa.array([bool(o.get("IsDeleteMarker")) for o in objects])
    columns["size"] = pa.array([None if o.get("IsDeleteMarker") else o["Size"] for o in objects],
                               pa.int64())
    columns["last_modified_date"] = pa.array([o["LastModifiedDate"] for o in objects],
                                             pa.timestamp("ms", tz="UTC"))
    columns["e_tag"] = pa.array([None if o.get("IsDeleteMarker") else o["ETag"]
                                 for o in objects], pa.string())
    columns["storage_class"] = pa.array(["STANDARD"] * len(objects), pa.string())
    out = io.BytesIO()
    pq.write_table(pa.table(columns), out)
    return out.getvalue()


def write_report(put: Callable[[str, bytes], None], *, source: str, created: datetime,
                 objects: list[dict], destination: str = "inventory-bucket",
                 prefix: str = "reports", config: str = "daily", fmt: str = "CSV",
                 versioned: bool = False, files: int = 1, oss: bool = False) -> str:
    """Write a report of `objects` (see the module docstring); returns manifest.json's key."""
    base = f"{prefix}/{source}/{config}" if prefix else f"{source}/{config}"
    fields = OSS_CSV if oss else (S3_CSV_VERSIONED if versioned else S3_CSV)
    chunks = [objects[i::files] for i in range(files)]
    listed = []
    name = uuid.uuid4()
    for i, chunk in enumerate(chunks):
        suffix = "" if i == 0 else f"-{i}"
        if fmt == "CSV":
            data, ext = _csv_file(chunk, fields, source), "csv.gz"
        else:
            data, ext = _parquet_file(chunk, source, versioned), "parquet"
        key = f"{base}/data/{name}{suffix}.{ext}"
        put(key, data)
        digest = md5(data)
        listed.append({"key": key, "size": len(data),
                       "MD5checksum": digest.upper() if oss else digest})
    return write_manifest(put, base, source=source, destination=destination, created=created,
                          fmt=fmt, fields=fields, files=listed, oss=oss)


def write_manifest(put: Callable[[str, bytes], None], base: str, *, source: str,
                   destination: str, created: datetime, fmt: str, fields: list[str],
                   files: list[dict], oss: bool = False) -> str:
    """`<base>/YYYY-MM-DDTHH-MMZ/manifest.json` listing `files` ({key, size, MD5checksum})
    and its `manifest.checksum`, through `put`; returns manifest.json's key."""
    millis = int(created.timestamp() * 1000)
    manifest = {
        "sourceBucket": source,
        "destinationBucket": destination if oss else f"arn:aws:s3:::{destination}",
        "version": "2019-09-01" if oss else "2016-11-30",
        "creationTimestamp": str(millis // 1000 if oss else millis),
        "fileFormat": {"CSV": "CSV", "ORC": "ORC"}.get(fmt, "Parquet"),
        "fileSchema": ", ".join(fields) if fmt == "CSV" else _PARQUET_SCHEMA,
        "files": files,
    }
    folder = created.astimezone(UTC).strftime("%Y-%m-%dT%H-%MZ")
    key = f"{base}/{folder}/manifest.json"
    body = json.dumps(manifest, indent=4).encode()
    put(key, body)
    put(f"{base}/{folder}/manifest.checksum", md5(body).encode())
    return key


def write_raw_csv(put: Callable[[str, bytes], None], rows: list[list[str]], *, source: str,
                  created: datetime, fields: list[str] = S3_CSV, base: str = "raw/src/daily",
                  ) -> str:
    """A CSV report of one data file holding `rows` as given (fields written as they are:
    keys already URL-encoded, sizes and times as text), for reports no store would write;
    returns manifest.json's key."""
    text = io.StringIO()
    csv.writer(text, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    return write_data_file(put, gzip.compress(text.getvalue().encode()), "csv.gz",
                           source=source, created=created, fmt="CSV", fields=fields, base=base)


def write_data_file(put: Callable[[str, bytes], None], data: bytes, ext: str, *, source: str,
                    created: datetime, fmt: str, fields: list[str] = S3_CSV,
                    base: str = "raw/src/daily") -> str:
    """A report of the one data file `data` (any bytes: a Parquet or ORC file of odd column
    types too), with its manifest; returns manifest.json's key."""
    key = f"{base}/data/{uuid.uuid4()}.{ext}"
    put(key, data)
    return write_manifest(put, base, source=source, destination="inventory-bucket",
                          created=created, fmt=fmt, fields=fields,
                          files=[{"key": key, "size": len(data), "MD5checksum": md5(data)}])


def s3_put(s3, bucket: str) -> Callable[[str, bytes], None]:
    return lambda key, data: s3.put_object(Bucket=bucket, Key=key, Body=data)


def from_s3_listing(s3: boto3.client, bucket: str) -> list[dict]:
    """The bucket's objects as S3 Inventory would report them (every prefix)."""
    out = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", ()):
            out.append({"Key": obj["Key"], "Size": obj["Size"],
                        "LastModifiedDate": obj["LastModified"],
                        "ETag": obj["ETag"].strip('"')})
    return out


def from_s3_versions(s3: boto3.client, bucket: str) -> list[dict]:
    """Every version and delete marker of a versioned bucket, as S3 Inventory reports them."""
    out = []
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket):
        for obj in page.get("Versions", ()):
            out.append({"Key": obj["Key"], "Size": obj["Size"], "VersionId": obj["VersionId"],
                        "IsLatest": obj["IsLatest"], "LastModifiedDate": obj["LastModified"],
                        "ETag": obj["ETag"].strip('"')})
        for obj in page.get("DeleteMarkers", ()):
            out.append({"Key": obj["Key"], "VersionId": obj["VersionId"],
                        "IsLatest": obj["IsLatest"], "IsDeleteMarker": True,
                        "LastModifiedDate": obj["LastModified"]})
    return out
