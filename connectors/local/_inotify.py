"""The inotify side of `connectors.local.listener`: watchdog's reader and observer, adapted.

Two changes to watchdog's own: the reader tells the listener when the kernel queue overflowed
(events were lost, a refresh is needed), and the emitter asks the kernel for IN_ATTRIB when
`FileAttribEvent` is filtered in, which watchdog only does together with IN_MODIFY (an event per
write). Attribute changes are how a `touch` of an existing file shows up (DESIGN §4.3).
"""

from __future__ import annotations

from collections.abc import Callable

from watchdog.events import FileAttribEvent
from watchdog.observers.api import BaseObserver
from watchdog.utils import UnsupportedLibcError

try:  # inotify exists on Linux only; elsewhere the listener polls
    from watchdog.observers.inotify import InotifyFullEmitter
    from watchdog.observers.inotify_c import InotifyConstants, InotifyEvent, InotifyFD, Mask
except (ImportError, OSError, UnsupportedLibcError):  # pragma: no cover - not Linux
    InotifyFD = None  # type: ignore[assignment,misc]

__all__ = ["InotifyFD", "_InotifyFD", "_InotifyObserver"]

if InotifyFD is not None:

    class _InotifyFD(InotifyFD):
        """watchdog's inotify reader, telling us when the kernel queue overflowed.

        watchdog handles IN_Q_OVERFLOW itself (it rebuilds its watches) and only logs it; the
        events are lost all the same, so the listener must ask for a refresh.
        """

        def __init__(self, on_overflow: Callable[[], None]) -> None:
            super().__init__()
            self._on_overflow = on_overflow

        def handle_event(self, event: InotifyEvent) -> None:
            if event.is_queue_overflow:
                self._on_overflow()
            super().handle_event(event)

    class _Emitter(InotifyFullEmitter):
        """`InotifyFullEmitter` that watches IN_ATTRIB alone for `FileAttribEvent`."""

        def get_event_mask_from_filter(self) -> Mask:
            mask = super().get_event_mask_from_filter()
            if self._event_filter is not None and FileAttribEvent in self._event_filter:
                mask = Mask(mask | InotifyConstants.IN_ATTRIB)
            return mask

    class _InotifyObserver(BaseObserver):
        """An inotify observer on our own `_InotifyFD`, reporting unpaired moves as moves.

        `InotifyFullEmitter` turns a rename from outside the watched tree into
        `FileMovedEvent("", dest)` instead of `FileCreatedEvent`, which is what tells a
        rename-into-place from a file that is only being created.
        """

        def __init__(self, inotify_fd: _InotifyFD) -> None:
            super().__init__(_Emitter, inotify_fd=inotify_fd)
            self._inotify_fd = inotify_fd

        def on_thread_stop(self) -> None:
            super().on_thread_stop()
            self._inotify_fd.stop()
            self._inotify_fd.join()


else:  # pragma: no cover - not Linux
    _InotifyFD = _InotifyObserver = None  # type: ignore[assignment,misc]
