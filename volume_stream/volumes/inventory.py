"""Backfill a volume from an inventory report instead of a listing (DESIGN §4.4, issue 26).

`inventory_lister(spec, uri)` finds the report (`uri` is a manifest.json, or a destination
prefix: the newest report of the volume's bucket under it), reads and checks its manifest, and
returns a `connectors.inventory.InventoryLister` over the destination bucket, read with the
volume's own connector options (endpoint, credentials, role). The refresh then runs as for a
listing (`VolumeRegistry._refresh`), with two differences made by `snapshot_diff`:

* the listing's moment is the report's `creationTimestamp` (or the refresh's start, if that
  is earlier: the manifest may be up to `CLOCK_SKEW` ahead), not the refresh's start: a delete
  the report implies is dated then, and no row or tombstone the refresh writes is dated later
  (an object's LastModifiedDate after it is cut back to it), so an event that follows the
  refresh is always newer than what the report wrote;
* the report is a snapshot of the past: a path whose last event (its row's `_event_time`, or a
  tombstone's) is newer than the report is left as the events made it. So an object created
  after the report is not deleted, an update after it is not undone, and an object the report
  lists but an event deleted after it stays deleted.

Events committed while the report is read are left alone as in any refresh (`listed_at_version`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import datetime
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from connectors.errors import InventoryError, ObjectNotFoundError
from connectors.inventory import InventoryLister, newest_manifest, parse_manifest
from connectors.scope import BucketScope
from directory_table import DirectoryTable
from volume_stream.errors import InvalidInputError
from volume_stream.volumes.backends import backend_for
from volume_stream.volumes.refresh import diff_listing
from volume_stream.volumes.spec import VolumeSpec

__all__ = ["inventory_lister", "newer_tombstones", "snapshot_diff"]


def inventory_lister(spec: VolumeSpec, uri: str) -> InventoryLister:
    """The lister of the report at `uri` for the volume `spec` (with its options and secrets).

    Raises:
        InvalidInputError: `uri` is not a URL of the volume's store.
        InventoryError: no report under the prefix, or the manifest fails its checksum.
    """
    parsed = urlparse(str(uri))
    if parsed.scheme != spec.scheme or spec.scheme not in ("s3", "oss") or not parsed.netloc:
        raise InvalidInputError(
            f"inventory {uri!r}: expected an {spec.scheme}:// URL of a manifest.json or of the "
            f"inventory's destination prefix (volume {spec.name!r} is on {spec.scheme}://; "
            f"inventories are read for s3:// and oss:// volumes)")
    bucket, key = parsed.netloc, parsed.path.lstrip("/")
    root = dataclasses.replace(spec, location=f"{spec.scheme}://{bucket}/", recursive=True)
    reader = backend_for(root).reader(root)
    if not key.endswith("manifest.json"):
        found = _newest(spec, bucket, key)
        if found is None:
            raise InventoryError(f"no inventory report of bucket {_volume_bucket(spec)!r} "
                                 f"under {uri} (no <date>/manifest.json)")
        key = found
    url = reader.url(key)
    with reader.open(key) as f:
        data = f.read()
    try:
        checksum_key = key[: -len("manifest.json")] + "manifest.checksum"
        with reader.open(checksum_key) as f:
            checksum: bytes | None = f.read()
    except ObjectNotFoundError:
        checksum = None
    manifest = parse_manifest(data, checksum, url)
    bucket_of, prefix = _volume_bucket(spec), urlparse(spec.location).path.lstrip("/")
    scope = BucketScope(bucket_of, prefix, spec.recursive)
    lister = InventoryLister(manifest, scope, reader.open, reader.url)
    return lister


def _volume_bucket(spec: VolumeSpec) -> str:
    return urlparse(spec.location).netloc


def _newest(spec: VolumeSpec, bucket: str, prefix: str) -> str | None:
    """The key of the newest manifest.json of the volume's bucket under `prefix`."""
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    where = dataclasses.replace(spec, location=f"{spec.scheme}://{bucket}/{prefix}",
                                recursive=True)
    keys = [prefix + p for batch in backend_for(where).lister(where).list()
            for p in batch["relative_path"].to_pylist() if p.endswith("manifest.json")]
    return newest_manifest(keys, _volume_bucket(spec))


def newer_tombstones(table: DirectoryTable, created: datetime) -> pa.Array:
    """Paths deleted by an event newer than `created` (their tombstones' `_event_time`)."""
    dataset = table.tombstones().to_pyarrow_dataset()
    newer = ds.field("_event_time") > pa.scalar(created, dataset.schema.field("_event_time").type)
    # delta-rs datasets are scanned without threads (tests/test_exit_codes.py)
    found = dataset.to_table(columns=["relative_path"], filter=newer, use_threads=False)
    return pc.unique(found["relative_path"].combine_chunks()) if found.num_rows else \
        pa.array([], pa.string())


def snapshot_diff(created: datetime, deleted_after: pa.Array,
                  diff: Callable[..., tuple[list, int]] | None = None) -> Callable[..., tuple]:
    """A refresh diff (`diff_listing` or a Spark one) for a report made at `created` (no later
    than the refresh's start): the stored rows whose last event is newer than the report, and
    the paths an event deleted after it (`deleted_after`), are taken out of both sides first,
    so the report changes none of them; and no event it makes is dated after `created`."""
    diff = diff or diff_listing

    def run(listing: pa.Table, stored: pa.Table, listed_at: datetime, *,
            store_times: bool = True) -> tuple[list, int]:
        when = pa.scalar(created, stored.schema.field("_event_time").type)
        newer = pc.fill_null(pc.greater(stored["_event_time"], when), False)
        kept = stored.filter(newer)["relative_path"].combine_chunks() if stored.num_rows \
            else pa.array([], pa.string())
        stored = stored.filter(pc.invert(newer)) if stored.num_rows else stored
        gone = deleted_after
        if len(gone) and stored.num_rows:  # a stored row (older than the report) wins
            gone = gone.filter(pc.invert(pc.is_in(gone, value_set=stored["relative_path"]
                                                  .combine_chunks())))
        skip = pa.concat_arrays([kept.cast(pa.string()), gone.cast(pa.string())])
        if len(skip) and listing.num_rows:
            listing = listing.filter(pc.invert(pc.is_in(listing["relative_path"],
                                                        value_set=skip)))
        events, invalid = diff(listing, stored, listed_at, store_times=store_times)
        return _not_after(events, created), invalid

    return run


def _not_after(events: pa.Table, created: datetime) -> pa.Table:
    """`events` with every `_event_time` after `created` set to `created`: a report's row
    dated ahead (a LastModifiedDate in 2200) must not outrank the events that follow it."""
    if not events.num_rows:
        return events
    column = events.schema.get_field_index("_event_time")
    times = events.column(column)
    when = pa.scalar(created, times.type)
    return events.set_column(column, events.schema.field(column), pc.if_else(
        pc.fill_null(pc.greater(times, when), False), when, times))
