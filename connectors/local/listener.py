"""Local directories as volumes: an inotify listener with a polling fallback.

`LocalListener` watches a directory with watchdog and emits `FileEvent`s for complete files
only (DESIGN §4.3): with inotify a file counts once it is closed after writing
(IN_CLOSE_WRITE) or renamed into place, never on create/modify, so a half-written file never
appears. Where inotify cannot start (not Linux, watch or instance limits) it falls back to
polling, where a file counts once its size and mtime stay the same across two checks. The
split follows watchdog's own: the observer's threads (producer) put raw events on a bounded
queue; `receive` (the dispatcher, on the caller's thread) debounces them per path and stats
each file when its deadline passes, so the emitted event describes the file as it is then.
Known losses are never silent: an inotify queue overflow, a directory moved out of the volume
or too many pending paths make the next `Received` carry `needs_refresh=True`.

Symlinks and non-regular files are skipped, as by `connectors.local.store.LocalLister`;
ETags are the lister's. The listener keeps its own algorithm but the `Listener` contract:
nothing to acknowledge, and `ListenerClosedError` after `close`.

    >>> with LocalListener("/data/drop", debounce_s=0.1) as listener:  # doctest: +SKIP
    ...     batch = listener.receive(timeout=1.0)
    ...     if batch.needs_refresh:       # reconcile against LocalLister("/data/drop").list()
    ...         refresh(volume)
    ...     table.apply(batch.events)
"""

from __future__ import annotations

import errno
import heapq
import itertools
import logging
import os
import stat as stat_module
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

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
    FileSystemEventHandler,
)
from watchdog.observers.api import BaseObserver
from watchdog.observers.polling import PollingObserver

from connectors.events import EventKind, FileEvent, InvalidPathError, utc_now
from connectors.local._inotify import InotifyFD, _InotifyFD, _InotifyObserver
from connectors.local.store import _check_key, _check_root, _etag, _mtime, _scan, content_etag
from connectors.protocols import Listener, Received

__all__ = ["LocalListener"]

logger = logging.getLogger("connectors.local")

_names = itertools.count(1)

# What each backend has to report; everything else (opens, modifies, attribs) is filtered out
# before it reaches the kernel mask or our queue.
_INOTIFY_EVENTS = [FileClosedEvent, FileMovedEvent, FileDeletedEvent, FileAttribEvent,
                   DirMovedEvent, DirDeletedEvent, DirCreatedEvent]
_POLLING_EVENTS = [FileCreatedEvent, FileModifiedEvent, FileMovedEvent, FileDeletedEvent,
                   DirMovedEvent, DirDeletedEvent]


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
                logger.warning("skipping %s: %s", os.path.join(self.root, key), exc)
                event = None
            except OSError as exc:
                malformed += 1
                logger.warning("cannot stat %s: %s", os.path.join(self.root, key), exc)
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


class _Enqueue(FileSystemEventHandler):
    """Runs on watchdog's dispatcher thread: only hands events to the listener's queue."""

    def __init__(self, put: Callable[[FileSystemEvent], None]) -> None:
        self._put = put

    def dispatch(self, event: FileSystemEvent) -> None:
        self._put(event)


class LocalListener(Listener):
    """Listen to a local directory (`Listener`): inotify by default, polling where it can't.

    Only complete files are reported (module docstring). A closed (or renamed-in, or deleted)
    file is reported as soon as `receive` sees its event; a path closed again within
    `debounce_s` of its previous event is debounced, so a writer that closes a file many times
    in a row yields its first state at once and then one event once it has been quiet for
    `debounce_s` (`_PendingFiles`).
    `Received.handles` is always empty: there is nothing to acknowledge, so `ack` and
    `extend` do nothing. After a crash the caller should run a refresh, as inotify does not
    replay what happened while nobody listened.

    Args:
        root: The volume's directory; must exist.
        recursive: Watch sub-directories too; else only direct children count.
        debounce_s: Quiet time before reporting a path that is in a burst of events (seen
            again within `debounce_s`), and before the stability check of events that do not
            prove a file complete (IN_ATTRIB, files found in a new directory, polling). A
            single close is not delayed by it.
        polling: None: inotify, falling back to polling (with a warning) if it cannot start;
            True: always poll; False: inotify or raise.
        poll_interval_s: Seconds between directory snapshots when polling.
        max_pending: Bound on queued raw events and on pending paths; beyond it they are
            dropped and the next `Received` asks for a refresh.
        clock: Monotonic clock for the debounce (injectable for tests).
        hash_content: ETags are hashes of the files' bytes (as `LocalLister(hash_content=True)`
            gives), not mtime and size; every reported file is read once.

    What is a change is the lister's rule: a new size or modification time (the ETag), so a
    `touch` of an existing file (IN_ATTRIB) is reported once the file is stable, and a chmod
    alone changes nothing. With `hash_content=True` the ETag is a hash of the bytes instead:
    a same-size rewrite whose mtime was restored is seen, a `touch` is not a change.

    Limitations: hard links made into the volume (IN_CREATE only) are not reported; a refresh
    picks them up. Files found in a new
    directory whose close the watch missed are reported once stable for `debounce_s`.
    watchdog skips, without a word, sub-directories it cannot watch (permissions, the
    `fs.inotify.max_user_watches` limit once the root's own watch succeeded); size that limit
    for the volume's directory count, or use `polling=True`.

    Example:
        >>> with LocalListener("/data/in", recursive=False) as listener:   # doctest: +SKIP
        ...     for event in listener.receive(timeout=5.0).events:
        ...         print(event.kind, event.relative_path, event.size)
    """

    def __init__(self, root: str | Path, *, recursive: bool = True, debounce_s: float = 0.2,
                 polling: bool | None = None, poll_interval_s: float = 1.0,
                 max_pending: int = 100_000, clock: Callable[[], float] = time.monotonic,
                 hash_content: bool = False) -> None:
        if debounce_s < 0 or poll_interval_s <= 0 or max_pending < 1:
            raise ValueError("need debounce_s >= 0, poll_interval_s > 0 and max_pending >= 1")
        self.root = _check_root(root)
        self.recursive = recursive
        self._clock = clock
        self._max_pending = max_pending
        self._poll_interval_s = poll_interval_s
        self._name = f"volume-stream-local-{next(_names)}"
        self._cond = threading.Condition()
        self._raw: deque[tuple[FileSystemEvent, float, datetime]] = deque()
        self._lost: list[str] = []  # refresh reasons from watchdog's threads
        self._closed = False
        self._observer, self.backend = self._start(polling)
        settle_s = debounce_s if self.backend == "inotify" else max(debounce_s, poll_interval_s)
        self._state = _PendingFiles(
            self.root, recursive=recursive, debounce_s=debounce_s, settle_s=settle_s,
            complete_on_close=self.backend == "inotify", source_id=self.backend,
            max_pending=max_pending, hash_content=hash_content)

    def __repr__(self) -> str:
        return (f"LocalListener({self.root!r}, recursive={self.recursive}, "
                f"backend={self.backend!r})")

    # -- observer threads (producer side)

    def _start(self, polling: bool | None) -> tuple[BaseObserver, str]:
        if not polling:
            try:
                return self._start_inotify(), "inotify"
            except OSError as exc:
                if polling is False:
                    raise
                logger.warning("inotify unavailable for %s (%s); polling every %.1fs instead",
                               self.root, exc, self._poll_interval_s)
        observer = PollingObserver(timeout=self._poll_interval_s)
        self._schedule_and_start(observer, _POLLING_EVENTS)
        return observer, "poll"

    def _start_inotify(self) -> BaseObserver:
        if InotifyFD is None:  # pragma: no cover - not Linux
            raise OSError(errno.ENOSYS, "inotify is not available on this platform")
        inotify_fd = _InotifyFD(self._on_overflow)
        inotify_fd.name = f"{self._name}-inotify"
        inotify_fd.start()
        try:
            observer = _InotifyObserver(inotify_fd)
            self._schedule_and_start(observer, _INOTIFY_EVENTS)
        except BaseException:
            inotify_fd.stop()
            inotify_fd.join()
            raise
        return observer

    def _schedule_and_start(self, observer: BaseObserver, events: list[type]) -> None:
        observer.name = self._name
        observer.schedule(_Enqueue(self._put), self.root, recursive=self.recursive,
                          event_filter=events)
        for emitter in observer.emitters:
            emitter.name = f"{self._name}-emitter"
        observer.start()  # adds the watches / takes the first snapshot before returning

    def _put(self, event: FileSystemEvent) -> None:
        at, wall = self._clock(), utc_now()
        with self._cond:
            if len(self._raw) >= self._max_pending:
                self._raw.clear()
                self._lost.append(f"more than {self._max_pending} raw events queued; dropped")
            self._raw.append((event, at, wall))
            self._cond.notify_all()

    def _on_overflow(self) -> None:
        with self._cond:
            self._lost.append("the inotify queue overflowed; events were lost")
            self._cond.notify_all()

    # -- Listener protocol (dispatcher side)

    def receive(self, timeout: float) -> Received:
        """Wait up to `timeout` seconds; return as soon as some path's debounce has passed.

        Raises:
            ListenerClosedError: the listener is closed.
        """
        self._check_open()
        state = self._state
        end = self._clock() + max(0.0, timeout)
        while True:
            with self._cond:
                raw, self._raw = self._raw, deque()
                lost, self._lost = self._lost, []
            for reason in lost:
                state.refresh(reason)
            for event, at, wall in raw:
                state.feed(event, at, wall)
            now = self._clock()
            events, malformed = state.collect(now)
            if events or malformed or state.refresh_reasons or now >= end or self._closed:
                reasons = state.take_refresh()
                return Received(events=tuple(events), malformed=malformed,
                                needs_refresh=bool(reasons),
                                info={"backend": self.backend, "pending": len(state.pending),
                                      "refresh_reasons": reasons})
            wait = end - now
            deadline = state.next_deadline()
            if deadline is not None:
                wait = min(wait, deadline - now)
            with self._cond:
                if not self._raw and not self._lost and not self._closed:
                    self._cond.wait(max(wait, 0.0))

    def ack(self, handles: Sequence[Any]) -> None:
        """Nothing to acknowledge for local files."""

    def extend(self, handles: Sequence[Any], seconds: int) -> None:
        """Nothing to keep invisible for local files."""

    def backlog(self) -> int:
        """Raw events queued plus paths waiting out their debounce."""
        with self._cond:
            queued = len(self._raw)
        return queued + len(self._state.pending)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def idle(self) -> bool:
        with self._cond:
            queued = bool(self._raw or self._lost)
        return not (queued or self._state.pending or self._state.refresh_reasons)

    def close(self) -> None:
        """Stop and join the observer threads; idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._observer.stop()
        self._observer.join()
