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
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
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

from connectors.events import utc_now
from connectors.local._inotify import InotifyFD, _InotifyFD, _InotifyObserver
from connectors.local._pending import _PendingFiles
from connectors.local.store import _check_root
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
