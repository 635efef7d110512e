"""GetRecords bodies cut from blocks of record texts: each record's JSON text is made for a
block of its window's records at once, kept while the window is, and a page is slices of it.

Made page by page (1000 records: ~150 Arrow kernel calls and the Python around them), the
text cost about three times what the same records cost made `BLOCK` at a time; a page is
then views of one or two blocks' text buffers, joined once into the body. A block's texts
are what `page_json` writes for the same records (`record_texts` of `arrow_page` of the
block), so a body is byte for byte the `page_json` of the page. DESIGN §10.3.
"""

from __future__ import annotations

from typing import Any
from weakref import WeakKeyDictionary

import pyarrow as pa

from volume_stream.serve.records_json import concatenated, page_body, record_texts
from volume_stream.shards.model import Shard
from volume_stream.shards.pages import arrow_page
from volume_stream.shards.reader import Window

__all__ = ["BLOCK", "RecordBlocks"]

#: records per block (aligned on the window's records: block k is [k * BLOCK, (k+1) * BLOCK))
BLOCK = 4096
#: blocks kept per window: readers of one shard at a few places each keep theirs
_KEPT = 4


class RecordBlocks:
    """The record texts of the windows a change log reader has open, by block; the texts of
    a window go when the change log lets go of the window."""

    def __init__(self, region: str, block: int = BLOCK):
        self.region, self.block = region, block
        self._texts: WeakKeyDictionary[Window, dict[tuple[str, int], pa.Array]] = \
            WeakKeyDictionary()

    def body(self, log: Any, slices: list[tuple[Window, int, int]], shard: Shard,
             next_iterator: str | None) -> bytes:
        """The GetRecords response document of records i to j of each (window, i, j) of
        `log` (a `ChangeLog`; `read_slices`), in order."""
        views = []
        size = self.block
        for window, i, j in slices:
            for k in range(i // size, (j - 1) // size + 1) if j > i else ():
                texts = self._block(log, window, shard, k)
                lo = max(i, k * size) - k * size
                views.append(concatenated(texts.slice(lo, min(j, (k + 1) * size) - k * size - lo)))
        return page_body(views, next_iterator)

    def _block(self, log: Any, window: Window, shard: Shard, k: int) -> pa.Array:
        blocks = self._texts.get(window)
        if blocks is None:
            blocks = self._texts[window] = {}
        key = (log.view_type, k)
        texts = blocks.pop(key, None)
        if texts is None:
            a, b = k * self.block, min(len(window), (k + 1) * self.block)
            page = arrow_page([(window, a, b)], shard, log.view_type, log.commit_time, window)
            texts = record_texts(page, log.view_type, self.region)
            while len(blocks) >= _KEPT:
                blocks.pop(next(iter(blocks)))
        blocks[key] = texts  # the most recent last
        return texts
