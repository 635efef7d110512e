"""GetRecords bodies cut from blocks of record texts: each record's JSON text is made for a
block of its window's records at once, kept while the window is, and a page is slices of it.

Made page by page (1000 records: ~150 Arrow kernel calls and the Python around them), the
text cost about three times what the same records cost made `BLOCK` at a time; a page is
then views of one or two blocks' text buffers, joined once into the body. A block's texts
are what `page_json` writes for the same records (`record_texts` of `arrow_page` of the
block), so a body is byte for byte the `page_json` of the page. A block ends after `BLOCK`
records, or where its records' approximate sizes (DynamoDB's count, as `max_bytes` cuts
pages) pass `BLOCK_BYTES`: a table of large rows gets short blocks, never a text of
thousands of large records. DESIGN §10.3.
"""

from __future__ import annotations

from typing import Any
from weakref import WeakKeyDictionary

import numpy as np
import pyarrow as pa

from volume_stream.serve.records_json import concatenated, page_body, record_texts
from volume_stream.shards.model import Shard
from volume_stream.shards.pages import arrow_page
from volume_stream.shards.reader import Window

__all__ = ["BLOCK", "BLOCK_BYTES", "RecordBlocks", "block_starts"]

#: records per block at most
BLOCK = 4096
#: a block ends once its records' approximate sizes pass this
BLOCK_BYTES = 4 * 1024 * 1024
#: blocks kept per window: readers of one shard at a few places each keep theirs
_KEPT = 4


class _Texts:
    """One window's blocks for one view type: where each starts, and the texts made."""

    __slots__ = ("blocks", "starts")

    def __init__(self, starts: np.ndarray):
        self.starts = starts
        self.blocks: dict[int, pa.Array] = {}


def block_starts(sizes: np.ndarray, block: int = BLOCK, block_bytes: int = BLOCK_BYTES
                 ) -> np.ndarray:
    """Where each block of records of these approximate sizes starts, then the end: a block
    starts every `block` records and at the record whose running size passes a multiple of
    `block_bytes`, so a block holds at most `block` records and under 2 * `block_bytes`
    (one record larger than that: a block of its own)."""
    n = len(sizes)
    full = np.cumsum(sizes) // block_bytes
    new = np.r_[True, (np.arange(1, n) % block == 0) | (full[1:] != full[:-1])][:n]
    return np.r_[np.flatnonzero(new), n].astype(np.int64)


class RecordBlocks:
    """The record texts of the windows a change log reader has open, by block; the texts of
    a window go when the change log lets go of the window."""

    def __init__(self, region: str, block: int = BLOCK, block_bytes: int = BLOCK_BYTES):
        self.region, self.block, self.block_bytes = region, block, block_bytes
        self._texts: WeakKeyDictionary[Window, dict[str, _Texts]] = WeakKeyDictionary()

    def body(self, log: Any, slices: list[tuple[Window, int, int]], shard: Shard,
             next_iterator: str | None) -> bytes:
        """The GetRecords response document of records i to j of each (window, i, j) of
        `log` (a `ChangeLog`; `read_slices`), in order."""
        views = []
        for window, i, j in slices:
            if j <= i:
                continue
            texts = self._of(window, log.view_type)
            starts = texts.starts
            first = int(np.searchsorted(starts, i, side="right")) - 1
            last = int(np.searchsorted(starts, j - 1, side="right")) - 1
            for k in range(first, last + 1):
                a, b = int(starts[k]), int(starts[k + 1])
                block = self._block(log, window, shard, texts, k, a, b)
                lo, hi = max(i, a) - a, min(j, b) - a
                views.append(concatenated(block.slice(lo, hi - lo)))
        return page_body(views, next_iterator)

    def _of(self, window: Window, view_type: str) -> _Texts:
        by_view = self._texts.get(window)
        if by_view is None:
            by_view = self._texts[window] = {}
        texts = by_view.get(view_type)
        if texts is None:
            keep_old = view_type in ("NEW_AND_OLD_IMAGES", "OLD_IMAGE")
            keep_new = view_type in ("NEW_AND_OLD_IMAGES", "NEW_IMAGE")
            sizes = window.record_sizes(keep_old, keep_new)
            texts = by_view[view_type] = _Texts(block_starts(sizes, self.block,
                                                             self.block_bytes))
        return texts

    def _block(self, log: Any, window: Window, shard: Shard, texts: _Texts, k: int, a: int,
               b: int) -> pa.Array:
        made = texts.blocks.pop(k, None)
        if made is None:
            page = arrow_page([(window, a, b)], shard, log.view_type, log.commit_time, window)
            made = record_texts(page, log.view_type, self.region)
            while len(texts.blocks) >= _KEPT:
                texts.blocks.pop(next(iter(texts.blocks)))
        texts.blocks[k] = made  # the most recent last
        return made
