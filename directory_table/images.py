"""The rows a batch's commit writes besides its planning: the new images of changed paths, the
placeholder rows of deleted paths a delta-rs merge takes as its source, and the tombstones of
deletes (DESIGN §4.1-4.2)."""

from __future__ import annotations

from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from directory_table.layout import Layout, for_layout
from directory_table.schema import TABLE_SCHEMA, TOMBSTONE_SCHEMA, TS

__all__ = ["images", "rows_for_delete", "write_tombstones"]


def images(events: pa.Table, base_url: str, version: int, now: datetime) -> pa.Table:
    """The new images of `events` (`batch.EVENT_SCHEMA` columns) written at `version`."""
    n, paths = events.num_rows, events["relative_path"]
    return pa.table({
        "relative_path": paths,  # and the url, on the column:
        "url": pc.binary_join_element_wise(pa.scalar(base_url, pa.string()), paths, ""),
        "size": events["size"],
        "last_modified_time": events["last_modified_time"],
        "etag": events["etag"],
        "_sequencer": events["_sequencer"],
        "_event_time": events["_event_time"],
        "_image_version": pa.repeat(pa.scalar(version, pa.int64()), n),
        "_image_timestamp": pa.repeat(pa.scalar(now, TS), n),
    }, schema=TABLE_SCHEMA)


def rows_for_delete(paths: pa.Table) -> pa.Table:
    """Rows of `paths` with every other column null (a merge's source for a delete)."""
    cols = {f.name: pa.nulls(paths.num_rows, f.type) for f in TABLE_SCHEMA}
    cols["relative_path"] = paths["relative_path"]
    return pa.table(cols, schema=TABLE_SCHEMA)


def write_tombstones(tomb: DeltaTable, deletes: pa.Table, now: datetime, version: int) -> None:
    """Tombstones of the REMOVED events `deletes` (`batch.EVENT_SCHEMA` columns) in the
    tombstone table `tomb`."""
    # Written before the directory commit: a crash in between leaves a tombstone for a
    # path that still exists, which only ever blocks events older than the delete.
    n = deletes.num_rows
    source = pa.table(
        {
            "relative_path": deletes["relative_path"],
            "_sequencer": deletes["_sequencer"],
            "_event_time": deletes["_event_time"],
            "deleted_at": pa.repeat(pa.scalar(now, TS), n),
            "deleted_version": pa.repeat(pa.scalar(version, pa.int64()), n),
        },
        schema=TOMBSTONE_SCHEMA,
    )
    layout = Layout.of(tomb)
    paths = source["relative_path"].to_pylist()
    (
        tomb.merge(for_layout(source, layout),
                   layout.merge_predicate(paths),
                   source_alias="s", target_alias="t")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
