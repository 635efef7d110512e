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
    "BY_BUCKET",
    "ITERATOR_KINDS",
    "MAX_ROW",
    "Keys",
    "VIEW_TYPES",
    "PageColumns",
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
#: a shard's `order` when its records of a version go by (bucket, key), the order a volume's
#: change data feed comes in (the streams of volumes made since; before: by key alone)
BY_BUCKET = "bucket"
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
    #: how a version's records are ordered: "key", or `BY_BUCKET` (by bucket, then key)
    order: str = field(default="key", repr=False)

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
            end_version=end, hash_buckets=hash_buckets, order=meta.get("order", "key"))


class Keys(list):
    """Keys of stand-alone records (`Record.of`): `keys[k]` is a new dict each time."""

    __slots__ = ()

    def __getitem__(self, k: int) -> dict[str, Any]:  # type: ignore[override]
        return dict(super().__getitem__(k))


class PageColumns:
    """The columns of one page of records, which its `Record`s are views over: plain lists
    (one item per record), the keys and images made by `make_*` on first use (a subclass,
    `shards.pages.ArrowPage`, builds them from Arrow columns then; here they are given).
    `keys[k]`, `old_images[k]`, `new_images[k]`: record k's dict (a new one for keys)."""

    __slots__ = ("commit_timestamps", "commit_versions", "event_names", "keys", "new_images",
                 "old_images", "rows", "sequence_numbers", "shard_id", "sizes")

    def __init__(self, sequence_numbers: list[str], event_names: list[str],
                 commit_versions: list[int], rows: list[int],
                 commit_timestamps: list[datetime], shard_id: str, sizes: list[int],
                 keys: Any = None, old_images: list | None = None,
                 new_images: list | None = None):
        self.sequence_numbers, self.event_names = sequence_numbers, event_names
        self.commit_versions, self.rows = commit_versions, rows
        self.commit_timestamps, self.shard_id, self.sizes = commit_timestamps, shard_id, sizes
        self.keys, self.old_images, self.new_images = keys, old_images, new_images

    def make_keys(self) -> Any:
        return self.keys

    def make_old_images(self) -> list[dict[str, Any] | None]:
        return self.old_images or []

    def make_new_images(self) -> list[dict[str, Any] | None]:
        return self.new_images or []


class Record:
    """One change of one key: INSERT (new_image), MODIFY (both), REMOVE (old_image); the images
    the change log's view type keeps, the others None.

    A record is a view (`__slots__`: its page and index) over the columns of its page
    (`PageColumns`): sequence numbers, event names and versions are made for the whole page
    at once; `key`, `old_image` and `new_image` are made from Arrow columns, for the whole page,
    the first time a record of the page asks, so a consumer that reads only sequence numbers
    or event names does not pay for dicts (a key or image is a new dict each time it is asked
    for). `Record.of(...)` makes a stand-alone one."""

    __slots__ = ("_k", "_p")

    def __init__(self, page: PageColumns, k: int):
        self._p, self._k = page, k

    @classmethod
    def of(cls, sequence_number: str, event_name: str, key: dict[str, Any],
           old_image: dict[str, Any] | None, new_image: dict[str, Any] | None,
           commit_version: int, commit_timestamp: datetime, shard_id: str,
           size_bytes: int = 0) -> Record:
        version, row = parse_sequence_number(sequence_number)
        if version != commit_version:
            raise InvalidInputError(f"sequence number {sequence_number} is not of version "
                                    f"{commit_version}")
        if not key:
            raise InvalidInputError(f"a record's key has at least one column, not {key!r}")
        return cls(PageColumns([str(sequence_number)], [event_name], [commit_version], [row],
                               [commit_timestamp], shard_id, [size_bytes], Keys([dict(key)]),
                               [old_image], [new_image]), 0)

    @property
    def sequence_number(self) -> str:
        return self._p.sequence_numbers[self._k]

    @property
    def event_name(self) -> str:
        return self._p.event_names[self._k]

    @property
    def commit_version(self) -> int:
        return self._p.commit_versions[self._k]

    @property
    def row(self) -> int:
        """The record's index among its shard's records of its version."""
        return self._p.rows[self._k]

    @property
    def commit_timestamp(self) -> datetime:
        return self._p.commit_timestamps[self._k]

    @property
    def shard_id(self) -> str:
        return self._p.shard_id

    @property
    def size_bytes(self) -> int:
        return self._p.sizes[self._k]

    @property
    def key(self) -> dict[str, Any]:
        """A new dict {key column: value, ...} each time."""
        keys = self._p.keys
        if keys is None:
            keys = self._p.make_keys()
        return keys[self._k]

    @property
    def old_image(self) -> dict[str, Any] | None:
        images = self._p.old_images
        if images is None:
            images = self._p.make_old_images()
        return images[self._k]

    @property
    def new_image(self) -> dict[str, Any] | None:
        images = self._p.new_images
        if images is None:
            images = self._p.make_new_images()
        return images[self._k]

    def _values(self) -> tuple:
        return (self.sequence_number, self.event_name, self.key, self.old_image,
                self.new_image, self.commit_version, self.commit_timestamp, self.shard_id,
                self.size_bytes)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Record) and self._values() == other._values()

    def __reduce__(self) -> tuple:
        # pickled (or copied) as a stand-alone record of its values, not with its page
        return (Record.of, self._values())

    def __hash__(self) -> int:
        return hash((self.shard_id, self.sequence_number))

    def __repr__(self) -> str:
        return (f"Record(sequence_number={self.sequence_number!r}, "
                f"event_name={self.event_name!r}, key={self.key!r}, "
                f"old_image={self.old_image!r}, new_image={self.new_image!r}, "
                f"commit_version={self.commit_version!r}, "
                f"commit_timestamp={self.commit_timestamp!r}, shard_id={self.shard_id!r})")


@dataclass(frozen=True)
class RecordsPage:
    """What one `get_records` returns; `next_iterator` is None once a closed shard is drained."""

    records: list[Record]
    next_iterator: str | None
