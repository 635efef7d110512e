"""The deletion vector format (`directory_table.dv`) against PROTOCOL.md's examples and itself,
and merge-on-read commits' edge cases (`directory_table.mor`); Delta Spark reading our DVs and
us reading Spark's is tests/interop/test_deletion_vectors.py."""

from __future__ import annotations

import struct
import uuid
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyroaring import BitMap

from connectors.events import FileEvent
from directory_table import DirectoryTable, _reads, dv
from directory_table.deltalog import replay

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_z85_of_the_protocols_uuid_example():
    """PROTOCOL.md: the DV file of uuid d2c639aa-… is named by these 20 characters."""
    code = dv.z85_encode(uuid.UUID("d2c639aa-8816-431a-aaf6-d3fe2512ff61").bytes)
    assert code == "^-aqEH.-t@S}K{vb[*k^"
    descriptor = dv.Descriptor("u", "ab" + code, 10, 1, offset=1)
    assert descriptor.file == "ab/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"


def test_the_protocols_inline_example_decodes_to_its_rows():
    """PROTOCOL.md's inline example is Delta's older layout (big-endian magic - 1, a size);
    the bitmap inside is the portable Roaring format we write after our own header."""
    raw = dv.z85_decode("wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L")
    assert struct.unpack_from(">III", raw) == (dv.MAGIC - 1, 1, 28)
    assert list(BitMap.deserialize(raw[12:])) == [3, 4, 7, 11, 18, 29]
    ours = dv.inline(BitMap([3, 4, 7, 11, 18, 29]))
    assert list(ours.rows(lambda *_: b"")) == [3, 4, 7, 11, 18, 29]


@given(st.sets(st.integers(0, 2**31), max_size=200))
def test_bitmaps_round_trip_inline_and_in_files(rows):
    bitmap = BitMap(rows)
    assert sorted(rows) == dv.decode(dv.encode(bitmap)).tolist()
    assert sorted(rows) == dv.inline(bitmap).rows(lambda *_: b"").tolist()
    name, body, descriptors = dv.pack_file([BitMap([1]), bitmap, BitMap()])
    assert name.startswith("deletion_vector_") and body[0] == dv.FILE_FORMAT

    def read(path, offset, length):
        assert path == name
        return body[offset:offset + length]

    assert [d.rows(read).tolist() for d in descriptors] == [[1], sorted(rows), []]
    assert [d.cardinality for d in descriptors] == [1, len(rows), 0]


def test_a_dv_of_several_high_buckets_decodes():
    """Positions past 2**32 (never ours: files are small) come in buckets of their own."""
    low, high = BitMap([1, 2]), BitMap([5])
    data = (struct.pack("<IQ", dv.MAGIC, 2) + struct.pack("<I", 0) + low.serialize()
            + struct.pack("<I", 3) + high.serialize())
    assert dv.decode(data).tolist() == [1, 2, 5 + (3 << 32)]
    with pytest.raises(ValueError, match="not a deletion vector"):
        dv.decode(struct.pack("<IQ", 1234, 0))
    assert dv.live_mask(None, 3, lambda *_: b"") is None
    mask = dv.live_mask(dv.inline(BitMap([0, 2])), 4, lambda *_: b"")
    assert mask is not None and mask.tolist() == [False, True, False, True]


@given(st.lists(st.tuples(st.integers(0, 40), st.booleans(), st.integers(0, 2**40)),
                min_size=1, max_size=30),
       st.sampled_from([1, 10_000]))
def test_marked_rows_drop_the_same_by_slices_or_one_filter(files, rows_per_slice):
    """`_drop_marked` keeps exactly the unmarked rows in order, whichever way it filters."""
    counts = [n for n, _, _ in files]
    rng = [np.random.default_rng(seed) for _, _, seed in files]
    masks = [r.random(n) < 0.5 if has else None for (n, has, _), r in zip(files, rng, strict=True)]
    table = pa.table({"i": pa.array(range(sum(counts)), pa.int64())})
    expected = [i for i, keep in enumerate(np.concatenate(
        [m if m is not None else np.ones(n, dtype=bool) for m, n in zip(masks, counts, strict=True)]))
        if keep]
    kept = _reads._drop_marked(table, masks, counts, rows_per_slice)
    assert kept["i"].to_pylist() == expected


def test_a_file_whose_every_row_goes_is_removed_not_marked(tmp_path):
    table = DirectoryTable.create(str(tmp_path / "t"), "file:///d/", buckets=1,
                                  target_file_size=64 * 4)  # files of 4 rows
    table.apply([FileEvent.created(f"f{i:02d}", size=i, last_modified_time=T0, event_time=T0)
                 for i in range(12)])
    files = replay(table.path, None, table.version()).files
    first = files.sort_by("min_path")["path"][0].as_py()
    at = T0 + timedelta(seconds=1)
    table.apply([FileEvent.removed(f"f{i:02d}", event_time=at) for i in range(4)]
                + [FileEvent.removed("f05", event_time=at)])
    state = replay(table.path, None, table.version())
    assert first not in state.files["path"].to_pylist()  # gone whole, no DV of 4 of 4 rows
    assert list(state.deletion_vectors().values())[0]["cardinality"] == 1
    assert sorted(table.snapshot()["relative_path"].to_pylist()) == \
        [f"f{i:02d}" for i in range(12) if i > 3 and i != 5]
    assert table.file_count() == 7
    assert np.array_equal(np.sort(table.changes(1, 2)["relative_path"].to_numpy(
        zero_copy_only=False)), np.array(["f00", "f01", "f02", "f03", "f05"], dtype=object))
