"""Parallel listing of an object-store prefix (the backfill of a huge volume, issue 12).

A flat ListObjectsV2 walk of 10M keys is 10k calls one after the other. `parallel_pages`
splits the prefix instead: it lists the first levels of "folders" with `delimiter="/"` (each
level's prefixes at once, on the pool) until there are enough of them to keep `workers`
threads busy (or `max_depth` levels down), then lists every remaining sub-prefix flat, in
parallel. The keys yielded are exactly those of the serial listing (each key is under
exactly one listed prefix, or is an object of a level listed with the delimiter), in no
particular order. Pages are handed over through a bounded queue, so a slow consumer holds back
the listing threads instead of buffering the whole listing; an error in any thread is raised
by the generator, and closing the generator early stops the threads.

    >>> def page(prefix, delimiter, token):   # one call of a store holding three keys
    ...     keys = [k for k in ("a/1", "a/2", "b") if k.startswith(prefix)]
    ...     if delimiter:
    ...         subs = sorted({prefix + k[len(prefix):].split("/")[0] + "/" for k in keys
    ...                        if "/" in k[len(prefix):]})
    ...         keys = [k for k in keys if "/" not in k[len(prefix):]]
    ...         return [(k, 1, None, None) for k in keys], subs, None
    ...     return [(k, 1, None, None) for k in keys], [], None
    >>> sorted(o[0] for p in parallel_pages(page, "", recursive=True, workers=4) for o in p)
    ['a/1', 'a/2', 'b']
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

__all__ = ["Page", "parallel_pages", "serial_pages"]

#: (objects as (key, size, last_modified, etag), common prefixes, next continuation token)
Page = tuple[list[tuple[str, int, datetime | Any, str | None]], list[str], str | None]
PageCall = Callable[[str, str, str | None], Page]

_DONE = object()


def serial_pages(page: PageCall, prefix: str, delimiter: str = "",
                 ) -> Iterator[tuple[list, list[str]]]:
    """The pages of one prefix, one call after the other: (objects, common prefixes)."""
    token: str | None = None
    while True:
        objects, prefixes, token = page(prefix, delimiter, token)
        yield objects, prefixes
        if not token:
            return


def parallel_pages(page: PageCall, prefix: str, *, recursive: bool = True, workers: int = 8,
                   max_depth: int = 3, fan_out: int = 4) -> Iterator[list]:
    """Yield pages of objects under `prefix` (module docstring). With `recursive=False` or
    one worker it is the plain serial listing (delimiter "/" when not recursive)."""
    if not recursive:
        for objects, _ in serial_pages(page, prefix, "/"):
            yield objects
        return
    if workers <= 1:
        for objects, _ in serial_pages(page, prefix):
            yield objects
        return
    yield from _Parallel(page, workers, max_depth, fan_out * workers).run(prefix)


class _Parallel:
    def __init__(self, page: PageCall, workers: int, max_depth: int, enough: int) -> None:
        self.page, self.workers = page, workers
        self.max_depth, self.enough = max_depth, enough
        self.out: queue.Queue[Any] = queue.Queue(maxsize=4 * workers)
        self.stop = threading.Event()

    def _put(self, item: Any) -> bool:
        while not self.stop.is_set():
            try:
                self.out.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _level(self, prefix: str) -> list[str]:
        """List one prefix with the delimiter: hand over its objects, return its folders."""
        found: list[str] = []
        for objects, prefixes in serial_pages(self.page, prefix, "/"):
            if objects and not self._put(objects):
                break
            found.extend(prefixes)
        return found

    def _flat(self, prefix: str) -> None:
        for objects, _ in serial_pages(self.page, prefix):
            if self.stop.is_set() or (objects and not self._put(objects)):
                return

    def _produce(self, prefix: str) -> None:
        try:
            with ThreadPoolExecutor(self.workers, thread_name_prefix="list") as pool:
                frontier = [prefix]
                for _ in range(self.max_depth):
                    frontier = [p for found in pool.map(self._level, frontier) for p in found]
                    if self.stop.is_set() or not frontier or len(frontier) >= self.enough:
                        break
                # what is under the last level found is listed flat
                list(pool.map(self._flat, frontier))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            self._put(exc)
        else:
            self._put(_DONE)

    def run(self, prefix: str) -> Iterator[list]:
        producer = threading.Thread(target=self._produce, args=(prefix,), name="list-producer",
                                    daemon=True)
        producer.start()
        try:
            while True:
                item = self.out.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.stop.set()
            producer.join()
