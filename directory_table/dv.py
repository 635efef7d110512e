"""Delta deletion vectors (DVs): the one module that knows how they are stored (DESIGN §4.8).

A deletion vector marks rows of one Parquet data file as deleted, by their position in the file
(0-based, counting every row the file holds). Delta's PROTOCOL.md ("Deletion Vector Format")
stores it as a *RoaringBitmapArray*: a little-endian magic number (1681511377), a 64-bit count
of 32-bit buckets, then per bucket its 32-bit high key and a portable 32-bit Roaring bitmap of
the low halves (`pyroaring` reads and writes that format). The bitmap lives either

* inline in the log (`storageType` "i"): Z85 text of the bytes, padded to a multiple of 4; or
* in a `deletion_vector_<uuid>.bin` file next to the table (`storageType` "u": the uuid as 20
  Z85 characters, after an optional random prefix folder): a format byte (1), then per DV its
  size (big-endian int32), the bitmap bytes and their CRC-32 (big-endian), at `offset`.

`Descriptor` is the value the log's `deletionVector` field holds; `Descriptor.rows(read)`
turns it into the set of deleted positions and `live_mask` into the mask a reader filters a
file's rows with. Nothing outside this module looks inside a descriptor.

    desc = inline({3, 4, 7})
    live_mask(desc, 10, read_bytes)      # array([ True, True, True, False, False, ...])
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
from pyroaring import BitMap

__all__ = ["Descriptor", "encode", "decode", "inline", "live_mask", "pack_file",
           "z85_decode", "z85_encode"]

MAGIC = 1681511377
#: the format byte a DV file starts with
FILE_FORMAT = 1
#: a bitmap of at most this many serialized bytes is kept inline in the log (a handful of rows):
#: a small batch then writes no DV file at all
INLINE_MAX_BYTES = 48

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUE = {c: i for i, c in enumerate(_Z85)}

#: how a descriptor's file bytes are read: (path relative to the table, offset, length) -> bytes
ReadBytes = Callable[[str, int, int], bytes]


def z85_encode(data: bytes) -> str:
    """ZeroMQ's Z85 of `data`, zero-padded to a multiple of 4 bytes (as Delta pads)."""
    if len(data) % 4:
        data += b"\0" * (4 - len(data) % 4)
    out = []
    for (word,) in struct.iter_unpack(">I", data):
        chars = []
        for _ in range(5):
            word, digit = divmod(word, 85)
            chars.append(_Z85[digit])
        out.extend(reversed(chars))
    return "".join(out)


def z85_decode(text: str) -> bytes:
    if len(text) % 5:
        raise ValueError(f"Z85 text of {len(text)} characters (not a multiple of 5)")
    out = bytearray()
    for i in range(0, len(text), 5):
        word = 0
        for c in text[i:i + 5]:
            word = word * 85 + _Z85_VALUE[c]
        out += struct.pack(">I", word)
    return bytes(out)


def encode(rows: BitMap) -> bytes:
    """The RoaringBitmapArray bytes of `rows` (positions < 2**32: data files are far smaller)."""
    if not rows:
        return struct.pack("<IQ", MAGIC, 0)
    if rows.max() >= 1 << 32:
        raise ValueError("a deletion vector position past 2**32")
    return struct.pack("<IQI", MAGIC, 1, 0) + rows.serialize()


def decode(data: bytes) -> np.ndarray:
    """The positions (sorted int64) a RoaringBitmapArray's bytes mark."""
    magic, count = struct.unpack_from("<IQ", data, 0)
    if magic != MAGIC:
        raise ValueError(f"not a deletion vector (magic {magic}, expected {MAGIC})")
    offset, parts = 12, []
    for i in range(count):
        (high,) = struct.unpack_from("<I", data, offset)
        bitmap = BitMap.deserialize(data[offset + 4:])
        if i + 1 < count:  # the next bucket starts where this bitmap's bytes end
            offset += 4 + len(bitmap.serialize())
        low = np.fromiter(bitmap, dtype=np.int64, count=len(bitmap))
        parts.append(low + (high << 32))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Descriptor:
    """A `deletionVector` field of an `add` or `remove` action."""

    storage_type: str  # "i" inline, "u" a uuid-named file, "p" an absolute path
    path_or_inline: str
    size: int
    cardinality: int
    offset: int | None = None

    @classmethod
    def of(cls, action: dict | None) -> Descriptor | None:
        """The descriptor in a log action's `deletionVector` field (None: the file has none)."""
        if not action:
            return None
        offset = action.get("offset")
        return cls(action["storageType"], action["pathOrInlineDv"], int(action["sizeInBytes"]),
                   int(action["cardinality"]), None if offset is None else int(offset))

    def to_json(self) -> dict:
        out = {"storageType": self.storage_type, "pathOrInlineDv": self.path_or_inline,
               "sizeInBytes": self.size, "cardinality": self.cardinality}
        if self.offset is not None:
            out["offset"] = self.offset
        return out

    @property
    def unique_id(self) -> str:
        """What identifies this DV in the log (with the path, a file's identity)."""
        base = self.storage_type + self.path_or_inline
        return base if self.offset is None else f"{base}@{self.offset}"

    @property
    def file(self) -> str | None:
        """The DV file's path relative to the table ("u"), or as given ("p"); None inline."""
        if self.storage_type == "i":
            return None
        if self.storage_type == "p":
            return self.path_or_inline
        prefix, code = self.path_or_inline[:-20], self.path_or_inline[-20:]
        name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(code))}.bin"
        return f"{prefix}/{name}" if prefix else name

    def rows(self, read: ReadBytes) -> np.ndarray:
        """The deleted positions (sorted int64). `read` fetches a DV file's bytes."""
        if self.storage_type == "i":
            return decode(z85_decode(self.path_or_inline)[:self.size])
        assert self.file is not None
        start = self.offset or 0
        framed = read(self.file, start, self.size + 8)
        (size,) = struct.unpack_from(">I", framed, 0)
        data = framed[4:4 + size]
        (crc,) = struct.unpack_from(">I", framed, 4 + size)
        if size != self.size or zlib.crc32(data) != crc:
            raise ValueError(f"deletion vector in {self.file} at {start} fails its checksum")
        return decode(data)


def live_mask(desc: Descriptor | None, rows: int, read: ReadBytes) -> np.ndarray | None:
    """A boolean mask of a file's `rows` rows, False where `desc` marks one deleted; None when
    nothing is marked (read the file as it is)."""
    if desc is None or not desc.cardinality:
        return None
    mask = np.ones(rows, dtype=bool)
    mask[desc.rows(read)] = False
    return mask


def inline(rows: BitMap) -> Descriptor:
    data = encode(rows)
    return Descriptor("i", z85_encode(data), len(data), len(rows))


def pack_file(bitmaps: Iterable[BitMap]) -> tuple[str, bytes, list[Descriptor]]:
    """One DV file holding `bitmaps`: (its name, its bytes, their descriptors, in order)."""
    file_id = uuid.uuid4()
    code = z85_encode(file_id.bytes)
    body = bytearray([FILE_FORMAT])
    descriptors = []
    for bitmap in bitmaps:
        data = encode(bitmap)
        descriptors.append(Descriptor("u", code, len(data), len(bitmap), offset=len(body)))
        body += struct.pack(">I", len(data)) + data + struct.pack(">I", zlib.crc32(data))
    return f"deletion_vector_{file_id}.bin", bytes(body), descriptors
