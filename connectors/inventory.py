"""S3 Inventory and OSS inventory reports as a volume's listing (issue 26 item 4).

A bucket of a billion objects cannot be listed; both stores deliver its listing once a day (or
week) as a report in a destination bucket:

    <destination-prefix>/<source-bucket>/<config-id>/YYYY-MM-DDTHH-MMZ/manifest.json
    <destination-prefix>/<source-bucket>/<config-id>/YYYY-MM-DDTHH-MMZ/manifest.checksum
    <destination-prefix>/<source-bucket>/<config-id>/data/<uuid>.csv.gz | .parquet | .orc

`manifest.json` names the source bucket, `creationTimestamp` (epoch milliseconds on S3,
seconds on OSS), `fileFormat` (CSV, Parquet, ORC; OSS: CSV), `fileSchema` (the CSV columns:
"Bucket, Key, VersionId, IsLatest, IsDeleteMarker, Size, LastModifiedDate, ETag, ...") and
`files` ([{key, size, MD5checksum}]); `manifest.checksum` holds the MD5 of manifest.json.
A manifest dated more than `CLOCK_SKEW` after now is refused: its moment would date the
refresh's deletes ahead of the events that follow it.

`InventoryLister` is a `Lister`: it reads the report one data file at a time (each downloaded
to a temporary file while its MD5 is computed, checked against the manifest, then decoded in
record batches), keeps the latest versions of objects that are not delete markers, under the
volume's prefix (`BucketScope`), and yields them in `LISTING_SCHEMA` exactly as a listing
would. CSV keys are URL-encoded (`+` a space); Parquet and ORC keys are not. A report that does
not check out (a checksum, a size, a missing file, a bucket that is not the volume's) raises
`InventoryError` naming the object, before the caller commits anything; so does a row of the
volume whose Size is not a whole number of bytes or whose LastModifiedDate is not a time (the
error names the data file and the row, counted from 1): skipping such a row would delete its
file from the table. A key whose percent-escapes do not decode as UTF-8 (no S3 or OSS key is
such) is skipped, logged and counted in `malformed`, as unsafe names are.

    >>> parse_created("1514944800000"), parse_created("1642994594")
    (datetime.datetime(2018, 1, 3, 2, 0, tzinfo=datetime.timezone.utc), datetime.datetime(2022, 1, 24, 3, 23, 14, tzinfo=datetime.timezone.utc))
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import IO, Any
from urllib.parse import unquote_to_bytes

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from connectors._objects import normalize_etag
from connectors.errors import ConnectorError, InventoryError
from connectors.events import InvalidPathError, valid_paths
from connectors.protocols import LISTING_SCHEMA, Lister
from connectors.scope import BucketScope

__all__ = ["CLOCK_SKEW", "InventoryError", "InventoryLister", "Manifest", "newest_manifest",
           "parse_created", "parse_manifest"]

log = logging.getLogger("connectors.inventory")

#: an inventory's columns (CSV fileSchema names, lower-cased) -> Parquet/ORC column names
_COLUMNS = {"bucket": "bucket", "key": "key", "versionid": "version_id",
            "islatest": "is_latest", "isdeletemarker": "is_delete_marker", "size": "size",
            "lastmodifieddate": "last_modified_date", "etag": "e_tag"}
_NEEDED = ("bucket", "key", "size", "last_modified_date", "e_tag")
#: the timestamp folder of a report: YYYY-MM-DDTHH-MMZ
_STAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}-\d{2}Z$")
_BATCH_ROWS = 65_536
#: how far after this machine's clock a report's `creationTimestamp` may be (the store's clock
#: and ours disagree a little); a report dated later is refused
CLOCK_SKEW = timedelta(minutes=5)
#: a Size as text: decimal digits only (no sign, blank, exponent or fraction), within int64
_DIGITS = r"^[0-9]{1,18}$"


@dataclass(frozen=True)
class Manifest:
    """A report's manifest.json, checked against manifest.checksum."""

    url: str
    source_bucket: str
    created: datetime
    file_format: str
    schema: tuple[str, ...]
    #: (key in the destination bucket, size, MD5 hex lower-case)
    files: tuple[tuple[str, int, str], ...]


def parse_created(value: Any) -> datetime:
    """`creationTimestamp`: epoch milliseconds (S3) or seconds (OSS), as a string or number."""
    number = int(str(value).strip())
    seconds = number / 1000 if number > 100_000_000_000 else number  # ms after 1973 are > 1e11
    return datetime.fromtimestamp(seconds, UTC)


def parse_manifest(data: bytes, checksum: bytes | None, url: str, *,
                   now: datetime | None = None) -> Manifest:
    """Parse manifest.json (`data`) after checking it against `checksum` (manifest.checksum:
    its MD5 in hex; None when the report has none, which is refused). A `creationTimestamp`
    more than `CLOCK_SKEW` after `now` (this machine's clock) is refused."""
    if checksum is None:
        raise InventoryError(f"{_sibling(url, 'manifest.checksum')} does not exist: the report "
                             f"is incomplete (still being delivered?)")
    expected = checksum.decode("ascii", "replace").strip().split()[0].lower() \
        if checksum.strip() else ""
    actual = hashlib.md5(data).hexdigest()
    if expected != actual:
        raise InventoryError(f"{url} does not match {_sibling(url, 'manifest.checksum')} (MD5 "
                             f"{actual}, expected {expected or 'nothing'}): refusing the "
                             f"inventory")
    try:
        doc = json.loads(data)
        fmt = str(doc["fileFormat"]).strip().upper()
        files = tuple((str(f["key"]), int(f["size"]), str(f["MD5checksum"]).strip().lower())
                      for f in doc["files"])
        created = parse_created(doc["creationTimestamp"])
        source = str(doc["sourceBucket"])
    except (ValueError, KeyError, TypeError, OverflowError, OSError) as exc:
        raise InventoryError(f"{url} is not an inventory manifest: {type(exc).__name__}: "
                             f"{exc}") from exc
    now = now or datetime.now(UTC)
    if created > now + CLOCK_SKEW:
        raise InventoryError(
            f"{url}: creationTimestamp {created:%Y-%m-%d %H:%M:%S} UTC is in the future (it is "
            f"{now:%Y-%m-%d %H:%M:%S} UTC here, {_minutes(CLOCK_SKEW)} of clock skew allowed): "
            f"refusing the inventory (its deletes would be dated after the events that follow "
            f"them)")
    if fmt not in ("CSV", "PARQUET", "ORC"):
        raise InventoryError(f"{url}: unsupported fileFormat {doc['fileFormat']!r} (CSV, "
                             f"Parquet or ORC)")
    schema = tuple(_COLUMNS.get(n.strip().lower(), n.strip().lower())
                   for n in str(doc.get("fileSchema", "")).split(",")) if fmt == "CSV" else ()
    if fmt == "CSV" and not set(_NEEDED) <= set(schema):
        missing = sorted(set(_NEEDED) - set(schema))
        raise InventoryError(f"{url}: fileSchema lacks {missing}: the inventory must include "
                             f"Size, LastModifiedDate and ETag")
    return Manifest(url, source, created, fmt, schema, files)


def newest_manifest(keys: list[str], source_bucket: str) -> str | None:
    """The newest report's manifest.json among `keys` (of a destination prefix): the latest
    `YYYY-MM-DDTHH-MMZ/manifest.json` of `source_bucket`."""
    found = []
    for key in keys:
        parts = key.split("/")
        if len(parts) >= 2 and parts[-1] == "manifest.json" and _STAMP.match(parts[-2]):
            if len(parts) < 4 or parts[-4] == source_bucket:
                found.append((parts[-2], key))
    return max(found)[1] if found else None


def _minutes(span: timedelta) -> str:
    minutes = span.total_seconds() / 60
    return f"{minutes:g} minute{'s' if minutes != 1 else ''}"


def _sibling(url: str, name: str) -> str:
    return url.rsplit("/", 1)[0] + "/" + name


class InventoryLister(Lister):
    """The volume's files as an inventory report lists them (see the module docstring).

    Args:
        manifest: The checked manifest.
        scope: The volume's bucket, prefix, recursion, suffix.
        open_object: Open a key of the destination bucket for reading (raises
            `ObjectNotFoundError` when it is missing).
        url_of: The URL of a key of the destination bucket (for messages).
        spill_dir: Where the data files are downloaded, one at a time.
    """

    def __init__(self, manifest: Manifest, scope: BucketScope,
                 open_object: Callable[[str], IO[bytes]], url_of: Callable[[str], str], *,
                 spill_dir: str | None = None) -> None:
        if manifest.source_bucket != scope.bucket:
            raise InventoryError(f"{manifest.url} is an inventory of bucket "
                                 f"{manifest.source_bucket!r}, not of {scope.bucket!r}")
        self.manifest, self.scope = manifest, scope
        self._open, self._url = open_object, url_of
        self.spill_dir = spill_dir
        self.malformed = 0
        #: rows read from the data files (all versions, all prefixes)
        self.rows_read = 0

    def list(self) -> Iterator[pa.RecordBatch]:
        self.malformed = 0
        for key, size, md5 in self.manifest.files:
            with tempfile.TemporaryDirectory(prefix="volume-stream-inventory-",
                                             dir=self.spill_dir) as folder:
                path = self._download(key, size, md5, folder)
                first = 1  # the row number (from 1) of the batch's first row in the file
                for batch in self._decode(path, key):
                    try:
                        rows = self._rows(batch, first)
                    except _Unreadable as exc:
                        where = "" if exc.row is None else f", row {exc.row}"
                        raise InventoryError(f"{self._url(key)}{where}: {exc}; refusing the "
                                             f"inventory") from None
                    except pa.ArrowException as exc:
                        raise InventoryError(f"{self._url(key)} is not a readable "
                                             f"{self.manifest.file_format} inventory file: "
                                             f"{exc}") from exc
                    first += batch.num_rows
                    if rows.num_rows:
                        yield rows

    # ------------------------------------------------------------------ one data file
    def _download(self, key: str, size: int, md5: str, folder: str) -> str:
        url = self._url(key)
        path = os.path.join(folder, "data")
        digest, got = hashlib.md5(), 0
        try:
            with self._open(key) as body, open(path, "wb") as out:
                while chunk := body.read(1 << 20):
                    digest.update(chunk)
                    got += len(chunk)
                    out.write(chunk)
        except ConnectorError as exc:
            raise InventoryError(f"{url}, listed in {self.manifest.url}, could not be read: "
                                 f"{exc}") from exc
        if got != size:
            raise InventoryError(f"{url} has {got} bytes, {self.manifest.url} says {size}: "
                                 f"truncated or replaced; refusing the inventory")
        if digest.hexdigest() != md5:
            raise InventoryError(f"{url} does not match its MD5checksum in {self.manifest.url} "
                                 f"({digest.hexdigest()}, expected {md5}); refusing the "
                                 f"inventory")
        return path

    def _decode(self, path: str, key: str) -> Iterator[pa.RecordBatch]:
        fmt = self.manifest.file_format
        try:
            if fmt == "CSV":
                yield from self._csv(path)
            elif fmt == "PARQUET":
                import pyarrow.parquet as pq

                with pq.ParquetFile(path) as f:
                    yield from f.iter_batches(batch_size=_BATCH_ROWS, columns=_present(
                        f.schema_arrow.names))
            else:
                import pyarrow.orc as orc

                f = orc.ORCFile(path)
                for stripe in range(f.nstripes):
                    yield f.read_stripe(stripe, columns=_present(f.schema.names))
        except (pa.ArrowException, OSError, EOFError, gzip.BadGzipFile) as exc:
            raise InventoryError(f"{self._url(key)} is not a readable {fmt} inventory file: "
                                 f"{exc}") from exc

    def _csv(self, path: str) -> Iterator[pa.RecordBatch]:
        names = list(self.manifest.schema)
        with open(path, "rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
        compression = "gzip" if gz else None
        with pa.input_stream(path, compression=compression) as probe:
            if not probe.read(1):  # a data file of no rows
                return
        stream = pa.input_stream(path, compression=compression)
        reader = pcsv.open_csv(
            stream, read_options=pcsv.ReadOptions(column_names=names, block_size=8 << 20),
            convert_options=pcsv.ConvertOptions(
                column_types={n: pa.string() for n in names},
                include_columns=[n for n in names if n in _COLUMNS.values()],
                strings_can_be_null=False))
        try:
            yield from reader
        finally:
            stream.close()

    def _rows(self, batch: pa.RecordBatch, first: int = 1) -> pa.RecordBatch:
        """The batch's current objects under the volume's prefix, in `LISTING_SCHEMA`.
        `first`: the row number of the batch's first row in its data file (for errors).

        Raises:
            _Unreadable: a kept row's Size or LastModifiedDate cannot be read.
        """
        self.rows_read += batch.num_rows
        table = pa.Table.from_batches([batch])
        table = table.append_column("_row", pa.array(
            np.arange(first, first + batch.num_rows, dtype=np.int64)))
        csv = self.manifest.file_format == "CSV"
        keep = pc.equal(table["bucket"], self.scope.bucket)
        if "is_latest" in table.column_names:
            keep = pc.and_(keep, _true(table["is_latest"], default=True))
        if "is_delete_marker" in table.column_names:
            keep = pc.and_(keep, pc.invert(_true(table["is_delete_marker"], default=False)))
        table = table.filter(keep)
        keys = table["key"]
        if csv:
            keys, undecodable = _unquote(keys)
            table = table.append_column("_undecodable", undecodable)
        prefix = self.scope.prefix
        inside = pc.starts_with(keys, prefix) if prefix else pc.is_valid(keys)
        table, keys = table.filter(inside), keys.filter(inside)
        paths = pc.utf8_slice_codeunits(keys, len(prefix)) if prefix else keys
        keep = pc.invert(pc.or_(pc.ends_with(paths, "/"), pc.equal(paths, "")))
        if not self.scope.recursive:
            keep = pc.and_(keep, pc.invert(pc.match_substring(paths, "/")))
        if self.scope.suffix:
            suffixes = self.scope.suffix if isinstance(self.scope.suffix, tuple) \
                else (self.scope.suffix,)
            ends = [pc.ends_with(paths, s) for s in suffixes]
            any_end = ends[0]
            for e in ends[1:]:
                any_end = pc.or_(any_end, e)
            keep = pc.and_(keep, any_end)
        keep = pc.fill_null(keep, False).to_numpy(zero_copy_only=False)
        if csv:
            keep &= ~self._undecodable(table, keep)
        table, paths = table.filter(pa.array(keep)), paths.filter(pa.array(keep))
        keep = self._safe(paths)
        table, paths = table.filter(pa.array(keep)), paths.filter(pa.array(keep))
        rows = table["_row"]
        size = _at_rows(_sizes, table["size"], rows)
        modified = _at_rows(_times, table["last_modified_date"], rows)
        etag = table["e_tag"]
        etag = pa.chunked_array([pa.array([normalize_etag(e) for e in etag.to_pylist()],
                                          pa.string())]) if _quoted(etag) else etag
        out = pa.table({"relative_path": paths, "size": size, "last_modified_time": modified,
                        "etag": pc.cast(etag, pa.string())}, schema=LISTING_SCHEMA)
        if not out.num_rows:
            return pa.RecordBatch.from_pylist([], schema=LISTING_SCHEMA)
        return out.combine_chunks().to_batches(max_chunksize=out.num_rows)[0]  # no scan

    def _undecodable(self, table: pa.Table, keep: np.ndarray) -> np.ndarray:
        """True for the kept rows whose key is not UTF-8 once percent-decoded (logged and
        counted in `malformed`): their decoded text, with U+FFFD in place of the bytes, would
        be another key's name, or several keys' one."""
        bad = table["_undecodable"].to_numpy(zero_copy_only=False) & keep
        for i in np.flatnonzero(bad).tolist():
            self.malformed += 1
            log.warning("skipping key %r (row %d of its data file): not UTF-8 once "
                        "percent-decoded", table["key"][i].as_py(), table["_row"][i].as_py())
        return bad

    def _safe(self, paths: pa.ChunkedArray) -> np.ndarray:
        """False for the paths `validate_relative_path` refuses (counted in `malformed`)."""

        def refused(path: str | None, exc: InvalidPathError) -> None:
            self.malformed += 1
            log.warning("skipping %s: %s", self.scope.object_url(
                self.scope.bucket, self.scope.prefix + (path or "")), exc)

        return valid_paths(paths, refused)


def _present(names: list[str]) -> list[str]:
    wanted = ("bucket", "key", "is_latest", "is_delete_marker", "size", "last_modified_date",
              "e_tag")
    return [n for n in wanted if n in names]


def _true(column: pa.ChunkedArray, *, default: bool) -> pa.ChunkedArray:
    if pa.types.is_boolean(column.type):
        return pc.fill_null(column, default)
    text = pc.utf8_lower(pc.utf8_trim_whitespace(column))
    return pc.fill_null(pc.if_else(pc.equal(text, ""), default, pc.equal(text, "true")), default)


def _unquote(keys: pa.ChunkedArray) -> tuple[pa.ChunkedArray, pa.Array]:
    """URL-decode CSV keys (`+` is a space): on the column, in Python only for the keys with
    a %-escape. Returns the keys and, per key, whether its escapes are not UTF-8 (such a key
    is decoded with U+FFFD for what does not decode, and must be skipped)."""
    escaped = pc.match_substring(keys, "%")
    if not pc.any(escaped).as_py():
        return pc.replace_substring(keys, "+", " "), pa.repeat(pa.scalar(False), len(keys))
    values, bad = [], []
    for k, e in zip(keys.to_pylist(), escaped.to_pylist(), strict=True):
        if not e:
            values.append(k.replace("+", " "))
            bad.append(False)
            continue
        raw = unquote_to_bytes(k.replace("+", " "))
        try:
            values.append(raw.decode("utf-8"))
            bad.append(False)
        except UnicodeDecodeError:
            values.append(raw.decode("utf-8", "replace"))
            bad.append(True)
    return pa.chunked_array([pa.array(values, pa.string())]), pa.array(bad, pa.bool_())


class _Unreadable(ValueError):
    """A value that cannot be read: the one at `index` of the column converted, or (None) the
    whole column, of a wrong type. `row`: its row number in the data file (`_at_rows`)."""

    def __init__(self, message: str, index: int | None) -> None:
        super().__init__(message)
        self.index, self.row = index, index


def _at_rows(convert: Callable[[pa.ChunkedArray], pa.Array], column: pa.ChunkedArray,
             rows: pa.ChunkedArray) -> pa.Array:
    """`convert(column)`, its `_Unreadable` naming the data file's row number (`rows`)."""
    try:
        return convert(column)
    except _Unreadable as exc:
        exc.row = None if exc.index is None else rows[exc.index].as_py()
        raise


def _sizes(column: pa.ChunkedArray) -> pa.Array:
    """Sizes as int64: an integer column, or text of decimal digits (CSV's). Raises
    `_Unreadable` at the first value that is not a number of bytes (blank, null, a sign, an
    exponent, a fraction, spaces, a negative or a too large number)."""
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        ok = pc.fill_null(pc.match_substring_regex(column, _DIGITS), False)
    elif pa.types.is_integer(kind):
        ok = pc.fill_null(pc.greater_equal(column, pa.scalar(0, kind)) if kind != pa.uint64()
                          else pc.less_equal(column, pa.scalar(2**63 - 1, kind)), False)
    else:
        raise _Unreadable(f"column size is of type {kind}, not an integer", None)
    if not pc.all(ok).as_py():
        i = int(pc.index(ok, False).as_py())
        raise _Unreadable(f"Size {column[i].as_py()!r} is not a number of bytes", i)
    return pc.cast(column, pa.int64()).combine_chunks()


def _times(column: pa.ChunkedArray) -> pa.Array:
    """LastModifiedDate as UTC timestamps: a timestamp column, or ISO 8601 text with its zone
    ('YYYY-MM-DDTHH:MM:SS.fffZ', CSV's). Raises `_Unreadable` at the first value that is not
    a time (blank, null, another layout, a month 13)."""
    kind = column.type
    target = LISTING_SCHEMA.field("last_modified_time").type
    if pa.types.is_timestamp(kind):
        times = pc.cast(column, target)
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        column = column.combine_chunks()
        try:
            times = pc.cast(column, target)
        except pa.ArrowInvalid:  # find the first value that fails, by halves
            lo, hi = 0, len(column)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                try:
                    pc.cast(column.slice(lo, mid - lo), target)
                    lo = mid
                except pa.ArrowInvalid:
                    hi = mid
            raise _Unreadable(_not_a_time(column[lo].as_py()), lo) from None
    else:
        raise _Unreadable(f"column last_modified_date is of type {kind}, not a timestamp", None)
    if times.null_count:
        i = int(pc.index(pc.is_null(times), True).as_py())
        raise _Unreadable(_not_a_time(None), i)
    return times.combine_chunks() if isinstance(times, pa.ChunkedArray) else times


def _not_a_time(value: Any) -> str:
    return f"LastModifiedDate {value!r} is not a time (YYYY-MM-DDTHH:MM:SS.fffZ)"


def _quoted(etag: pa.ChunkedArray) -> bool:
    return len(etag) > 0 and bool(pc.any(pc.or_(pc.starts_with(etag, '"'),
                                               pc.starts_with(etag, "W/"))).as_py())
