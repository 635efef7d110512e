"""Bad input gets a clear error that names the object and what exists; nothing is lost."""

from __future__ import annotations

import pytest

import volume_stream as vs


def test_unknown_volume_and_stream_name_what_exists(catalog, volume):
    catalog.create_stream("s1", volume)
    with pytest.raises(vs.NotFoundError, match=r"volume 'nope' does not exist.*vol"):
        catalog.refresh("nope")
    with pytest.raises(vs.NotFoundError, match=r"stream 'nope' does not exist.*s1"):
        catalog.read_stream_arrow("nope")
    with pytest.raises(vs.NotFoundError, match="volume 'nope'"):
        catalog.create_stream("s2", "nope")


def test_duplicate_names_need_replace(catalog, volume, data_dir):
    with pytest.raises(vs.AlreadyExistsError, match="replace=True"):
        catalog.create_volume(volume, data_dir)
    catalog.create_stream("s", volume)
    with pytest.raises(vs.AlreadyExistsError):
        catalog.create_stream("s", volume)
    catalog.create_stream("s", volume, mode="APPEND_ONLY", replace=True)
    assert catalog.describe_stream("s")["mode"] == "APPEND_ONLY"


def test_replacing_a_volume_orphans_its_streams_clearly(catalog, volume, data_dir):
    catalog.create_stream("s", volume)
    catalog.create_volume(volume, data_dir, replace=True)
    with pytest.raises(vs.NotFoundError, match="dropped or replaced"):
        catalog.read_stream_arrow("s")


def test_invalid_mode_lists_valid_modes(catalog, volume):
    with pytest.raises(vs.InvalidInputError, match="STANDARD, APPEND_ONLY"):
        catalog.create_stream("s", volume, mode="UPSERT")


@pytest.mark.parametrize("name", ["", "1abc", "a-b", "a b", "x;drop", "ü"])
def test_invalid_names(catalog, data_dir, name):
    with pytest.raises(vs.InvalidInputError, match="invalid volume name"):
        catalog.create_volume(name, data_dir)


def test_missing_or_unreadable_location(catalog, tmp_path):
    with pytest.raises(vs.InvalidInputError, match="does not exist"):
        catalog.create_volume("v", tmp_path / "missing")
    f = tmp_path / "file.txt"
    f.write_text("x")
    with pytest.raises(vs.InvalidInputError, match="not a folder"):
        catalog.create_volume("v", f)
    with pytest.raises(vs.InvalidInputError, match="unsupported scheme"):
        catalog.create_volume("v", "ftp://host/x")
    assert catalog.list_volumes() == []


def test_foreign_folder_as_warehouse_is_refused_untouched(tmp_path):
    foreign = tmp_path / "mydata"
    foreign.mkdir()
    (foreign / "precious.csv").write_text("a,b\n")
    with pytest.raises(vs.WarehouseError, match="not a volume-stream warehouse.*precious.csv"):
        vs.connect(foreign)
    assert sorted(p.name for p in foreign.iterdir()) == ["precious.csv"]


def test_corrupt_warehouse_is_refused(tmp_path, spark):
    wh = tmp_path / "wh"
    vs.connect(wh, spark=spark)
    (wh / "volume-stream.json").write_text("{not json")
    with pytest.raises(vs.WarehouseError, match="corrupt"):
        vs.connect(wh)
    (wh / "volume-stream.json").write_text('{"format": "volume-stream-warehouse"}')
    import shutil
    shutil.rmtree(wh / "_catalog")
    with pytest.raises(vs.WarehouseError, match="damaged"):
        vs.connect(wh)


def test_drop_volume_with_streams_needs_cascade(catalog, volume):
    catalog.create_stream("s", volume)
    with pytest.raises(vs.InvalidInputError, match=r"has streams \['s'\]"):
        catalog.drop_volume(volume)
    assert catalog.drop_volume(volume, cascade=True)
    assert catalog.list_volumes() == [] and catalog.list_streams() == []
    assert catalog.drop_volume(volume, if_exists=True) is False
    assert catalog.drop_stream("s", if_exists=True) is False
