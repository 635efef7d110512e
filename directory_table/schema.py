"""Column layout of the directory table (DESIGN §2): the public columns every Delta reader sees,
and the internal ones volume-stream needs to order events and to tell which commit wrote a row.

`_image_version` / `_image_timestamp` are the version and time of the commit that wrote the
row's current image, so a DELETE or UPDATE_BEFORE can show the version that wrote the old image
(§5) without reading that old commit. `_sequencer` / `_event_time` order late or redelivered
events against the stored state (§4.2).
"""

from __future__ import annotations

import pyarrow as pa

__all__ = [
    "BUCKET_FIELD",
    "BUCKETED_SCHEMA",
    "BUCKETED_TOMBSTONE_SCHEMA",
    "INTERNAL_COLUMNS",
    "PUBLIC_COLUMNS",
    "TABLE_SCHEMA",
    "TOMBSTONE_SCHEMA",
    "TS",
]

TS = pa.timestamp("us", tz="UTC")

PUBLIC_COLUMNS = ("relative_path", "url", "size", "last_modified_time", "etag")
INTERNAL_COLUMNS = ("_sequencer", "_event_time", "_image_version", "_image_timestamp")

TABLE_SCHEMA = pa.schema(
    [
        pa.field("relative_path", pa.string(), nullable=False),
        pa.field("url", pa.string()),
        pa.field("size", pa.int64()),
        pa.field("last_modified_time", TS),
        pa.field("etag", pa.string()),
        pa.field("_sequencer", pa.string()),
        pa.field("_event_time", TS),
        pa.field("_image_version", pa.int64()),
        pa.field("_image_timestamp", TS),
    ]
)

#: Paths deleted recently, with the ordering key of the delete, so a redelivered older
#: CREATED cannot resurrect a file (queues redeliver and reorder).
TOMBSTONE_SCHEMA = pa.schema(
    [
        pa.field("relative_path", pa.string(), nullable=False),
        pa.field("_sequencer", pa.string()),
        pa.field("_event_time", TS),
        pa.field("deleted_at", TS),
        pa.field("deleted_version", pa.int64()),
    ]
)

#: the partition column of the bucketed layout (`directory_table.layout`): crc32 of the path
#: modulo the table's bucket count. Not a public column; `changes()` keeps it for shard readers.
BUCKET_FIELD = pa.field("_bucket", pa.int32())
BUCKETED_SCHEMA = TABLE_SCHEMA.append(BUCKET_FIELD)
BUCKETED_TOMBSTONE_SCHEMA = TOMBSTONE_SCHEMA.append(BUCKET_FIELD)
