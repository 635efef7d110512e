"""A live progress line for long commands on a terminal (`volume refresh` of a huge volume).

`refresh_progress(console)` is a context manager yielding the callback that
`Catalog.refresh(name, progress)` calls with (stage, listed, changed); rich redraws one
transient line (spinner, stage, counts, elapsed time) that disappears when the block ends, so
only the result line stays. Used only when the console is a terminal: piped output never sees
it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

__all__ = ["refresh_progress"]


@contextmanager
def refresh_progress(console: Console) -> Iterator[Callable[[str, int, int], None]]:
    columns = (SpinnerColumn(), TextColumn("{task.description}"),
               TextColumn("listed {task.fields[listed]:,}  changed {task.fields[changed]:,}"),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("listing", total=None, listed=0, changed=0)

        def update(stage: str, listed: int, changed: int) -> None:
            progress.update(task, description=stage, listed=listed, changed=changed)

        yield update
