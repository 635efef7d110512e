"""The local listener's dispatcher state, without threads (`_PendingFiles`): raw watchdog
events in, complete files out as `FileEvent`s (see `connectors.local.listener`)."""

from __future__ import annotations

import heapq
import logging
import os
import stat as stat_module
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileAttribEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
)

from connectors.events import EventKind, FileEvent, InvalidPathError
from connectors.local.store import _check_key, _etag, _mtime, _scan, content_etag

__all__ = ["_PendingFiles"]

logger = logging.getLogger("connectors.local")

_CREATE, _REMOVE, _CANDIDATE = "create", "remove", "candidate"


@dataclass(slots=True)
class _Pending:
    kind: str  # _CREATE: complete, emit when due; _CANDIDATE: emit once stable; _REMOVE
    deadline: float
    event_time: datetime
    signature: tuple[int, int] | None = None  # (size, mtime_ns) at the last stability check


class _PendingFiles:
    """The dispatcher's state, without threads: raw watchdog events in, `FileEvent`s out.

    Each raw event sets its path's pending kind (the last one wins) and its deadline. A
    complete event (a close after writing, a rename into place, a delete) is due at once
    (`at`): the file is whole, waiting adds latency and nothing else. Only a path seen again
    within `debounce_s` of its previous complete event (a writer appending in bursts, a
    delete-and-recreate) or one still pending is debounced: its deadline moves to
    `at + debounce_s`, so a burst yields its first state at once and its last state once
    quiet. Events that do not prove a file complete (attribute changes, files found in a new
    directory, polling's create/modify) always wait `debounce_s` and then for stability.
    `collect(now)` stats every path whose deadline has passed: a regular
    file is CREATED (a `_CANDIDATE` only once its size and mtime match the previous check,
    `settle_s` earlier), anything else REMOVED; a pending removal of a file that exists again
    emits nothing, because the new file's own close will come.
    """

    def __init__(self, root: str, *, recursive: bool, debounce_s: float, settle_s: float,
                 complete_on_close: bool, source_id: str, max_pending: int,
                 stat: Callable[[str], os.stat_result] = os.lstat,
                 hash_content: bool = False) -> None:
        self.root = root
        self.prefix = root if root.endswith(os.sep) else root + os.sep
        self.recursive = recursive
        self.debounce_s = debounce_s
        self.settle_s = settle_s
        self.complete_on_close = complete_on_close
        self.source_id = source_id
        self.max_pending = max_pending
        self.stat = stat
        self.hash_content = hash_content
        self.pending: dict[str, _Pending] = {}
        self.refresh_reasons: list[str] = []
        # A rename is complete by convention with inotify; polling cannot tell a rename of a
        # file still being written from one of a finished file, so it waits for stability.
        self._moved_in = _CREATE if complete_on_close else _CANDIDATE
        self._heap: list[tuple[float, str]] = []
        # complete events of the last `debounce_s`: path -> when, and in arrival order
        self._recent: dict[str, float] = {}
        self._recent_order: deque[tuple[float, str]] = deque()

    # -- input

    def relative(self, path: str | bytes) -> str | None:
        """The key of an absolute path inside the root, None outside it (or too deep)."""
        if not path:
            return None
        path = os.fsdecode(path)
        if not path.startswith(self.prefix) or len(path) == len(self.prefix):
            return None
        key = path[len(self.prefix):]
        if os.sep != "/":
            key = key.replace(os.sep, "/")
        if not self.recursive and "/" in key:
            return None
        return key

    def refresh(self, reason: str) -> None:
        if reason not in self.refresh_reasons:
            logger.warning("local volume %s needs a refresh: %s", self.root, reason)
            self.refresh_reasons.append(reason)

    def feed(self, event: FileSystemEvent, at: float, wall: datetime) -> None:
        if event.is_synthetic:
            return  # watchdog's own walk of a moved/created tree; we walk it ourselves
        if isinstance(event, DirMovedEvent):
            self._dir_moved(event, at, wall)
        elif isinstance(event, FileMovedEvent):
            src, dest = self.relative(event.src_path), self.relative(event.dest_path)
            if src is not None:
                self._mark(src, _REMOVE, at, wall)
            if dest is not None:
                self._mark(dest, self._moved_in, at, wall)
        elif isinstance(event, FileClosedEvent):
            self._mark_key(event.src_path, _CREATE, at, wall)
        elif isinstance(event, FileAttribEvent):
            # `touch`, chmod, a hard link: a new mtime is a change, as it is to a listing
            # (the etag is mtime and size); report the file once it is stable
            key = self.relative(event.src_path)
            if key is not None:
                self._mark(key, _CANDIDATE, at, wall, weak=True)
        elif isinstance(event, FileDeletedEvent):
            self._mark_key(event.src_path, _REMOVE, at, wall)
        elif isinstance(event, (FileCreatedEvent, FileModifiedEvent)):
            if not self.complete_on_close:  # polling: no close events, wait for stability
                self._mark_key(event.src_path, _CANDIDATE, at, wall)
        elif isinstance(event, DirDeletedEvent):
            # rmdir needs an empty directory, so its files' deletions were reported one by
            # one; only the root itself going away loses information.
            if os.fsdecode(event.src_path).rstrip(os.sep) == self.root.rstrip(os.sep):
                self.refresh("the volume root was deleted; the listener stopped watching")
        elif isinstance(event, DirCreatedEvent):
            # Files written into a new directory before its watch was added sent their close
            # to nobody: take what is there, once it stops changing.
            key = self.relative(event.src_path)
            if key is not None and self.recursive and self.complete_on_close:
                for found in _scan(self.root, key, recursive=True, strict=False):
                    for file_key in found.paths:
                        self._mark(file_key, _CANDIDATE, at, wall, weak=True)
        self._bound()

    def _dir_moved(self, event: FileSystemEvent, at: float, wall: datetime) -> None:
        if not self.recursive:
            return  # a sub-directory's files never belong to a non-recursive volume
        src, dest = self.relative(event.src_path), self.relative(event.dest_path)
        if dest is not None:
            for found in _scan(self.root, dest, recursive=True, strict=False):
                for key in found.paths:
                    self._mark(key, self._moved_in, at, wall)
                    if src is not None:
                        self._mark(src + key[len(dest):], _REMOVE, at, wall)
        elif src is not None:
            self.refresh(f"directory {src!r} moved out of the volume; its files are unknown")

    def _mark_key(self, path: str | bytes, kind: str, at: float, wall: datetime) -> None:
        key = self.relative(path)
        if key is not None:
            self._mark(key, kind, at, wall)

    def _mark(self, key: str, kind: str, at: float, wall: datetime, *, weak: bool = False) -> None:
        pending = self.pending.get(key)
        deadline = at + self.debounce_s
        if kind != _CANDIDATE:
            if pending is None and not self._seen_recently(key, at):
                deadline = at  # complete and not part of a burst: report it at once
            self._recent[key] = at
            self._recent_order.append((at, key))
        if pending is None:
            self.pending[key] = _Pending(kind, deadline, wall)
        elif weak and pending.kind in (_CREATE, _CANDIDATE):
            return  # a directory walk must not downgrade a complete file to a candidate
        else:
            pending.kind, pending.deadline, pending.event_time = kind, deadline, wall
        heapq.heappush(self._heap, (deadline, key))

    def _seen_recently(self, key: str, at: float) -> bool:
        last = self._recent.get(key)
        return last is not None and at - last < self.debounce_s

    def _forget_before(self, now: float) -> None:
        """Drop the complete events older than `debounce_s` (they no longer make a burst)."""
        order, recent, horizon = self._recent_order, self._recent, now - self.debounce_s
        while order and (order[0][0] <= horizon or len(order) > self.max_pending):
            at, key = order.popleft()
            if recent.get(key) == at:
                del recent[key]

    def _bound(self) -> None:
        if len(self.pending) > self.max_pending:
            self.pending.clear()
            self._heap.clear()
            self.refresh(f"more than {self.max_pending} paths pending; dropped them")
        elif len(self._heap) > 2 * len(self.pending) + 1024:
            self._heap = [(p.deadline, k) for k, p in self.pending.items()]
            heapq.heapify(self._heap)

    # -- output

    def next_deadline(self) -> float | None:
        heap = self._heap
        while heap:
            deadline, key = heap[0]
            pending = self.pending.get(key)
            if pending is not None and pending.deadline == deadline:
                return deadline
            heapq.heappop(heap)  # superseded by a later event for the same path
        return None

    def take_refresh(self) -> list[str]:
        reasons, self.refresh_reasons = self.refresh_reasons, []
        return reasons

    def collect(self, now: float) -> tuple[list[FileEvent], int]:
        """Emit the paths whose deadline has passed: REMOVED first, then CREATED, by path."""
        events: list[FileEvent] = []
        malformed = 0
        self._forget_before(now)
        while (deadline := self.next_deadline()) is not None and deadline <= now:
            _, key = heapq.heappop(self._heap)
            pending = self.pending[key]
            try:
                event = self._decide(key, pending, now)
            except InvalidPathError as exc:
                malformed += 1
                logger.warning("skipping %r: %s", os.path.join(self.root, key), exc)
                event = None
            except OSError as exc:
                malformed += 1
                logger.warning("cannot stat %r: %s", os.path.join(self.root, key), exc)
                event = None
            if pending.deadline != deadline:
                continue  # rescheduled: a candidate still settling
            del self.pending[key]
            if event is not None:
                events.append(event)
        events.sort(key=lambda e: (e.kind is EventKind.CREATED, e.relative_path))
        return events, malformed

    def _decide(self, key: str, pending: _Pending, now: float) -> FileEvent | None:
        try:
            st = self.stat(os.path.join(self.root, key))
        except (FileNotFoundError, NotADirectoryError):
            st = None
        if st is None or not stat_module.S_ISREG(st.st_mode):
            _check_key(key)
            return FileEvent.removed(key, event_time=pending.event_time, source_id=self.source_id)
        if pending.kind == _REMOVE:
            return None  # recreated since: its own close (or stability) will report it
        if pending.kind == _CANDIDATE:
            signature = (st.st_size, st.st_mtime_ns)
            if signature != pending.signature:
                pending.signature = signature
                pending.deadline = now + self.settle_s
                heapq.heappush(self._heap, (pending.deadline, key))
                return None
        _check_key(key)
        etag = content_etag(os.path.join(self.root, key)) if self.hash_content else _etag(st)
        return FileEvent.created(key, size=st.st_size, last_modified_time=_mtime(st),
                                 etag=etag, event_time=pending.event_time,
                                 source_id=self.source_id)
