"""Shards over a volume's change log, DynamoDB Streams style (issue 15): `ChangeLog`,
shard iterators and records. See `volume_stream.shards.log`."""

from volume_stream.shards.log import ChangeLog, list_change_logs
from volume_stream.shards.model import (
    ITERATOR_KINDS,
    VIEW_TYPES,
    Record,
    RecordsPage,
    Shard,
    parse_sequence_number,
    sequence_number,
)

__all__ = [
    "ITERATOR_KINDS",
    "VIEW_TYPES",
    "ChangeLog",
    "Record",
    "RecordsPage",
    "Shard",
    "list_change_logs",
    "parse_sequence_number",
    "sequence_number",
]
