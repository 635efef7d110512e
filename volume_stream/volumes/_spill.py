"""A refresh's listing as it arrives, bounded in memory (issue 12 item 4; DESIGN §4.4).

`Listing` keeps the accepted rows in memory up to `spill_rows`. Past that (bucketed directory
tables only), every row goes to its *partition* (a range of the table's buckets, at most
`MAX_PARTITIONS` of them) in a local temporary Arrow IPC file, so the listing of a 10M-object
prefix never sits whole on the driver: the refresh then diffs a group of partitions at a time
(`groups`, `read`), each against the stored rows of its buckets only. A partition's rows stay
buffered in memory until the buffers together pass `spill_rows // 4` rows, then each
partition's buffer is written as one record batch.

    >>> listing = Listing(buckets=16, spill_rows=1_000_000)          # doctest: +SKIP
    >>> for batch in batches: listing.add(batch)                     # doctest: +SKIP
    >>> listing.table() if listing.in_memory else listing.groups(0)  # doctest: +SKIP
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.protocols import LISTING_SCHEMA
from directory_table.batch import bucket_column
from directory_table.layout import bucket_array

__all__ = ["MAX_PARTITIONS", "Listing", "accepted_rows"]

#: spill files (and open writers) at most, whatever the table's bucket count
MAX_PARTITIONS = 256


class Listing:
    """The rows of one listing (`LISTING_SCHEMA`); see the module docstring.

    Args:
        buckets: The directory table's bucket count (1: never spilled).
        spill_rows: Rows kept in memory before spilling (about one diff group).
        spill_dir: Where the temporary directory goes (default: the system's temp dir).
    """

    def __init__(self, buckets: int, *, spill_rows: int, spill_dir: str | None = None) -> None:
        self.buckets = max(1, buckets)
        self.spill_rows = max(1, spill_rows)
        self.spill_dir = spill_dir
        self.rows = 0
        self.partitions = min(self.buckets, MAX_PARTITIONS)
        self._held: list[pa.Table] = []
        self._dir: str | None = None
        self._writers: dict[int, pa.ipc.RecordBatchStreamWriter] = {}
        self._buffers: list[list[pa.Table]] = [[] for _ in range(self.partitions)]
        self._buffered = 0
        self.partition_rows = [0] * self.partitions

    # ------------------------------------------------------------------ filling
    @property
    def in_memory(self) -> bool:
        return self._dir is None

    def add(self, batch: pa.RecordBatch | pa.Table) -> None:
        if batch.num_rows == 0:
            return
        if isinstance(batch, pa.RecordBatch):
            batch = pa.Table.from_batches([batch])
        self.rows += batch.num_rows
        if self._dir is None:
            self._held.append(batch)
            if self.rows > self.spill_rows and self.buckets > 1:
                self._start_spilling()
            return
        self._partition(batch)

    def _start_spilling(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="volume-stream-refresh-", dir=self.spill_dir)
        held, self._held = self._held, []
        for batch in held:
            self._partition(batch)

    def _partition(self, batch: pa.Table) -> None:
        """Split `batch` by partition into the buffers; flush them when they are full."""
        of_path = bucket_array(batch["relative_path"].to_pylist(), self.buckets)
        buckets = np.asarray(of_path)
        parts = buckets.astype(np.int64) * self.partitions // self.buckets
        order = np.argsort(parts, kind="stable")
        # each row keeps its bucket, so the commit does not hash its path again
        batch = batch.append_column(bucket_column(self.buckets), of_path)
        ordered = batch.take(pa.array(order))
        counts = np.bincount(parts, minlength=self.partitions)
        start = 0
        for p in np.nonzero(counts)[0]:
            n = int(counts[p])
            self._buffers[p].append(ordered.slice(start, n))
            self.partition_rows[p] += n
            start += n
        self._buffered += batch.num_rows
        if self._buffered >= max(1, self.spill_rows // 4):
            self._flush()

    def _flush(self) -> None:
        for p, parts in enumerate(self._buffers):
            if not parts:
                continue
            writer = self._writers.get(p)
            if writer is None:
                writer = pa.ipc.new_stream(os.path.join(self._dir or "", f"p{p:03d}.arrow"),
                                           self._spilled_schema)
                self._writers[p] = writer
            writer.write_table(pa.concat_tables(parts).combine_chunks())
            self._buffers[p] = []
        self._buffered = 0

    def finish(self) -> None:
        """No more rows: write what is buffered and close the spill files."""
        if self._dir is None:
            return
        self._flush()
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()

    # ------------------------------------------------------------------ reading
    def table(self) -> pa.Table:
        """The whole listing (only while it is in memory)."""
        if self._dir is not None:
            raise RuntimeError("the listing was spilled: read it a group at a time")
        return pa.concat_tables(self._held) if self._held else LISTING_SCHEMA.empty_table()

    def buckets_of(self, partitions: list[int]) -> list[int]:
        """The table buckets of `partitions` (partition p holds the buckets b with
        b * partitions // buckets == p)."""
        wanted = set(partitions)
        return [b for b in range(self.buckets) if b * self.partitions // self.buckets in wanted]

    def groups(self, stored_rows: int) -> Iterator[list[int]]:
        """Consecutive partitions holding about `spill_rows` rows each, counting this
        listing's rows of each and an even share of the `stored_rows` of the table."""
        share = stored_rows / self.partitions
        group: list[int] = []
        size = 0.0
        for p in range(self.partitions):
            rows = self.partition_rows[p] + share
            if group and size + rows > self.spill_rows:
                yield group
                group, size = [], 0.0
            group.append(p)
            size += rows
        if group:
            yield group

    def read(self, partitions: list[int]) -> pa.Table:
        """The listing's rows of `partitions` (after `finish`)."""
        tables = []
        for p in partitions:
            path = os.path.join(self._dir or "", f"p{p:03d}.arrow")
            if os.path.exists(path):
                with pa.OSFile(path, "rb") as f:
                    tables.append(pa.ipc.open_stream(f).read_all())
        return pa.concat_tables(tables) if tables else self._spilled_schema.empty_table()

    @property
    def _spilled_schema(self) -> pa.Schema:
        """`LISTING_SCHEMA` and each row's bucket (`batch.bucket_column`)."""
        return LISTING_SCHEMA.append(pa.field(bucket_column(self.buckets), pa.int32()))

    def close(self) -> None:
        """Drop the spill files (also after an error)."""
        for writer in self._writers.values():
            try:
                writer.close()
            except (OSError, pa.ArrowException):
                pass
        self._writers.clear()
        self._held = []
        self._buffers = [[] for _ in range(self.partitions)]
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> Listing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def accepted_rows(batch: pa.RecordBatch, accept: Callable[[str], bool] | None,
                  recursive: bool) -> pa.RecordBatch:
    """`batch` without the rows a volume does not take: `accept(path)` per path, or with
    `accept=None` the same rule vectorised (no folder markers; no nested paths unless
    `recursive`)."""
    if batch.num_rows == 0:
        return batch
    paths = batch["relative_path"]
    if accept is None:
        drop = pc.ends_with(paths, "/")
        if not recursive:
            drop = pc.or_(drop, pc.match_substring(paths, "/"))
        if not pc.any(drop).as_py():
            return batch
        return batch.filter(pc.invert(drop))
    keep = pa.array([accept(p) for p in paths.to_pylist()], pa.bool_())
    return batch.filter(keep)
