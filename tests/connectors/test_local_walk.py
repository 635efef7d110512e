"""A local walk shared with a helper process (`connectors.local._walk`) lists exactly what the
serial walk lists: the same rows, the same skipped names, and no process left behind, also
when the helper cannot start or the listing is abandoned half way."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.local import LocalLister, _walk
from connectors.local.store import _etags
from connectors.protocols import LISTING_SCHEMA


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    for d in range(12):
        for e in range(3):
            folder = root / f"d{d:02d}" / f"e{e}"
            folder.mkdir(parents=True)
            for i in range(d + 2):
                (folder / f"f{i}.bin").write_bytes(b"x" * i)
    deep = root / "d05" / "e1" / "deep" / "deeper"
    deep.mkdir(parents=True)
    (deep / "leaf name+#.txt").write_bytes(b"leaf")
    (root / "d07" / "e2" / "back\\slash").write_bytes(b"")
    os.close(os.open(os.fsencode(root / "d09" / "e0") + b"/bad-\xff", os.O_CREAT | os.O_WRONLY))
    os.symlink(root / "d01", root / "d02" / "link")
    os.mkfifo(root / "d03" / "fifo")
    (root / "top.txt").write_bytes(b"top")
    return root


def rows(lister: LocalLister) -> list[tuple]:
    table = pa.Table.from_batches(list(lister.list()), schema=LISTING_SCHEMA)
    return sorted(zip(*(table[c].to_pylist() for c in LISTING_SCHEMA.names), strict=True))


def shared(root: Path, **kw) -> LocalLister:
    lister = LocalLister(root, **kw)
    lister.expected_rows = 10**9  # the helper starts at once
    return lister


def test_the_shared_walk_is_the_serial_walk(tree: Path, monkeypatch) -> None:
    monkeypatch.setattr(_walk, "BUDGET", 7)  # many round trips, directories handed back
    serial = LocalLister(tree, helper=False)
    expected = rows(serial)
    assert len(expected) == sum(3 * (d + 2) for d in range(12)) + 2
    for kw in ({}, {"batch_size": 5}):
        lister = shared(tree, **kw)
        assert rows(lister) == expected
        assert lister.malformed == serial.malformed == 2
    # the helper takes the top directory (the caller waits for that here) and hands back
    # what is left after 7 files: both walk, every file once
    walk = _walk._HelperWalk(os.fspath(tree), "", strict=True)
    walk.start()
    deadline = time.monotonic() + 30
    while walk.pending and time.monotonic() < deadline:
        time.sleep(0.01)
    found = list(walk.run())
    helper = [p for f in found if isinstance(f, _walk._Files)
              for p in (f.paths if isinstance(f.paths, list) else f.paths.to_pylist())]
    mine = [p for f in found if isinstance(f, _walk._Dir) for p in f.paths]
    assert len(helper) >= 7 and mine
    assert sorted(helper + mine) == sorted([r[0] for r in expected] + [
        "d07/e2/back\\slash", "d09/e0/bad-\udcff"])


def test_a_helper_that_cannot_run_leaves_the_walk_to_the_caller(tree: Path, tmp_path: Path,
                                                                monkeypatch) -> None:
    broken = tmp_path / "broken_helper.py"
    broken.write_text("import sys\nsys.exit(3)\n")
    monkeypatch.setattr(_walk, "_HELPER", os.fspath(broken))
    assert rows(shared(tree)) == rows(LocalLister(tree, helper=False))
    monkeypatch.setattr(_walk, "_HELPER", os.fspath(tmp_path / "missing.py"))
    monkeypatch.setattr(sys, "executable", os.fspath(tmp_path / "no-python"))
    assert rows(shared(tree)) == rows(LocalLister(tree, helper=False))


def test_an_abandoned_walk_stops_its_helper(tree: Path, monkeypatch) -> None:
    monkeypatch.setattr(_walk, "BUDGET", 3)
    batches = shared(tree, batch_size=4).list()
    assert next(batches).num_rows == 4
    batches.close()  # the no_leaks guard checks the helper process is gone
    never = shared(tree).list()  # started, never iterated
    never.close()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-2**63, 2**63 - 1), st.integers(0, 2**63 - 1)),
                max_size=40))
def test_vectorised_etags_are_the_formatted_ones(pairs) -> None:
    mtimes = np.array([m for m, _ in pairs], dtype=np.int64)
    sizes = np.array([n for _, n in pairs], dtype=np.int64)
    assert _etags(mtimes, sizes).to_pylist() == [f"{m:x}-{n:x}" for m, n in pairs]
