"""`ChangeLog`: one stream of a volume's change log, read shard by shard through iterators.

    log = cat.change_log("landing")
    for shard in log.shards():                       # parents before children
        it = log.iterator(shard.shard_id, "TRIM_HORIZON")
        while it:
            page = log.get_records(it, limit=1000)
            handle(page.records)
            it = page.next_iterator                  # None once a closed shard is drained
            if not page.records and not shard.closed:
                break                                # an open shard: poll again later

Takes the `Catalog` (public methods and its `warehouse`) only; the metadata lives in the
warehouse catalog (`shards.meta`), the records come from the directory table
(`shards.reader`). DESIGN §10.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

from volume_stream.errors import (
    ExpiredIteratorError,
    InvalidInputError,
    NotFoundError,
    TrimmedDataError,
    VolumeStreamError,
    converted,
)
from volume_stream.shards import meta as shard_meta
from volume_stream.shards.iterators import IteratorSigner
from volume_stream.shards.model import (
    ITERATOR_KINDS,
    MAX_ROW,
    Position,
    RecordsPage,
    Shard,
    parse_sequence_number,
)
from volume_stream.shards.pages import arrow_page, page_records, prepare
from volume_stream.shards.reader import CommitTimes, Window, empty_window, fitting, shard_windows
from volume_stream.shards.sources import TableSource, VolumeSource
from volume_stream.tables.keys import key_columns
from volume_stream.tables.store import ROW_ID

__all__ = ["DEFAULT_ACCOUNT", "DEFAULT_REGION", "ChangeLog", "Target", "disable_change_log",
           "enable_change_log", "list_change_logs", "owner_id"]

DEFAULT_REGION = "us-east-1"
DEFAULT_ACCOUNT = "000000000000"
MAX_LIMIT = 1000
MAX_BYTES = 1024 * 1024
#: versions per read window (on a fixed grid, so pages of one window share its cached read)
WINDOW = 64
_WINDOWS_CACHED = 4
#: at most this many shards read together (`ChangeLog._window`)
_MAX_GROUP = 16
#: how long the records of a table's closed change log stay readable
TABLE_RETENTION_DAYS = 7.0


def _expired(stream: dict[str, Any], retention_days: float, now: datetime) -> bool:
    disabled = stream.get("disabled_at")
    return bool(disabled) and (datetime.fromisoformat(disabled)
                               + timedelta(days=retention_days) < now)


def list_change_logs(catalog: Any, volume: str | None = None) -> list[tuple[str, str]]:
    """(name, label) of every readable stream, oldest first per volume or table; one without
    change log metadata yet gets its default one (enabled, one shard)."""
    names = [volume] if volume else [v["name"] for v in catalog.list_volumes()]
    if not volume:
        names += [t for t in catalog.tables.names() if t not in names
                  and _tracked(catalog.tables, t)]
    out = []
    now = datetime.now(UTC)
    for name in names:
        log = ChangeLog(catalog, name)
        out += [(name, s["label"]) for s in log.meta["streams"]
                if not _expired(s, log.retention_days, now)]
    return out


def _tracked(store: Any, name: str) -> bool:
    """Change-tracked, with row ids or a key; False when unreadable (its folder gone)."""
    try:
        return store.change_tracking(name) and bool(store.has_row_ids(name) or store.key(name))
    except VolumeStreamError:
        return False


def _is_volume(catalog: Any, name: str) -> bool:
    try:
        catalog.volume_spec(name)
    except NotFoundError:
        return False
    return True


def owner_id(catalog: Any, name: str) -> str:
    """The id of volume `name`, else of SQL table `name` (NotFoundError: neither exists)."""
    try:
        return catalog.volume_spec(name).id
    except NotFoundError:
        if not catalog.tables.exists(name):
            raise
        return catalog.tables.table_id(name)


def _stored_key(key: Any) -> str | list[str] | None:
    """A key as the change log's metadata keeps it: a name, or a list of several."""
    cols = key_columns(key)
    return None if not cols else cols[0] if len(cols) == 1 else list(cols)


class Target:
    """What a change log belongs to: a volume, or (when no volume has the name) a change-tracked
    SQL table keyed by `key` (a column or a list of them; default: once stored, the log's own,
    else the table's declared key, else the hidden row id)."""

    def __init__(self, catalog: Any, name: str, key: str | list[str] | None = None):
        store = catalog.tables
        self.name = name
        if _is_volume(catalog, name) or not store.exists(name):
            if key is not None:
                raise InvalidInputError(f"volume {name!r}: a volume's change log is keyed by "
                                        f"relative_path; key= is for tables")
            self.spec = catalog.volume_spec(name)  # NotFoundError names the volumes
            self.kind, self.meta_name, self.owner_id = "volume", name, self.spec.id
            self.table = catalog.directory_table(name)
            self.source: Any = VolumeSource(self.table)
            self.retention_days = self.spec.retention_days
            self.created = (datetime.fromisoformat(self.spec.created_at)
                            if self.spec.created_at else None)
            self.key, self.start_version = None, 0
            return
        self.kind, self.meta_name = "table", shard_meta.TABLE_PREFIX + name
        self.owner_id = store.table_id(name)
        stored = catalog.warehouse.read().get((shard_meta.CHANGE_LOG, self.meta_name))
        if key is None and stored and stored.get("volume_id") == self.owner_id:
            key = stored.get("key")
        self.source = TableSource(store, name, key or store.key(name) or ROW_ID)
        self.spec, self.table, self.created = None, None, None
        self.key = _stored_key(self.source.key)
        self.retention_days = TABLE_RETENTION_DAYS
        self.start_version = (0 if stored and stored.get("volume_id") == self.owner_id
                              else self.source.tracked_since())

    def ensure(self, warehouse: Any) -> dict[str, Any]:
        return shard_meta.ensure(warehouse, self.meta_name, self.source.buckets(),
                                 created=self.created, owner_id=self.owner_id, key=self.key,
                                 start_version=self.start_version)


def enable_change_log(catalog: Any, name: str, *, view_type: str = "NEW_AND_OLD_IMAGES",
                      shards: int = 1, key: str | list[str] | None = None) -> None:
    """Start a new stream (new label) of the change log of volume or table `name` from its
    latest version on; a table's is keyed by `key` (a column or a list), else by its declared
    key, else by the previous stream's key (the hidden row id at first)."""
    if key is None and not _is_volume(catalog, name) and catalog.tables.exists(name):
        key = _stored_key(catalog.tables.key(name))
    target = Target(catalog, name, key)
    with converted(f"{target.kind} {name!r}"):
        shard_meta.enable(catalog.warehouse, target.meta_name, target.source.buckets(),
                          target.source.version(), view_type=view_type, shards=shards,
                          owner_id=target.owner_id, key=target.key)


def disable_change_log(catalog: Any, name: str) -> None:
    """Close every open shard at the latest version; records stay readable for the retention
    period after now."""
    target = Target(catalog, name)
    with converted(f"{target.kind} {name!r}"):
        target.ensure(catalog.warehouse)
        shard_meta.disable(catalog.warehouse, target.meta_name, target.source.version)


class ChangeLog:
    """One stream (the newest unless `label` names another) of the change log of a volume
    or, when no volume has that name, of a change-tracked SQL table (`key`: its key column,
    default the hidden row id)."""

    def __init__(self, catalog: Any, volume: str, *, label: str | None = None,
                 region: str = DEFAULT_REGION, account_id: str = DEFAULT_ACCOUNT,
                 clock: Callable[[], float] = time.time,
                 key: str | list[str] | None = None):
        if not (isinstance(account_id, str) and len(account_id) == 12 and account_id.isdigit()):
            raise InvalidInputError(f"account_id must be 12 digits, not {account_id!r}")
        self.catalog, self.volume = catalog, volume
        self.region, self.account_id, self.clock = region, account_id, clock
        with converted(f"change log of {volume!r}"):
            target = Target(catalog, volume, key)
            self.meta = target.ensure(catalog.warehouse)
        self.kind, self.meta_name, self.owner_id = target.kind, target.meta_name, target.owner_id
        self._what = f"{self.kind} {volume!r}"  # what errors name
        self.spec, self.table, self.source = target.spec, target.table, target.source
        self.retention_days = target.retention_days
        streams = {s["label"]: s for s in self.meta["streams"]}
        if label is not None and label not in streams:
            raise NotFoundError("change log stream", f"{volume}/{label}", streams)
        self.stream = streams[label] if label else self.meta["streams"][-1]
        if _expired(self.stream, self.retention_days, datetime.now(UTC)):
            raise NotFoundError("change log stream", f"{volume}/{self.stream['label']}",
                                [s for s, v in streams.items()
                                 if not _expired(v, self.retention_days, datetime.now(UTC))])
        stream_key = self.stream.get("key") or self.meta.get("key")
        if self.kind == "table" and stream_key and key_columns(stream_key) != \
                self.source.key_columns:
            if key is not None:
                raise InvalidInputError(f"stream {self.stream['label']} of table {volume!r} is "
                                        f"keyed by {stream_key!r}, not {key!r}")
            self.source = TableSource(catalog.tables, volume, stream_key)
        self._signer = IteratorSigner(catalog.warehouse.location)
        #: version -> its commit time (read from the log once)
        self.commit_time = CommitTimes(self.source)
        self._windows: OrderedDict[tuple[str, int, int], Window] = OrderedDict()
        #: windows read for a shard's siblings along with its own (`_window`)
        self._ahead: dict[tuple[str, int, int], Window] = {}
        self._share = True
        self._empty: Window | None = None
        #: {shard id: (shard, last version known)}: what `_state` read, reused until a
        #: reader has caught up with it (consistent: the version was read before the catalog)
        self._known: dict[str, tuple[Shard, int]] = {}

    # ------------------------------------------------------------------ description
    @property
    def label(self) -> str:
        return self.stream["label"]

    @property
    def arn(self) -> str:
        return (f"arn:aws:dynamodb:{self.region}:{self.account_id}:table/{self.volume}"
                f"/stream/{self.label}")

    @property
    def view_type(self) -> str:
        return self.stream["view_type"]

    @property
    def enabled(self) -> bool:
        return self.stream["disabled_version"] is None

    def _reload(self) -> None:
        state = self.catalog.warehouse.read()
        meta = state.get((shard_meta.CHANGE_LOG, self.meta_name))
        if meta is None or meta["volume_id"] != self.owner_id:
            raise ExpiredIteratorError(f"the change log of {self.kind} {self.volume!r} is gone "
                                       f"({self.kind} dropped or replaced)")
        self.meta = meta
        self.stream = next(s for s in meta["streams"] if s["label"] == self.label)

    def oldest_version(self) -> int:
        with converted(f"{self.kind} {self.volume!r}"):
            return self.source.oldest_version()

    def shards(self) -> list[Shard]:
        """The shards, parents before children; closed shards whose records retention removed
        are left out (an empty one, closed where it opened, stays until then)."""
        self._reload()
        oldest = self.oldest_version()
        shards = [Shard.from_meta(s, self.meta["buckets"]) for s in self.stream["shards"]]
        kept = [s for s in shards if s.end_version is None or s.end_version > oldest
                or s.start_version >= oldest]
        return kept  # in creation order: parents before children

    def _state(self, shard_id: str) -> tuple[Shard, int]:
        """The shard and the last version to read from it: its end once closed; while open,
        the latest version, read *before* the catalog (a reshard commits its intent, then
        closes at a version it reads after: at least this one; `meta._intend`)."""
        cached = next((s for s in self.stream["shards"] if s["id"] == shard_id), None)
        if cached is not None and cached["end_version"] is not None:
            # closed for good: no need to read the catalog again
            return Shard.from_meta(cached, self.meta["buckets"]), cached["end_version"]
        with converted(f"{self.kind} {self.volume!r}"):
            latest = self.source.version()
            self._reload()
            if self.stream.get("closing") and self.stream is self.meta["streams"][-1]:
                shard_meta.finish(self.catalog.warehouse, self.meta_name, self.source.version)
                self._reload()
        shard = self._shard(shard_id)
        return shard, shard.end_version if shard.closed else latest

    def _window(self, shard: Shard, a: int, b: int, oldest: int) -> Window:
        """The shard's records of versions (a, b] and their sequence numbers, cached (a few
        windows): consecutive pages of one window read its change data feed once.

        A miss reads the range for the shard's siblings too (one read of every bucket, split
        by shard: `_siblings`), kept aside for when their readers ask, as a consumer reading
        every shard does; once a miss finds read-ahead windows still unused (the readers do not
        move together), this change log reads one shard at a time from then on."""
        key = (shard.shard_id, a, b)
        hit = self._windows.get(key)
        if hit is not None:
            self._windows.move_to_end(key)  # the most recent last
            return hit
        hit = self._ahead.pop(key, None)
        if hit is None:
            for k in [k for k in self._ahead if k[0] == shard.shard_id]:
                del self._ahead[k]  # read ahead for an older range of this shard: stale
            group = [shard]
            if self._share:
                siblings = self._siblings(shard, a, b, oldest)
                if siblings and self._ahead:
                    self._share = False
                    self._ahead.clear()  # those readers do not move together either
                elif siblings:
                    group += siblings
            windows = shard_windows(self.source, group, a, b, lambda w, s: prepare(
                w, s, self.view_type, self.commit_time))
            hit = windows[0]
            self._ahead.update(((s.shard_id, a, b), w)
                               for s, w in zip(group[1:], windows[1:], strict=True))
        self._windows[key] = hit
        while len(self._windows) > _WINDOWS_CACHED:
            self._windows.popitem(last=False)
        return hit

    def _siblings(self, shard: Shard, a: int, b: int, oldest: int) -> list[Shard]:
        """The other shards whose reader will ask for the same range (a, b]: on the same grid
        step (started at `a`, or before it when `a` is on the grid or the oldest version), and
        ending the range where this one does (closed at `b` or later than the grid step's
        end, or open like this one)."""
        out = []
        for m in self.stream["shards"]:
            start, end = m["start_version"], m["end_version"]
            if m["id"] == shard.shard_id or start > a or (
                    start < a and a % WINDOW and a != oldest):
                continue
            if end is None:
                same_end = not shard.closed or b == a + WINDOW
            else:
                same_end = min(end, a + WINDOW) == b
            if same_end:
                out.append(Shard.from_meta(m, self.meta["buckets"]))
        return out if len(out) < _MAX_GROUP else []

    def _shard(self, shard_id: str) -> Shard:
        for s in self.stream["shards"]:
            if s["id"] == shard_id:
                return Shard.from_meta(s, self.meta["buckets"])
        raise NotFoundError("shard", shard_id, [s["id"] for s in self.stream["shards"]])

    # ------------------------------------------------------------------ iterators
    def iterator(self, shard_id: str, kind: str, sequence_number: str | None = None) -> str:
        """A shard iterator (valid 15 minutes). `kind`: TRIM_HORIZON (the oldest kept record),
        LATEST (only records committed from now on), AT_SEQUENCE_NUMBER or
        AFTER_SEQUENCE_NUMBER (with `sequence_number`).

        Raises:
            NotFoundError: no such shard. InvalidInputError: bad kind or sequence number.
            TrimmedDataError: the sequence number is older than retention keeps.
        """
        shard, hi = self._state(shard_id)
        kind = str(kind).upper()
        if kind not in ITERATOR_KINDS:
            raise InvalidInputError(f"invalid shard iterator type {kind!r}; valid types: "
                                    f"{', '.join(ITERATOR_KINDS)}")
        with_seq = kind in ("AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER")
        if with_seq != (sequence_number is not None):
            raise InvalidInputError(f"{kind} {'needs' if with_seq else 'takes no'} "
                                    f"sequence number")
        oldest = self.oldest_version()
        top = shard.end_version if shard.closed else None
        if kind == "TRIM_HORIZON":
            pos: Position = (max(shard.start_version, oldest), MAX_ROW)
        elif kind == "LATEST":
            pos = (max(hi, shard.start_version), MAX_ROW)
        else:
            version, row = parse_sequence_number(sequence_number)
            if version <= shard.start_version or (top is not None and version > top):
                raise InvalidInputError(
                    f"sequence number {sequence_number} is not in shard {shard_id} (versions "
                    f"{shard.start_version + 1} to {top if top is not None else 'now'})")
            if kind == "AFTER_SEQUENCE_NUMBER":
                pos = (version, row)
            else:
                pos = (version, row - 1) if row > 0 else (version - 1, MAX_ROW)
            self._check_kept(pos, oldest, shard_id)
        return self._token(shard, pos)

    def _token(self, shard: Shard, pos: Position) -> str:
        return self._signer.sign_position({"vid": self.owner_id, "vol": self.volume,
                                           "label": self.label, "shard": shard.shard_id},
                                          pos, self.clock())

    def _check_kept(self, pos: Position, oldest: int, shard_id: str) -> None:
        base = pos[0] if pos[1] == MAX_ROW else pos[0] - 1
        if base < oldest:
            raise TrimmedDataError(
                f"shard {shard_id} of {self.kind} {self.volume!r}: position at version {pos[0]} is "
                f"older than the oldest kept version {oldest} (trimmed by retention); start "
                f"again from TRIM_HORIZON")

    # ------------------------------------------------------------------ records
    def get_records_arrow(self, iterator: str, limit: int = MAX_LIMIT, *,
                          max_bytes: int = MAX_BYTES) -> tuple[pa.Table, str | None]:
        """(page, next iterator): up to `limit` (≤ 1000) records, about `max_bytes` at most,
        after the iterator's position, as an Arrow table with the columns of
        `shards.pages.RECORD_COLUMNS` (sequence_number, event_name, keys, old_image,
        new_image as struct columns, shard_id, commit_version, commit_timestamp,
        size_bytes); the next iterator continues after the last one (None once a closed
        shard is drained). `get_records` and the endpoint's GetRecords are views of it.

        Raises:
            ExpiredIteratorError: expired, forged, or of another change log.
            TrimmedDataError: the position is older than retention keeps.
        """
        slices, shard, token, window = self.read_slices(iterator, limit, max_bytes)
        if window is None:
            if self._empty is None:
                self._empty = empty_window(self.source)
            window = self._empty
        return arrow_page(slices, shard, self.view_type, self.commit_time, window), token

    def get_records(self, iterator: str, limit: int = MAX_LIMIT, *,
                    max_bytes: int = MAX_BYTES) -> RecordsPage:
        """Up to `limit` (≤ 1000) records, about `max_bytes` at most, after the iterator's
        position; `next_iterator` continues after the last one (None once a closed shard is
        drained). The records are views over `get_records_arrow`'s table.

        Raises:
            ExpiredIteratorError: expired, forged, or of another change log.
            TrimmedDataError: the position is older than retention keeps.
        """
        table, token = self.get_records_arrow(iterator, limit, max_bytes=max_bytes)
        return RecordsPage(page_records(table), token)

    def read_slices(self, iterator: str, limit: int = MAX_LIMIT, max_bytes: int = MAX_BYTES
                    ) -> tuple[list[tuple[Window, int, int]], Shard, str | None, Window | None]:
        """The page `get_records_arrow` makes, unmade: (slices (window, i, j) of its records in
        order, the shard, the next iterator, a window whose columns an empty page takes); a
        window's records are the same objects from page to page while it is cached."""
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
            raise InvalidInputError(f"limit must be from 1 to {MAX_LIMIT}, not {limit!r}")
        payload = self._signer.verify(iterator, self.clock())
        if (payload.get("vid"), payload.get("vol"), payload.get("label")) != (
                self.owner_id, self.volume, self.label):
            raise ExpiredIteratorError(f"shard iterator belongs to another change log than "
                                       f"{self.arn}")
        pos: Position = (int(payload["pos"][0]), int(payload["pos"][1]))
        known = self._known.get(payload["shard"])
        if known is not None and (pos[0] if pos[1] == MAX_ROW else pos[0] - 1) < known[1]:
            shard, hi = known  # versions known but not read yet: no need to look again
        else:
            shard, hi = self._known[payload["shard"]] = self._state(payload["shard"])
        keep_old = self.view_type in ("NEW_AND_OLD_IMAGES", "OLD_IMAGE")
        keep_new = self.view_type in ("NEW_AND_OLD_IMAGES", "NEW_IMAGE")
        slices: list[tuple[Window, int, int]] = []
        count, window = 0, None
        with converted(self._what):
            oldest = self.source.oldest_version()
            self._check_kept(pos, oldest, shard.shard_id)
            hi = max(hi, shard.start_version)
            a = pos[0] if pos[1] == MAX_ROW else pos[0] - 1
            ran = False
            while a < hi and count <= limit:
                ran = True
                g = max(a - a % WINDOW, shard.start_version, oldest)  # windows on a fixed grid
                b = min(hi, g + WINDOW)
                window = self._window(shard, g, b, oldest)
                i = window.after(*pos)
                j = min(len(window), i + limit + 1 - count)
                if j > i:
                    slices.append((window, i, j))
                    count += j - i
                a = b
        keep = min(count, limit)
        if keep:
            keep = min(keep, fitting(slices, max_bytes, keep_old, keep_new))
        if keep < count:  # cut: the next page starts after the last record kept
            trimmed, left = [], keep
            for w, i, j in slices:
                if left <= 0:
                    break
                trimmed.append((w, i, min(j, i + left)))
                left -= min(j, i + left) - i
            slices = trimmed
            w, _, j = slices[-1]
            nxt: Position = w.position(j)
        else:
            nxt = (a, MAX_ROW) if ran else pos  # every version up to `a` was read whole
            if shard.closed and nxt[0] >= shard.end_version:
                return slices, shard, None, window
        return slices, shard, self._token(shard, nxt), window

    # ------------------------------------------------------------------ changes
    def reshard(self, n: int) -> list[Shard]:
        """Close every open shard at the latest version and open `n` children."""
        with converted(f"{self.kind} {self.volume!r}"):
            children = shard_meta.reshard(self.catalog.warehouse, self.meta_name, n,
                                          self.source.version)
        self._reload()
        return [Shard.from_meta(c, self.meta["buckets"]) for c in children]
