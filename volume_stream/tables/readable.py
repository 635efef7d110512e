"""What a failed read of a warehouse table means, in volume-stream's words (`readable`).

Two failures come from outside: a VACUUM (a user's Spark `VACUUM ... RETAIN 0 HOURS`, or
delta-rs's with a short retention) removed data or change files that the log still lists, and
another writer turned on a Delta table feature delta-rs's reader refuses (Spark's `ALTER TABLE
... SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')`). The first becomes
`directory_table.kept.VersionsGone` (a table stream raises `StaleStreamError` from it), the
second an `UnsupportedFeatureError` naming the table and the features.

    with readable("t", path, dt, after=3, up_to=7):
        dt.load_cdf(starting_version=4, ending_version=7)

A snapshot of a local table is read from its data files on the calling thread (`rows`): such
a read starts no thread that could still run as the interpreter exits (DESIGN §8).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaProtocolError

from directory_table.kept import VersionsGone, is_missing_file, oldest_readable
from directory_table.protocol import UnsupportedFeature, unsupported
from directory_table.storage import local_rows
from volume_stream.errors import UnsupportedFeatureError, VolumeStreamError

__all__ = ["check_readable", "readable", "rows"]


@contextmanager
def readable(table: str, path: str, dt: DeltaTable, *, after: int | None = None,
             up_to: int | None = None, storage_options: dict[str, str] | None = None
             ) -> Iterator[None]:
    """Run a read of versions (after, up_to] of table `table` (at `path`, opened as `dt`), or
    without them of `dt`'s snapshot; turn a file a VACUUM removed into `VersionsGone` and a
    refused table feature into `UnsupportedFeatureError`."""
    try:
        yield
    except VolumeStreamError:
        raise
    except Exception as exc:
        if is_missing_file(exc):
            if after is None or up_to is None:  # its snapshot is gone: at best the next reads
                after = up_to = dt.version()
                oldest = up_to + 1
            else:
                oldest = oldest_readable(path, after, up_to, storage_options)
            if oldest > after:
                raise VersionsGone(path, after, up_to, oldest) from exc
        if isinstance(exc, DeltaProtocolError) or "not yet supported by the deltalake" in str(
                exc):
            raise _refused(table, path, unsupported(dt, write=False) or [str(exc)]) from exc
        raise


def check_readable(table: str, path: str, dt: DeltaTable) -> None:
    """Refuse a table whose data files do not hold its rows as they are (deletion vectors,
    column mapping): reading them straight (Spark's Parquet reader, pyarrow) would be wrong."""
    features = unsupported(dt, write=False)
    if features:
        raise _refused(table, path, features)


def _refused(table: str, path: str, features: list[str]) -> UnsupportedFeatureError:
    return UnsupportedFeatureError(
        f"table {table!r}: {UnsupportedFeature(path, features, write=False)}", path, features)


def rows(table: str, path: str, dt: DeltaTable) -> pa.Table:
    """Every row of `dt`'s loaded version (the table's full schema): a local table's read
    file by file on this thread (`directory_table.storage.local_rows`, which starts no
    thread), others through delta-rs's dataset."""
    check_readable(table, path, dt)  # the files hold the rows as they are
    got = local_rows(dt)
    return dt.to_pyarrow_dataset().to_table(use_threads=False) if got is None else got
