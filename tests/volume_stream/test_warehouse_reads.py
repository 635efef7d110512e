"""Catalog reads of a local warehouse look at the next commit before asking delta-rs to catch
up (the shard API reads the catalog on every request): what another handle committed is read
all the same, also once log clean-up left only a checkpoint for it."""

from __future__ import annotations

import os

from deltalake import DeltaTable

from volume_stream.warehouse.store import Warehouse

KEY = ("test", "x")


def _put(warehouse: Warehouse, n: int) -> None:
    warehouse.mutate(lambda state: state.__setitem__(KEY, {"n": n}))


def test_a_commit_by_another_handle_is_read(tmp_path):
    one, two = Warehouse(tmp_path / "wh"), Warehouse(tmp_path / "wh")
    assert KEY not in two.read()
    assert KEY not in two.read()              # nothing new: read from the open handle
    _put(one, 1)
    assert two.read()[KEY] == {"n": 1}
    _put(two, 2)
    assert one.read()[KEY] == {"n": 2} == two.read()[KEY]


def test_commits_cleaned_up_behind_a_checkpoint_are_read(tmp_path):
    one, two = Warehouse(tmp_path / "wh"), Warehouse(tmp_path / "wh")
    _put(one, 1)
    assert two.read()[KEY] == {"n": 1}
    seen = DeltaTable(two.catalog_path).version()
    _put(one, 2)
    _put(one, 3)
    DeltaTable(one.catalog_path).create_checkpoint()
    os.remove(f"{one.catalog_path}/_delta_log/{seen + 1:020d}.json")  # as clean-up would
    assert two.read()[KEY] == {"n": 3}
