"""The lifecycle the daemon's runners share: a loop on its own thread."""

from __future__ import annotations

import threading

__all__ = ["LoopThread"]


class LoopThread:
    """Lifecycle of an object that runs its loop on `self._thread` (set by the subclass)."""

    _thread: threading.Thread

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the loop to end; True if it did."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()
