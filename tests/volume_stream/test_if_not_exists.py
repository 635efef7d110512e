"""`if_not_exists=True` on create_volume / create_stream / create_table and `--if-not-exists`
on `volume create` / `stream create` (issue 34): what exists is left as it is (a stream's
offset too) and returned, as SQL's IF NOT EXISTS; without it, AlreadyExistsError as before;
with replace too, refused."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import volume_stream as vs
from volume_stream.cli import app


@pytest.fixture
def cat(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("a")
    return vs.connect(tmp_path / "wh")


def test_python_creates_leave_what_exists(cat, tmp_path):
    first = cat.create_volume("land", tmp_path / "data", if_not_exists=True)
    cat.refresh("land")
    again = cat.create_volume("land", tmp_path / "elsewhere", if_not_exists=True)
    assert again.id == first.id and again.location == first.location
    assert cat.directory_table("land").version() == 1          # its table untouched
    with pytest.raises(vs.AlreadyExistsError):
        cat.create_volume("land", tmp_path / "data")
    with pytest.raises(vs.InvalidInputError, match="not both"):
        cat.create_volume("land", tmp_path / "data", replace=True, if_not_exists=True)

    made = cat.create_stream("s", on_volume="land", show_initial_rows=True)
    with cat.consume("s"):
        pass
    kept = cat.create_stream("s", on_volume="land", if_not_exists=True, mode="APPEND_ONLY")
    assert kept["mode"] == "STANDARD" and kept["offset"] == 1 and kept["batch_id"] == 1
    assert made["created_at"] == kept["created_at"]
    assert cat.describe_stream("s")["offset"] == 1            # the offset did not move back
    with pytest.raises(vs.AlreadyExistsError):
        cat.create_stream("s", on_volume="land")

    assert cat.create_table("t", {"id": "INT", "name": "STRING"}, key="id") is True
    assert cat.create_table("t", {"other": "STRING"}, if_not_exists=True) is False
    assert cat.tables.schema("t").names == ["id", "name"] and cat.tables.key("t") == ("id",)
    with pytest.raises(vs.AlreadyExistsError):
        cat.create_table("t", {"id": "INT"})
    with pytest.raises(vs.InvalidInputError, match="not both"):
        cat.create_table("t", {"id": "INT"}, replace=True, if_not_exists=True)


def test_cli_creates_take_if_not_exists(tmp_path):
    (tmp_path / "data").mkdir()
    wh = ["--warehouse", str(tmp_path / "wh")]
    runner = CliRunner()
    res = runner.invoke(app, ["volume", "create", "land", str(tmp_path / "data"), *wh])
    assert res.exit_code == 0 and "created volume land" in res.output
    for _ in range(2):
        res = runner.invoke(app, ["volume", "create", "land", str(tmp_path / "data"),
                                  "--if-not-exists", *wh])
        assert res.exit_code == 0 and "exists" in res.output and "left as it is" in res.output
    res = runner.invoke(app, ["volume", "create", "land", str(tmp_path / "data"), *wh])
    assert isinstance(res.exception, vs.AlreadyExistsError)
    res = runner.invoke(app, ["stream", "create", "s", "--on", "land", "--if-not-exists", *wh])
    assert res.exit_code == 0 and "created stream s" in res.output
    res = runner.invoke(app, ["stream", "create", "s", "--on", "land", "--if-not-exists", *wh])
    assert res.exit_code == 0 and "stream s exists (at offset 0); left as it is" in res.output
