"""The values of the shard API: shards, records, pages, sequence numbers, shard ids, ARNs.

A sequence number encodes (commit_version, row-in-version) as a decimal string of 30 digits,
`"1" + version (19 digits) + row (10 digits)`: numeric and string order agree, so it increases
within a shard, and it names the exact version a record came from (what retention checks).
Row is the record's index among the shard's records of that version, ordered by key.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from volume_stream.errors import InvalidInputError

__all__ = [
    "ITERATOR_KINDS",
    "MAX_ROW",
    "VIEW_TYPES",
    "Position",
    "Record",
    "RecordsPage",
    "Shard",
    "check_view_type",
    "parse_sequence_number",
    "sequence_number",
    "shard_id",
]

#: what a record carries, DynamoDB's names; the first is the default
VIEW_TYPES = ("NEW_AND_OLD_IMAGES", "NEW_IMAGE", "OLD_IMAGE", "KEYS_ONLY")
ITERATOR_KINDS = ("TRIM_HORIZON", "LATEST", "AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER")
#: the row part of a position that stands for "the whole version"
MAX_ROW = 9_999_999_999
_VERSION_DIGITS, _ROW_DIGITS = 19, 10

#: (commit_version, row): a reader at this position has seen every record up to and including it
Position = tuple[int, int]


def sequence_number(version: int, row: int) -> str:
    return f"1{version:0{_VERSION_DIGITS}d}{row:0{_ROW_DIGITS}d}"


def parse_sequence_number(value: Any) -> Position:
    """(version, row) of a sequence number; InvalidInputError if it is not one of ours."""
    text = str(value)
    if not (text.isdigit() and len(text) == 1 + _VERSION_DIGITS + _ROW_DIGITS
            and text[0] == "1"):
        raise InvalidInputError(
            f"invalid sequence number {value!r}: expected 30 decimal digits starting with 1, "
            f"as the records and shards of this change log show")
    return int(text[1:1 + _VERSION_DIGITS]), int(text[1 + _VERSION_DIGITS:])


def shard_id(volume_id: str, label: str, lo: int, hi: int, start_version: int,
             ordinal: int) -> str:
    """`shardId-<20 digits>-<8 hex>` (37 characters); `ordinal` numbers the stream's shards,
    so a reshard at the same version never repeats an id."""
    digest = hashlib.sha1(f"{volume_id}/{label}/{lo}/{hi}/{start_version}/{ordinal}".encode()
                          ).hexdigest()
    return f"shardId-{start_version:020d}-{digest[:8]}"


def check_view_type(view_type: str) -> str:
    value = str(view_type).upper()
    if value not in VIEW_TYPES:
        raise InvalidInputError(
            f"invalid view type {view_type!r}; valid view types: {', '.join(VIEW_TYPES)}")
    return value


@dataclass(frozen=True)
class Shard:
    """One shard of a change log: the keys whose bucket is in [bucket_lo, bucket_hi), for the
    versions (start_version, end_version] (open while end_version is None)."""

    shard_id: str
    parent_shard_id: str | None
    parent_sibling_shard_id: str | None
    starting_sequence_number: str
    ending_sequence_number: str | None
    bucket_lo: int = field(default=0, repr=False)
    bucket_hi: int = field(default=1, repr=False)
    start_version: int = field(default=0, repr=False)
    end_version: int | None = field(default=None, repr=False)
    #: the bucket count the ranges are of (the change log's; 0: the table's)
    hash_buckets: int = field(default=0, repr=False)

    @property
    def closed(self) -> bool:
        return self.end_version is not None

    @property
    def buckets(self) -> range:
        return range(self.bucket_lo, self.bucket_hi)

    @classmethod
    def from_meta(cls, meta: dict[str, Any], hash_buckets: int = 0) -> Shard:
        end = meta.get("end_version")
        return cls(
            shard_id=meta["id"], parent_shard_id=meta.get("parent"),
            parent_sibling_shard_id=meta.get("sibling"),
            starting_sequence_number=sequence_number(meta["start_version"] + 1, 0),
            ending_sequence_number=None if end is None else sequence_number(end, MAX_ROW),
            bucket_lo=meta["lo"], bucket_hi=meta["hi"], start_version=meta["start_version"],
            end_version=end, hash_buckets=hash_buckets)


@dataclass(slots=True)
class Record:
    """One change of one key: INSERT (new_image), MODIFY (both), REMOVE (old_image); the images
    the change log's view type keeps, the others None."""

    sequence_number: str
    event_name: str
    key: dict[str, Any]
    old_image: dict[str, Any] | None
    new_image: dict[str, Any] | None
    commit_version: int
    commit_timestamp: datetime
    shard_id: str
    size_bytes: int = 0


@dataclass(frozen=True)
class RecordsPage:
    """What one `get_records` returns; `next_iterator` is None once a closed shard is drained."""

    records: list[Record]
    next_iterator: str | None
